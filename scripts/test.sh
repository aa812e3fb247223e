#!/usr/bin/env bash
# The test command: install everything, lint, run the whole suite, then the
# scheduler-side flow tests on every other vLLM minor version (0.26-0.33).
#   bash scripts/test.sh                 (everything; what CI runs)
#   bash scripts/test.sh [pytest args]   (only pytest, with these arguments)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
echo "[test] ruff"
.venv/bin/ruff check miniflex tests bench scripts
.venv/bin/ruff format --check miniflex tests bench scripts
echo "[test] pytest"
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider || rc=$?
# Each version's Python files are fetched once into .venv/vllm-matrix/ and reused.
echo "[test] tests/connector on the other vLLM minor versions (scripts/vllm_matrix.py)"
.venv/bin/python scripts/vllm_matrix.py || rc=$?
exit $rc
