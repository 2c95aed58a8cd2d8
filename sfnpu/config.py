"""Hardware configuration: the one object that compiler, models and RTL are parameterised by.

A :class:`HwConfig` is validated when it is built; an impossible combination raises
:class:`ConfigError` with the reason. The reference configurations from the design brief are
available through :func:`get_config` (``tiny``, ``ecp5``, ``kcu1500``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from fractions import Fraction
from math import ceil

__all__ = [
    "ConfigError", "Device", "HwConfig", "DEVICES", "CONFIGS", "get_config", "bram18k_blocks",
    "ROW_BUFFER_ROWS", "MAX_KERNEL",
]

#: Rows in the circular row buffer: five for a 5×5 window plus one being prefetched.
ROW_BUFFER_ROWS = 6
#: Largest kernel side the window generator and the weight-block buffer are sized for.
MAX_KERNEL = 7

# Aspect ratios (depth, width in bits) of an 18 Kbit block RAM; both Xilinx RAMB18E2 and
# Lattice DP16KD offer these, so one estimate serves both families.
_BRAM18K_ASPECTS = ((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18), (512, 36))


class ConfigError(ValueError):
    """An invalid hardware configuration; the message names the field and the reason."""


def bram18k_blocks(depth: int, width_bits: int) -> int:
    """18 Kbit block RAMs needed for a ``depth`` × ``width_bits`` memory, best aspect ratio."""
    if depth <= 0 or width_bits <= 0:
        return 0
    return min(ceil(depth / d) * ceil(width_bits / w) for d, w in _BRAM18K_ASPECTS)


@dataclass(frozen=True)
class Device:
    """An FPGA part's resource budget, used to reject configurations that cannot fit."""
    name: str
    family: str          # "ecp5" or "ultrascale"
    multipliers: int     # MULT18X18D (ECP5) or DSP48E2 (UltraScale)
    bram18k: int         # 18 Kbit block RAMs (an ECP5 DP16KD counts as one)
    luts: int            # LUT4 (ECP5) or LUT6 (UltraScale)


