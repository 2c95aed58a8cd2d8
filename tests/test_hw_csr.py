# amaranth: UnusedElaboratable=no
"""CSR block (hw/csr.py) against the register map (sfnpu/regmap.py), in Amaranth's simulator.

Roles: a host driver issues AXI4-Lite reads and writes (with random response back-pressure), a
core model drives the control interface (events, stall bits, byte counts) from a plan, and the
Python reference (the plan's sums, the register map's reset values and access kinds) is the
scoreboard. A variant that returns the live upper half of a counter instead of the latched one
must fail the atomic 64-bit read check.
"""

import numpy as np
import pytest
from amaranth.sim import Simulator

from sfnpu import regmap
from sfnpu.config import get_config
from sfnpu.hw.axi import Resp
from sfnpu.hw.csr import CsrBlock
from sfnpu.regmap import ErrorCode, StallCause

CONFIG = get_config("ecp5")
OKAY, SLVERR = Resp.OKAY, Resp.SLVERR
REG = {r.name: r.offset for r in regmap.REGISTERS}


def field_value(reg_name, field_name, word):
    f = regmap.register(reg_name).field(field_name)
    return (word >> f.lsb) & ((1 << f.width) - 1)


def field_bits(reg_name, field_name, value=1):
    f = regmap.register(reg_name).field(field_name)
    return value << f.lsb


class LiteHost:
    """AXI4-Lite master driver: one transaction at a time, random ready on R and B."""

    def __init__(self, ctx, bus, rng, stall=0.3):
        self.ctx, self.bus, self.rng, self.stall = ctx, bus, rng, stall

    async def _wait_response(self, channel, *fields):
        ctx = self.ctx
        while True:
            ready = int(self.rng.random() >= self.stall)
            ctx.set(channel.ready, ready)
            _, _, valid, *values = await ctx.tick().sample(channel.valid, *fields)
            if valid and ready:
                ctx.set(channel.ready, 0)
                return values

    async def write(self, offset, value, strb=0xF):
        ctx, bus = self.ctx, self.bus
        ctx.set(bus.aw.payload.addr, offset)
        ctx.set(bus.w.payload.data, value & 0xFFFF_FFFF)
        ctx.set(bus.w.payload.strb, strb)
        ctx.set(bus.aw.valid, 1)
        ctx.set(bus.w.valid, 1)
        await ctx.tick().until(bus.aw.ready)
        ctx.set(bus.aw.valid, 0)
        ctx.set(bus.w.valid, 0)
        resp, = await self._wait_response(bus.b, bus.b.payload.resp)
        return resp

    async def read(self, offset):
        ctx, bus = self.ctx, self.bus
        ctx.set(bus.ar.payload.addr, offset)
        ctx.set(bus.ar.valid, 1)
        await ctx.tick().until(bus.ar.ready)
        ctx.set(bus.ar.valid, 0)
        data, resp = await self._wait_response(bus.r, bus.r.payload.data, bus.r.payload.resp)
        return data, resp

    async def read_ok(self, name):
        data, resp = await self.read(REG[name])
        assert resp == OKAY, name
        return data

    async def read64(self, name):
        lo = await self.read_ok(f"{name}_LO")
        hi = await self.read_ok(f"{name}_HI")
        return hi << 32 | lo


async def wait_for(ctx, condition):
    """Ticks until ``condition`` was true at a clock edge (one-shot waits: safe in background
    testbenches that the simulation abandons)."""
    while not (await ctx.tick().sample(condition))[2]:
        pass


def run(dut, host_bench, core_bench=None, seed=0, idle=1):
    """Simulate ``dut`` with a host testbench (and optionally a core model)."""
    rng = np.random.default_rng(seed)

    async def host(ctx):
        ctx.set(dut.control.idle, idle)
        await host_bench(LiteHost(ctx, dut.bus, rng), ctx)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(host)
    if core_bench is not None:
        sim.add_testbench(core_bench, background=True)
    sim.run()


def make_dut(**kw):
    return CsrBlock(CONFIG, **kw)


# -- register map conformance --------------------------------------------------------------------

