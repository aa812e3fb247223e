#!/usr/bin/env bash
# The test command: install everything, lint, then run the whole suite.
#   bash scripts/test.sh [pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
echo "[test] ruff"
.venv/bin/ruff check miniflex tests bench
.venv/bin/ruff format --check miniflex tests bench
echo "[test] pytest"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