DEVICES = {
    "LFE5U-85F": Device("LFE5U-85F", "ecp5", multipliers=156, bram18k=208, luts=83640),
    "XCKU115": Device("XCKU115", "ultrascale", multipliers=5520, bram18k=4320, luts=663360),
}


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class HwConfig:
    """Elaboration parameters of one accelerator instance.

    Sizes are in bytes. ``ti``/``to`` are the input/output channel parallelism; tensors are
    stored in blocks of :attr:`lanes` channels (see :mod:`sfnpu.layout`), and every on-chip
    buffer has one bank per lane.
    """
    name: str
    ti: int                          # input channels consumed per cycle
    to: int                          # output channels produced per cycle (even: packing pairs them)
    buffer_bytes: tuple[int, int, int]  # the three interchangeable buffers {0, 1, 2}
    row_buffer_bytes: int            # circular row buffer, ROW_BUFFER_ROWS rows
    psum_buffer_bytes: int           # 32-bit partial sums
    write_buffer_bytes: int          # output staging before DRAM
    dsp_packing: bool                # two int8 products per multiplier (DSP48E2-style)
    clock_mhz: float
    dram_bus_bits: int               # AXI4 data width
    dram_latency: int                # cycles from read address accepted to first data beat
    dram_bandwidth_gbps: float       # sustained DRAM bandwidth (an assumption; reports state it)
    dram_max_burst: int = 256        # beats per AXI4 INCR burst
    device: str | None = None        # key of DEVICES, or None for simulation-only configs
    # Controller stores beside the buffers (sfnpu.limits.overflows states what they bound):
    max_channels: int = 2048         # output channels of one group (bias, multiplier stores)
    max_table_channels: int = 256    # input channels one group's input tables cover
    pool_row_pixels: int = 2048      # pixels × channel blocks of a pooled/upsampled row

    def __post_init__(self):
        # Accept lists (e.g. from JSON) but store a tuple so the config stays hashable.
        object.__setattr__(self, "buffer_bytes", tuple(self.buffer_bytes))
        self._validate()

    # -- validation -------------------------------------------------------------------------

    def _fail(self, field: str, value, reason: str):
        raise ConfigError(f"hardware config {self.name!r}: {field}={value!r}: {reason}")

    def _validate(self):
        if not self.name or not isinstance(self.name, str):
            self._fail("name", self.name, "must be a non-empty string")
        for field in ("ti", "to"):
            value = getattr(self, field)
            if not isinstance(value, int) or not _is_pow2(value) or not 2 <= value <= 256:
                self._fail(field, value, "must be a power of two between 2 and 256")
        if len(self.buffer_bytes) != 3:
            self._fail("buffer_bytes", self.buffer_bytes, "needs exactly three buffers {0, 1, 2}")
        for i, size in enumerate(self.buffer_bytes):
            self._check_banked(f"buffer_bytes[{i}]", size, self.lanes)
        self._check_banked("row_buffer_bytes", self.row_buffer_bytes, self.lanes * ROW_BUFFER_ROWS)
        self._check_banked("psum_buffer_bytes", self.psum_buffer_bytes, 4 * self.to)
        self._check_banked("write_buffer_bytes", self.write_buffer_bytes, self.to)
        if self.max_row_bytes < self.lanes * MAX_KERNEL:
            self._fail("row_buffer_bytes", self.row_buffer_bytes,
                       f"a row must hold at least {MAX_KERNEL} pixels of one channel block")
        if not self.clock_mhz > 0:
            self._fail("clock_mhz", self.clock_mhz, "must be positive")
        if not _is_pow2(self.dram_bus_bits) or not 32 <= self.dram_bus_bits <= 1024:
            self._fail("dram_bus_bits", self.dram_bus_bits,
                       "AXI4 data width must be a power of two from 32 to 1024")
        if not isinstance(self.dram_latency, int) or not 1 <= self.dram_latency <= 4096:
            self._fail("dram_latency", self.dram_latency, "must be 1..4096 cycles")
        if not 1 <= self.dram_max_burst <= 256:
            self._fail("dram_max_burst", self.dram_max_burst, "AXI4 INCR bursts are 1..256 beats")
        if not self.dram_bandwidth_gbps > 0:
            self._fail("dram_bandwidth_gbps", self.dram_bandwidth_gbps, "must be positive")
        peak = self.dram_bus_bytes * self.clock_mhz / 1000
        if self.dram_bandwidth_gbps > peak + 1e-9:
            self._fail("dram_bandwidth_gbps", self.dram_bandwidth_gbps,
                       f"exceeds the bus peak of {peak:g} GB/s "
                       f"({self.dram_bus_bits} bits at {self.clock_mhz:g} MHz)")
        if self.dram_bytes_per_cycle == 0:
            self._fail("dram_bandwidth_gbps", self.dram_bandwidth_gbps,
                       "is below 1/64 byte per cycle")
        if not isinstance(self.max_channels, int) or self.max_channels < self.lanes \
                or self.max_channels % self.lanes:
            self._fail("max_channels", self.max_channels,
                       f"must be a positive multiple of {self.lanes} (lanes)")
        if not isinstance(self.max_table_channels, int) or self.max_table_channels < self.lanes \
                or self.max_table_channels % self.lanes:
            self._fail("max_table_channels", self.max_table_channels,
                       f"must be a positive multiple of {self.lanes} (lanes)")
        if not isinstance(self.pool_row_pixels, int) or self.pool_row_pixels < 1:
            self._fail("pool_row_pixels", self.pool_row_pixels, "must be a positive integer")
        if self.device is not None:
            self._validate_device()

    def _check_banked(self, field: str, size, granule: int):
        if not isinstance(size, int) or size <= 0 or size % granule:
            self._fail(field, size, f"must be a positive multiple of {granule} bytes")

    def _validate_device(self):
        if self.device not in DEVICES:
            self._fail("device", self.device, f"unknown part; known: {', '.join(DEVICES)}")
        dev = DEVICES[self.device]
        if self.mac_multipliers > dev.multipliers:
            self._fail("ti/to", (self.ti, self.to),
                       f"needs {self.mac_multipliers} multipliers for the MAC array but "
                       f"{dev.name} has {dev.multipliers}")
        if self.bram18k > dev.bram18k:
            self._fail("buffer sizes", self.bram18k,
                       f"on-chip buffers need {self.bram18k} 18K block RAMs but "
                       f"{dev.name} has {dev.bram18k}")

    # -- derived quantities -----------------------------------------------------------------

    @property
    def lanes(self) -> int:
        """Channels per tensor block and banks per on-chip buffer."""
        return max(self.ti, self.to)

    @property
    def macs(self) -> int:
        return self.ti * self.to

    @property
    def mac_multipliers(self) -> int:
        """Hardware multipliers of the MAC array (two products each when packed)."""
        return self.macs // 2 if self.dsp_packing else self.macs

    @property
    def max_row_bytes(self) -> int:
        """Largest input row (width × channels, padded to lanes) the row buffer holds."""
        return self.row_buffer_bytes // ROW_BUFFER_ROWS

    @property
    def dram_bus_bytes(self) -> int:
        return self.dram_bus_bits // 8

    @property
    def dram_bytes_per_cycle(self) -> Fraction:
        """Sustained DRAM bandwidth in bytes per accelerator clock, as an exact fraction."""
        exact = Fraction(self.dram_bandwidth_gbps) * 1000 / Fraction(self.clock_mhz)
        return exact.limit_denominator(64)

    @property
    def weight_store_words(self) -> int:
        """Words of the weight store, Ti × To bytes each: the controller's own memory of
        buffer 1's size, beside the three feature-map buffers (the paper keeps weights in
        buffer 1 itself, eq. 2)."""
        return self.buffer_bytes[1] // (self.ti * self.to)

    @property
    def weight_store_bytes(self) -> int:
        return self.weight_store_words * self.ti * self.to

    @property
    def sram_bytes(self) -> int:
        """Raw on-chip SRAM as the RTL instantiates it: paper eq. 6 with this configuration's
        buffer sizes, plus the separate weight store."""
        return (sum(self.buffer_bytes) + self.weight_store_bytes + self.row_buffer_bytes
                + self.psum_buffer_bytes + self.write_buffer_bytes)

    @property
    def bram18k(self) -> int:
        """18K block RAMs of all banked buffers (one memory per bank) and the weight store
        (one memory Ti × To bytes wide)."""
        byte_banked = [*self.buffer_bytes, self.row_buffer_bytes, self.write_buffer_bytes]
        total = sum(self.lanes * bram18k_blocks(size // self.lanes, 8) for size in byte_banked)
        total += bram18k_blocks(self.weight_store_words, 8 * self.ti * self.to)
        return total + self.to * bram18k_blocks(self.psum_buffer_bytes // (4 * self.to), 32)

    # -- identity ---------------------------------------------------------------------------

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["buffer_bytes"] = list(self.buffer_bytes)
        return d

    @property
    def fingerprint(self) -> int:
        """64-bit identity of everything that changes the hardware or its timing.

        Written into every DRAM image so an image built for one configuration is refused by
        another. The name is excluded: renaming a configuration does not change the hardware.
        """
        fields = {k: v for k, v in self.to_dict().items() if k != "name"}
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:8], "little")

    def replace(self, **changes) -> "HwConfig":
        """A copy with some fields changed (validated like any new configuration)."""
        return dataclasses.replace(self, **changes)

    def summary(self) -> str:
        kib = lambda n: f"{n / 1024:g} KiB"
        return (f"{self.name}: Ti={self.ti} To={self.to} ({self.macs} MAC/cycle, "
                f"{self.mac_multipliers} multipliers{', packed' if self.dsp_packing else ''}), "
                f"buffers {'/'.join(kib(b) for b in self.buffer_bytes)}, "
                f"SRAM {kib(self.sram_bytes)} ({self.bram18k} BRAM18K), "
                f"{self.clock_mhz:g} MHz, DRAM {self.dram_bus_bits}-bit "
                f"{self.dram_bandwidth_gbps:g} GB/s latency {self.dram_latency} cycles")


KiB = 1024
MiB = 1024 * KiB

CONFIGS: dict[str, HwConfig] = {
    # Small enough that Verilator system tests of ≤64×64 networks run in seconds.
    "tiny": HwConfig(
        name="tiny", ti=8, to=8, buffer_bytes=(64 * KiB,) * 3, row_buffer_bytes=24 * KiB,
        psum_buffer_bytes=32 * KiB, write_buffer_bytes=1 * KiB, dsp_packing=False,
        clock_mhz=100.0, dram_bus_bits=64, dram_latency=16, dram_bandwidth_gbps=0.8,
        dram_max_burst=16),
    # ULX3S-85F: 64 MACs on 64 MULT18X18D (ECP5 multipliers cannot pack two products);
    # DRAM is the board's 16-bit SDR SDRAM behind a 32-bit AXI port.
    "ecp5": HwConfig(
        name="ecp5", ti=8, to=8, buffer_bytes=(64 * KiB,) * 3, row_buffer_bytes=12 * KiB,
        psum_buffer_bytes=16 * KiB, write_buffer_bytes=2 * KiB, dsp_packing=False,
        clock_mhz=100.0, dram_bus_bits=32, dram_latency=20, dram_bandwidth_gbps=0.2,
        dram_max_burst=16, device="LFE5U-85F"),
    # The paper's KCU1500 design: 4096 int8 MAC/cycle on 2048 DSP48E2 at 200 MHz. The DRAM
    # figures are an assumption (one 512-bit AXI port at full rate), stated in every report.
    "kcu1500": HwConfig(
        name="kcu1500", ti=64, to=64, buffer_bytes=(1536 * KiB,) * 3,
        row_buffer_bytes=384 * KiB, psum_buffer_bytes=512 * KiB, write_buffer_bytes=32 * KiB,
        dsp_packing=True, clock_mhz=200.0, dram_bus_bits=512, dram_latency=64,
        dram_bandwidth_gbps=12.8, dram_max_burst=64, device="XCKU115",
        # Stores for every paper network: VGG-16's 4096-channel classifier, DenseNet-121's
        # input tables over up to 1024 channels.
        max_channels=4096, max_table_channels=1024),
}
#: What the ULX3S bitstream holds: ``ecp5`` with Ti = To = 4 and 16 KiB buffers, which fits
#: the LFE5U-85F. ``ecp5`` itself (Ti = To = 8, 64 KiB buffers) synthesises to 175 MULT18X18D,
#: 314 DP16KD and 92 k LUTs — the part has 156, 208 and 83 640: besides the MAC array, every
#: lane has float32-exact requantisers and adders built from 18x18 multipliers
#: (``sfnpu.resources.TERMS``; docs/boards.md, "Fitting ecp5").
#: Its clock is the one the routed board design meets (51.5 MHz after routing, docs/boards.md):
#: 50 MHz, which the PLL makes exactly from the 25 MHz oscillator; the SDRAM runs on it, so the
#: DRAM still moves 2 bytes a cycle.
CONFIGS["ecp5-ulx3s"] = CONFIGS["ecp5"].replace(
    name="ecp5-ulx3s", ti=4, to=4, buffer_bytes=(16 * KiB,) * 3, psum_buffer_bytes=8 * KiB,
    clock_mhz=50.0, dram_bandwidth_gbps=0.1)


def depthwise_taps(config: HwConfig) -> int:
    """Kernel taps per channel and cycle in depthwise mode (``Ti/2``: half a MAC row)."""
    return config.ti // 2


def get_config(name: str) -> HwConfig:
    """A reference configuration by name; the error lists the known names."""
    try:
        return CONFIGS[name]
    except KeyError:
        raise ConfigError(f"unknown hardware config {name!r}; known: {', '.join(CONFIGS)}") \
            from None
