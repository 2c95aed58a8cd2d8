# amaranth: UnusedElaboratable=no
"""DMA engine (hw/dma.py) with the AXI4 memory model (hw/axi_mem.py), in Amaranth's simulator.

Roles: a driver offers commands and write words (random gaps), the read-data monitor applies
random back-pressure, a bus monitor records every AXI handshake with its cycle, and the
scoreboard compares with Python references: memory contents (backdoor-loaded bytes, and the
expected image after writes), the burst split (max burst, 4 KiB boundaries), the window rule,
error codes, and the memory model's timing formula (module docstring of hw/axi_mem.py).
Every run has a cycle limit, so a hang fails instead of blocking.
"""

from dataclasses import dataclass, field

import numpy as np
import pytest
from amaranth.hdl import Cat, Module, Mux, Value
from amaranth.lib import wiring
from amaranth.sim import Simulator

from sfnpu.config import CONFIGS, get_config
from sfnpu.hw.axi import BOUNDARY_BYTES, Resp
from sfnpu.hw.axi_mem import AxiMemory
from sfnpu.hw.dma import Direction, DmaEngine
from sfnpu.regmap import ErrorCode
from sfnpu.tb.verilator import to_verilog, verilator_env

READ, WRITE = Direction.READ, Direction.WRITE


class DmaSystem(wiring.Component):
    """The DMA engine wired to the memory model; the engine's other ports and the memory's
    fault-injection inputs are the system's ports (the testbench drives only these)."""

    def __init__(self, config, *, mem_size, init=b"", **dma_args):
        self.config = config
        self.dma = DmaEngine(config, **dma_args)
        self.mem = AxiMemory.from_config(config, size=mem_size, init=init)
        members = {name: member for name, member in self.dma.signature.members.items()
                   if name != "bus"}
        members.update({name: self.mem.signature.members[name]
                        for name in ("error_base", "error_limit", "hang")})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma = self.dma
        m.submodules.mem = self.mem
        wiring.connect(m, self.dma.bus, self.mem.bus)
        for name, member in self.signature.members.items():
            outer = getattr(self, name)
            inner = getattr(self.mem if name in ("error_base", "error_limit", "hang")
                            else self.dma, name)
            if member.is_signature:
                wiring.connect(m, wiring.flipped(outer), inner)
            elif member.flow == wiring.In:
                m.d.comb += inner.eq(outer)
            else:
                m.d.comb += outer.eq(inner)
        return m


@dataclass
class Trace:
    """Handshakes by cycle (cycle 0: the first clock edge after reset)."""
    accepted: list = field(default_factory=list)     # (cycle, command index)
    ar: list = field(default_factory=list)           # (cycle, addr, beats)
    aw: list = field(default_factory=list)
    r: list = field(default_factory=list)            # (cycle, resp)
    w: list = field(default_factory=list)            # (cycle, strb)
    b: list = field(default_factory=list)            # (cycle, resp)
    read_data: list = field(default_factory=list)    # (cycle, data, last)
    read_bytes: int = 0
    write_bytes: int = 0
    max_reads_outstanding: int = 0
    write_busy_low: list = field(default_factory=list)   # cycles write_busy fell
    error: bool = False
    error_code: ErrorCode = ErrorCode.NONE
    error_addr: int = 0
    cycles: int = 0
    memory: bytes = b""


