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
# Debian's Chromium drives the dashboard browser tests (browser downloads fail offline).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "install.sh: chromium not found; browser tests will be skipped (run as root to install it)" >&2
    fi
fi
echo "loopeval installed in $(pwd)/.venv"