def test_reset_values_and_identity():
    dut = make_dut(group_log_depth=64)

    async def bench(host, ctx):
        for r in regmap.REGISTERS:
            data, resp = await host.read(r.offset)
            assert resp == OKAY and data == regmap.reset_value(r, dut.parameters), r.name
        fingerprint = await host.read64("FINGERPRINT")
        assert fingerprint == CONFIG.fingerprint
        assert await host.read_ok("ID") == regmap.MAGIC
        assert await host.read_ok("GROUP_LOG_DEPTH") == 64

    run(dut, bench)


def test_unmapped_and_read_only_answer_slverr():
    dut = make_dut()
    mapped = {r.offset for r in regmap.REGISTERS}
    holes = [o for o in range(0, 0x100, 4) if o not in mapped] + [0xFFC, 0x800]

    async def bench(host, ctx):
        for offset in holes:
            assert await host.read(offset) == (0, SLVERR), hex(offset)
            assert await host.write(offset, 0xFFFF_FFFF) == SLVERR, hex(offset)
        for r in regmap.REGISTERS:
            if not r.writable:
                assert await host.write(r.offset, 0xFFFF_FFFF) == SLVERR, r.name
                if r.name != "GROUP_LOG_DATA":       # its read advances the index
                    assert await host.read_ok(r.name) == regmap.reset_value(r, dut.parameters)
        # The two low address bits select nothing: an unaligned address reads its word.
        assert await host.read(REG["ID"] + 3) == (regmap.MAGIC, OKAY)

    run(dut, bench)


def test_read_write_fields_honour_strobes_and_widths():
    dut = make_dut()
    rw = [r for r in regmap.REGISTERS
          if all(f.access is regmap.Access.RW for f in r.fields)]
    assert {"WATCHDOG", "IMAGE_BASE_LO", "DMA_WINDOW_LIMIT_HI", "GROUP_LOG_INDEX"} <= \
        {r.name for r in rw}

    async def bench(host, ctx):
        rng = np.random.default_rng(1)
        model = {r.name: regmap.reset_value(r) for r in rw}
        for _ in range(60):
            r = rw[rng.integers(len(rw))]
            value, strb = int(rng.integers(1 << 32)), int(rng.integers(16))
            assert await host.write(r.offset, value, strb) == OKAY
            byte_mask = sum(0xFF << (8 * i) for i in range(4) if strb >> i & 1)
            writable = sum(f.mask for f in r.fields)
            model[r.name] = (model[r.name] & ~byte_mask) | (value & byte_mask & writable)
            for name in (r.name, rw[rng.integers(len(rw))].name):
                assert await host.read_ok(name) == model[name], name
        # The control interface carries the 64-bit values.
        base = model["DMA_WINDOW_BASE_HI"] << 32 | model["DMA_WINDOW_BASE_LO"]
        assert ctx.get(dut.control.window_base) == base
        # CONTROL: irq_enable is RW, the pulse bits read 0, the unused bits stay 0.
        assert await host.write(REG["CONTROL"], 0xFFFF_FFF8 | field_bits("CONTROL",
                                                                        "irq_enable")) == OKAY
        assert await host.read_ok("CONTROL") == field_bits("CONTROL", "irq_enable")

    run(dut, bench)


# -- run control, status, errors, interrupt ------------------------------------------------------

