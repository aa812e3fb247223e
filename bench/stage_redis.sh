#!/usr/bin/env bash
# Stage redis-server (and redis-benchmark) with their shared libraries, and the `redis`
# Python client, for a machine with no package index (the GPU machine).
#
#   bash bench/stage_redis.sh [DEST]        (run from the project root; DEST: .redisstage)
#
# DEST/bin holds wrappers that run the copied binaries with DEST/lib as their library path,
# so nothing else sees those libraries (torch needs its own newer libstdc++: the C and C++
# runtimes are not copied, the target's are newer). DEST/site holds the pure-Python client
# (hiredis, a compiled extension, is left out; the client parses replies without it) and the
# crc32c wheel for the target's Python, unpacked.
# DEST/env.sh puts both on PATH and PYTHONPATH. There:
#   run(carry=[".redisstage"], command="cp -r .redisstage /tmp/redisstage && ...")
#   source /tmp/redisstage/env.sh && redis-server --version
set -euo pipefail
DEST="${1:-.redisstage}"
PY="${PYTHON:-python3}"  # the interpreter whose `redis` client is copied
rm -rf "$DEST" && mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/site"
SKIP='^(linux-vdso|libc\.so|libm\.so|ld-linux|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s)'
tools=(redis-server redis-benchmark)
command -v valkey-server >/dev/null && tools+=(valkey-server)  # optional: bench --server
for tool in "${tools[@]}"; do
  src="$(command -v "$tool")" || { echo "[stage_redis] $tool is not installed" >&2; exit 2; }
  cp -L "$src" "$DEST/lib/$tool"
  ldd "$src" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ "$name" =~ $SKIP ]]; then cp -L "$path" "$DEST/lib/$name"; fi
  done
  cat > "$DEST/bin/$tool" <<WRAP
#!/bin/sh
HERE="\$(cd "\$(dirname "\$0")/.." && pwd)"
LD_LIBRARY_PATH="\$HERE/lib" exec "\$HERE/lib/$tool" "\$@"
WRAP
  chmod +x "$DEST/bin/$tool"
done
CLIENT="$("$PY" -c 'import os, redis; print(os.path.dirname(redis.__file__))')"
cp -r "$CLIENT" "$DEST/site/redis"
# the checksum library (a compiled wheel, for the target's Python: TARGET_PYTHON, default 3.12)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${TARGET_PYTHON:-3.12}" \
  --platform manylinux2014_x86_64 -d "$DEST/wheels" crc32c
"$PY" -m zipfile -e "$DEST"/wheels/crc32c-*.whl "$DEST/site"
find "$DEST/site" -name '__pycache__' -prune -exec rm -rf {} +
cat > "$DEST/env.sh" <<'ENV'
STAGE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="$STAGE/bin:$PATH"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$STAGE/site"
ENV
echo "[stage_redis] $(du -sh "$DEST" | cut -f1) in $DEST: $("$DEST/bin/redis-server" --version)"
