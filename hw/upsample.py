"""2× nearest-neighbour upsample of a row stream (:func:`sfnpu.numeric.upsample_nearest2x`).

Output row ``2y`` and ``2y+1`` are both input row ``y`` with every pixel doubled. The first copy
of a row is emitted straight from the input while the row is written to a one-row line buffer;
the second copy is replayed from that buffer. The output side is busy every cycle (four output
beats per input beat), so the input is simply held while a row is replayed.

Row-interleaved channel blocks (row-based weight reuse: every input row is ``blocks`` segments
of ``W`` pixels, segment *b* holding channel block *b*, order ``(y, b, x)``) need nothing
special: doubling every pixel of the ``blocks · W``-pixel row turns segment *b* into the ``2W``
pixels of output segment *b*, and repeating the row gives output rows ``2y`` and ``2y + 1`` —
exactly the interleaved order of the ``2H × 2W`` output. The controller sets
``in_w = blocks · W``, so ``max_width`` must cover the widest interleaved row.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .beat import code_beat, pass_through
from .fifo import UNCHECKED_COLLISIONS, unchecked_read

__all__ = ["Upsample2x"]


class Upsample2x(wiring.Component):
    """``y[r, c] = x[r // 2, c // 2]`` over a stream of rows, ``lanes`` channels per beat.

    Parameters
    ----------
    lanes : int
        Codes per beat (``HwConfig.lanes``).
    max_width : int
        Widest input row (pixels; ``blocks · W`` for row-interleaved channel blocks); the line
        buffer's depth.

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        Input pixels, rows in raster order (any number of rows): one channel block after
        another, or rows of row-interleaved channel blocks (order ``(y, b, x)``).
    o_stream : Out(stream.Signature(ArrayLayout(8, lanes)))
        Output pixels in raster order: every input row twice, every pixel twice per row (for
        interleaved input: ``2H`` rows of ``blocks`` segments of ``2W``).
    enable : In(1)
        Configuration: 0 bypasses the stage (``o_stream`` is ``i_stream``, combinationally).
    in_w : In(range(1, max_width + 1))
        Configuration: input row width in pixels (``blocks · W`` for interleaved blocks).

    Configuration may change only between groups: once every input beat has been accepted
    and every output beat delivered.

    Timing: one output beat per cycle (the input is accepted on the second copy of each pixel
    of the first pass and held during the replay pass: 4 output beats per input beat). The
    first copy of a pixel leaves in the cycle it arrives (no latency); the line buffer's read
    register feeds the replay.
    """

    def __init__(self, lanes: int, max_width: int):
        if lanes < 1 or max_width < 1:
            raise ValueError(f"lanes and max_width must be positive ({lanes}, {max_width})")
        self.lanes = lanes
        self.max_width = max_width
        beat = code_beat(lanes)
        super().__init__({
            "i_stream": In(beat),
            "o_stream": Out(beat),
            "enable": In(1),
            "in_w": In(range(1, max_width + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        beat_layout = data.ArrayLayout(8, self.lanes)
        m.submodules.line = line = Memory(shape=beat_layout, depth=self.max_width, init=[],
                                          attrs=UNCHECKED_COLLISIONS)
        write = line.write_port()

        replay = Signal()                       # 0: first copy from the input; 1: from the buffer
        column = Signal(range(self.max_width))
        second = Signal()                       # emitting the second copy of the pixel
        fire = Signal()                         # an output beat leaves (bypass: counters rest)
        m.d.comb += fire.eq(self.enable & self.o_stream.valid & self.o_stream.ready)

        row_end = column == self.in_w - 1
        next_column = Mux(fire & second, Mux(row_end, 0, column + 1), column)
        with m.If(fire):
            m.d.sync += second.eq(~second)
            with m.If(second):
                m.d.sync += column.eq(next_column)
                with m.If(row_end):
                    m.d.sync += replay.eq(~replay)

        # The replay needs pixel `column` in the read register: address the column that is
        # current in the next cycle. Writes happen in the first pass only, whose reads are
        # never used: a read that collides with a write is never used.
        read_data = unchecked_read(m, line, next_column, "replay_pixel")
        m.d.comb += [
            write.addr.eq(column),
            write.data.eq(self.i_stream.payload),
        ]

        with m.If(~self.enable):
            m.d.comb += pass_through(self.i_stream, self.o_stream)
        with m.Elif(~replay):
            m.d.comb += [
                self.o_stream.payload.eq(self.i_stream.payload),
                self.o_stream.valid.eq(self.i_stream.valid),
                self.i_stream.ready.eq(self.o_stream.ready & second),
                # Written with the first copy, read (for the replay) at the earliest with the
                # second: even a one-pixel row never reads the column being written.
                write.en.eq(fire & ~second),
            ]
        with m.Else():
            m.d.comb += [
                self.o_stream.payload.eq(read_data),
                self.o_stream.valid.eq(1),
            ]
        return m
