"""The whole accelerator under cocotb: a DRAM image in, the golden and cycle models as the
scoreboard (``tests/test_cocotb_system.py`` starts it through the cocotb runner).

Roles: :class:`AxiLiteMaster` drives the CSR port; :class:`TB` holds the clock, the reset
and the DRAM model's backdoor (the image is loaded before reset is released, one word per
clock — not bus cycles, and not part of the run); the scoreboard compares the DRAM after
the run with the golden model's and the group log with the cycle model's. While the
accelerator runs, the testbench waits on one trigger — the interrupt, or a timeout derived
from the cycle model — so no Python runs per clock. Register offsets and fields come from
:mod:`sfnpu.regmap`, sizes from the configuration named by ``SFNPU_CONFIG``; the image is
the file named by ``SFNPU_IMAGE``.
"""

from __future__ import annotations

import os
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import First, ReadOnly, RisingEdge, Timer

from sfnpu import image, regmap
from sfnpu.config import get_config
from sfnpu.sim.cycle import CycleModel, compare
from sfnpu.sim.golden import GoldenModel

__all__ = ["AxiLiteMaster", "TB"]

CLOCK_NS = 10
HANDSHAKE_CYCLES = 1000


def _reg(name: str) -> int:
    return regmap.register(name).offset


def _mask(register: str, field: str) -> int:
    return regmap.register(register).field(field).mask


class AxiLiteMaster:
    """AXI4-Lite master on the accelerator's ``csr__*`` ports (32-bit data, 4 strobes)."""

    def __init__(self, dut):
        self.dut = dut
        self.clk = dut.clk
        for name in ("aw__valid", "w__valid", "b__ready", "ar__valid", "r__ready"):
            getattr(dut, f"csr__{name}").value = 0

    async def _cycle(self, *ready):
        """Sample ``ready`` signals in the settled cycle, then step to the next edge."""
        await ReadOnly()
        fired = [bool(r.value) for r in ready]
        await RisingEdge(self.clk)
        return fired

    async def write(self, address: int, value: int) -> None:
        d = self.dut
        d.csr__aw__payload.value = address
        d.csr__w__payload.value = (0xF << 32) | value
        d.csr__aw__valid.value = d.csr__w__valid.value = 1
        d.csr__b__ready.value = 1
        aw = w = False
        for _ in range(HANDSHAKE_CYCLES):
            aw_fire, w_fire, b_fire = await self._cycle(d.csr__aw__ready, d.csr__w__ready,
                                                        d.csr__b__valid)
            if aw_fire and not aw:
                aw, d.csr__aw__valid.value = True, 0
            if w_fire and not w:
                w, d.csr__w__valid.value = True, 0
            if b_fire and aw and w:
                d.csr__b__ready.value = 0
                assert int(d.csr__b__payload.value) & 3 == 0, f"write {address:#x}: error"
                return
        raise TimeoutError(f"register write {address:#x} got no response")

    async def read(self, address: int) -> int:
        d = self.dut
        d.csr__ar__payload.value = address
        d.csr__ar__valid.value = 1
        d.csr__r__ready.value = 1
        for _ in range(HANDSHAKE_CYCLES):
            await ReadOnly()
            ar_fire, r_fire = bool(d.csr__ar__ready.value), bool(d.csr__r__valid.value)
            payload = int(d.csr__r__payload.value) if r_fire else 0
            await RisingEdge(self.clk)
            if ar_fire:
                d.csr__ar__valid.value = 0
            if r_fire:
                d.csr__r__ready.value = 0
                assert (payload >> 32) & 3 == 0, f"read {address:#x}: error response"
                return payload & 0xFFFFFFFF
        raise TimeoutError(f"register read {address:#x} got no response")

    async def read64(self, stem: str) -> int:
        low = await self.read(_reg(f"{stem}_LO"))
        return low | await self.read(_reg(f"{stem}_HI")) << 32


