# amaranth: UnusedElaboratable=no
"""The cycle model's components (sim/cycle/) against the RTL block each one times, alone, in
Amaranth's simulator: cycle for cycle.

* :class:`~sfnpu.sim.cycle.dram.DmaTiming` (a control-FSM read: its bursts and cycles) and
  :class:`~sfnpu.sim.cycle.dram.CommandArbiter`'s bus (reads and writes through the DMA's two
  directions on the memory's one bandwidth credit) against ``hw/dma.py`` + ``hw/axi_mem.py``,
  on the configurations whose beat is a whole number of cycles;
* :class:`~sfnpu.sim.cycle.upsample.Upsampler` against ``hw/upsample.py``;
* the post chain's global average pool (:func:`~sfnpu.sim.cycle.post_chain.gap_outputs`)
  against ``hw/gap.py``;
* :class:`~sfnpu.sim.cycle.avg_pool.AvgPool`'s walk (line buffers, window sums, dividers)
  against ``hw/avgpool.py``, free-running (its hold on the array needs the result FIFO).

The other components (input and shortcut readers, weight stream, output writer, the rest of
the post chain, the average pool's hold) are checked only through the whole accelerator
(``tests/test_system.py``).
"""

from types import SimpleNamespace

import numpy as np
import pytest
from amaranth.sim import Simulator

from sfnpu.config import get_config
from sfnpu.hw.avgpool import AvgPool as AvgPoolRtl
from sfnpu.hw.gap import GlobalAvgPool
from sfnpu.hw.upsample import Upsample2x
from sfnpu.isa import Pool
from sfnpu.sim.cycle.avg_pool import AvgPool
from sfnpu.sim.cycle.dram import CommandArbiter, DmaTiming
from sfnpu.sim.cycle.post_chain import gap_outputs
from sfnpu.sim.cycle.upsample import Upsampler

from test_hw_dma import READ, WRITE, DmaSystem, simulate

#: Configurations whose DRAM beat takes a whole number of cycles (the model's exact domain):
#: the three references, and tiny at half its bandwidth, at short and long latency.
TINY = get_config("tiny")
DRAM_CONFIGS = {
    "tiny": TINY,
    "ecp5": get_config("ecp5"),
    "kcu1500": get_config("kcu1500"),
    "tiny half bandwidth": TINY.replace(dram_bandwidth_gbps=TINY.dram_bandwidth_gbps / 2),
    "tiny latency 4": TINY.replace(dram_latency=4),
    "tiny latency 64": TINY.replace(dram_latency=64),
    "ecp5 bursts of 4": get_config("ecp5").replace(dram_max_burst=4),
}
MEMORY = 4 * 4096


@pytest.mark.parametrize("name", ["tiny", "ecp5", "kcu1500"])
@pytest.mark.parametrize("address, length", [
    (0, 64), (40, 1000),
    (4096 - 136, 512),         # a short burst among full ones: the outstanding limit shows
    (4096 - 8, 300),           # a one-beat burst first
    (2 * 4096 - 3, 4100),      # unaligned at both ends, across two boundaries
])
def test_control_read_matches_the_dma(name, address, length):
    """A control-FSM read: the DMA's bursts, and the cycles from the command's acceptance to
    its last beat, inclusive."""
    config = DRAM_CONFIGS[name]
    dma = DmaTiming(config)
    trace = simulate(DmaSystem(config, mem_size=MEMORY), [(address, length, READ)])
    cycles, beats = dma.control_read(address, length)
    assert [n for _, _, n in trace.ar] == dma.bursts(address, beats)
    assert len(trace.read_data) == beats
    assert trace.read_data[-1][0] - trace.accepted[0][0] + 1 == cycles


def random_commands(rng, count):
    return [(int(rng.integers(0, 3 * 4096)), int(rng.integers(1, 700)),
             READ if rng.random() < 0.5 else WRITE) for _ in range(count)]


