#!/usr/bin/env bash
# Install loopeval into ./.venv on a fresh machine (idempotent; rerunning is cheap).
#   bash scripts/install.sh          the main job: loopeval and its pinned dependencies
#   bash scripts/install.sh --test   also what the tests need: the test extra (pytest, Playwright,
#                                    Ray, psycopg) and, as root, Debian's Chromium and Postgres server
# torch is pinned to the CPU wheel first, so nothing pulls a multi-GB CUDA build;
# constraints.txt pins every other package to the versions the tests were run with.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") extra="" ;;
    --test) extra="[test]" ;;
    *) echo "usage: scripts/install.sh [--test]" >&2; exit 2 ;;
esac
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -c constraints.txt -e ".$extra"

# apt_install PACKAGE WHY: Debian's package, as root; otherwise say which tests will skip.
apt_install() {
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
    else
        echo "install.sh: $1 not found; $2 will be skipped (run as root to install it)" >&2
    fi
}
if [ -n "$extra" ]; then
    # Debian's Chromium drives the dashboard browser tests (browser downloads fail offline).
    command -v chromium >/dev/null 2>&1 || apt_install chromium "browser tests"
    # bubblewrap is the sandbox HumanEval runs model-written code in (without it HumanEval refuses to run).
    command -v bwrap >/dev/null 2>&1 || apt_install bubblewrap "HumanEval tests"
    # The Postgres tests start a throwaway cluster with the server's initdb and pg_ctl (tests/pg.py);
    # Debian keeps them in /usr/lib/postgresql/N/bin, off PATH.
    if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
        apt_install postgresql "Postgres tests"
    fi
fi
echo "loopeval installed in $(pwd)/.venv"
