# amaranth: UnusedElaboratable=no
"""The group controller's command arbiter (hw/controller/arbiter.py), in Amaranth's simulator:
in the compute phase the highest-priority valid requester reaches the DMA command port and
alone sees its ``ready`` (the DMA's for its own command's direction); outside it only the
sequencer's ``control`` stream does."""

import itertools

from amaranth.sim import Simulator

from sfnpu.hw.controller.arbiter import PRIORITY, CommandArbiter
from sfnpu.hw.dma import Direction, command_layout


def test_priorities_in_and_out_of_the_compute_phase():
    dut = CommandArbiter(command_layout(32, 24))
    names = (*PRIORITY, "control")
    address = {name: 0x100 * (k + 1) for k, name in enumerate(names)}

    async def bench(ctx):
        for name in names:
            port = getattr(dut, name)
            ctx.set(port.payload.address, address[name])
            ctx.set(port.payload.length, names.index(name) + 1)
            ctx.set(port.payload.direction,
                    Direction.WRITE if name == "write" else Direction.READ)
        for compute, takes_read, takes_write in itertools.product((0, 1), repeat=3):
            ctx.set(dut.compute, compute)
            ctx.set(dut.takes_read, takes_read)
            ctx.set(dut.takes_write, takes_write)
            for valid in itertools.product((0, 1), repeat=len(names)):
                for name, v in zip(names, valid):
                    ctx.set(getattr(dut, name).valid, v)
                await ctx.delay(1e-9)
                asking = [n for n, v in zip(names, valid) if v and
                          (n != "control") == bool(compute)]
                winner = asking[0] if asking else None
                assert ctx.get(dut.cmd.valid) == (winner is not None)
                if winner is not None:
                    assert ctx.get(dut.cmd.payload.address) == address[winner]
                    assert ctx.get(dut.cmd.payload.length) == names.index(winner) + 1
                for name in names:
                    # control sees the DMA's ready whenever it owns the port
                    owner = name == winner or (name == "control" and not compute)
                    ready = takes_write if name == "write" else takes_read
                    expect = ready if owner else 0
                    assert ctx.get(getattr(dut, name).ready) == expect, (compute, valid, name)

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


def test_priority_order_is_data():
    dut = CommandArbiter(command_layout(32, 24), priority=("prefetch", "write"))
    assert dut.priority == ("prefetch", "write")

    async def bench(ctx):
        ctx.set(dut.compute, 1)
        ctx.set(dut.takes_read, 1)
        ctx.set(dut.takes_write, 1)
        ctx.set(dut.prefetch.payload.address, 7)
        ctx.set(dut.write.payload.address, 9)
        ctx.set(dut.prefetch.valid, 1)
        ctx.set(dut.write.valid, 1)
        await ctx.delay(1e-9)
        assert ctx.get(dut.cmd.payload.address) == 7
        assert ctx.get(dut.prefetch.ready) == 1 and ctx.get(dut.write.ready) == 0

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
