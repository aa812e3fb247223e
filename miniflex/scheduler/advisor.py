"""The cost model's seat in the scheduler: what a request loads, and what it really cost.

:class:`HitAdvisor` answers, per lookup, how many of the resident chunks a
request loads and whether inside the computing step (layer by layer) or
before it (asynchronously), by ``hit_policy`` and ``load_mode``. It also
feeds the cost model: the workers' start-up probes, every timed load, and
the forward time of every step together with the tokens that step computed.
A request whose load was decided by the calibrated model is timed from its
allocation to the end of the step that computes its last prompt token, and
the prediction and the actual time are added to the stats.

Example::

    advisor = HitAdvisor(config, cost_model)
    n, timing, decision = advisor.decide(st, [Tier.CPU, Tier.SSD], 4096, 0, ssd=True)
    advisor.record(st, stats)                    # at allocation: counted, TTFT timed
    advisor.note_scheduled(step, st, n_tokens, ctx)
    advisor.end_step(step, timed=True)
    advisor.on_step_times([(step, 0.21)], reqs, stats)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from miniflex.config import MiniFlexConfig
from miniflex.cost import CostModel, Decision
from miniflex.plan import JobResult, LoadProbe, LoadTiming
from miniflex.scheduler.requests import ReqState
from miniflex.stats import TransferStats
from miniflex.tiers.stack import WRITE_WAIT_S
from miniflex.types import ReqId, Tier

__all__ = ["HitAdvisor"]

logger = logging.getLogger(__name__)

KEEP_STEPS = 256
"""Steps whose forward time is still awaited; older ones are forgotten (never reported)."""

DECODE_TIMED_EVERY = 16
"""Of the steps in which every request computes one token (decode), the workers time one
in this many: those say little more than the fixed cost of a step, and timing a forward
costs CUDA events on vLLM's thread every step (bench/run_h200.sh decode)."""


