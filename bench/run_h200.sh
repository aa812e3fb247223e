#!/usr/bin/env bash
# The benchmarks on the H200 machine, side by side: vLLM APC alone, vLLM's native
# OffloadingConnector, MiniFlex's CPU tier, MiniFlex CPU+SSD. vLLM 0.26.0 must be importable
# (on PYTHONPATH; the project root is added here); the model is the Qwen3-8B-shaped
# config in bench/models/qwen3-8b-shape with dummy weights (regime: also qwen3-32b-shape and
# qwen3-8b-shape-128k); vLLM's KV cache is limited with num_gpu_blocks_override
# (--gpu-blocks) so that the over-capacity cases are real.
#
#   bash bench/run_h200.sh PART OUT_DIR
#   PART: ttft | decode | burst | overflow | mixed | overhead | multiturn | ssd | regime | remote
#         | mla | all (every part but regime and mla)
#
# Engines run as users run them: torch.compile and CUDA graphs (vLLM's default,
# FULL_AND_PIECEWISE); EXTRA_ARGS=--eager runs them eagerly instead. Each PART is one
# `miniflex bench` run that starts each configuration once (about 150 s for the first
# engine, which compiles, and 40-60 s for the next ones, from vLLM's compile cache).
# Results: OUT_DIR/<workload>/<card>.json and .png per workload (<card>: h200 or h100 as
# nvidia-smi names the card, CARD sets it), OUT_DIR/<part>.txt (the tables) and
# OUT_DIR/<part>.log (progress and vLLM's log). A part cut short by the time limit
# (LIMIT_S, default 900 s) still prints and writes what it measured, marked partial.
# ttft also runs the decode workload on the same engines (decode throughput with no reuse:
# 32 x 512 tokens and 2 x 12,000 tokens, 256 out); decode runs it alone, 5 rounds. burst
# sends 96 requests over 12 shared 4k-token prefixes at once, three rounds, with 6 GiB of
# CPU tier for every connector (MiniFlex CPU+SSD too) and vLLM's KV below four prefixes.
# multiturn compares how MiniFlex loads a hit instead (MT_CONFIGS, default APC alone and
# MiniFlex's CPU tier with load_mode sync, layerwise and async, and MiniFlex CPU+SSD with
# its smaller CPU tier). overhead runs OH_CONFIGS (default APC alone, MiniFlex's CPU tier,
# the native connector and MiniFlex CPU+SSD). ssd serves 8k and 30k prompts
# that fillers pushed out of a 5 GiB CPU tier, so that they are resident only on disk
# (SSD_CONFIGS, default APC alone, miniflex-ssd and vLLM's CPU+fs tiering; both tiers read
# with O_DIRECT, so the page cache plays no part) into OUT_DIR/ttft/<card>-ssd-resident.json.
# regime does the same where the SSD tier should pay: long prompts on larger models, each
# computed in one step once evicted (--max-num-batched-tokens of a prompt or half of one).
# One `miniflex bench ttft` run per shape in REGIME_SHAPES (default 32b,8b-128k), one repeat,
# REGIME_CONFIGS (default APC alone, miniflex-ssd, miniflex-ssd with every hit loaded, async,
# and vLLM's CPU+fs tiering), into OUT_DIR/ttft/<card>-regime-<shape>.json: 32b is
# bench/models/qwen3-32b-shape (256 KiB of KV a token) at 8,192 and 32,768 tokens over an
# 8 GiB CPU tier (fillers 12 GiB), 8b-128k is qwen3-8b-shape-128k at 65,536 and 131,072
# tokens over a 9 GiB one, half a 128k prompt (fillers 13.5 GiB; vLLM's fs tier promotes a
# whole prompt into its CPU tier, so it can load at most half of a 128k one). Every shape is
# a run of its own under LIMIT_S; with four configurations one takes about 9-11 minutes
# (32b: 32B engines start in about 200 s, then 60-80 s each; 8b-128k: 150 s, then 40-60 s;
# 30-80 s of requests and disk writes per configuration), so give each shape its own call
# with LIMIT_S=570 under a 10-minute limit, or split REGIME_CONFIGS over two calls with apc
# in each. Disk, per configuration (the directory is emptied between them): miniflex-ssd
# preallocates --ssd-bytes (24 GiB, 36 GiB); vLLM's fs tier never evicts and writes 34 GiB
# (32b) and 54 GiB (8b-128k), the latter more than a 64 GiB disk has free: there run
# native-fs at 8b-128k with EXTRA_ARGS="--ttft-prompts 131072" (about 32 GiB).
# mla times 8k and 30k hits of an MLA model (bench/models/deepseek-v2-lite-shape: DeepSeek-V2-
# Lite's attention, 27 layers of one 576-value latent vector a token, 30 KiB of KV a token, and a
# dense MLP in every layer) for MLA_CONFIGS (default APC alone, MiniFlex's CPU tier and vLLM's
# native connector) into OUT_DIR/ttft/<card>-mla.json.
# remote (bench/remote_share.py): two engines on the GPU, one after the other, and one
# redis-server on the same machine; engine A computes 8k and 30k-token prompts, engine B serves
# them through the store, against recompute and its own CPU-tier hit, into
# OUT_DIR/remote/<card>.json; one engine B per hit_policy in B_POLICIES (default cost,load:
# the cost model's choice, and a fetch forced where it would recompute). The machine has no redis-server: stage it here with
# `bash bench/stage_redis.sh` (.redisstage, 16 MB; carry it and copy it to /tmp/redisstage),
# or point REDIS_STAGE at it; an existing store can be given as REMOTE_URL instead.
# Environment: PYTHON (default python3), CONFIGS (default all four), LIMIT_S (per run; regime
# has one per shape), COMMIT (the commit measured, for a copied tree without git), EXTRA_ARGS
# (more `miniflex bench` arguments, after the part's own, so they win; EXTRA_ARGS=--dry-run
# checks a part without starting engines, and EXTRA_ARGS="--ssd-cpu-bytes cpu" gives
# miniflex-ssd the CPU tier's bytes), VERBOSE=1 (vLLM's and MiniFlex's INFO log into
# OUT_DIR/<part>.log, with the time per connector hook that each engine logs when it shuts
# down).
# LMCache is a row of its own with e.g. CONFIGS=apc,miniflex-cpu,native,lmcache once it is
# importable there (bash bench/stage_lmcache.sh here; `source .lmcstage/install.sh` there,
# after vLLM); otherwise that row is left out and the output says why.
set -uo pipefail
USAGE="usage: bash bench/run_h200.sh ttft|decode|burst|overflow|mixed|overhead|multiturn|ssd|regime|remote|mla|all OUT_DIR"
PART="${1:?$USAGE}"
case "$PART" in ttft|decode|burst|overflow|mixed|overhead|multiturn|ssd|regime|remote|mla|all) ;; *) echo "$USAGE" >&2; exit 2 ;; esac
OUT="$(mkdir -p "${2:?$USAGE}" && cd "$2" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
CONFIGS="${CONFIGS:-apc,miniflex-cpu,native,miniflex-ssd}"
MT_CONFIGS="${MT_CONFIGS:-apc,miniflex-sync,miniflex-layerwise,miniflex-async,miniflex-ssd}"
OH_CONFIGS="${OH_CONFIGS:-apc,miniflex-cpu,native,miniflex-ssd}"
SSD_CONFIGS="${SSD_CONFIGS:-apc,miniflex-ssd,native-fs}"
REGIME_CONFIGS="${REGIME_CONFIGS:-apc,miniflex-ssd,miniflex-ssd+hit_policy=load+load_mode=async,native-fs}"
REGIME_SHAPES="${REGIME_SHAPES:-32b,8b-128k}"
MLA_CONFIGS="${MLA_CONFIGS:-apc,miniflex-cpu,native}"
LIMIT_S="${LIMIT_S:-900}"