def simulate(system, commands, write_words=(), *, window=(0, 1 << 32), watchdog=0,
             ready=1.0, gaps=0.0, seed=0, max_cycles=20_000, error_range=(0, 0),
             hang=False, settle=8, stop_on_error=False, ready_from=0,
             abort_on_error=True) -> Trace:
    """Run ``commands`` [(address, length, Direction)] to completion.

    ``write_words`` feeds ``write_data`` in order. ``ready``: probability the read-data
    consumer is ready in a cycle (never before cycle ``ready_from``); ``gaps``: probability
    the drivers idle in a cycle. With ``abort_on_error`` the consumer stops being ready once
    the engine reports an error, as an aborted datapath would. The run
    ends ``settle`` cycles after every command was accepted and the engine is idle (or, with
    ``stop_on_error``, has failed); reaching ``max_cycles`` first is a hang.
    """
    dma, mem = system, system.mem
    bus = system.dma.bus
    rng = np.random.default_rng(seed)
    trace = Trace()
    write_words = list(write_words)

    # Probes are built once (building expressions every cycle costs more than simulating).
    probes = (
        dma.cmd.valid & dma.cmd.ready, dma.write_data.valid & dma.write_data.ready,
        dma.read_data.valid & dma.read_data.ready, Value.cast(dma.read_data.payload.data),
        Value.cast(dma.read_data.payload.last),
        bus.ar.valid & bus.ar.ready, Value.cast(bus.ar.payload.addr),
        Value.cast(bus.ar.payload.len),
        bus.aw.valid & bus.aw.ready, Value.cast(bus.aw.payload.addr),
        Value.cast(bus.aw.payload.len),
        bus.r.valid & bus.r.ready, Value.cast(bus.r.payload.resp),
        Value.cast(bus.r.payload.last),
        bus.w.valid & bus.w.ready, Value.cast(bus.w.payload.strb),
        bus.b.valid & bus.b.ready, Value.cast(bus.b.payload.resp),
        dma.read_bytes, dma.write_bytes, dma.idle, dma.error, dma.write_busy)
    # One packed sample per cycle: the simulator's cost is per sampled expression.
    probe = Cat(*probes)
    fields, lsb = [], 0
    for p in probes:
        fields.append((lsb, (1 << len(p)) - 1))
        lsb += len(p)
    cmd_valid, cmd_payload = dma.cmd.valid, Value.cast(dma.cmd.payload)
    word_valid, word_payload = dma.write_data.valid, dma.write_data.payload
    read_ready = dma.read_data.ready
    layout = dma.cmd.payload.shape()
    encoded = [Value.cast(layout.const({"address": a, "length": n, "direction": d})).value
               for a, n, d in commands]
    offer_cmd_draw = (rng.random(max_cycles) >= gaps).tolist()
    offer_word_draw = (rng.random(max_cycles) >= gaps).tolist()
    ready_draw = ((rng.random(max_cycles) < ready)
                  & (np.arange(max_cycles) >= ready_from)).tolist()

    async def bench(ctx):
        ctx.set(dma.window_base, window[0])
        ctx.set(dma.window_limit, window[1])
        ctx.set(dma.watchdog, watchdog)
        ctx.set(dma.error_base, error_range[0])
        ctx.set(dma.error_limit, error_range[1])
        ctx.set(dma.hang, hang)
        next_cmd, next_word, quiet, outstanding = 0, 0, 0, 0
        write_was_busy = failed = False
        for cycle in range(max_cycles):
            offer_cmd = next_cmd < len(commands) and offer_cmd_draw[cycle]
            if offer_cmd:
                ctx.set(cmd_payload, encoded[next_cmd])
            ctx.set(cmd_valid, offer_cmd)
            offer_word = next_word < len(write_words) and offer_word_draw[cycle]
            if offer_word:
                ctx.set(word_payload, write_words[next_word])
            ctx.set(word_valid, offer_word)
            ctx.set(read_ready, ready_draw[cycle] and not (failed and abort_on_error))
            _, _, packed = await ctx.tick().sample(probe)
            (cmd_ok, word_ok, rd_ok, rd_data, rd_last, ar_ok, ar_addr, ar_len, aw_ok,
             aw_addr, aw_len, r_ok, r_resp, r_last, w_ok, w_strb, b_ok, b_resp, rbytes, wbytes,
             idle, error, write_busy) = [packed >> lsb & mask for lsb, mask in fields]
            if cmd_ok:
                trace.accepted.append((cycle, next_cmd))
                next_cmd += 1
            next_word += word_ok
            if rd_ok:
                trace.read_data.append((cycle, rd_data, rd_last))
            if ar_ok:
                trace.ar.append((cycle, ar_addr, ar_len + 1))
                outstanding += 1
            if aw_ok:
                trace.aw.append((cycle, aw_addr, aw_len + 1))
            if r_ok:
                trace.r.append((cycle, Resp(r_resp)))
                outstanding -= r_last
            if w_ok:
                trace.w.append((cycle, w_strb))
            if b_ok:
                trace.b.append((cycle, Resp(b_resp)))
            if write_was_busy and not write_busy:
                trace.write_busy_low.append(cycle)
            write_was_busy = write_busy
            failed = failed or error
            trace.max_reads_outstanding = max(trace.max_reads_outstanding, outstanding)
            trace.read_bytes += rbytes
            trace.write_bytes += wbytes
            finished = next_cmd == len(commands) and (idle or (error and stop_on_error))
            quiet = quiet + 1 if finished else 0
            if quiet == settle:
                break
        else:
            raise AssertionError(f"no completion within {max_cycles} cycles (hang)")
        trace.cycles = cycle
        trace.error = bool(ctx.get(dma.error))
        trace.error_code = ctx.get(dma.error_code)
        trace.error_addr = ctx.get(dma.error_addr)
        trace.memory = mem.backdoor_read(ctx, 0, mem.size)

    sim = Simulator(system)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return trace