def test_start_pulse_status_w1c_and_interrupt():
    dut = make_dut()
    pulses = []

    async def core(ctx):
        while True:
            _, _, start, soft_reset = await ctx.tick().sample(dut.control.start,
                                                              dut.control.soft_reset)
            if start or soft_reset:
                pulses.append(("start" if start else "soft_reset", start + soft_reset))
            if start:
                for _ in range(30):
                    await ctx.tick()
                ctx.set(dut.control.done, 1)
                await ctx.tick()
                ctx.set(dut.control.done, 0)

    async def bench(host, ctx):
        start = field_bits("CONTROL", "start")
        assert await host.write(REG["CONTROL"], start | field_bits("CONTROL", "irq_enable")) \
            == OKAY
        status = await host.read_ok("STATUS")
        assert field_value("STATUS", "busy", status) == 1
        assert await host.write(REG["CONTROL"], start) == OKAY      # ignored while busy
        await ctx.tick().until(~dut.control.running)
        status = await host.read_ok("STATUS")
        assert (field_value("STATUS", "busy", status), field_value("STATUS", "done", status),
                field_value("STATUS", "error", status)) == (0, 1, 0)
        assert ctx.get(dut.irq) == 0                    # irq_enable was cleared by that write
        assert await host.write(REG["CONTROL"], field_bits("CONTROL", "irq_enable")) == OKAY
        assert ctx.get(dut.irq) == 1
        assert await host.write(REG["STATUS"], 0) == OKAY            # writing 0 keeps it
        assert field_value("STATUS", "done", await host.read_ok("STATUS")) == 1
        assert await host.write(REG["STATUS"], field_bits("STATUS", "done"), strb=0b0010) \
            == OKAY                                                   # strobe misses bit 1
        assert field_value("STATUS", "done", await host.read_ok("STATUS")) == 1
        assert await host.write(REG["STATUS"], field_bits("STATUS", "done")) == OKAY
        assert await host.read_ok("STATUS") == 0 and ctx.get(dut.irq) == 0
        assert await host.write(REG["CONTROL"], field_bits("CONTROL", "soft_reset")) == OKAY

    run(dut, bench, core)
    assert pulses == [("start", 1), ("soft_reset", 1)]     # one start: the second was ignored


def test_error_capture_and_locked_registers():
    dut = make_dut()

    async def core(ctx):
        await wait_for(ctx, dut.control.start)
        await ctx.tick().repeat(3)
        for signal, value in ((dut.control.idle, 0),          # draining after the error
                              (dut.control.error, 1),
                              (dut.control.error_code, ErrorCode.DMA_WINDOW),
                              (dut.control.error_group, 17),
                              (dut.control.error_addr, 0x1_2345_6780)):
            ctx.set(signal, value)
        await ctx.tick()
        ctx.set(dut.control.error_code, ErrorCode.TIMEOUT)   # a later error is not recorded
        await ctx.tick()
        ctx.set(dut.control.error, 0)

    async def bench(host, ctx):
        assert await host.write(REG["IMAGE_BASE_LO"], 0x1000) == OKAY
        assert await host.write(REG["CONTROL"], field_bits("CONTROL", "start")) == OKAY
        assert await host.write(REG["IMAGE_BASE_LO"], 0x2000) == SLVERR    # locked while busy
        assert await host.read_ok("IMAGE_BASE_LO") == 0x1000
        await ctx.tick().until(~dut.control.running)
        await ctx.tick().repeat(4)
        code = await host.read_ok("ERROR_CODE")
        assert ErrorCode(field_value("ERROR_CODE", "code", code)) is ErrorCode.DMA_WINDOW
        assert await host.read_ok("ERROR_GROUP") == 17
        assert await host.read64("ERROR_ADDR") == 0x1_2345_6780
        status = await host.read_ok("STATUS")
        assert status == sum(field_bits("STATUS", f) for f in ("busy", "done", "error"))
        assert await host.write(REG["IMAGE_BASE_LO"], 0x2000) == SLVERR    # core not idle
        ctx.set(dut.control.idle, 1)
        assert await host.write(REG["IMAGE_BASE_LO"], 0x2000) == OKAY
        assert await host.write(REG["STATUS"], field_bits("STATUS", "error")) == OKAY
        assert await host.read_ok("STATUS") == field_bits("STATUS", "done")
        assert await host.write(REG["CONTROL"], field_bits("CONTROL", "soft_reset")) == OKAY
        assert await host.read_ok("STATUS") == 0 and await host.read_ok("ERROR_CODE") == 0

    run(dut, bench, core)


# -- counters and the group log ------------------------------------------------------------------

