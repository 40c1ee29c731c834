#!/bin/bash
# Harbor verifier entry point: lay the hidden tests over the workspace, run them,
# write the reward. (tryloop's own verifier does this outside the agent's reach.)
cp -a /tests/workspace/. /workspace/ 2>/dev/null
cd /workspace
mkdir -p /logs/verifier
if python3 -m pytest -q; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
