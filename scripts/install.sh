#!/usr/bin/env bash
# Install loopeval into ./.venv on a fresh machine (idempotent; rerunning is cheap).
# torch is pinned to the CPU wheel first, so nothing pulls a multi-GB CUDA build;
# constraints.txt pins every other package to the versions the tests were run with.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test]"
# Debian packages: Chromium drives the dashboard browser tests (browser downloads fail offline);
# bubblewrap is the sandbox HumanEval executes model-written code in (without it, HumanEval refuses to run).
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "install.sh: ${missing[*]} not found; run as root to install (browser tests skip, HumanEval refuses)" >&2
    fi
fi
echo "loopeval installed in $(pwd)/.venv"
