"""SkidBuffer: every beat out once, in order; ``ready`` and the outputs from registers; a beat
per cycle; one cycle of latency when the output is not stalled."""

import random

import pytest
from amaranth.sim import Simulator

from sfnpu.hw.skid_buffer import SkidBuffer


FORMS = pytest.mark.parametrize("payload_register", [False, True],
                                ids=["two-slots", "payload-register"])


def simulate(seed, payload_register, cycles=3000, width=12):
    """Random valid/ready in phases; returns the beats in, the beats out with their cycles,
    and per cycle (i.ready, o.valid, o.payload) sampled before the inputs of that cycle."""
    dut = SkidBuffer(width, payload_register=payload_register)
    i, o = dut.i_stream, dut.o_stream
    rng = random.Random(seed)
    log = {"sent": [], "received": [], "ready_before": [], "ready_after": [], "latency": []}

    async def bench(ctx):
        offered, taken_at = None, {}
        for cycle in range(cycles):
            phase = (cycle // 41) % 3
            p_valid, p_ready = ((0.95, 0.25), (0.35, 0.95), (0.9, 0.9))[phase]
            # ready and the outputs before this cycle's inputs are applied: registers only
            log["ready_before"].append((ctx.get(i.ready), ctx.get(o.valid), ctx.get(o.payload)))
            if offered is None and rng.random() < p_valid:
                offered = rng.randrange(1 << width)
            ctx.set(i.valid, offered is not None)
            ctx.set(i.payload, offered or 0)
            ctx.set(o.ready, rng.random() < p_ready)
            await ctx.delay(1e-9)
            log["ready_after"].append((ctx.get(i.ready), ctx.get(o.valid), ctx.get(o.payload)))
            if ctx.get(o.valid) and ctx.get(o.ready):
                beat = ctx.get(o.payload)
                log["received"].append(beat)
                log["latency"].append(cycle - taken_at.pop(len(log["received"]) - 1))
            if offered is not None and ctx.get(i.ready):
                taken_at[len(log["sent"])] = cycle
                log["sent"].append(offered)
                offered = None
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return log


@FORMS
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_beat_once_in_order(seed, payload_register):
    log = simulate(seed, payload_register)
    assert len(log["received"]) > 1000
    assert log["received"] == log["sent"][:len(log["received"])]
    assert len(log["sent"]) - len(log["received"]) <= 2          # at most two held


@FORMS
@pytest.mark.parametrize("seed", [0, 1])
def test_ready_and_outputs_are_registers(seed, payload_register):
    """Within a cycle, nothing the testbench drives (valid, payload, the output's ready)
    moves ``i_stream.ready``, ``o_stream.valid`` or ``o_stream.payload``."""
    log = simulate(seed, payload_register)
    assert log["ready_before"] == log["ready_after"]


@FORMS
def test_full_rate_and_one_cycle_latency(payload_register):
    """Valid and ready always high: a beat in and a beat out every cycle, each out the
    cycle after it is taken."""
    dut = SkidBuffer(8, payload_register=payload_register)
    i, o = dut.i_stream, dut.o_stream
    out = []

    async def bench(ctx):
        ctx.set(o.ready, 1)
        ctx.set(i.valid, 1)
        for cycle in range(20):
            ctx.set(i.payload, cycle)
            await ctx.delay(1e-9)
            assert ctx.get(i.ready)
            if ctx.get(o.valid):
                out.append((cycle, ctx.get(o.payload)))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert out == [(c, c - 1) for c in range(1, 20)]


@pytest.mark.parametrize("seed", [0, 3])
def test_both_forms_behave_alike_cycle_by_cycle(seed):
    """The same traffic through either form: the same ``i_stream.ready``, ``o_stream.valid``
    and, while valid, payload in every cycle (the cycle model sees one two-beat queue)."""
    def ports(log):
        return [(ready, valid, payload if valid else None)
                for ready, valid, payload in log["ready_before"]]
    assert ports(simulate(seed, False)) == ports(simulate(seed, True))
