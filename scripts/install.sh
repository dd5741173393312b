#!/usr/bin/env bash
# Install loopeval into ./.venv on a fresh machine (idempotent; rerunning is cheap).
#   bash scripts/install.sh          the main job: loopeval and its pinned dependencies, nothing else
#   bash scripts/install.sh --test   also what the tests need: the test extra (pytest, Playwright,
#                                    Ray, psycopg, Triton for the kernel tests) and, as root, Debian's Chromium (browser tests),
#                                    bubblewrap (HumanEval sandbox) and Postgres server
# torch is pinned to the CPU wheel first, so nothing pulls a multi-GB CUDA build;
# constraints.txt pins every other package to the versions the tests were run with.
# Each step prints a numbered header and pip's own progress, so a long install is never silent.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") extra="" steps=3 ;;
    --test) extra="[test]" steps=4 ;;
    *) echo "usage: scripts/install.sh [--test]" >&2; exit 2 ;;
esac
step=0
begin() { step=$((step + 1)); echo "==> install.sh [$step/$steps] $* (${SECONDS}s so far)"; }

begin "virtual environment .venv and an up-to-date pip"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
begin "torch 2.13.0, CPU build"
.venv/bin/python -m pip install --progress-bar on "torch==2.13.0"
begin "loopeval${extra} and its pinned dependencies (constraints.txt)"
.venv/bin/python -m pip install --progress-bar on -c constraints.txt -e ".$extra"

if [ -n "$extra" ]; then
    # Debian packages only the tests use: Chromium drives the dashboard browser tests (browser
    # downloads fail offline); bubblewrap is the sandbox HumanEval runs model-written code in; the
    # Postgres tests start a throwaway cluster with the server's initdb and pg_ctl (tests/support/pg.py),
    # which Debian keeps in /usr/lib/postgresql/N/bin, off PATH.
    missing=()
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
    command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
    begin "Debian packages for the tests: ${missing[*]:-none missing}"
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ]; then
            apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
        else
            echo "install.sh: ${missing[*]} not installed (run as root to install them); the tests that need them skip" >&2
        fi
    fi
fi
echo "loopeval installed in $(pwd)/.venv in ${SECONDS}s"
echo "run it as .venv/bin/loopeval, or activate the venv first (source .venv/bin/activate) and type loopeval"
