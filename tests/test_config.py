"""Hardware configuration: reference configs, validation, derived figures, fingerprint."""

from fractions import Fraction

import pytest

from sfnpu.config import (CONFIGS, ConfigError, DEVICES, HwConfig, bram18k_blocks,
                          get_config)


def test_reference_configs_are_valid_and_named():
    assert set(CONFIGS) == {"tiny", "ecp5", "ecp5-ulx3s", "kcu1500"}
    for name, config in CONFIGS.items():
        assert config.name == name
        assert get_config(name) is config


def test_kcu1500_matches_the_paper_design():
    c = get_config("kcu1500")
    assert (c.ti, c.to, c.macs) == (64, 64, 4096)
    assert c.dsp_packing and c.mac_multipliers == 2048  # 4096 int8 MAC on 2048 DSP48E2
    assert c.clock_mhz == 200.0
    assert c.dram_bytes_per_cycle == 64  # 12.8 GB/s at 200 MHz, the stated assumption


def test_ecp5_fits_the_ulx3s_part():
    c = get_config("ecp5")
    dev = DEVICES[c.device]
    assert not c.dsp_packing
    assert c.mac_multipliers <= dev.multipliers and c.bram18k <= dev.bram18k


def test_unknown_config_lists_the_known_ones():
    with pytest.raises(ConfigError, match="tiny, ecp5, kcu1500"):
        get_config("zcu104")


BASE = get_config("tiny")


@pytest.mark.parametrize("changes, message", [
    (dict(ti=6), "ti=6: must be a power of two"),
    (dict(to=0), "to=0: must be a power of two"),
    (dict(ti=512), "ti=512"),
    (dict(buffer_bytes=(1024, 1024)), "exactly three buffers"),
    (dict(buffer_bytes=(1024, 1024, 1020)), r"buffer_bytes\[2\]=1020: must be a positive"),
    (dict(row_buffer_bytes=100), "row_buffer_bytes=100"),
    (dict(row_buffer_bytes=48 * 6), "a row must hold at least 7 pixels"),
    (dict(psum_buffer_bytes=4 * 8 + 1), "psum_buffer_bytes"),
    (dict(write_buffer_bytes=0), "write_buffer_bytes"),
    (dict(max_channels=100), "max_channels=100: must be a positive multiple of 8"),
    (dict(max_table_channels=0), "max_table_channels=0"),
    (dict(pool_row_pixels=0), "pool_row_pixels=0"),
    (dict(dram_bus_bits=48), "dram_bus_bits=48"),
    (dict(dram_bandwidth_gbps=1.0), "exceeds the bus peak of 0.8 GB/s"),
    (dict(dram_bandwidth_gbps=0), "must be positive"),
    (dict(dram_latency=0), "dram_latency=0"),
    (dict(dram_max_burst=257), "AXI4 INCR bursts"),
    (dict(clock_mhz=0), "clock_mhz"),
    (dict(device="XC7Z020"), "unknown part"),
    (dict(ti=16, to=16, device="LFE5U-85F"), "needs 256 multipliers .* LFE5U-85F has 156"),
    (dict(buffer_bytes=(256 * 1024,) * 3, device="LFE5U-85F"), "block RAMs but LFE5U-85F"),
    (dict(to=4, ti=4, dsp_packing=True, device=None), None),
])
def test_invalid_configs_are_rejected_with_the_reason(changes, message):
    if message is None:  # control case: a legal variation
        BASE.replace(**changes)
        return
    with pytest.raises(ConfigError, match=message) as e:
        BASE.replace(**changes)
    assert "'tiny'" in str(e.value)


def test_bram18k_estimate_uses_the_best_aspect_ratio():
    assert bram18k_blocks(2048, 8) == 1       # 2K x 9
    assert bram18k_blocks(1024, 18) == 1
    assert bram18k_blocks(1024, 32) == 2      # 2 x (1K x 18) or 2 x (512 x 36)
    assert bram18k_blocks(512, 36) == 1
    assert bram18k_blocks(4096, 8) == 2
    assert bram18k_blocks(0, 8) == 0


def test_dram_bandwidth_is_an_exact_fraction():
    assert get_config("tiny").dram_bytes_per_cycle == 8
    assert get_config("ecp5").dram_bytes_per_cycle == 2
    assert BASE.replace(dram_bandwidth_gbps=0.3).dram_bytes_per_cycle == 3
    assert BASE.replace(dram_bandwidth_gbps=0.25, clock_mhz=150.0).dram_bytes_per_cycle \
        == Fraction(5, 3)


def test_fingerprint_tracks_hardware_not_the_name():
    assert len({c.fingerprint for c in CONFIGS.values()}) == len(CONFIGS)
    assert BASE.replace(name="renamed").fingerprint == BASE.fingerprint
    assert BASE.replace(dram_latency=17).fingerprint != BASE.fingerprint
    assert BASE.replace(buffer_bytes=[65536] * 3) == BASE  # lists are normalised to tuples
    assert 0 <= BASE.fingerprint < 1 << 64


def test_configs_are_frozen_and_hashable():
    with pytest.raises(AttributeError):
        BASE.ti = 16
    assert len({BASE, BASE.replace(name="x")}) == 2
    assert isinstance(HwConfig(**BASE.to_dict()), HwConfig)