# -- Python references ---------------------------------------------------------------------------

def word_range(address, length, bus_bytes):
    return address // bus_bytes, -(-(address + length) // bus_bytes)


def expected_bursts(commands, config, direction):
    """(addr, beats) of every burst: full-width INCR, ≤ max_burst, never across 4 KiB."""
    B = config.dram_bus_bytes
    bursts = []
    for address, length, d in commands:
        if d != direction or length == 0:
            continue
        word, end = word_range(address, length, B)
        while word < end:
            to_boundary = (BOUNDARY_BYTES - word * B % BOUNDARY_BYTES) // B
            beats = min(config.dram_max_burst, end - word, to_boundary)
            bursts.append((word * B, beats))
            word += beats
    return bursts


def check_burst_rules(bursts, config):
    B = config.dram_bus_bytes
    for addr, beats in bursts:
        assert addr % B == 0 and 1 <= beats <= config.dram_max_burst, (addr, beats)
        assert addr // BOUNDARY_BYTES == (addr + beats * B - 1) // BOUNDARY_BYTES, \
            f"burst {addr:#x}+{beats} crosses a 4 KiB boundary"


def split_by_command(read_data):
    commands, current = [], []
    for _, value, last in read_data:
        current.append(value)
        if last:
            commands.append(current)
            current = []
    assert not current, "read data after the last `last`"
    return commands


def words_of(image, word, end, bus_bytes):
    return [int.from_bytes(image[w * bus_bytes:(w + 1) * bus_bytes], "little")
            for w in range(word, end)]