@pytest.mark.parametrize("name", list(DRAM_CONFIGS))
def test_command_arbiter_matches_the_dma(name):
    """Commands offered one after another (the next in the cycle after the previous one is
    accepted), reads and writes mixed: each read's end, the last write response and the bus
    beats, the model's from the cycles the commands were offered."""
    config = DRAM_CONFIGS[name]
    dma = DmaTiming(config)
    rng = np.random.default_rng(sum(map(ord, name)))
    for _ in range(2):
        commands = random_commands(rng, 6)
        words = sum(dma.beats(a, n) for a, n, d in commands if d == WRITE)
        trace = simulate(DmaSystem(config, mem_size=MEMORY), commands, list(range(words)))
        first = trace.accepted[0][0]
        offered = [0] + [cycle - first + 1 for cycle, _ in trace.accepted[:-1]]
        arbiter = CommandArbiter(dma)
        handles = [arbiter.write(request, a, n) if d == WRITE else arbiter.read(request, a, n)
                   for request, (a, n, d) in zip(offered, commands)]
        reads = [arbiter.finish(h) for h, (_, _, d) in zip(handles, commands) if d == READ]
        last_response = arbiter.drain()
        assert reads == [cycle - first + 1 for cycle, _, last in trace.read_data if last]
        if trace.b:
            assert last_response == trace.b[-1][0] - first
        assert arbiter.beats_moved == len(trace.r) + len(trace.w)


def offered_stream(dut, arrivals, outputs, config):
    """A testbench: input word k offered from cycle ``arrivals[k]`` on (held until taken),
    the output always ready; the cycles of the first ``outputs`` output beats."""
    out = []

    async def bench(ctx):
        for name, value in config.items():
            ctx.set(getattr(dut, name), value)
        ctx.set(dut.o_stream.ready, 1)
        k = 0
        for cycle in range(arrivals[-1] + 8 * len(arrivals) + 40 * outputs + 16):
            offer = k < len(arrivals) and cycle >= arrivals[k]
            ctx.set(dut.i_stream.valid, offer)
            _, _, taken, valid = await ctx.tick().sample(dut.i_stream.ready, dut.o_stream.valid)
            k += bool(offer and taken)
            if valid:
                out.append(cycle)
            if len(out) == outputs:
                return

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


def upsampler_beats(arrivals, width):
    """Cycles of Upsample2x's output beats."""
    return offered_stream(Upsample2x(lanes=4, max_width=width), arrivals, 4 * len(arrivals),
                          {"enable": 1, "in_w": width})


@pytest.mark.parametrize("blocks, width, rows, seed", [(1, 5, 3, 0), (3, 2, 4, 1),
                                                       (2, 1, 3, 2), (2, 6, 2, 3)])
def test_upsampler_matches_upsample2x(blocks, width, rows, seed):
    """Rows of ``blocks`` interleaved segments of ``width`` words, arriving with random gaps
    (some during the previous row's replay): every output beat's cycle, the first copy's and
    the replay's."""
    rng = np.random.default_rng(seed)
    arrivals = (np.cumsum(rng.integers(0, 4, rows * blocks * width)) + 1).tolist()
    plan = SimpleNamespace(obs=blocks, pooled_w=width, reads_map=False,
                           instr=SimpleNamespace(pool=Pool.NONE))
    # one write per word, no chain behind: the model's readies are the beats themselves
    writer = SimpleNamespace(rows_out=2, per_block=2 * width, chunk=1, latency=0)
    upsampler = Upsampler(plan, writer)
    post, expect = -1, []
    words = blocks * width
    for r in range(rows):
        row = arrivals[r * words:(r + 1) * words]
        post, beats = upsampler.row(post, [row[b * width:(b + 1) * width]
                                           for b in range(blocks)])
        expect += beats
    assert upsampler_beats(arrivals, blocks * width) == expect


