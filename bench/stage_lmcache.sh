#!/usr/bin/env bash
# Stage LMCache for the GPU machine, which has no package index: the wheels it lacks there,
# in one folder small enough for one device call, plus an install.sh.
#
#   bash bench/stage_lmcache.sh [DEST]      (from the project root; DEST defaults to .lmcstage)
#
# Add "/.lmcstage/" to .git/info/exclude. On the GPU machine, once vLLM 0.26.0 is installed in
# /tmp/site, carry DEST and run
#   source .lmcstage/install.sh
# It checks the wheels, installs them into /tmp/site (pip --no-index --no-deps), exports
# PYTHONPATH=/tmp/site and prints "import lmcache: ok ..." (version, device, whether the
# compiled CUDA kernels are bound) or "import lmcache: FAILED: <exact error>".
#
# LMCACHE_VERSION (default 0.5.3) picks the release. 0.5.3 is the newest whose compiled CUDA
# ops (lmcache/c_ops*.so) link against torch 2.11, the torch of that machine and of vLLM
# 0.26.0. From 0.5.4 on, lmcache/cuda_ops*.so needs a c10 symbol that torch 2.11 lacks
# (c10::NotImplementedError(c10::SourceLocation, std::string)); LMCache then falls back to
# torch ops, and that fallback copies vLLM 0.26's packed K/V layout (per layer [blocks,
# block_size, heads, 2 x head_size]) to the wrong slots. `miniflex bench` leaves LMCache out,
# with that reason, when its kernels are not bound.
#
# The wheels: lmcache itself, plus aiofile and caio (lmcache's GDS backend imports aiofile
# when its storage backends load, even with GDS off). Every other module LMCache's vLLM
# path imports is on that machine already (torch, numpy, numba, cupy, prometheus-client,
# psutil, pyyaml, safetensors, sortedcontainers, aiohttp, aiofiles, httpx, transformers,
# huggingface-hub, grpcio, protobuf, ...) or comes with vLLM's staged dependencies (pyzmq,
# msgspec, fastapi, uvicorn, httptools, cachetools, blake3, cryptography, opentelemetry-*).
# numpy and torch are never shipped. Downloads are cached in ~/.cache/miniflex-lmcstage.
set -euo pipefail
VERSION="${LMCACHE_VERSION:-0.5.3}"
DEST="${1:-.lmcstage}"
CACHE="${HOME}/.cache/miniflex-lmcstage/wheels"
LIMIT=60000000  # bytes; a device call carries at most 64 MiB with the project tree
# name==version:tag pattern; aiofile and caio as pure-Python wheels (nothing of them runs)
WHEELS=("lmcache==${VERSION}:cp312-cp312-manylinux" "aiofile==3.12.3:py3-none-any" "caio==0.12.10:py3-none-any")
mkdir -p "$CACHE"

PLAT=""
for n in 17 24 26 27 28 31 34 35 36 37 38 39; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
# pip's own notices about local wheel folders are noise here; keep real errors
quiet() { local out rc; out=$("$@" 2>&1) && rc=0 || rc=$?; printf '%s\n' "$out" | grep -v "^WARNING: Location" >&2 || true; return $rc; }
# shellcheck disable=SC2086
PIPDL="python3 -m pip download -q --no-deps --python-version 3.12 --implementation cp $PLAT
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64
  --only-binary=:all: -d $CACHE"
PUREDL="python3 -m pip download -q --no-deps --python-version 3.12 --implementation py --abi none
  --platform any --only-binary=:all: -d $CACHE"

echo "[lmcstage] downloading LMCache ${VERSION}, aiofile and caio (cached in $CACHE)"
files=()
for entry in "${WHEELS[@]}"; do
  spec="${entry%%:*}" tag="${entry##*:}"
  name="${spec%%==*}" ver="${spec##*==}"
  pattern="$CACHE/${name}-${ver}-${tag}*.whl"
  dl="$PIPDL"
  [ "$tag" = "py3-none-any" ] && dl="$PUREDL"
  # shellcheck disable=SC2086
  if ! ls $pattern >/dev/null 2>&1; then quiet $dl "$spec"; fi
  # shellcheck disable=SC2086
  files+=($(ls $pattern | head -n 1))
done

rm -rf "$DEST" && mkdir -p "$DEST"
cp "${files[@]}" "$DEST/"
total=$(cat "$DEST"/*.whl | wc -c)
if [ "$total" -gt "$LIMIT" ]; then
  echo "[lmcstage] $total bytes of wheels: over the $LIMIT a device call carries" >&2
  exit 1
fi
SUMS="$(cd "$DEST" && sha256sum ./*.whl)"

cat > "$DEST/install.sh" <<EOF
# source me on the GPU machine, after vLLM 0.26.0 went into /tmp/site (LMCache ${VERSION})
set -e
HERE="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)"
(cd "\$HERE" && sha256sum -c --quiet) <<'SUMS'
${SUMS}
SUMS
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "\$HERE"/*.whl
export PYTHONPATH=/tmp/site\${PYTHONPATH:+:\$PYTHONPATH}
set +e
LMCACHE_TRACK_USAGE=false LMCACHE_LOG_LEVEL=WARNING python3 - <<'PY'
import inspect, sys
try:
    import lmcache
    from lmcache.v1.platform import resolve_device_ops
    ops = resolve_device_ops(lmcache.torch_device_type)
    kernels = "compiled CUDA kernels" if inspect.isbuiltin(ops.multi_layer_kv_transfer) else "torch fallback"
    print(f"import lmcache: ok, {lmcache.__version__} on {lmcache.torch_device_type} ({kernels})")
except BaseException as exc:
    print(f"import lmcache: FAILED: {type(exc).__name__}: {exc}")
    sys.exit(1)
try:
    import lmcache.integration.vllm.vllm_v1_adapter  # what vLLM's LMCacheConnectorV1 imports
    print("import lmcache.integration.vllm.vllm_v1_adapter: ok")
except BaseException as exc:
    print(f"import lmcache.integration.vllm.vllm_v1_adapter: FAILED: {type(exc).__name__}: {exc}")
PY
EOF
ls -la "$DEST"
echo "[lmcstage] done: LMCache ${VERSION}, $total bytes of wheels in $DEST"
