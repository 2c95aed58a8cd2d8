"""The whole accelerator under cocotb: what a host does with a DRAM image.

:class:`sfnpu.tb.system.SystemHarness` starts this module through cocotb's runner, once per
run, with the run's parameters in the JSON file named by ``SFNPU_RUN``. Roles:

- :class:`AxiLiteMaster` drives the CSR port (AXI4-Lite, 32-bit data, 4 strobes);
- :class:`TB` holds the reset and the DRAM model's file backdoor: the image is in
  the DRAM model at time 0 (``+sfnpu_load``, ``$readmemh``: no clock or bus cycles, not part of
  the run) and the DRAM is written to a file after it (``backdoor_dump``, ``$writememh``);
- :func:`run_image` programs IMAGE_BASE, the DMA window and CONTROL, then waits on one trigger
  — the interrupt, or the timeout the harness derived from the cycle model (or the soft
  reset of an abort test) — so no Python runs per clock; it reads STATUS, the error
  registers, every counter and the per-group log, and writes them as JSON for the harness's
  scoreboard (golden model: the whole DRAM; cycle model: per-group cycles and bytes).

Register offsets and field masks come from :mod:`sfnpu.regmap` through the run's parameters
(:func:`sfnpu.regmap.offsets_and_masks`): no constant is copied here, and the simulator's
Python loads neither Amaranth nor numpy (a run starts in about 0.4 s).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cocotb
from cocotb.triggers import First, ReadOnly, RisingEdge, Timer
from cocotb.utils import get_sim_time

__all__ = ["AxiLiteMaster", "RegisterMap", "TB", "COUNTERS", "CLOCK_NS"]

#: 64-bit counters read after a run (register-name stems of sfnpu.regmap).
COUNTERS = ("CYCLES", "STALL_DRAM_READ", "STALL_DRAM_WRITE", "STALL_WEIGHTS", "STALL_CONTROL",
            "DRAM_READ_BYTES", "DRAM_WRITE_BYTES")

CLOCK_NS = 10               # the bench's clock period (sfnpu.tb.system.bench_verilog)
HANDSHAKE_CYCLES = 1000     # a register access answered later than this is an error
SETTLE_POLLS = 10_000       # STATUS polls, 16 cycles apart, for a stopped core to go idle


class RegisterMap:
    """Offsets and masks by name, from :func:`sfnpu.regmap.offsets_and_masks`."""

    def __init__(self, table: dict):
        self.magic = table["magic"]
        self.offsets = table["offsets"]
        self.masks = table["masks"]

    def offset(self, name: str) -> int:
        return self.offsets[name]

    def mask(self, register: str, field: str) -> int:
        return self.masks[f"{register}.{field}"]


class AxiLiteMaster:
    """AXI4-Lite master on the accelerator's ``csr__*`` ports."""

    def __init__(self, dut, registers: RegisterMap):
        self.dut = dut
        self.registers = registers
        self.clk = dut.clk
        for name in ("aw__valid", "w__valid", "b__ready", "ar__valid", "r__ready"):
            getattr(dut, f"csr__{name}").value = 0

    async def _cycle(self, *signals):
        """Sample ``signals`` in the settled cycle, then step to the next rising edge."""
        await ReadOnly()
        sampled = [int(s.value) for s in signals]
        await RisingEdge(self.clk)
        return sampled

    async def write(self, address: int, value: int) -> None:
        d = self.dut
        d.csr__aw__payload.value = address
        d.csr__w__payload.value = (0xF << 32) | value
        d.csr__aw__valid.value = d.csr__w__valid.value = 1
        d.csr__b__ready.value = 1
        for _ in range(HANDSHAKE_CYCLES):
            aw_valid, aw_ready, w_valid, w_ready, b_valid, b_payload = await self._cycle(
                d.csr__aw__valid, d.csr__aw__ready, d.csr__w__valid, d.csr__w__ready,
                d.csr__b__valid, d.csr__b__payload)
            if aw_valid and aw_ready:
                d.csr__aw__valid.value = 0
            if w_valid and w_ready:
                d.csr__w__valid.value = 0
            if b_valid:
                d.csr__b__ready.value = 0
                if b_payload & 3:
                    raise RuntimeError(f"register write {address:#x} answered with an error")
                return
        raise TimeoutError(f"register write {address:#x} got no response")

    async def read(self, address: int) -> int:
        d = self.dut
        d.csr__ar__payload.value = address
        d.csr__ar__valid.value = 1
        d.csr__r__ready.value = 1
        for _ in range(HANDSHAKE_CYCLES):
            ar_valid, ar_ready, r_valid, payload = await self._cycle(
                d.csr__ar__valid, d.csr__ar__ready, d.csr__r__valid, d.csr__r__payload)
            if ar_valid and ar_ready:
                d.csr__ar__valid.value = 0
            if r_valid:
                d.csr__r__ready.value = 0
                if (payload >> 32) & 3:
                    raise RuntimeError(f"register read {address:#x} answered with an error")
                return payload & 0xFFFFFFFF
        raise TimeoutError(f"register read {address:#x} got no response")

    async def read_register(self, name: str) -> int:
        return await self.read(self.registers.offset(name))

    async def write_register(self, name: str, value: int) -> None:
        await self.write(self.registers.offset(name), value)

    async def read64(self, stem: str) -> int:
        low = await self.read_register(f"{stem}_LO")
        return low | await self.read_register(f"{stem}_HI") << 32

    async def write64(self, stem: str, value: int) -> None:
        await self.write_register(f"{stem}_LO", value & 0xFFFFFFFF)
        await self.write_register(f"{stem}_HI", value >> 32)