class TB:
    """Clock, reset, the DRAM backdoor and the CSR master of one accelerator."""

    def __init__(self, dut, config):
        self.dut, self.config = dut, config
        self.bus_bytes = config.dram_bus_bytes
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
        self.csr = AxiLiteMaster(dut)
        dut.backdoor_we.value = 0

    async def load(self, blob: bytes, base: int = 0) -> None:
        """The image into DRAM through the backdoor, in reset."""
        d, B = self.dut, self.bus_bytes
        d.rst.value = 1
        for offset in range(0, len(blob), B):
            d.backdoor_addr.value = (base + offset) // B
            d.backdoor_wdata.value = int.from_bytes(blob[offset:offset + B], "little")
            d.backdoor_we.value = 1
            await RisingEdge(d.clk)
        d.backdoor_we.value = 0
        for _ in range(4):
            await RisingEdge(d.clk)
        d.rst.value = 0
        await RisingEdge(d.clk)

    async def dump(self, nbytes: int) -> bytes:
        d, B = self.dut, self.bus_bytes
        out = bytearray()
        for word in range(-(-nbytes // B)):
            d.backdoor_addr.value = word
            await Timer(1, unit="ns")
            out += int(d.backdoor_rdata.value).to_bytes(B, "little")
        return bytes(out[:nbytes])

    async def run(self, base: int, window: tuple[int, int], timeout_cycles: int) -> bool:
        """Program the CSRs, start, and wait for the interrupt (one trigger); False on
        timeout."""
        csr = self.csr
        assert await csr.read(_reg("ID")) == regmap.MAGIC, "ID register"
        for stem, value in (("IMAGE_BASE", base), ("DMA_WINDOW_BASE", window[0]),
                            ("DMA_WINDOW_LIMIT", window[1])):
            await csr.write(_reg(f"{stem}_LO"), value & 0xFFFFFFFF)
            await csr.write(_reg(f"{stem}_HI"), value >> 32)
        irq = _mask("CONTROL", "irq_enable")
        await csr.write(_reg("CONTROL"), irq)
        await csr.write(_reg("CONTROL"), irq | _mask("CONTROL", "start"))
        if not int(self.dut.irq.value):
            done = await First(RisingEdge(self.dut.irq),
                               Timer(timeout_cycles * CLOCK_NS, unit="ns"))
            if isinstance(done, Timer):
                return False
        await RisingEdge(self.dut.clk)
        return True

    async def group_log(self) -> list[tuple[int, int, int]]:
        """(cycles, DRAM bytes read, written) of every group, from the CSR log."""
        csr = self.csr
        groups = await csr.read(_reg("GROUP_COUNT"))
        await csr.write(_reg("GROUP_LOG_INDEX"), 0)
        log = []
        for _ in range(groups):
            read = await csr.read(_reg("GROUP_LOG_READ_BYTES"))
            written = await csr.read(_reg("GROUP_LOG_WRITE_BYTES"))
            log.append((await csr.read(_reg("GROUP_LOG_DATA")), read, written))
        return log


@cocotb.test()
async def image_matches_the_models(dut):
    """Run the image; the DRAM must equal the golden model's and the group log the cycle
    model's (DRAM bytes exactly, cycles within its tolerance)."""
    config = get_config(os.environ["SFNPU_CONFIG"])
    blob = Path(os.environ["SFNPU_IMAGE"]).read_bytes()
    tb = TB(dut, config)
    model = CycleModel(config).run(blob)
    await tb.load(blob)
    finished = await tb.run(0, (0, int(os.environ.get("SFNPU_DRAM_BYTES", 1 << 24))),
                            timeout_cycles=4 * model.cycles + 10_000)
    assert finished, f"no interrupt within 4× the cycle model's {model.cycles} cycles"
    status = await tb.csr.read(_reg("STATUS"))
    assert status & _mask("STATUS", "done") and not status & _mask("STATUS", "error"), \
        f"error code {await tb.csr.read(_reg('ERROR_CODE'))}"
    log = await tb.group_log()
    cycles = await tb.csr.read64("CYCLES")
    assert sum(c for c, _, _ in log) == cycles
    comparison = compare(model, *zip(*log))
    dut._log.info("cycle model vs RTL: %s", comparison.summary())
    assert not comparison.problems(), "\n".join(comparison.problems())
    golden = bytes(GoldenModel(config).run(blob).dram)
    dram = await tb.dump(len(golden))
    differ = sum(a != b for a, b in zip(dram, golden))
    assert differ == 0, f"{differ} DRAM bytes differ from the golden model"
    footprint = image.unpack(blob, config).layout.image_bytes
    assert len(golden) >= footprint
