"""The kernel movers' CTA rule for layerwise loads (pure arithmetic: runs without CUDA)."""

from __future__ import annotations

from miniflex.gpu.kernel_mover import (
    DEFAULT_CTAS,
    LAYERWISE_CTAS,
    PAGES_PER_CTA,
    layerwise_ctas,
)


def test_small_loads_keep_the_default_and_large_ones_are_capped() -> None:
    assert layerwise_ctas(1) == DEFAULT_CTAS  # one 16-token block a layer
    assert layerwise_ctas(4) == DEFAULT_CTAS  # one 64-token chunk a layer
    assert layerwise_ctas(PAGES_PER_CTA * (DEFAULT_CTAS + 1)) == DEFAULT_CTAS + 1
    assert layerwise_ctas(30_000 // 16) == LAYERWISE_CTAS  # a 30k-token hit
    assert layerwise_ctas(10**9) == LAYERWISE_CTAS


def test_ctas_never_decrease_as_the_load_grows() -> None:
    ctas = [layerwise_ctas(n) for n in range(0, 20 * PAGES_PER_CTA)]
    assert ctas == sorted(ctas)
    assert set(ctas) == set(range(DEFAULT_CTAS, LAYERWISE_CTAS + 1))