class TB:
    """Reset, the DRAM model's file backdoor and the CSR master of one accelerator. The clock
    runs in the bench's Verilog (:func:`sfnpu.tb.system.bench_verilog`), period
    :data:`CLOCK_NS`."""

    def __init__(self, dut, registers: RegisterMap):
        self.dut = dut
        self.registers = registers
        dut.backdoor_we.value = 0
        dut.backdoor_dump.value = 0
        self.csr = AxiLiteMaster(dut, registers)

    @property
    def cycle(self) -> int:
        return int(get_sim_time("ns")) // CLOCK_NS

    async def clocks(self, n: int) -> None:
        """``n`` clock cycles as one trigger (from a rising edge to a rising edge): half a
        period short, then the edge, so the end never races the clock in one time step."""
        await Timer(n * CLOCK_NS - CLOCK_NS // 2, unit="ns")
        await RisingEdge(self.dut.clk)

    async def reset(self, cycles: int = 4) -> None:
        self.dut.rst.value = 1
        await RisingEdge(self.dut.clk)
        await self.clocks(cycles)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    async def start(self, base: int, window: tuple[int, int]) -> None:
        """Check the ID, program the image base and the DMA window, enable the interrupt and
        start."""
        regs = self.registers
        magic = await self.csr.read_register("ID")
        if magic != regs.magic:
            raise RuntimeError(f"ID register reads {magic:#x}, not {regs.magic:#x}")
        await self.csr.write64("IMAGE_BASE", base)
        await self.csr.write64("DMA_WINDOW_BASE", window[0])
        await self.csr.write64("DMA_WINDOW_LIMIT", window[1])
        irq = regs.mask("CONTROL", "irq_enable")
        await self.csr.write_register("CONTROL", irq)
        await self.csr.write_register("CONTROL", irq | regs.mask("CONTROL", "start"))

    async def wait_for_interrupt(self, max_cycles: int, abort_after: int = 0) -> dict:
        """One trigger: the interrupt, the timeout, or (``abort_after`` > 0) the cycle at
        which CONTROL.soft_reset stops the run."""
        started = self.cycle
        abort = 0 < abort_after <= max_cycles
        limit = abort_after if abort else max_cycles
        timeout = aborted = False
        if not int(self.dut.irq.value):
            # Half a period short of the limit, then the edge (see clocks()).
            fired = await First(RisingEdge(self.dut.irq),
                                Timer(limit * CLOCK_NS - CLOCK_NS // 2, unit="ns"))
            if isinstance(fired, Timer):
                await RisingEdge(self.dut.clk)
                if abort:
                    await self.csr.write_register("CONTROL",
                                                  self.registers.mask("CONTROL", "soft_reset"))
                    aborted = True
                else:
                    timeout = True
        return {"timeout": timeout, "aborted": aborted, "waited": self.cycle - started}

    async def settle(self) -> None:
        """Let an aborted or failed core finish its bus transactions (STATUS.busy low)."""
        busy = self.registers.mask("STATUS", "busy")
        for _ in range(SETTLE_POLLS):
            if not await self.csr.read_register("STATUS") & busy:
                return
            await self.clocks(16)

    async def report(self) -> dict:
        """STATUS, the error registers, every counter and the per-group log."""
        csr = self.csr
        values = {name: await csr.read_register(name)
                  for name in ("STATUS", "ERROR_CODE", "ERROR_GROUP")}
        values["ERROR_ADDR"] = await csr.read64("ERROR_ADDR")
        values["counters"] = {name: await csr.read64(name) for name in COUNTERS}
        groups = await csr.read_register("GROUP_COUNT")
        depth = await csr.read_register("GROUP_LOG_DEPTH")
        await csr.write_register("GROUP_LOG_INDEX", 0)
        log = []
        for _ in range(min(groups, depth)):
            # The byte fields first: reading GROUP_LOG_DATA advances the index.
            read = await csr.read_register("GROUP_LOG_READ_BYTES")
            written = await csr.read_register("GROUP_LOG_WRITE_BYTES")
            log.append((await csr.read_register("GROUP_LOG_DATA"), read, written))
        values["GROUP_COUNT"] = groups
        values["group_log"] = log
        return values

    async def dump_dram(self) -> None:
        """One edge with ``backdoor_dump`` high: the DRAM model writes its file."""
        self.dut.backdoor_dump.value = 1
        await RisingEdge(self.dut.clk)
        self.dut.backdoor_dump.value = 0
        await RisingEdge(self.dut.clk)


@cocotb.test()
async def run_image(dut):
    """Run the image the harness preloaded, as its host would, and record what the host
    sees (the harness's scoreboard checks it against the golden and cycle models)."""
    params = json.loads(Path(os.environ["SFNPU_RUN"]).read_text())
    tb = TB(dut, RegisterMap(params["registers"]))
    await tb.reset()
    await tb.start(params["base"], tuple(params["window"]))
    result = await tb.wait_for_interrupt(params["max_cycles"], params["abort_after"])
    await tb.settle()
    result.update(await tb.report())
    await tb.dump_dram()
    Path(params["result"]).write_text(json.dumps(result))
