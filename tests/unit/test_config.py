"""MiniFlexConfig: parsing, environment overrides, and readable errors for bad config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miniflex.config import MiniFlexConfig, config_table, parse_size, total_memory_bytes
from miniflex.errors import ConfigError


def test_defaults_are_valid_and_frozen() -> None:
    cfg = MiniFlexConfig.from_dict({}, env={})
    assert cfg == MiniFlexConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cpu_bytes = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("4096", 4096),
        (12345, 12345),
        ("2 kib", 2048),
        ("0", 0),
    ],
)
def test_sizes_accept_units_and_plain_bytes(text: object, expected: int) -> None:
    assert parse_size("cpu_bytes", text) == expected


def test_extra_config_is_parsed_and_env_overrides_it() -> None:
    cfg = MiniFlexConfig.from_dict(
        {"cpu_bytes": "1GiB", "blocks_per_chunk": 8, "cpu_eviction": "FIFO"},
        env={"MINIFLEX_BLOCKS_PER_CHUNK": "2", "MINIFLEX_STORE": "off", "PATH": "/bin"},
    )
    assert cfg.cpu_bytes == 2**30
    assert cfg.blocks_per_chunk == 2  # the environment wins
    assert cfg.cpu_eviction == "fifo"
    assert cfg.store is False


def _error(extra: dict[str, object], env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        MiniFlexConfig.from_dict(extra, env=env or {})
    return info.value


def test_unknown_key_names_the_key_and_lists_valid_keys() -> None:
    err = _error({"cpu_byte": "1GiB"})
    assert err.key == "cpu_byte"
    assert "valid keys are" in str(err) and "cpu_bytes" in str(err)


def test_unknown_environment_variable_is_an_error_not_ignored() -> None:
    err = _error({}, env={"MINIFLEX_CPU_BYTE": "1GiB"})
    assert err.key == "MINIFLEX_CPU_BYTE"
    assert "'1GiB'" in str(err)


def test_malformed_size_says_what_is_accepted() -> None:
    err = _error({"cpu_bytes": "8XB"})
    assert (err.key, err.value) == ("cpu_bytes", "8XB")
    assert "'8GiB'" in str(err)


def test_negative_and_boolean_sizes_are_rejected() -> None:
    assert _error({"cpu_bytes": -5}).key == "cpu_bytes"
    assert _error({"cpu_bytes": True}).key == "cpu_bytes"


def test_out_of_range_integer_names_the_range() -> None:
    err = _error({"blocks_per_chunk": 0})
    assert "from 1 to 1024" in str(err)
    assert "from 1 to 1024" in str(_error({"blocks_per_chunk": "many"}))


def test_auto_chunk_length_is_at_least_64_tokens() -> None:
    auto = MiniFlexConfig.from_dict({}, env={})
    assert auto.blocks_per_chunk is None
    assert [auto.chunk_blocks(bs) for bs in (16, 32, 48, 128)] == [4, 2, 2, 1]
    fixed = MiniFlexConfig.from_dict({"blocks_per_chunk": "3"}, env={})
    assert fixed.chunk_blocks(16) == 3
    assert "'auto'" in str(_error({"blocks_per_chunk": 2000}))


def test_bad_choice_lists_the_choices() -> None:
    err = _error({"cpu_eviction": "random"})
    assert "'lru'" in str(err) and "'fifo'" in str(err)


def test_bad_boolean_is_rejected() -> None:
    assert "true or false" in str(_error({"store": "maybe"}))


def test_cpu_pool_larger_than_ram_is_rejected() -> None:
    too_big = total_memory_bytes() + 2**30
    err = _error({"cpu_bytes": too_big})
    assert err.key == "cpu_bytes" and "physical memory" in str(err)


def test_pool_file_in_a_missing_directory_is_rejected(tmp_path: Path) -> None:
    err = _error({"cpu_pool_file": str(tmp_path / "nope" / "pool")})
    assert err.key == "cpu_pool_file" and "must exist" in str(err)
    ok = MiniFlexConfig.from_dict({"cpu_pool_file": str(tmp_path / "pool")}, env={})
    assert ok.cpu_pool_file == str(tmp_path / "pool")


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ConfigError):
        MiniFlexConfig(cpu_eviction="nope")
    with pytest.raises(ConfigError):
        MiniFlexConfig().replace(bogus=1)


def test_docs_table_matches_the_code() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    assert config_table() in doc, "docs/config.md is out of date: paste config_table() into it"


def test_load_mode_defaults_to_auto_and_rejects_unknown_modes() -> None:
    assert MiniFlexConfig.from_dict({}, env={}).load_mode == "auto"
    assert MiniFlexConfig.from_dict({"load_mode": "Layerwise"}, env={}).load_mode == "layerwise"
    env = {"MINIFLEX_LOAD_MODE": "sync"}
    assert MiniFlexConfig.from_dict({"load_mode": "async"}, env=env).load_mode == "sync"
    with pytest.raises(ConfigError, match=r"load_mode.*'auto', 'layerwise', 'sync', 'async'"):
        MiniFlexConfig.from_dict({"load_mode": "overlap"}, env={})


def test_staging_stores_defaults_to_direct_and_rejects_unknown_paths() -> None:
    assert MiniFlexConfig.from_dict({}, env={}).staging_stores == "direct"
    env = {"MINIFLEX_STAGING_STORES": "lanes"}
    assert MiniFlexConfig.from_dict({}, env=env).staging_stores == "lanes"
    with pytest.raises(ConfigError, match=r"staging_stores.*'direct', 'lanes'"):
        MiniFlexConfig.from_dict({"staging_stores": "queue"}, env={})
