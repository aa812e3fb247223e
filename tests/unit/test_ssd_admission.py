"""SSD admission: a disk slower than recompute is not written to, and costs the CPU tier nothing."""

from __future__ import annotations

import pytest

from miniflex.tiers import TierStack
from miniflex.tiers.admission import OFF_RATIO, ON_RATIO, PROBE_EVERY_S, SMOOTH_S, SSDAdmission
from miniflex.tiers.writeback import WRITE_WAIT_S
from miniflex.types import ChunkKey


def k(i: int) -> ChunkKey:
    return ChunkKey((i + 1) * 0x9E3779B97F4A7C15 % (1 << 128))


def store(stack: TierStack, keys: list[ChunkKey]) -> None:
    stack.complete_store(stack.prepare_store(keys), ok=True)


class Disk:
    """Predicted seconds to read a chunk from SSD and to recompute the costliest one, changed
    by tests; the write-back costs (:class:`~miniflex.tiers.writeback.WriteBackCosts`)."""

    def __init__(
        self, read: float | None, recompute: float | None, rough: float | None = None
    ) -> None:
        self.read, self.recompute, self.rough, self.now = read, recompute, rough, 0.0

    def admission(self) -> SSDAdmission:
        return SSDAdmission(
            lambda: self.read, lambda: self.recompute, lambda: self.now, lambda: self.rough
        )

    def stack(self, **kwargs: object) -> TierStack:
        return TierStack(clock=lambda: self.now, costs=self, **kwargs)  # type: ignore[arg-type]

    def write_wait_budget(self) -> float:
        return WRITE_WAIT_S

    def chunk_recompute_seconds(self) -> float | None:
        return None

    def costliest_recompute_seconds(self) -> float | None:
        return self.recompute

    def rough_recompute_seconds(self) -> float | None:
        return self.rough

    def ssd_chunk_seconds(self) -> float | None:
        return self.read


def test_admits_while_either_speed_is_unknown_or_the_disk_is_faster() -> None:
    disk = Disk(read=None, recompute=0.003)
    a = disk.admission()
    assert a.pays_off and a.admits()
    disk.read, disk.recompute = 0.007, None
    assert a.pays_off and a.admits()
    disk.recompute = 0.020  # a read takes 0.35 of a recompute
    assert a.pays_off and a.admits() and a.declined == 0


def test_a_disk_barely_faster_than_recompute_is_not_written_to() -> None:
    disk = Disk(read=0.007, recompute=0.010)  # saves 3 ms a hit: less than the CPU slots cost
    a = disk.admission()
    assert not a.pays_off and a.admits()  # the probe write only
    assert not a.admits() and a.declined == 1


def test_before_the_fit_a_rough_figure_can_hold_writes_back_but_decides_nothing() -> None:
    disk = Disk(read=0.007, recompute=None, rough=0.005)  # a read: 1.4 of even the rough figure
    a = disk.admission()
    assert not a.pays_off
    assert a.admits() and not a.admits() and a.declined == 1  # the probe write only
    disk.rough = 0.020  # 0.35 of a figure that prices recompute high: that proves nothing
    assert a.pays_off and a.admits()
    disk.rough = 0.005
    assert not a.pays_off and a.switches == 0
    disk.recompute = 0.020  # fitted: a read takes 0.35 of the recompute, the first decision
    assert a.pays_off and a.switches == 0
    disk.rough = 0.001  # no longer asked once the fit is known
    assert a.pays_off


def test_a_recompute_figure_that_swings_between_refits_does_not_flip_admission() -> None:
    """The prefill model's costliest-chunk figure moved 1.5-3.6 ms from one refit to the next
    under the burst, against a 2.7 ms read: compared raw, admission flipped every second."""
    disk = Disk(read=0.0027, recompute=0.0036)
    a = disk.admission()
    seen = set()
    for step in range(200):
        disk.now = step * 0.5
        disk.recompute = 0.0036 if step % 4 < 2 else 0.0015
        seen.add(a.pays_off)
    assert seen == {False} and a.switches == 0


def test_admission_follows_a_lasting_change_with_hysteresis() -> None:
    disk = Disk(read=0.007, recompute=0.003)
    a = disk.admission()
    assert not a.pays_off
    disk.read = 0.001  # measured much faster: sample 0.33
    assert not a.pays_off  # one figure moves the average by little
    disk.now = 3 * SMOOTH_S
    assert a.pays_off and a.switches == 1
    disk.read = (ON_RATIO + OFF_RATIO) / 2 * disk.recompute  # between the lines: stays on
    disk.now = 10 * SMOOTH_S
    assert a.pays_off and a.switches == 1
    disk.read = 2 * disk.recompute
    assert a.pays_off  # seen now, it weighs by how long it holds
    disk.now = 13 * SMOOTH_S
    assert not a.pays_off and a.switches == 2


def test_a_figure_seen_after_an_idle_spell_does_not_stand_for_the_spell() -> None:
    disk = Disk(read=0.001, recompute=0.003)
    a = disk.admission()
    assert a.pays_off
    disk.now, disk.read = 10 * SMOOTH_S, 0.007  # idle, then one refit's figure far off
    assert a.pays_off and a.switches == 0
    disk.now += SMOOTH_S / 10
    assert a.pays_off and a.switches == 0  # a tenth of the time constant moves it little


