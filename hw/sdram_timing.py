"""SDR SDRAM geometry, datasheet timing and its conversion to clock cycles.

One source of truth for the controller (:mod:`sfnpu.hw.sdram`) and the behavioural model that
checks it (:mod:`sfnpu.tb.sdram_model`): both take the same :class:`SdramCycles`, computed
from nanoseconds at the controller's clock by :meth:`SdramTiming.cycles`.

The ULX3S carries one 16-bit SDR SDRAM: 32 MB (MT48LC16M16A2 / IS42S16160G class: 4 banks of
8192 rows × 512 columns) on most boards, 64 MB (AS4C32M16SB-7TCN: 1024 columns) on some.
:data:`ULX3S_SDRAM` addresses the 32 MB that every board has. :data:`AS4C_7` holds the -7 speed
grade's AC table of Alliance's AS4C16M16SA / AS4C32M16SB datasheets (the slowest of the parts
found on the boards; the Micron and ISSI -7/-75 grades are equal or faster).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SdramGeometry", "SdramTiming", "SdramCycles", "ULX3S_SDRAM", "AS4C_7"]


@dataclass(frozen=True)
class SdramGeometry:
    """Organisation of one x16 SDR SDRAM."""
    bank_bits: int = 2
    row_bits: int = 13
    col_bits: int = 9
    data_bits: int = 16

    @property
    def addr_bits(self) -> int:
        """Address pins: the row address is the widest use (A10 also selects 'all banks')."""
        return max(self.row_bits, 11)

    @property
    def size_bytes(self) -> int:
        return (1 << (self.bank_bits + self.row_bits + self.col_bits)) * self.data_bits // 8


ULX3S_SDRAM = SdramGeometry()


@dataclass(frozen=True)
class SdramTiming:
    """Datasheet minimums in nanoseconds (``*_clk`` fields: minimums in clock cycles that
    apply besides the nanoseconds)."""
    t_rc: float = 63.0          # ACTIVATE to ACTIVATE, same bank
    t_rfc: float = 63.0         # AUTO REFRESH to any command
    t_rcd: float = 21.0         # ACTIVATE to READ/WRITE
    t_rp: float = 21.0          # PRECHARGE to ACTIVATE/REFRESH
    t_rrd: float = 14.0         # ACTIVATE to ACTIVATE, other bank
    t_mrd: float = 14.0         # MODE REGISTER SET to any command
    t_mrd_clk: int = 2
    t_ras: float = 42.0         # ACTIVATE to PRECHARGE
    t_wr: float = 14.0          # last write data to PRECHARGE
    t_refi: float = 7812.5      # average refresh interval: 64 ms / 8192 rows
    t_power_up: float = 200_000.0   # stable clock and NOPs before the first command
    t_ck_cl2: float = 10.0      # shortest clock period at CAS latency 2 (else CL 3)
    init_refreshes: int = 2     # AUTO REFRESH commands of the power-up sequence

    def cycles(self, clock_mhz: float, *, burst_length: int = 2) -> SdramCycles:
        """Every constraint in whole cycles of a ``clock_mhz`` clock (rounded up)."""
        period = 1000.0 / clock_mhz

        def clk(ns: float) -> int:
            # 1e-9: 21 ns at 100 MHz is 2.1 cycles → 3, and 20 ns exactly 2, not 3
            return max(1, math.ceil(ns / period - 1e-9))

        return SdramCycles(
            rc=clk(self.t_rc), rfc=clk(self.t_rfc), rcd=clk(self.t_rcd), rp=clk(self.t_rp),
            rrd=clk(self.t_rrd), mrd=max(self.t_mrd_clk, clk(self.t_mrd)), ras=clk(self.t_ras),
            wr=clk(self.t_wr), refi=int(self.t_refi / period), power_up=clk(self.t_power_up),
            cas_latency=2 if period >= self.t_ck_cl2 else 3, burst_length=burst_length,
            init_refreshes=self.init_refreshes)


AS4C_7 = SdramTiming()


@dataclass(frozen=True)
class SdramCycles:
    """The constraints in clock cycles: command B may follow command A after ``n`` cycles
    (issued ``n`` clock edges later). ``refi`` is the longest gap between two AUTO REFRESH
    commands the controller may leave."""
    rc: int
    rfc: int
    rcd: int
    rp: int
    rrd: int
    mrd: int
    ras: int
    wr: int
    refi: int
    power_up: int
    cas_latency: int
    burst_length: int = 2
    init_refreshes: int = 2

    @property
    def read_to_write(self) -> int:
        """READ to WRITE: the read burst leaves the bus, then one idle cycle so the SDRAM's
        output driver is off before the controller drives write data."""
        return self.cas_latency + self.burst_length + 1

    @property
    def read_to_precharge(self) -> int:
        """READ to PRECHARGE of the same bank: the whole burst has left the array."""
        return self.burst_length

    @property
    def write_to_precharge(self) -> int:
        """WRITE to PRECHARGE of the same bank: tWR after the burst's last data word."""
        return self.burst_length - 1 + self.wr

    @property
    def mode_register(self) -> int:
        """MODE REGISTER value: burst length, sequential bursts, CAS latency, burst writes."""
        bl_code = {1: 0, 2: 1, 4: 2, 8: 3}[self.burst_length]
        return bl_code | self.cas_latency << 4
