# amaranth: UnusedElaboratable=no
"""The group controller's read router (hw/controller/router.py), in Amaranth's simulator: in the
compute phase each DMA read's beats go to the agent whose command was granted, in grant order
(input and shortcut beats gathered into words, weight beats into steps, prefetch beats as
they are); outside it every beat is taken and none is routed."""

from amaranth.sim import Simulator

from sfnpu.hw.controller.router import ReadRouter

BUS, LANES, STEP = 4, 8, 16


def test_beats_follow_the_grants():
    dut = ReadRouter(BUS, LANES, STEP)
    # (agent, beats) in grant order
    reads = [("input", 4), ("weights", 8), ("prefetch", 3), ("shortcut", 2), ("input", 2)]
    beats = {name: [] for name in ("input", "weights", "shortcut", "prefetch")}
    got = {name: [] for name in beats}
    counter = iter(range(1, 1000))

    async def monitor(ctx):
        names = ("input", "weights", "shortcut", "prefetch")
        ports = [getattr(dut, name) for name in names]
        async for _, _, *values in ctx.tick().sample(
                *(p.valid for p in ports), *(p.payload for p in ports)):
            for k, name in enumerate(names):
                if values[k]:
                    payload = values[len(names) + k]
                    got[name].append(payload["data"] if name == "prefetch" else payload)

    async def bench(ctx):
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        ctx.set(dut.compute, 1)
        for name, _ in reads:                       # one grant per cycle
            ctx.set(getattr(dut, f"grant_{name}"), 1)
            await ctx.tick()
            ctx.set(getattr(dut, f"grant_{name}"), 0)
        for name, count in reads:
            for k in range(count):
                value = next(counter)
                beats[name].append(value)
                ctx.set(dut.read.payload.data, value)
                ctx.set(dut.read.payload.last, k == count - 1)
                ctx.set(dut.read.valid, 1)
                await ctx.tick().until(dut.read.ready)
            ctx.set(dut.read.valid, 0)
            await ctx.tick()
        assert not ctx.get(dut.read.ready)          # no tag left: nothing more is taken
        ctx.set(dut.compute, 0)
        ctx.set(dut.read.valid, 1)
        await ctx.delay(1e-9)
        assert ctx.get(dut.read.ready) and not ctx.get(dut.input.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(monitor)
    sim.add_testbench(bench)
    sim.run_until(2e-4)

    def gathered(values, per_word):
        return [sum(v << (32 * j) for j, v in enumerate(values[k:k + per_word]))
                for k in range(0, len(values), per_word)]
    assert got["input"] == gathered(beats["input"], LANES // BUS)
    assert got["shortcut"] == gathered(beats["shortcut"], LANES // BUS)
    assert got["weights"] == gathered(beats["weights"], STEP // BUS)
    assert got["prefetch"] == beats["prefetch"]