def random_commands(rng, config, count, span, direction, max_length=700):
    B = config.dram_bus_bytes
    out = []
    for _ in range(count):
        length = int(rng.integers(1, max_length))
        if rng.random() < 0.3:                               # aligned, often long
            length = B * int(rng.integers(1, 3 * max_length // B))
        address = int(rng.integers(0, span - length))
        if rng.random() < 0.4:
            address -= address % B
        if rng.random() < 0.2:                               # straddle a 4 KiB boundary
            address = int(rng.integers(1, span // BOUNDARY_BYTES)) * BOUNDARY_BYTES \
                - int(rng.integers(1, 3 * B))
        out.append((address, length, direction))
    return out


# -- random traffic against the references -------------------------------------------------------

@pytest.mark.parametrize("name", ["ecp5", "tiny"])
def test_random_reads_return_memory_contents(name):
    config = get_config(name)
    rng = np.random.default_rng(1)
    size = 4 * BOUNDARY_BYTES
    image = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    commands = random_commands(rng, config, 24, size, READ)
    commands.insert(3, (100, 0, READ))                      # zero length: nothing at all
    system = DmaSystem(config, mem_size=size, init=image)
    trace = simulate(system, commands, ready=0.7, gaps=0.2, seed=2)

    B = config.dram_bus_bytes
    got = split_by_command(trace.read_data)
    expect = [words_of(image, *word_range(a, n, B), B) for a, n, _ in commands if n]
    assert len(got) == len(expect)
    for index, (g, e) in enumerate(zip(got, expect)):
        assert g == e, f"command {index}"
    bursts = [(addr, beats) for _, addr, beats in trace.ar]
    check_burst_rules(bursts, config)
    assert bursts == expected_bursts(commands, config, READ)
    assert any(a // BOUNDARY_BYTES != (a + n - 1) // BOUNDARY_BYTES for a, n, _ in commands)
    assert not trace.aw and not trace.w and not trace.error
    assert all(resp == Resp.OKAY for _, resp in trace.r)
    assert 1 < trace.max_reads_outstanding <= system.dma.read_outstanding
    assert trace.read_bytes == B * sum(beats for _, beats in bursts)


@pytest.mark.parametrize("name", ["ecp5", "tiny"])
def test_random_writes_land_where_expected(name):
    config = get_config(name)
    rng = np.random.default_rng(3)
    size = 4 * BOUNDARY_BYTES
    image = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    commands = random_commands(rng, config, 20, size, WRITE)
    B = config.dram_bus_bytes
    reference = bytearray(image)
    words, written = [], 0
    for address, length, _ in commands:
        first, end = word_range(address, length, B)
        payload = rng.integers(0, 256, (end - first) * B, dtype=np.uint8).tobytes()
        words += [int.from_bytes(payload[i:i + B], "little") for i in range(0, len(payload), B)]
        skip = address - first * B
        reference[address:address + length] = payload[skip:skip + length]
        written += length
    system = DmaSystem(config, mem_size=size, init=image)
    trace = simulate(system, commands, words, gaps=0.3, seed=4)

    assert trace.memory == bytes(reference)
    bursts = [(addr, beats) for _, addr, beats in trace.aw]
    check_burst_rules(bursts, config)
    assert bursts == expected_bursts(commands, config, WRITE)
    assert len(trace.w) == sum(beats for _, beats in bursts) == len(words)
    assert len(trace.b) == len(bursts) and all(r == Resp.OKAY for _, r in trace.b)
    assert trace.write_bytes == written and not trace.ar and not trace.error


def test_reads_and_writes_run_concurrently():
    config = get_config("ecp5")
    rng = np.random.default_rng(5)
    size = 2 * BOUNDARY_BYTES
    image = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    B = config.dram_bus_bytes
    # Reads from the first 4 KiB, writes to the second, interleaved in one command stream.
    reads = [(64 * i, 256, READ) for i in range(8)]
    writes = [(BOUNDARY_BYTES + 256 * i, 256, WRITE) for i in range(8)]
    commands = [c for pair in zip(reads, writes) for c in pair]
    payload = rng.integers(0, 256, 8 * 256, dtype=np.uint8).tobytes()
    words = [int.from_bytes(payload[i:i + B], "little") for i in range(0, len(payload), B)]
    trace = simulate(DmaSystem(config, mem_size=size, init=image), commands, words)
    assert trace.memory[BOUNDARY_BYTES:BOUNDARY_BYTES + len(payload)] == payload
    assert split_by_command(trace.read_data) == [words_of(image, *word_range(a, n, B), B)
                                                 for a, n, _ in reads]
    # Both directions were active in overlapping periods, sharing the bandwidth credit.
    assert trace.r[0][0] < trace.w[-1][0] and trace.w[0][0] < trace.r[-1][0]
    check_credit(config, [c for c, _ in trace.r] + [c for c, _ in trace.w])


class DmaIgnoring4KiB(DmaEngine):
    def _burst_words(self, m, next_word, words_left):
        return Mux(words_left < self.max_burst, words_left, self.max_burst)


def test_bursts_across_4kib_are_caught():
    config = get_config("tiny")
    commands = [(BOUNDARY_BYTES - 40, 200, READ)]
    system = DmaSystem(config, mem_size=2 * BOUNDARY_BYTES)
    system.dma = DmaIgnoring4KiB(config)
    trace = simulate(system, commands)
    with pytest.raises(AssertionError, match="crosses a 4 KiB boundary"):
        check_burst_rules([(addr, beats) for _, addr, beats in trace.ar], config)


# -- the DMA window -------------------------------------------------------------------------------

WINDOW = (0x1000, 0x3000)


@pytest.mark.parametrize("address,length", [
    (0x0000, 64),           # entirely below
    (0x3000, 64),           # entirely above (limit is exclusive)
    (0x0FF0, 64),           # starts below
    (0x2FF0, 17),           # ends one byte past the limit
    (0x1001, 0x2000),       # ends one byte past the limit, unaligned start
])
@pytest.mark.parametrize("direction", [READ, WRITE])
def test_window_violation_issues_nothing_and_stops(address, length, direction):
    config = get_config("ecp5")
    system = DmaSystem(config, mem_size=4 * BOUNDARY_BYTES)
    words = [0x12345678] * 64
    later = (0x1000, 64, direction)                  # discarded after the error
    trace = simulate(system, [(address, length, direction), later], words,
                     window=WINDOW, max_cycles=200)
    assert trace.error and trace.error_code == ErrorCode.DMA_WINDOW
    assert trace.error_addr == address
    assert not (trace.ar or trace.aw or trace.w or trace.read_data)
    assert len(trace.accepted) == 2 and trace.cycles < 20
    assert trace.memory == bytes(4 * BOUNDARY_BYTES)


def test_range_wrapping_the_address_space_is_refused():
    config = get_config("ecp5")
    trace = simulate(DmaSystem(config, mem_size=BOUNDARY_BYTES), [(0xFFFF_FFF0, 0x40, READ)],
                     window=(0, 1 << 40), max_cycles=100)
    assert trace.error_code == ErrorCode.DMA_WINDOW and not trace.ar


def test_window_edges_are_inclusive_of_base_and_exclusive_of_limit():
    config = get_config("ecp5")
    image = bytes(range(256)) * 64
    commands = [(WINDOW[0], 4, READ), (WINDOW[1] - 4, 4, READ), (WINDOW[1] - 7, 3, READ)]
    trace = simulate(DmaSystem(config, mem_size=len(image), init=image), commands,
                     window=WINDOW)
    assert not trace.error and len(split_by_command(trace.read_data)) == 3


def test_clear_resumes_after_an_error():
    config = get_config("ecp5")
    image = bytes(range(256)) * 64
    system = DmaSystem(config, mem_size=len(image), init=image)
    dma = system

    async def bench(ctx):
        ctx.set(dma.window_base, WINDOW[0])
        ctx.set(dma.window_limit, WINDOW[1])
        ctx.set(dma.read_data.ready, 1)
        ctx.set(dma.cmd.payload, {"address": 0, "length": 4, "direction": READ})
        ctx.set(dma.cmd.valid, 1)
        await ctx.tick().until(dma.cmd.ready)
        ctx.set(dma.cmd.valid, 0)
        await ctx.tick()                  # pending
        assert not ctx.get(dma.error)
        await ctx.tick()                  # decoded: the window check fails
        assert ctx.get(dma.error) and ctx.get(dma.error_code) == ErrorCode.DMA_WINDOW
        ctx.set(dma.clear, 1)
        await ctx.tick()
        ctx.set(dma.clear, 0)
        assert not ctx.get(dma.error) and ctx.get(dma.error_code) == ErrorCode.NONE
        ctx.set(dma.cmd.payload, {"address": 0x1004, "length": 4, "direction": READ})
        ctx.set(dma.cmd.valid, 1)
        await ctx.tick().until(dma.cmd.ready)
        ctx.set(dma.cmd.valid, 0)
        value, = await ctx.tick().sample(dma.read_data.payload.data).until(
            dma.read_data.valid)
        assert value == int.from_bytes(image[0x1004:0x1008], "little")

    sim = Simulator(system)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


# -- AXI error responses and the watchdog ---------------------------------------------------------

def test_read_error_response_stops_and_drains():
    config = get_config("tiny")
    B = config.dram_bus_bytes
    image = bytes(range(256)) * 64
    bad = (0x800, 0x808)                                  # one word answers SLVERR
    commands = [(0x700, 0x400, READ), (0x2000, 64, READ)]
    trace = simulate(DmaSystem(config, mem_size=len(image), init=image), commands,
                     error_range=bad, ready=0.8)
    assert trace.error and trace.error_code == ErrorCode.AXI_READ_ERROR
    bursts = expected_bursts(commands[:1], config, READ)
    failing = next(addr for addr, beats in bursts if addr <= bad[0] < addr + beats * B)
    assert trace.error_addr == failing
    # Words before the bad one were delivered, nothing from it on; every burst already issued
    # was drained (no beat left in flight), no further command ran.
    delivered = [value for _, value, _ in trace.read_data]
    assert delivered == words_of(image, 0x700 // B, bad[0] // B, B)
    assert sum(beats for _, _, beats in trace.ar) == len(trace.r)
    error_cycle = next(cycle for cycle, resp in trace.r if resp != Resp.OKAY)
    assert all(cycle <= error_cycle + 1 for cycle, _, _ in trace.ar)    # none issued after
    assert all(addr < 0x2000 for _, addr, _ in trace.ar)


def test_write_error_response_and_decode_error():
    config = get_config("ecp5")
    size = 2 * BOUNDARY_BYTES
    words = list(range(1, 200))
    # SLVERR inside the memory; DECERR past its end (the window allows it).
    for command, error_range, expect_addr in (
            ((0x100, 0x100, WRITE), (0x180, 0x184), 0x100 + 16 * 4 * 2),
            ((size - 32, 64, WRITE), (0, 0), size)):
        trace = simulate(DmaSystem(config, mem_size=size), [command], words,
                         error_range=error_range)
        assert trace.error and trace.error_code == ErrorCode.AXI_WRITE_ERROR
        assert trace.error_addr == expect_addr
        # Every W beat owed was sent (no hang); the bad word was not written.
        assert len(trace.w) == sum(beats for _, _, beats in trace.aw)
        assert len(trace.b) == len(trace.aw)
        lo, hi = error_range
        assert trace.memory[lo:hi] == bytes(hi - lo)


@pytest.mark.parametrize("direction", [READ, WRITE])
def test_watchdog_reports_a_dead_slave(direction):
    config = get_config("ecp5")
    watchdog = 50
    trace = simulate(DmaSystem(config, mem_size=BOUNDARY_BYTES), [(0, 64, direction)],
                     [1] * 16, watchdog=watchdog, hang=True, max_cycles=200,
                     stop_on_error=True)
    assert trace.error and trace.error_code == ErrorCode.TIMEOUT
    assert trace.cycles <= watchdog + 16


def test_watchdog_quiet_under_long_latency():
    """The memory's latency is waiting on the slave, but below the limit."""
    config = get_config("ecp5").replace(dram_latency=40)
    trace = simulate(DmaSystem(config, mem_size=BOUNDARY_BYTES), [(0, 256, READ)],
                     watchdog=41)
    assert not trace.error


# -- timing: the memory model's formula, end to end ------------------------------------------------

def check_credit(config, beat_cycles):
    """The memory's credit rule (hw/axi_mem.py), replayed: no beat without a full beat of
    credit, at most one beat per cycle."""
    bpc = config.dram_bytes_per_cycle
    p, q, B = bpc.numerator, bpc.denominator, config.dram_bus_bytes
    cost, cap = B * q, B * q + p - 1
    beats = sorted(beat_cycles)
    assert len(set(beats)) == len(beats), "two beats in one cycle"
    credit, last = cap, 0
    for cycle in beats:
        credit = min(cap, credit + p * (cycle - last))
        assert credit >= cost, f"beat in cycle {cycle} without credit"
        credit -= cost
        last = cycle


#: The reference configurations, plus bandwidths that are not a whole number of bytes per
#: cycle (3, 5/2 and 33/10 bytes per cycle), where the credit counter's fractions matter.
TIMING_CONFIGS = {
    **CONFIGS,
    "ecp5 3 B/cycle": get_config("ecp5").replace(dram_bandwidth_gbps=0.3),
    "ecp5 5/2 B/cycle": get_config("ecp5").replace(dram_bandwidth_gbps=0.25),
    "tiny 33/10 B/cycle": get_config("tiny").replace(dram_bandwidth_gbps=0.33),
}


@pytest.mark.parametrize("name", list(TIMING_CONFIGS))
def test_long_read_and_write_follow_the_bandwidth_formula(name):
    config = TIMING_CONFIGS[name]
    B, L = config.dram_bus_bytes, config.dram_latency
    beats = 8 * config.dram_max_burst
    length = beats * B
    system = DmaSystem(config, mem_size=2 * length, init=bytes(range(256)) * (length // 128))
    mem = system.mem
    trace = simulate(system, [(0, length, READ)])
    accepted = trace.accepted[0][0]
    first_ar = trace.ar[0][0]
    assert first_ar == accepted + DmaEngine.ISSUE_LATENCY
    got = [cycle for cycle, _, _ in trace.read_data]
    expect = [first_ar + L + mem.beat_cycle(k) for k in range(beats)]
    assert got == expect
    assert got[-1] - first_ar + 1 == mem.read_cycles(beats) == \
        L + (beats - 1) * B * config.dram_bytes_per_cycle.denominator \
        // config.dram_bytes_per_cycle.numerator + 1

    words = list(range(beats))
    trace = simulate(DmaSystem(config, mem_size=2 * length), [(length, length, WRITE)], words)
    accepted = trace.accepted[0][0]
    first_w = accepted + DmaEngine.ISSUE_LATENCY + 1     # AW accepted the cycle before
    assert trace.aw[0][0] == first_w - 1
    assert [c for c, _ in trace.w] == [first_w + mem.beat_cycle(k) for k in range(beats)]
    # Each response: max(AW + L, last W + 1); write_busy falls the cycle after the last one.
    ends = np.cumsum([n for _, _, n in trace.aw]) - 1
    for (aw_cycle, _, _), end, (b_cycle, _) in zip(trace.aw, ends, trace.b):
        assert b_cycle == max(aw_cycle + L, trace.w[end][0] + 1)
    assert trace.write_busy_low == [trace.b[-1][0] + 1]


def test_one_outstanding_read_exposes_the_latency():
    config = get_config("tiny")
    B, L = config.dram_bus_bytes, config.dram_latency
    n = config.dram_max_burst
    length = 4 * n * B
    system = DmaSystem(config, mem_size=length, read_outstanding=1)
    trace = simulate(system, [(0, length, READ)])
    last_beats = [trace.read_data[(j + 1) * n - 1][0] for j in range(4)]
    for j, (ar_cycle, _, _) in enumerate(trace.ar):
        if j:
            assert ar_cycle == last_beats[j - 1] + DmaEngine.REISSUE_LATENCY
        assert trace.read_data[j * n][0] == ar_cycle + L
    fast = simulate(DmaSystem(config, mem_size=length), [(0, length, READ)])
    assert trace.cycles - fast.cycles >= 3 * L


def test_a_waiting_read_beat_does_not_block_writes():
    config = get_config("ecp5")
    commands = [(0, 64, READ), (2048, 256, WRITE)]
    trace = simulate(DmaSystem(config, mem_size=4096), commands, list(range(64)),
                     ready_from=400)
    assert trace.write_busy_low and trace.write_busy_low[0] < 400 <= trace.read_data[0][0]
    assert trace.memory[2048:2048 + 256] == b"".join(i.to_bytes(4, "little")
                                                     for i in range(64))


def test_saturated_read_and_write_share_the_bandwidth():
    config = get_config("tiny")            # a full-rate bus: one beat per cycle in total
    n = 16 * config.dram_max_burst
    B = config.dram_bus_bytes
    commands = [(0, n * B, READ), (n * B, n * B, WRITE)]
    trace = simulate(DmaSystem(config, mem_size=2 * n * B), commands, list(range(n)))
    beats = [c for c, _ in trace.r] + [c for c, _ in trace.w]
    check_credit(config, beats)
    both = [c for c in range(max(trace.r[0][0], trace.w[0][0]) + 4,
                             min(trace.r[-1][0], trace.w[-1][0]) - 4)]
    assert len(both) > 100
    r_cycles = {c for c, _ in trace.r}
    share = sum(c in r_cycles for c in both) / len(both)
    assert 0.45 < share < 0.55                          # alternating beats


# -- elaboration and Verilog ----------------------------------------------------------------------

def test_parameters_are_checked():
    config = get_config("ecp5")
    with pytest.raises(ValueError):
        DmaEngine(config, length_bits=40)
    with pytest.raises(ValueError):
        AxiMemory(size=6, data_width=32, latency=1, bytes_per_cycle=1)
    with pytest.raises(ValueError):
        AxiMemory(size=64, data_width=32, latency=1, bytes_per_cycle=5)


def test_verilator_accepts_the_generated_verilog(tmp_path):
    """The memory model is meant for Verilator system tests: the DMA and the model (with its
    initial contents) must pass Verilator's lint."""
    import subprocess

    system = DmaSystem(get_config("tiny"), mem_size=1024, init=bytes(range(256)) * 4)
    path = tmp_path / "dma_system.v"
    path.write_text(to_verilog(system, "dma_system"))
    result = subprocess.run(["verilator", "--lint-only", "-Wno-fatal", "-Wno-WIDTH",
                             "--top-module", "dma_system", str(path)],
                            env=verilator_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
