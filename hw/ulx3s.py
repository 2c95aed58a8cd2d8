"""ULX3S (ECP5) board top: PLL, reset, pins around :class:`~sfnpu.hw.board.BoardSystem`.

The 25 MHz oscillator feeds an EHXPLLL whose dividers come from Project Trellis' ``ecppll``
(:func:`ecp5_pll_settings`); the system clock domain is held in reset until the PLL locks.
Pins: the FTDI UART (the host link), LED 0 the heartbeat, LED 1 the accelerator's interrupt,
LED 7 PLL lock, and the SDRAM (the accelerator's DRAM by default; ``memory="bram"`` uses block
RAM instead).

SDRAM pins (:func:`sdram_pins`): every output, DQ's output enable included, leaves through a
register on the system clock; the SDRAM's clock is the system clock inverted (a DDR output
of 0 then 1), so the SDRAM samples commands and write data half a cycle after they change;
read data is captured by registers on the inverted clock, in the middle of the data's valid
window, which at 100 MHz no rising edge hits. From the controller's side this adds one cycle to
a read (:data:`SDRAM_READ_DELAY`). The controller is verified in simulation against a
behavioural SDRAM; this pin timing is reasoned from the datasheet's tAC/tOH, not measured on a
board.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from amaranth.hdl import ClockDomain, ClockSignal, Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from sfnpu.config import HwConfig, get_config

from .board import BoardSystem

__all__ = ["Ulx3sTop", "Ulx3s85FPlatform", "ecp5_pll_settings", "ulx3s_config", "sdram_pins",
           "OSCILLATOR_MHZ", "MEMORY_BYTES", "SDRAM_READ_DELAY"]

OSCILLATOR_MHZ = 25
#: Block RAM for the DRAM image with ``memory="bram"``: what is left of the part's 208 DP16KD
#: beside the accelerator (bundled PP-LCNet needs 4.6 MB: it does not fit; small models do).
MEMORY_BYTES = 64 * 1024
#: Cycles the SDRAM pins' registers add to a read (see the module docstring).
SDRAM_READ_DELAY = 1


def ulx3s_config() -> HwConfig:
    """The configuration the bitstream holds (``ecp5-ulx3s`` of :data:`sfnpu.config.CONFIGS`,
    which says why it is not ``ecp5``)."""
    return get_config("ecp5-ulx3s")


def ecp5_pll_settings(ecppll: str, clock_mhz: float) -> tuple[dict, dict, float]:
    """EHXPLLL parameters and attributes for ``clock_mhz`` from the 25 MHz oscillator, as
    ``ecppll`` computes them, and the frequency actually reached."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pll.v"
        result = subprocess.run([ecppll, "-i", str(OSCILLATOR_MHZ), "-o", f"{clock_mhz:g}",
                                 "-f", out.name], cwd=tmp, capture_output=True, text=True)
        if result.returncode or not out.exists():
            raise RuntimeError(f"ecppll cannot make {clock_mhz:g} MHz from "
                               f"{OSCILLATOR_MHZ} MHz:\n{result.stdout}{result.stderr}")
        text = out.read_text()
    params = {k: (int(v) if v.isdigit() else v.strip('"'))
              for k, v in re.findall(r"\.(\w+)\(([^)]*)\),?\n", text.split(") pll_i")[0])}
    attrs = dict(re.findall(r'\(\* (\w+)="([^"]*)" \*\)', text))
    reached = float(re.search(r"clkout0 frequency: ([\d.]+) MHz", result.stdout)[1])
    return params, attrs, reached


class Ulx3s85FPlatform(ULX3S_85F_Platform):
    """amaranth-boards' ULX3S-85F without the debug Verilog copy of the design (a second
    conversion of the whole accelerator that the build does not use)."""

    @property
    def file_templates(self):
        return {k: v for k, v in super().file_templates.items() if not k.endswith(".debug.v")}


