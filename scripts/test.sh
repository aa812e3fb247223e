#!/usr/bin/env bash
# The test command: install everything, lint, run the whole suite, then the
# scheduler-side flow tests on every other vLLM minor version (0.26-0.34).
#   bash scripts/test.sh                 (everything; what CI runs)
#   bash scripts/test.sh [pytest args]   (only pytest, with these arguments)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
# The remote-tier tests start their own redis-server and valkey-server processes
# (tests/remote runs against both), and the soak (tests/e2e/test_soak.py) puts its SSD tier
# on a loop-mounted ext4, and the Grafana dashboard's test reads a live server through a real
# Prometheus; as root, install Debian's packages (and openssl, for the TLS certificates) where
# missing. Valkey 8 comes from Debian's backports (bookworm has none).
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v openssl >/dev/null || missing+=(openssl)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
command -v prometheus >/dev/null || missing+=(prometheus)  # the dashboard's test scrapes with it
# Mooncake's transfer engine loads libibverbs even for TCP (tests/remote/test_mooncake_*)
ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 ' || missing+=(libibverbs1)
if [ ${#missing[@]} -gt 0 ] || ! command -v valkey-server >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[test] installing ${missing[*]} valkey-server (apt, about a minute)"
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
    if [ "$codename" = bookworm ] && ! grep -rqs bookworm-backports /etc/apt/sources.list*; then
      echo "deb http://deb.debian.org/debian bookworm-backports main" \
        > /etc/apt/sources.list.d/miniflex-backports.list
    fi
    apt-get update -qq
    if [ ${#missing[@]} -gt 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    fi
    target=()
    [ "$codename" = bookworm ] && target=(-t bookworm-backports)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${target[@]}" valkey-server >/dev/null
  else
    echo "[test] ${missing[*]} valkey-server missing and no apt-get as root: tests that need them will skip"
  fi
fi
# The Mooncake Store backend's tests run a private mooncake_master and holder from its wheel
# (extra "mooncake"; a prebuilt wheel, where one exists for this platform and Python).
if ! .venv/bin/python -c "import mooncake.store" 2>/dev/null; then
  echo "[test] installing the mooncake extra (Mooncake Store's client and servers)"
  .venv/bin/python -m pip install -q -e ".[mooncake]" 2>&1 \
    | grep -v -e "^WARNING: Location" -e "^\[notice\]" || true
  .venv/bin/python -c "import mooncake.store" 2>/dev/null \
    || echo "[test] Mooncake's client does not import here: its tests will skip, saying why"
fi
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
