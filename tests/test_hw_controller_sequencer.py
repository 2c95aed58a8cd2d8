# amaranth: UnusedElaboratable=no
"""The group controller's sequencer (hw/controller/sequencer.py) alone, in Amaranth's simulator,
on DRAM buses of 4, 8, 16 and 64 bytes: it reads an image through a DMA stand-in that serves
every read command from the image's bytes, and in each group's compute phase its operand pitch
registers hold the group's geometry (:func:`sfnpu.layout.geometry`) — dense ones it derives,
or a windowed group's from the window record it passed while loading the parameter block."""

from pathlib import Path

import pytest
from amaranth.sim import Simulator

from sfnpu import image, layout
from sfnpu.config import get_config
from sfnpu.hw.controller.sequencer import Sequencer
from sfnpu.hw.dma import command_layout
from test_system import STRIPS, column_strips, compiled_image

#: Group registers and the Geometry fields they hold.
REGISTERS = {"in_row_bytes": "in_row", "in_plane": "in_plane", "out_row_bytes": "out_row",
             "out_plane": "out_plane", "sc_row_bytes": "sc_row", "sc_plane": "sc_plane"}


def geometries_in_compute(config, blob):
    """Each group's pitch registers in its compute phase, as Geometry field values."""
    dut = Sequencer(config, 32, command_layout(32, 24))
    B = config.dram_bus_bytes
    seen = []

    async def bench(ctx):
        ctx.set(dut.dma_idle, 1)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        while not ctx.get(dut.done):
            assert not ctx.get(dut.error), ctx.get(dut.error_code)
            if ctx.get(dut.cmd.valid):
                address, length = ctx.get(dut.cmd.payload.address), ctx.get(
                    dut.cmd.payload.length)
                ctx.set(dut.cmd.ready, 1)
                await ctx.tick()
                ctx.set(dut.cmd.ready, 0)
                # bus-aligned beats, as the DMA reads them
                first, end = address // B * B, -(-(address + length) // B) * B
                for at in range(first, end, B):
                    ctx.set(dut.beat.data, int.from_bytes(blob[at:at + B].ljust(B, b"\0"),
                                                          "little"))
                    ctx.set(dut.beat.last, at + B == end)
                    ctx.set(dut.beat_valid, 1)
                    ctx.set(dut.beat_fire, 1)
                    await ctx.tick()
                ctx.set(dut.beat_valid, 0)
                ctx.set(dut.beat_fire, 0)
            elif ctx.get(dut.compute):
                seen.append({field: ctx.get(getattr(dut.group, register))
                             for register, field in REGISTERS.items()})
                ctx.set(dut.compute_done, 1)
                await ctx.tick()
                ctx.set(dut.compute_done, 0)
                # The phase ports are registers set on the transitions: compute ends with
                # compute_done, and a phase starts with start_compute's one cycle.
                assert not ctx.get(dut.compute)
            else:
                starting = ctx.get(dut.start_compute)
                await ctx.tick()
                assert ctx.get(dut.compute) == starting
                assert not (starting and ctx.get(dut.start_compute))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return seen


@pytest.mark.parametrize("name, bus_bits", [("ecp5", 32), ("tiny", 64), ("tiny", 128),
                                            ("kcu1500", 512)])
def test_operand_pitches(tmp_path: Path, name, bus_bits):
    """A residual block (every pitch used), unsplit and in windowed column strips."""
    config = get_config(name).replace(dram_bus_bits=bus_bits)
    build, widths = STRIPS[-1]
    net, outputs = build()
    compiled, dense_blob = compiled_image(tmp_path, net, outputs, config)
    split = column_strips(compiled, widths)
    strips_blob = split.program.pack(split.quantise_inputs({"x": net.samples(1)}))
    for blob, windowed in ((dense_blob, False), (strips_blob, True)):
        img = image.unpack(blob, config)
        want = []
        for instr in img.program:
            block = bytes(img.dram[instr.params.offset:][:layout.param_bytes(instr, config)])
            geo = layout.geometry(instr, config, block)
            assert instr.windowed == windowed
            assert (geo != layout.Geometry.dense(instr, config.lanes)) == windowed
            want.append({field: getattr(geo, field) for field in REGISTERS.values()})
        assert geometries_in_compute(config, blob) == want


def test_split_product_is_the_product_two_cycles_later():
    """split_product (the store checks' extents): a·b two cycles after the operands, for
    operands that use both halves of b, the widest ones and zero."""
    from amaranth.hdl import Module, Signal
    from sfnpu.hw.controller.common import split_product

    m = Module()
    a, b = Signal(17), Signal(32)
    product = split_product(m, a, b, "extent")
    cases = [(0, 0), (1, 1), ((1 << 17) - 1, (1 << 32) - 1), (3, 1 << 16), (5, 0xFFFF),
             (12345, 0x12345678), ((1 << 17) - 1, 1 << 31), (77, 0x0001_0001)]
    got = []

    async def bench(ctx):
        for x, y in cases + [(0, 0)]:
            ctx.set(a, x)
            ctx.set(b, y)
            await ctx.tick()            # the half products take a, b
            got.append(ctx.get(product))  # the sum takes the last ones' half products

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert got[1:] == [x * y for x, y in cases]