VERSIONS="import vllm, torch; print('[run_h200] vllm', vllm.__version__, torch.__version__)"
if ! "$PY" -c "$VERSIONS"; then
  echo "[run_h200] vLLM is not importable with $PY: put vLLM 0.26.0 on PYTHONPATH first" >&2
  exit 2
fi
if ! "$PY" -c "import crc32c" 2>/dev/null; then  # MiniFlex's checksums; not in vLLM's bundle
  echo "[run_h200] crc32c is not importable with $PY: pip install crc32c, or source the" \
    "env.sh of bench/stage_redis.sh's folder (it carries the wheel)" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1 || true

MODEL=bench/models/qwen3-8b-shape  # a part may run another: MODEL=... BATCHED=... run_part
BATCHED=8192
# the card's name in the result files (h200, h100; CARD overrides it): a figure names the
# card that measured it
CARD="${CARD:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 \
  | grep -o -i -m 1 'h[0-9]\{3\}' | tr 'A-Z' 'a-z')}"
CARD="${CARD:-gpu}"
COMMON=(--load-format dummy --block-size 16 --out-dir "$OUT" --tag "$CARD")
if [ -n "${COMMIT:-}" ]; then COMMON+=(--commit "$COMMIT"); fi
read -r -a EXTRA <<< "${EXTRA_ARGS:-}"