class HitAdvisor:
    """Decides loads with the cost model and keeps it calibrated; scheduler side, one thread."""

    def __init__(self, config: MiniFlexConfig, cost: CostModel) -> None:
        self.config = config
        self.cost = cost
        self._tokens, self._pairs = 0, 0.0  # of the step being planned
        self._step_work: dict[int, tuple[int, float]] = {}  # step -> (tokens, query-key pairs)
        self._ttft_pending: dict[int, list[ReqId]] = {}  # step -> requests whose prefill ends
        self._planning: list[ReqState] = []  # requests of the step being planned
        self._last_step: list[ReqState] = []  # those of the last planned step
        self._asking: dict[Tier, bool] = {}  # worth_asking's last answer, logged on a change

    # ---- decisions ----
    def decide(
        self,
        st: ReqState,
        tiers: list[Tier],
        num_tokens: int,
        num_computed: int,
        ssd: bool,
        instep: int = 0,
    ) -> tuple[int, LoadTiming, Decision | None]:
        """How many of the resident chunks (in ``tiers``) of request ``st`` to load, by
        ``hit_policy``, how (by ``load_mode``), and the cost model's decision where it made
        one. ``ssd``: the engine has an SSD or remote tier; ``instep``: how many leading
        chunks a load inside the step may take, SSD reads included (0: only CPU chunks
        load inside a step). Reads ``st``, never writes it."""
        mode = self.config.load_mode
        layerwise = False
        decision = None
        others = self.running_besides(st)
        if self.config.hit_policy == "cost" and (ssd or mode == "auto"):
            decision = self.cost.choose(
                tiers, num_tokens, num_computed, mode == "auto", others, instep
            )
            n, layerwise = decision.load_chunks, decision.layerwise
        else:
            n = len(tiers)
            if self.config.hit_policy == "cpu":
                n = next((i for i, t in enumerate(tiers) if t is not Tier.CPU), n)
            if mode == "auto":
                choice = self.cost.choose(tiers[:n], num_tokens, num_computed, True, others, instep)
                layerwise = choice.layerwise and choice.load_chunks == n
        local = n <= instep or all(t is Tier.CPU for t in tiers[:n])  # instep: none remote
        if n == 0 or not local:
            timing = LoadTiming.ASYNC  # remote fetches, and reads past the CPU slots free
        elif mode == "auto":
            timing = LoadTiming.LAYERWISE if layerwise else LoadTiming.ASYNC
        else:
            timing = LoadTiming(mode)
        return n, timing, decision

    def worth_asking(self, tier: Tier, prompt_tokens: int) -> bool:
        """Whether a lookup should ask ``tier`` (the remote store) at all: not when no chunk
        of it would be loaded (``hit_policy=cpu``, or ``cost`` while a chunk from it is
        predicted slower than recomputing the prompt's costliest one). The question costs a
        round trip on the scheduler's thread, behind whatever the store is busy with."""
        policy = self.config.hit_policy
        ask = policy == "load" or (
            policy == "cost" and not self.cost.loses_to_recompute(tier, prompt_tokens)
        )
        if ask != self._asking.get(tier, True):
            self._asking[tier] = ask
            recompute = self.cost.chunk_recompute_seconds(prompt_tokens)
            logger.info(
                "MiniFlex: %s the %s tier at lookups (a chunk from it %.1f ms, the "
                "costliest recomputed %s)",
                "asking" if ask else "not asking",
                tier.name.lower(),
                1e3 * self.cost.chunk_load_seconds(tier),
                "unknown" if recompute is None else f"{1e3 * recompute:.1f} ms",
            )
        return ask

    def running_besides(self, st: ReqState) -> int:
        """Requests of the last planned step that are not finished, ``st`` aside: those an
        in-step load for ``st`` would hold up."""
        return sum(1 for r in self._last_step if r is not st and not r.finished)

    def record(self, st: ReqState, stats: TransferStats) -> None:
        """Count the cost model's decision for this request once, and start timing its TTFT."""
        d = st.hit.decision
        a = st.account
        if d is None or not d.calibrated or a.ttft_start is not None or a.decided:
            return
        a.decided = True
        stats.cost_decisions += 1
        stats.decided_load_chunks += d.load_chunks
        stats.ssd_chunks_recomputed += d.resident_chunks - d.load_chunks
        a.ttft_start = time.perf_counter()
        logger.debug(
            "MiniFlex %s: load %d of %d resident chunks %s, predicted TTFT %.1f ms "
            "(async %.1f ms, load all %.1f ms, recompute %.1f ms)",
            st.req_id,
            d.load_chunks,
            d.resident_chunks,
            "layerwise" if d.layerwise else "async",
            1e3 * d.predicted_s,
            1e3 * d.async_s,
            1e3 * d.load_all_s,
            1e3 * d.recompute_s,
        )

    def write_wait_budget(self) -> float:
        """How long a store may wait for a write-back to SSD rather than drop a chunk: what
        recomputing one chunk costs by the prefill fit; WRITE_WAIT_S at least."""
        fitted = self.cost.chunk_recompute_seconds() if self.cost.calibrated else None
        return max(WRITE_WAIT_S, fitted or 0.0)

    # ---- what each step computed ----
    def note_scheduled(self, step: int, st: ReqState, num_tokens: int, ctx: int) -> None:
        """``st`` computes ``num_tokens`` after ``ctx`` in ``step`` (one call per request)."""
        self._tokens += num_tokens
        self._pairs += num_tokens * (ctx + num_tokens / 2)
        self._planning.append(st)
        if st.account.ttft_start is not None and ctx + num_tokens >= st.num_prompt_tokens:
            self._ttft_pending.setdefault(step, []).append(st.req_id)
            _trim(self._ttft_pending)

    def end_step(self, step: int, timed: bool) -> bool:
        """The plan of ``step`` is complete; ``timed`` False: its forward time says little
        about prefill (it waited for a load inside the step). Returns whether the workers
        time its forward: every step that computes more than one token for a request or ends
        a prefill, and one decode step in :data:`DECODE_TIMED_EVERY`."""
        decode = self._tokens == len(self._planning) and step not in self._ttft_pending
        wanted = bool(self._tokens) and (not decode or step % DECODE_TIMED_EVERY == 0)
        if wanted and timed:
            self._step_work[step] = (self._tokens, self._pairs)
            _trim(self._step_work)
        self._tokens, self._pairs = 0, 0.0
        self._last_step, self._planning = self._planning, []
        return wanted

    # ---- measurements ----
    def on_probes(self, probes: Iterable[LoadProbe]) -> None:
        """The workers' start-up probes: the cost model's first bandwidths (slowest rank), the
        disk's read speed among them."""
        probes = list(probes)
        if probes:
            slow = min(probes, key=lambda p: p.num_bytes / p.load_seconds)
            slow_lw = min(probes, key=lambda p: p.num_bytes / p.layerwise_seconds)
            self.cost.start_from_probe(
                slow.num_bytes / slow.load_seconds, slow_lw.num_bytes / slow_lw.layerwise_seconds
            )
            disks = [p.ssd_read_bps for p in probes if p.ssd_read_bps]
            if disks:
                self.cost.start_ssd_from_probe(min(disks))
            stores = [p.remote_read_bps for p in probes if p.remote_read_bps]
            if stores:
                self.cost.start_remote_from_probe(min(stores))

    def observe_load(
        self, timing: LoadTiming, promoted: int, r: JobResult, fetched: int = 0
    ) -> None:
        """A worker's load result; ``promoted``, ``fetched``: chunks it read from SSD and from
        the remote store without failing."""
        if timing is not LoadTiming.ASYNC and promoted:  # its copies waited for the disk
            if r.ssd_seconds > 0:
                self.cost.observe_load(Tier.SSD, promoted * self.cost.chunk_bytes, r.ssd_seconds)
            return
        if timing is not LoadTiming.ASYNC:  # in-step: timed from issue, with compute
            self.cost.observe_layerwise(r.num_bytes, r.seconds)
            return
        if promoted > 0 and r.ssd_seconds > 0:
            self.cost.observe_load(Tier.SSD, promoted * self.cost.chunk_bytes, r.ssd_seconds)
        if fetched > 0 and r.remote_seconds > 0:
            self.cost.observe_load(Tier.REMOTE, fetched * self.cost.chunk_bytes, r.remote_seconds)
        self.cost.observe_load(Tier.CPU, r.num_bytes, r.copy_seconds)

    def on_step_times(
        self,
        times: Iterable[tuple[int, float]],
        reqs: Mapping[ReqId, ReqState],
        stats: TransferStats,
    ) -> None:
        """Forward times the workers measured: calibrate the prefill model, close TTFTs."""
        by_step: dict[int, float] = {}
        for step, seconds in times:  # every TP rank reports every step: the slowest counts
            by_step[step] = max(seconds, by_step.get(step, 0.0))
        now = time.perf_counter()
        for step, seconds in sorted(by_step.items()):
            work = self._step_work.pop(step, None)
            if work is not None:
                self.cost.observe_step(work[0], work[1], seconds)
            for req_id in self._ttft_pending.pop(step, ()):
                st = reqs.get(req_id)
                decision = None if st is None else st.hit.decision
                if st is None or st.account.ttft_start is None or decision is None:
                    continue
                actual = now - st.account.ttft_start
                stats.ttft_samples += 1
                stats.ttft_predicted_s += decision.predicted_s
                stats.ttft_actual_s += actual
                st.account.ttft_measured_s = actual
                logger.debug(
                    "MiniFlex %s: TTFT %.1f ms, predicted %.1f ms",
                    req_id,
                    1e3 * actual,
                    1e3 * decision.predicted_s,
                )
                st.account.ttft_start = None


def _trim(by_step: dict) -> None:
    while len(by_step) > KEEP_STEPS:  # steps whose timing never came back
        del by_step[next(iter(by_step))]
