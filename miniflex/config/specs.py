"""The table of MiniFlex settings: each key's parser, default and documentation.

``miniflex.config`` builds :class:`~miniflex.config.MiniFlexConfig` from it, and
``config_table()`` renders it as the table in ``docs/config.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from miniflex.config.parse import (
    parse_auto_float,
    parse_auto_size,
    parse_bool,
    parse_choice,
    parse_chunk_blocks,
    parse_dirs,
    parse_int,
    parse_path,
    parse_seconds,
    parse_size,
)
from miniflex.config.remote import REMOTE_SPECS

__all__ = ["AUTO_CHUNK_TOKENS", "SPECS", "Spec"]

AUTO_CHUNK_TOKENS = 64


@dataclass(frozen=True)
class Spec:
    parse: Callable[[str, object], Any]
    default: Any
    doc: str
    shown_default: str


def _size(default: str, doc: str) -> Spec:
    return Spec(parse_size, parse_size("default", default), doc, default)


_EVICTION = ("lru", "fifo")
_MOVERS = ("auto", "cpu", "kernel", "dma", "staged")
_SSD_IO = ("auto", "io_uring", "threads")
_SSD_WRITE = ("back", "through")
_STAGING_STORES = ("direct", "lanes")
_HIT_POLICIES = ("cost", "load", "cpu")
_LOAD_MODES = ("auto", "layerwise", "sync", "async")


SPECS: dict[str, Spec] = {
    "cpu_bytes": _size(
        "4GiB",
        "Size of the CPU tier of the engine (pinned host memory). With tensor parallelism "
        "each rank's pool gets an equal share (an MLA model's latent cache is the same on every "
        "rank: one pool, which all ranks map, gets it all). Each pool must hold at least one "
        "chunk; the total must be below the machine's physical memory.",
    ),
    "cpu_pool_file": Spec(
        lambda k, v: parse_path(k, v),
        None,
        "Back the CPU pool by a shared mapping of this file (one per TP rank: `<path>.<rank>`; "
        "the pool all ranks of an MLA model share: `<path>.<engine id>`, "
        "mode 0600, removed at shutdown) instead of anonymous memory, e.g. under `/dev/shm` so "
        "that tools can inspect a live pool. Empty: anonymous memory.",
        "",
    ),
    "blocks_per_chunk": Spec(
        parse_chunk_blocks,
        None,
        "vLLM blocks per chunk, the unit of lookup, allocation, eviction and I/O; a chunk is "
        "`blocks_per_chunk * block_size` tokens. `auto`: the fewest blocks that make at least "
        f"{AUTO_CHUNK_TOKENS} tokens (4 blocks of 16, 2 of 32, 1 of 128).",
        "auto",
    ),
    "cpu_eviction": Spec(
        lambda k, v: parse_choice(k, v, _EVICTION),
        "lru",
        "Eviction policy of the CPU tier: " + ", ".join(_EVICTION) + ". Under either, "
        "chunks of generated tokens are stored at the evicting end until a request hits "
        'them, and a lookup counts as a use (docs/design/tiers.md, "Recency").',
        "lru",
    ),
    "mover": Spec(
        lambda k, v: parse_choice(k, v, _MOVERS),
        "auto",
        "How KV bytes move between vLLM's cache and the CPU pool: `cpu` (torch copies; the "
        "only mover on vLLM's CPU backend), `kernel` (CuPy gather/scatter kernel into mapped "
        "pinned memory), `dma` (batched async memcpy), `staged` (loads: whole slots by the copy "
        "engines through a GPU staging buffer, pages placed by the kernel; stores: see "
        "`staging_stores`); `auto`: the tuning cache's "
        "winner for "
        "this GPU and layout, else `staged` on CUDA and `cpu` elsewhere.",
        "auto",
    ),
    "kernel_ctas": Spec(
        lambda k, v: parse_int(k, v, 0, 4096),
        0,
        "Thread blocks (CTAs) of every launch of the copy kernel (`kernel` and `staged` "
        "movers, the `staged` mover's direct stores included, which run for a whole store); "
        "few leave the SMs to vLLM's compute. 0: the tuning cache's value, else the built-in "
        "defaults (2; 8 for the `staged` gather/scatter; 2-8 by size for a load issued layer "
        "by layer).",
        "0",
    ),
    "staging_lane_bytes": _size(
        "32MiB",
        "The `staged` mover's GPU staging buffer: 4 lanes of this size (each at least one chunk "
        "slot), allocated beside vLLM's KV cache. Each step of a store or load moves a lane's "
        "worth of chunks; larger lanes mean fewer CUDA calls per chunk on the transfer "
        "thread, which makes them holding the interpreter lock that it shares with vLLM's "
        "thread.",
    ),
    "staging_stores": Spec(
        lambda k, v: parse_choice(k, v, _STAGING_STORES),
        "direct",
        "How the `staged` mover stores: `direct`, the copy kernel's SMs write the pages into "
        "the pool through its mapped address (`kernel_ctas` CTAs, 2 by default, as "
        "`mover=kernel`), so no copy engine is used; `lanes`, pages are gathered into the "
        "staging buffer and the copy engine copies them to the pool. With `lanes`, vLLM's own "
        "device-to-host copy after each step (its sampled tokens) waited for nearly a whole "
        "store (docs/gpu.md). Whole-chunk loads go through the lanes either way; layerwise "
        "loads take the direct path.",
        "direct",
    ),
    "tune_cache": Spec(
        lambda k, v: parse_path(k, v),
        None,
        "JSON file where `miniflex tune` stores the fastest mover per GPU, layout and chunk "
        "size, read at start-up. Empty: `$XDG_CACHE_HOME/miniflex/tune.json` "
        "(`~/.cache/miniflex/tune.json`).",
        "",
    ),
    "max_inflight_chunks": Spec(
        lambda k, v: parse_int(k, v, 1, 1 << 20),
        4096,
        "Upper bound on chunks being stored at once; further stores are skipped "
        "(and counted in `stores_skipped`) rather than queued without bound.",
        "4096",
    ),
    "store": Spec(
        parse_bool,
        True,
        "Save newly computed chunks. `false` makes the cache read-only (loads still work).",
        "true",
    ),
    "ssd_dirs": Spec(
        parse_dirs,
        (),
        "Directories of the SSD tier (comma-separated; one preallocated O_DIRECT data file "
        "each, slots striped over them; TP rank r uses the subdirectory `rank<r>`). Empty: no "
        "SSD tier. Chunks found there after a restart with the same model and layout are served. "
        "`MiniFlexHMAConnector` gives each KV cache group of a hybrid model the subdirectory "
        "`group<g>` and an even share of `ssd_bytes` (vLLM 0.30+; refused before).",
        "",
    ),
    "ssd_bytes": _size(
        "16GiB",
        "Size of the SSD tier of the engine, split evenly over the TP ranks' stores (MLA: rank "
        "0's store, the only one, gets it all) and over `ssd_dirs`; checked against each file "
        "system's free space at start-up.",
    ),
    "ssd_write": Spec(
        lambda k, v: parse_choice(k, v, _SSD_WRITE),
        "back",
        "`back`: a chunk is written to SSD when the CPU tier evicts it (write-back); "
        "`through`: every chunk stored on CPU is also written to SSD at once.",
        "back",
    ),
    "ssd_write_backlog": Spec(
        parse_auto_size,
        None,
        "Write-back: at most this much KV is being written from the CPU tier to SSD at once "
        "(it stays readable in CPU meanwhile). Past that, a store takes the slot of the oldest "
        "write and waits for it if the disk writes a chunk faster than recomputing one takes "
        "(or that write ends within one chunk's recompute); otherwise the evicted chunk is "
        "dropped, counted in `demotions_skipped`, so that a slow disk never holds up stores. "
        "Writes start ahead of "
        "need, from the least recently used chunks, so that this much of the CPU tier is free "
        "or being written. `auto`: the KV of one engine step (`max_num_batched_tokens`), "
        "within 1/8 to 1/2 of the CPU tier.",
        "auto",
    ),
    "ssd_stream_bytes": _size(
        "256MiB",
        "Pinned host memory per CPU pool, after the CPU tier's slots, through which a load "
        "streams the chunks it reads from SSD or fetches from the remote store once it holds "
        "as many CPU slots as the tier can spare (with write-back, all but "
        "`ssd_write_backlog`), or no CPU slot can be freed (all pinned): each is read into a "
        "staging slot and copied to the GPU as soon as its window has arrived, while the next "
        "window is read, so a load is never capped by the CPU tier's size. Rounded up to "
        "whole chunks, 2 at least and 64 at most; allocated only with `ssd_dirs` or "
        "`remote_url`. `0`: no staging; a load that reads from SSD or the store is then "
        "capped at what the CPU tier can spare. Not used by an MLA model's shared pool.",
    ),
    "ssd_eviction": Spec(
        lambda k, v: parse_choice(k, v, _EVICTION),
        "lru",
        "Eviction policy of the SSD tier: " + ", ".join(_EVICTION) + ".",
        "lru",
    ),
    "hit_policy": Spec(
        lambda k, v: parse_choice(k, v, _HIT_POLICIES),
        "cost",
        "Which resident chunks a request loads: `cost` (all CPU chunks; SSD and remote chunks "
        "only while loading them is predicted to be faster than recomputing, see "
        "docs/design/cost.md; a remote store slower than recomputing any chunk is not even asked), "
        "`load` (everything resident), `cpu` (never SSD-only or remote chunks: they are "
        "recomputed).",
        "cost",
    ),
    "load_mode": Spec(
        lambda k, v: parse_choice(k, v, _LOAD_MODES),
        "auto",
        "How a hit is loaded: `async` (in the background; the request is computed in a later "
        "engine step), `sync` (before the step's forward, which waits for all of it: "
        "load-then-compute), `layerwise` (in the same step, layer L+1 copying while layer L "
        "computes); `auto`: the cost model picks layerwise or async per request (see "
        "docs/design/cost.md). Chunks on SSD load in the step too, read into CPU slots layer by "
        "layer as it computes, as many as free CPU slots take (remote chunks, an MLA cache's at "
        "TP > 1 and `ssd_stream_bytes=0` load async).",
        "auto",
    ),
    "backfill_s": Spec(
        lambda k, v: parse_seconds(k, v, 0.0, 600.0),
        5.0,
        "Backfill: a waiting request that vLLM could not fit in its KV cache is passed over "
        "for up to this long, so that the requests behind it that fit (most often ones whose "
        "prefix is already on the GPU) are scheduled instead of waiting too; it is tried again "
        "whenever a request ends, oldest first (passes counted in `backfill_passes`). `0`: "
        "vLLM's own order, first come first served.",
        "5.0",
    ),
    "cpu_load_gbps": Spec(
        parse_auto_float,
        None,
        "Cost model: CPU pool -> vLLM cache bandwidth in GB/s. `auto`: learned from loads.",
        "auto",
    ),
    "ssd_read_gbps": Spec(
        parse_auto_float,
        None,
        "Cost model: SSD -> CPU pool read bandwidth in GB/s. It also decides admission: "
        "evicted chunks are written to SSD once reading one back takes at most half of "
        "recomputing the costliest chunk, and no longer once it takes more than 0.8 of it "
        "(averaged over 20 s; one probe write every 10 s while off; declined ones counted in "
        "`demotions_declined`). Before the prefill model is fitted, nothing is written if a "
        "read takes more than 0.8 of a chunk's recompute at the mean seconds per token of "
        "the prefill steps seen. `auto`: measured at start-up (each worker reads back up to "
        "256 MiB from a scratch file beside its store), then learned from reads.",
        "auto",
    ),
    "prefill_tokens_per_s": Spec(
        parse_auto_float,
        None,
        "Cost model: a fixed prefill speed (tokens/s, no attention term) instead of the one "
        "fitted to the engine's own forward times. `auto`: fitted.",
        "auto",
    ),
    "status_file": Spec(
        lambda k, v: parse_path(k, v),
        None,
        "Write the scheduler's live state (tiers, cost model, cumulative counters) to this "
        "JSON file, atomically, every second from a thread of its own, idle or not; the state "
        "is refreshed while busy (at most once a second) and when the engine falls idle. "
        "`miniflex inspect FILE` prints it, its age and whether the engine runs. Empty: off.",
        "",
    ),
    "trace_file": Spec(
        lambda k, v: parse_path(k, v),
        None,
        "Append one JSON line per finished request to this file: which tier served each of "
        "its prompt's chunks (or that vLLM computed it, or that its read failed), its tokens "
        "per tier, how it was loaded, and the cost model's prediction beside the TTFT it "
        "measured (docs/operations.md). Empty: off.",
        "",
    ),
    "ssd_io": Spec(
        lambda k, v: parse_choice(k, v, _SSD_IO),
        "auto",
        "SSD I/O backend: `io_uring` (raw syscalls through cffi), `threads` "
        "(`preadv`/`pwritev` thread pool); `auto`: io_uring if a probe succeeds, else threads "
        "(logged, and shown in stats).",
        "auto",
    ),
    **{key: Spec(*spec) for key, spec in REMOTE_SPECS.items()},
}
