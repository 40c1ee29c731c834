#!/bin/bash
# Harbor oracle: lay the reference files over the workspace.
cp -a "$(dirname "$0")/workspace/." /workspace/
