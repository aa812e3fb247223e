#!/usr/bin/env bash
# The main job: install everything, then run the MiniFlex demo.
#   bash scripts/demo.sh [miniflex demo args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/miniflex" demo "$@"