@pytest.mark.parametrize("lanes, in_h, in_w, blocks, block_cycles", [
    (8, 2, 3, 1, 3),
    (8, 2, 3, 3, 3),           # blocks closer than an output: each waits for the one before
    (8, 3, 4, 4, 20),
    (8, 2, 5, 3, 9),
    (4, 2, 2, 5, 2),
    (16, 2, 6, 3, 30),
])
def test_gap_outputs_match_global_avg_pool(lanes, in_h, in_w, blocks, block_cycles):
    """The last row's blocks end ``block_cycles`` apart (their words back to back before
    that): each block's output beat, from the cycle the last block's last word is offered."""
    arrivals = list(range(1, (in_h - 1) * blocks * in_w + 1))
    first_end = len(arrivals) + 20 + in_w
    ends = [first_end + b * block_cycles for b in range(blocks)]
    arrivals += [end - in_w + 1 + x for end in ends for x in range(in_w)]
    dut = GlobalAvgPool(lanes, max_height=16, max_width=32, max_blocks=blocks)
    got = offered_stream(dut, arrivals, blocks, {
        "enable": 1, "in_h": in_h, "in_w": in_w, "blocks": blocks, "multiplier": 0x3C000000})
    assert [cycle - ends[-1] for cycle in got] == gap_outputs(lanes, blocks, block_cycles)


@pytest.mark.parametrize("h, w, blocks, kernel, stride, pad, pixel_step, gaps", [
    (4, 4, 1, 2, 2, 0, 1, 0),
    (6, 5, 2, 3, 1, 1, 2, 3),
    (7, 7, 1, 3, 2, 1, 4, 10),
    (5, 6, 3, 2, 1, 0, 9, 0),
    (8, 8, 2, 2, 2, 0, 2, 40),
])
def test_avg_pool_walk_matches_avgpool(h, w, blocks, kernel, stride, pad, pixel_step, gaps):
    """Conv rows of ``blocks`` segments of ``w`` words, a word every ``pixel_step`` cycles,
    rows up to ``gaps`` cycles apart; the pool's input an unbounded queue (no hold): every
    output word's cycle. The model's word is in the write buffer, a cycle after the pool's
    output."""
    rng = np.random.default_rng(h * w)
    out_h, out_w = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    row = blocks * w * pixel_step
    plan = SimpleNamespace(
        instr=SimpleNamespace(pool_size=kernel, pool_stride=stride, pool_pad=pad),
        s=SimpleNamespace(conv_w=w, conv_h=h, ib=1), obs=blocks, pooled_w=out_w,
        pooled_h=out_h, pass_cycles=w * pixel_step, row=row, first_step=pixel_step - 1,
        pixel_step=pixel_step)
    model = SimpleNamespace(config=TINY, result_latency=0)
    pool = AvgPool(model, plan, stages=0)
    starts = np.cumsum([0] + [row + int(g) for g in rng.integers(0, gaps + 1, h - 1)]).tolist()
    arrival = [[start + pool._step(k) + pool.to_pool for k in range(blocks * w)]
               for start in starts]
    results, words = [], []
    for r, start in enumerate(starts):
        pool.rows.append((start, row, 0))                 # free run: no hold
        results.append(arrival[r][-1] - 1)     # the last result: at the pool a cycle later
        for _, _, row_words in pool.advance(r, results):
            words += row_words
    dut = AvgPoolRtl(4, max_width=16, max_height=16, max_blocks=blocks)
    got = offered_stream(dut, sum(arrival, []), blocks * out_h * out_w, {
        "enable": 1, "x_scale": 0x3F800000, "y_scale": 0x3F800000, "kernel": kernel,
        "stride": stride, "pad": pad, "count_include_pad": 1, "in_h": h, "in_w": w,
        "out_h": out_h, "out_w": out_w, "blocks": blocks})
    assert [cycle + 1 for cycle in got] == words