run_part() {  # run_part NAME WORKLOADS [miniflex bench args]; MODEL, BATCHED: the model and
  # its --max-num-batched-tokens
  local name="$1" workloads="$2"
  shift 2
  echo "[run_h200] $(date +%T) $name: miniflex bench $workloads $*"
  timeout -s INT -k 60 "$LIMIT_S" \
    "$PY" -m miniflex.tools.cli ${VERBOSE:+-v} bench "$workloads" --configs "$CONFIGS" "$@" \
    --model "$MODEL" --max-num-batched-tokens "$BATCHED" "${COMMON[@]}" "${EXTRA[@]}" \
    > "$OUT/$name.txt" 2> "$OUT/$name.log"
  local rc=$?
  grep '^\[bench' "$OUT/$name.log" | tail -n 50
  cat "$OUT/$name.txt"
  if [ "$rc" -ne 0 ]; then
    echo "[run_h200] $name exited with status $rc; the end of $OUT/$name.log:"
    grep -v '^\[bench' "$OUT/$name.log" | tail -n 40
  fi
  echo "[run_h200] $(date +%T) $name done (status $rc)"
  return "$rc"
}

case "$PART" in
  ttft)  # 2100 blocks = 33,600 tokens: one 30k prompt fits, and so does its GPU-hit rerun;
    # so do the decode batches (24.6k and 24.5k tokens with their outputs)
    run_part ttft ttft,decode --gpu-blocks 2100 --ttft-prompts 1024,8192,30000 --repeat 3 \
      --max-num-seqs 32 --decode-cases 32x512x256,2x12000x256 --decode-rounds 3 ;;
  decode)  # the ttft part's decode workload alone, 5 rounds: throughput with no reuse
    run_part decode decode --gpu-blocks 2100 --max-num-seqs 32 \
      --decode-cases 32x512x256,2x12000x256 --decode-rounds 5 ;;
  burst)  # 900 blocks = 14,400 tokens: under four 4k prefixes; 6 GiB of CPU tier holds
    # about 10.7 of the 12 (144 KiB a token), the same bytes for every connector
    run_part burst burst --gpu-blocks 900 --max-num-seqs 64 --cpu-bytes 6GiB \
      --ssd-cpu-bytes 6GiB --ssd-bytes 40GiB --burst-prefixes 12 --burst-prefix-tokens 4096 \
      --burst-requests 96 --burst-max-tokens 64 --burst-rounds 3 ;;
  overflow)  # 1024 blocks = 16,384 tokens; 4k-token prompts: 2 to 12 of them
    run_part overflow overflow --gpu-blocks 1024 --overflow-prompt-tokens 4096 \
      --overflow-ratios 0.5,1,1.5,2,3 ;;
  mixed)  # 4 shared 8k prefixes = 2x the 16k-token KV cache; 160 requests, 40 s at 4/s
    run_part mixed mixed --gpu-blocks 1024 --mixed-prefixes 4 \
      --mixed-prefix-tokens 8192 --mixed-suffix-tokens 128 --mixed-short-tokens 256 \
      --mixed-long-fraction 0.5 --mixed-rate 4 --mixed-requests 160 --mixed-max-tokens 8 ;;
  overhead)  # no reuse; 6000 blocks hold the whole batch, so no round waits for KV space
    CONFIGS="$OH_CONFIGS" run_part overhead overhead --gpu-blocks 6000 \
      --overhead-prompts 32 --overhead-prompt-tokens 2048 --overhead-max-tokens 16 \
      --overhead-serial 8 --overhead-rounds 10 ;;
  multiturn)  # 1600 blocks = 25,600 tokens: the 24k-token second turn fits, the history is
    # evicted between the turns; MiniFlex loads 20k tokens (2.9 GB) while 4k new ones compute
    CONFIGS="$MT_CONFIGS" run_part multiturn multiturn --gpu-blocks 1600 \
      --multiturn-prefix-tokens 20000 --multiturn-new-tokens 4096 --multiturn-repeat 3 ;;
  ssd)  # 5 GiB of CPU tier holds a 30k-token prompt (4.4 GB; vLLM's fs tier promotes a whole
    # prompt into it); fillers worth 7.5 GiB of KV push it out to disk before each hit. One
    # repeat: the fs tier never evicts, and writes about 20 GB of files in this part
    CONFIGS="$SSD_CONFIGS" run_part ssd ttft --gpu-blocks 2100 --ttft-prompts 8192,30000 \
      --repeat 1 --ttft-evict cpu --ssd-cpu-bytes 5GiB --json "$OUT/ttft/$CARD-ssd-resident.json" ;;
  regime)  # 32b: 2100 blocks = 33,600 tokens (8.2 GiB) hold a 32k prompt and its GPU-hit
    # rerun; 8b-128k: 8300 blocks = 132,800 tokens (18.2 GiB) a 128k one. The SSD tier holds
    # the prompt and the fillers after it (8 + 12 and 18 + 13.5 GiB)
    for shape in ${REGIME_SHAPES//,/ }; do
      case "$shape" in 32b|8b-128k) ;; *)
        echo "[run_h200] REGIME_SHAPES: unknown shape '$shape' (32b, 8b-128k)" >&2; exit 2 ;; esac
    done
    status=0
    for shape in ${REGIME_SHAPES//,/ }; do
      case "$shape" in
        32b)
          MODEL=bench/models/qwen3-32b-shape BATCHED=32768 CONFIGS="$REGIME_CONFIGS" \
            run_part regime-32b ttft --gpu-blocks 2100 --ttft-prompts 8192,32768 --repeat 1 \
            --ttft-evict cpu --cpu-bytes 8GiB --ssd-cpu-bytes 8GiB --ssd-bytes 24GiB \
            --json "$OUT/ttft/$CARD-regime-32b.json" || status=1 ;;
        8b-128k)
          MODEL=bench/models/qwen3-8b-shape-128k BATCHED=65536 CONFIGS="$REGIME_CONFIGS" \
            run_part regime-8b-128k ttft --gpu-blocks 8300 --ttft-prompts 65536,131072 \
            --repeat 1 --ttft-evict cpu --cpu-bytes 9GiB --ssd-cpu-bytes 9GiB --ssd-bytes 36GiB \
            --json "$OUT/ttft/$CARD-regime-8b-128k.json" || status=1 ;;
      esac
    done
    exit "$status" ;;
  mla)  # 2100 blocks = 33,600 tokens (1 GiB of latent KV): a 30k prompt fits, and so does its
    # GPU-hit rerun
    MODEL=bench/models/deepseek-v2-lite-shape CONFIGS="$MLA_CONFIGS" run_part mla ttft \
      --gpu-blocks 2100 --ttft-prompts 8192,30000 --repeat 3 --json "$OUT/ttft/$CARD-mla.json" ;;
  remote)  # 2100 blocks = 33,600 tokens: a 30k prompt fits; 12 GiB of CPU tier holds one
    # (4.4 GB); the store holds all six prompts (26 GB of KV)
    STAGE="${REDIS_STAGE:-/tmp/redisstage}"
    if [ -z "${REMOTE_URL:-}" ] && [ -f "$STAGE/env.sh" ]; then source "$STAGE/env.sh"; fi
    if [ -z "${REMOTE_URL:-}" ] && ! command -v redis-server >/dev/null; then
      echo "[run_h200] no redis-server: bash bench/stage_redis.sh here, copy it to $STAGE" >&2
      exit 2
    fi
    mkdir -p "$OUT/remote"
    echo "[run_h200] $(date +%T) remote: python -m bench.remote_share"
    timeout -s INT -k 60 "$LIMIT_S" "$PY" -m bench.remote_share \
      --model bench/models/qwen3-8b-shape --load-format dummy --block-size 16 \
      --gpu-blocks 2100 --prompt-tokens 8192,30000 --repeat 3 --cpu-bytes 12GiB \
      --server-memory 40gb --b-hit-policies "${B_POLICIES:-cost,load}" \
      ${REMOTE_URL:+--url "$REMOTE_URL"} ${COMMIT:+--commit "$COMMIT"} \
      --json "$OUT/remote/$CARD.json" \
      "${EXTRA[@]}" > "$OUT/remote.txt" 2> "$OUT/remote.log"
    rc=$?
    grep '^\[remote_share' "$OUT/remote.log" | tail -n 20
    tail -n 8 "$OUT/remote.txt"
    if [ "$rc" -ne 0 ]; then tail -n 40 "$OUT/remote.log"; fi
    echo "[run_h200] $(date +%T) remote done (status $rc)"
    exit "$rc" ;;
  all)
    status=0
    for p in ttft burst overflow mixed overhead multiturn ssd remote; do bash "${BASH_SOURCE[0]}" "$p" "$OUT" || status=1; done
    exit "$status" ;;
  *)
    echo "$USAGE" >&2
    exit 2 ;;
esac