def test_counters_and_group_log_match_the_plan():
    """A random run plan: stall bits, byte counts and group ends per cycle."""
    depth = 8
    dut = make_dut(group_log_depth=depth)
    rng = np.random.default_rng(5)
    cycles = 300
    bus_bytes = CONFIG.dram_bus_bytes
    stall = rng.integers(0, 1 << len(StallCause), cycles)
    read_bytes = rng.integers(0, bus_bytes + 1, cycles)
    write_bytes = np.where(rng.random(cycles) < 0.3, bus_bytes, 0)
    group_end = rng.random(cycles) < 0.04
    group_end[-1] = True                             # the last group ends with the run
    ends = np.flatnonzero(group_end)
    assert len(ends) > depth                         # the log wraps
    lengths = np.diff(np.concatenate([[-1], ends]))

    async def core(ctx):
        await wait_for(ctx, dut.control.start)        # now in the run's first cycle
        for t in range(cycles):
            ctx.set(dut.control.stall, int(stall[t]))
            ctx.set(dut.control.read_bytes, int(read_bytes[t]))
            ctx.set(dut.control.write_bytes, int(write_bytes[t]))
            ctx.set(dut.control.group_done, int(group_end[t]))
            ctx.set(dut.control.done, int(t == cycles - 1))
            await ctx.tick()
        for signal in (dut.control.stall, dut.control.read_bytes, dut.control.write_bytes,
                       dut.control.group_done, dut.control.done):
            ctx.set(signal, 0)

    async def bench(host, ctx):
        assert await host.write(REG["CONTROL"], field_bits("CONTROL", "start")) == OKAY
        await ctx.tick().until(~dut.control.running)
        await ctx.tick().repeat(3)                   # counters hold after the run
        assert await host.read64("CYCLES") == cycles
        for cause in StallCause:
            expect = int(np.count_nonzero(stall >> cause.value & 1))
            assert await host.read64(f"STALL_{cause.name}") == expect, cause
        assert await host.read64("DRAM_READ_BYTES") == int(read_bytes.sum())
        assert await host.read64("DRAM_WRITE_BYTES") == int(write_bytes.sum())
        assert await host.read_ok("GROUP_COUNT") == len(ends)
        # The log keeps the last `depth` groups at k mod depth; DATA reads auto-increment.
        first = len(ends) - depth
        assert await host.write(REG["GROUP_LOG_INDEX"], first) == OKAY
        got = []
        for _ in range(depth):          # the byte fields first: DATA advances the index
            got.append((await host.read_ok("GROUP_LOG_READ_BYTES"),
                        await host.read_ok("GROUP_LOG_WRITE_BYTES"),
                        await host.read_ok("GROUP_LOG_DATA")))
        starts = np.concatenate([[0], ends[:-1] + 1])
        assert got == [(int(read_bytes[a:b + 1].sum()), int(write_bytes[a:b + 1].sum()), int(n))
                       for a, b, n in zip(starts[first:], ends[first:], lengths[first:])]
        assert await host.read_ok("GROUP_LOG_INDEX") == first + depth
        assert int(lengths.sum()) == cycles          # entries add up to CYCLES

    run(dut, bench, core)


def atomic_read_check(dut):
    """Read CYCLES while its low half wraps: LO then HI must be one snapshot."""
    torn = []

    async def core(ctx):
        await wait_for(ctx, dut.control.start)

    async def bench(host, ctx):
        assert await host.write(REG["CONTROL"], field_bits("CONTROL", "start")) == OKAY
        for lead in range(2, 14):                    # the carry lands between the two reads
            ctx.set(dut.counters["CYCLES"], (5 << 32) - lead)
            before = ctx.get(dut.counters["CYCLES"])
            value = await host.read64("CYCLES")
            after = ctx.get(dut.counters["CYCLES"])
            if not before <= value <= after:
                torn.append((lead, hex(value)))

    run(dut, bench, core)
    return torn


def test_64bit_counter_read_is_atomic():
    assert atomic_read_check(make_dut()) == []


class CsrWithoutLatch(CsrBlock):
    @staticmethod
    def _high_half(counter, shadow):
        return counter[32:]


def test_unlatched_counter_read_is_caught():
    assert len(atomic_read_check(CsrWithoutLatch(CONFIG))) > 0


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        CsrBlock(CONFIG, group_log_depth=48)
    with pytest.raises(ValueError, match="addr_width"):
        CsrBlock(CONFIG, addr_width=6)