def test_a_slow_disk_gets_one_probe_write_every_interval() -> None:
    disk = Disk(read=0.007, recompute=0.003)
    a = disk.admission()
    assert not a.pays_off
    assert a.admits()  # the first: a probe, so the disk's speed keeps being measured
    assert not a.admits() and not a.admits() and a.declined == 2
    disk.now = PROBE_EVERY_S
    assert a.admits() and not a.admits()


def test_over_a_slow_disk_the_cpu_tier_keeps_every_slot_and_evicts_without_writing() -> None:
    disk = Disk(read=0.007, recompute=0.003)
    stack = disk.stack(cpu_slots=4, ssd_slots=16, max_writeback=2)
    for i in range(4):
        store(stack, [k(i)])
    assert stack.cpu.free_slots == 0 and stack.writeback.writing_back == 0  # nothing written ahead
    assert stack.max_load_chunks == 4  # no slot kept for write-back
    store(stack, [k(4)])  # evicts k(0), the probe write (kept until written), then k(1)
    store(stack, [k(5)])  # evicts k(2), dropped unwritten
    batch = stack.take_demotions()
    copies = batch.copies
    assert [c.key for c in copies] == [k(0)]
    assert batch.declined == 2 and stack.take_demotions().declined == 0
    assert stack.match([k(1)]) == 0 and stack.match([k(2)]) == 0
    assert stack.match([k(3), k(4), k(5)]) == 3
    stack.complete_demotions(copies, set())
    assert stack.match([k(0)]) == 1 and stack.cpu.free_slots == 1  # on SSD; its slot free


@pytest.mark.parametrize("rough", [None, 0.020, 0.003])
def test_before_the_fit_only_a_rough_figure_past_the_line_keeps_every_cpu_slot(rough) -> None:
    disk = Disk(read=0.007, recompute=None, rough=rough)
    stack = disk.stack(cpu_slots=4, ssd_slots=16, max_writeback=2)
    for i in range(4):
        store(stack, [k(i)])
    held_back = rough == 0.003  # a read takes 2.3 of it
    assert stack.max_load_chunks == (4 if held_back else 2)
    written_ahead = [c.key for c in stack.take_demotions().copies]
    assert written_ahead == ([] if held_back else [k(0), k(1)])


def test_write_back_resumes_once_the_disk_pays_off_again() -> None:
    disk = Disk(read=0.007, recompute=0.003)
    stack = disk.stack(cpu_slots=4, ssd_slots=16, max_writeback=2)
    for i in range(4):
        store(stack, [k(i)])
    disk.read = 0.001  # measured faster (writes seen, or reads), and for a while
    assert not stack.ssd_admits  # not at once
    disk.now = 3 * SMOOTH_S
    store(stack, [k(4)])  # evicts k(0) and writes ahead until 2 slots are free or written
    assert [c.key for c in stack.take_demotions().copies] == [k(0), k(1)]
    assert stack.max_load_chunks == 2


def test_the_engine_prices_the_costliest_recompute_only_once_the_prefill_model_is_fitted() -> None:
    """Before the fit, the rough per-token figure counts each step's fixed cost as tokens'
    and makes a slow disk look fast: admission must not decide on it."""
    from miniflex.config import MiniFlexConfig
    from miniflex.cost import MIN_STEPS, make_cost_model
    from miniflex.scheduler.advisor import HitAdvisor
    from miniflex.scheduler.tier_setup import EngineCosts

    config = MiniFlexConfig.from_dict({"cpu_bytes": "1GiB"})
    cost = make_cost_model(config, chunk_bytes=9_437_184, chunk_tokens=64, num_layers=36)
    costs = EngineCosts(cost, HitAdvisor(config, cost), max_model_len=32768)
    cost.observe_step(8192, 8192 * 4096.0, 0.25)  # one prefill step: a rough figure exists
    assert cost.chunk_recompute_seconds(32768) is not None
    assert costs.costliest_recompute_seconds() is None
    assert costs.rough_recompute_seconds() == pytest.approx(0.25 / 8192 * 64)  # held back on
    for i in range(MIN_STEPS + 1):
        n = 2048 * (1 + i % 4)
        cost.observe_step(n, n * n / 2.0, 0.005 + n * 2.5e-5 + n * n / 2.0 * 1e-10)
    assert cost.calibrated
    fitted = costs.costliest_recompute_seconds()
    assert fitted is not None and fitted == cost.chunk_recompute_seconds(32768)
    assert costs.rough_recompute_seconds() is None


def test_write_through_writes_every_chunk_however_slow_the_disk() -> None:
    """``ssd_write=through`` is an explicit choice (the default is write-back): admission does
    not override it, even where a read is far slower than recomputing."""
    disk = Disk(read=0.050, recompute=0.003, rough=0.003)
    stack = disk.stack(cpu_slots=4, ssd_slots=8, write_through=True)
    store(stack, [k(0), k(1), k(2)])
    batch = stack.take_demotions()
    assert [c.key for c in batch.copies] == [k(0), k(1), k(2)] and batch.declined == 0