class Ulx3sTop(Elaboratable):
    """The ULX3S build top (see the module docstring)."""

    def __init__(self, config: HwConfig, *, clock_mhz: float, baud: int,
                 pll: tuple[dict, dict], memory: str = "sdram", memory_bytes: int | None = None,
                 with_accelerator: bool = True):
        divisor = round(clock_mhz * 1e6 / baud)
        if abs(clock_mhz * 1e6 / divisor / baud - 1) > 0.02:
            raise ValueError(f"baud {baud}: {clock_mhz:g} MHz / {divisor} is more than 2 % off")
        self.config = config
        self.memory = memory
        self.memory_bytes = memory_bytes
        self.clock_mhz = clock_mhz
        self.uart_divisor = divisor
        self.pll_params, self.pll_attrs = pll
        self.with_accelerator = with_accelerator

    def elaborate(self, platform):
        m = Module()
        m.submodules.clk25 = clk25 = io.Buffer("i", platform.request("clk25", dir="-"))
        locked = Signal()
        pll_clock = Signal()
        m.domains.sync = ClockDomain("sync")
        m.d.comb += ClockSignal("sync").eq(pll_clock)
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=str(OSCILLATOR_MHZ),
            a_FREQUENCY_PIN_CLKOP=f"{self.clock_mhz:g}",
            **{f"a_{k}": v for k, v in self.pll_attrs.items()
               if not k.startswith("FREQUENCY_PIN")},
            **{f"p_{k}": v for k, v in self.pll_params.items()},
            i_RST=0, i_STDBY=0, i_CLKI=clk25.i, o_CLKOP=pll_clock, i_CLKFB=pll_clock, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1,
            i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0, o_LOCK=locked)
        m.submodules.reset_sync = ResetSynchronizer(~locked, domain="sync")
        # No constraint on pll_clock: nextpnr derives the PLL output's from the oscillator's
        # and the divider settings (a net constraint would name a net synthesis renamed).

        m.submodules.system = system = BoardSystem(
            self.config, memory=self.memory, memory_bytes=self.memory_bytes,
            uart_divisor=self.uart_divisor, clock_mhz=self.clock_mhz,
            sdram_read_delay=SDRAM_READ_DELAY,
            heartbeat_bits=max(2, int(self.clock_mhz * 1e6).bit_length() - 1),
            with_accelerator=self.with_accelerator)
        if self.memory == "sdram":
            sdram_pins(m, platform, system.sdram)
        uart = platform.request("uart", dir={"rx": "-", "tx": "-", "rts": "-", "dtr": "-"})
        m.submodules.uart_rx = uart_rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = uart_tx = io.Buffer("o", uart.tx)
        leds = []
        for k in (0, 1, 7):
            m.submodules[f"led_{k}"] = led = io.Buffer("o", platform.request("led", k, dir="-"))
            leds.append(led)
        m.d.comb += [
            system.uart_rx.eq(uart_rx.i),
            uart_tx.o.eq(system.uart_tx),
            leds[0].o.eq(system.heartbeat),
            leds[1].o.eq(system.irq),
            leds[2].o.eq(locked),
        ]
        return m


def sdram_pins(m: Module, platform, sdram):
    """The SDRAM controller's pin signals onto the board's ``sdram`` resource (see the module
    docstring for the clocking)."""
    pins = platform.request("sdram", dir="-")
    m.domains.sdram_capture = capture = ClockDomain("sdram_capture", reset_less=True,
                                                    local=True)
    m.d.comb += capture.clk.eq(~ClockSignal("sync"))
    m.submodules.sdram_clk = clk = io.DDRBuffer("o", pins.clk)
    m.d.comb += [clk.o[0].eq(0), clk.o[1].eq(1)]
    for name in ("clk_en", "cs", "we", "ras", "cas", "ba", "a", "dqm"):
        m.submodules[f"sdram_{name}"] = buffer = io.FFBuffer("o", getattr(pins, name))
        m.d.comb += buffer.o.eq(getattr(sdram, name))
    # DQ's registers are in the fabric: an ECP5 I/O cell takes one clock for input and output.
    m.submodules.sdram_dq = dq = io.Buffer("io", pins.dq)
    m.d.sync += [dq.o.eq(sdram.dq_o), dq.oe.eq(sdram.dq_oe)]
    m.d.sdram_capture += sdram.dq_i.eq(dq.i)
