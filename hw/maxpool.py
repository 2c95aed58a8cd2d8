"""Max pooling of a row-streamed feature map (:func:`sfnpu.numeric.max_pool`).

The window maximum is separable: a horizontal stage reduces every input row to one value per
output column, and a vertical stage combines those reduced rows. Both stages share one rule for
a window along their axis:

* window *o* covers positions ``lo = o·stride − pad`` … ``lo + kernel − 1``, clipped to the
  input (padding never wins, so padded positions are simply not candidates);
* it is complete when the position arriving now is ``end = min(lo + kernel − 1, size − 1)``,
  and it is emitted then, from the arriving element and the previous ``kernel − 1`` ones;
* windows that end at the last element or beyond (padding, ceil mode) complete together: the
  extra ones are emitted afterwards from the stored elements, with no new input;
* elements after the last window (floor mode) are consumed and dropped.

The horizontal stage keeps the previous ``kernel − 1`` pixels in registers; the vertical stage
keeps the previous ``kernel − 1`` reduced rows in two line buffers (a row shift register: a new
row goes to ``rows_0`` while ``rows_0``'s old contents move to ``rows_1``).

Channel blocks arrive *row-interleaved* (the order of row-based weight reuse): every input row
is ``blocks`` segments of ``in_w`` pixels, segment *b* holding channel block *b* — the order
``(y, b, x)``. The horizontal stage treats every segment as a row of its own (windows never
cross a segment boundary; each segment has its own padding and ceil-mode windows at both
edges), so it turns an input row into ``blocks`` segments of ``out_w`` reduced pixels. The
vertical stage sees one reduced row of ``blocks · out_w`` pixels, in which position
``b · out_w + o`` is column *o* of block *b* in every row: combining reduced rows position by
position pools each block on its own and leaves the output in the same interleaved order.
With ``blocks = 1`` this is plain raster order, one channel block after another.

Codes are compared as order keys: the raw byte with the sign bit inverted for int8, so one
unsigned comparison serves both types and the key 0 (the lowest code) is the neutral element.
"""

from __future__ import annotations

import operator
from functools import reduce

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .beat import code_beat, pass_through
from .line_store import line_members, line_ports
from .stream_register import StreamRegister

__all__ = ["MaxPool", "MAX_HEIGHT"]

#: Largest feature-map height (the ISA's 12-bit size fields).
MAX_HEIGHT = 4095
#: Windows are at most 3 × 3; padding is below the window side.
_MAX_KERNEL = 3


class MaxPool(wiring.Component):
    """Max pooling, kernel 2 or 3, stride 1 or 2, padding below the kernel, any output size
    (floor or ceil mode: ``out_h``/``out_w`` are configuration, as ``out_hw`` of
    :func:`sfnpu.numeric.max_pool`).

    Parameters
    ----------
    lanes : int
        Codes per beat (``HwConfig.lanes``).
    max_width : int
        Widest input segment (pixels of one channel block in a row).
    max_height : int
        Tallest input (the ISA's 12-bit size field by default).
    max_blocks : int
        Most channel blocks per row (the range of ``blocks``); 1 by default.
    max_row_pixels : int
        Depth of each of the two line buffers: the largest interleaved reduced row
        ``blocks · out_w`` a configuration may use. Default ``max_blocks · (max_width + 2)``,
        enough for every configuration (an output segment can be two pixels wider than the
        input: stride 1, padding 2); a smaller value bounds ``blocks · out_w`` instead.
    shared_lines : bool
        The two line buffers are outside the unit (``lines``), built by the owner
        (:func:`~sfnpu.hw.line_store.share_lines`); their reads must be transparent.

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        Input pixels, ``in_h`` rows of ``blocks`` segments of ``in_w`` (order ``(y, b, x)``);
        the next group's rows follow without a gap.
    o_stream : Out(stream.Signature(ArrayLayout(8, lanes)))
        Pooled pixels, ``out_h`` rows of ``blocks`` segments of ``out_w``.
    enable : In(1)
        Configuration: 0 bypasses the stage (``o_stream`` is ``i_stream``, combinationally).
    signed : In(1)
        Configuration: the codes are int8 (1) or uint8 (0).
    kernel : In(range(1, 4))
        Configuration: window side (2 or 3; 1 also works).
    stride : In(range(1, 3))
        Configuration: window step.
    pad : In(range(3))
        Configuration: padding on every side, below ``kernel``.
    in_h, in_w, out_h, out_w : In(...)
        Configuration: input and output sizes of one channel block. An output window lying
        wholly in the padding (impossible for sizes from
        :func:`sfnpu.numeric.pool_output_size`) gives the lowest code.
    blocks : In(range(1, max_blocks + 1), init=1)
        Configuration: channel blocks per row (segments per row); ``blocks · out_w`` must not
        exceed ``max_row_pixels``. With 1 the input is simply one channel block after another.
    lines : Out(LinePort(ArrayLayout(8, lanes), max_row_pixels)).array(2)
        With ``shared_lines``: the ports of the two line buffers.

    Configuration may change only between groups: once every input beat has been accepted
    and every output beat delivered (inputs past the last window are still consumed
    after the last output). The first beat comes a cycle after the configuration at the
    earliest (the window bounds derived from it are registers).

    Timing: one input beat per cycle, except where several windows end at the last pixel of a
    segment (padding, ceil mode): each one after the first costs a cycle without input (at most
    ``pad`` per segment), and likewise each output row after the first that ends at the last
    input row costs a pass of ``blocks · out_w`` cycles. Latency from the last pixel of a
    window to its output: :attr:`LATENCY` (3) cycles, the reduced pixel's register (``h_valid``),
    the vertical stage's register (``b_valid``) and the output register (a
    :class:`~sfnpu.hw.stream_register.StreamRegister`). The stalls of ``o_stream`` propagate
    to ``i_stream`` through three beats of buffering. The same holds for every ``blocks``:
    segment boundaries cost nothing.
    """

    LATENCY = 3

    def __init__(self, lanes: int, max_width: int, max_height: int = MAX_HEIGHT,
                 max_blocks: int = 1, max_row_pixels: int | None = None,
                 shared_lines: bool = False):
        if lanes < 1 or max_width < 1 or max_height < 1 or max_blocks < 1:
            raise ValueError(f"lanes, max_width, max_height and max_blocks must be positive "
                             f"({lanes}, {max_width}, {max_height}, {max_blocks})")
        self.lanes = lanes
        self.max_width = max_width
        self.max_height = max_height
        self.max_blocks = max_blocks
        #: Longest output segment: stride 1 and padding 2 widen a row by two pixels.
        self.max_out_width = max_width + 2
        if max_row_pixels is None:
            max_row_pixels = max_blocks * self.max_out_width
        if max_row_pixels < 1:
            raise ValueError(f"max_row_pixels must be positive ({max_row_pixels})")
        #: Depth of the line buffers (reduced pixels of an interleaved row).
        self.max_row_pixels = max_row_pixels
        self.shared_lines = shared_lines
        beat = code_beat(lanes)
        super().__init__({
            "i_stream": In(beat),
            "o_stream": Out(beat),
            "enable": In(1),
            "signed": In(1),
            "kernel": In(range(1, _MAX_KERNEL + 1)),
            "stride": In(range(1, 3)),
            "pad": In(range(_MAX_KERNEL)),
            "in_h": In(range(1, max_height + 1)),
            "in_w": In(range(1, max_width + 1)),
            "out_h": In(range(1, max_height + 3)),
            "out_w": In(range(1, self.max_out_width + 1)),
            "blocks": In(range(1, max_blocks + 1), init=1),
            **line_members(2, data.ArrayLayout(8, lanes), max_row_pixels, shared_lines),
        })

    def elaborate(self, platform):
        m = Module()
        sign_flip = Mux(self.signed, 0x80, 0x00)
        # The output register: the line stores' block-RAM outputs and the lane-wise
        # maximum end there, not in the stages behind the pool.
        m.submodules.output = output = StreamRegister(data.ArrayLayout(8, self.lanes))
        self._out = output.i_stream
        h_valid, h_data, h_ready, i_ready = self._horizontal(m, sign_flip)
        b_valid, b_emit, v_maximum = self._vertical(m, h_valid, h_data, h_ready)

        m.d.comb += output.i_stream.valid.eq(self.enable & b_valid & b_emit)
        for lane in range(self.lanes):
            m.d.comb += output.i_stream.payload[lane].eq(v_maximum[lane] ^ sign_flip)
        with m.If(self.enable):
            m.d.comb += [self.i_stream.ready.eq(i_ready),
                         *pass_through(output.o_stream, self.o_stream)]
        with m.Else():
            m.d.comb += pass_through(self.i_stream, self.o_stream)
        return m

    def _key_max(self, m, candidates, name):
        """Lane-wise maximum of (keys, included) pairs; excluded ones count as key 0. Every
        pair of candidates is compared side by side and the first maximum is selected (one
        comparison deep, not one per candidate)."""
        result = Signal(data.ArrayLayout(8, self.lanes), name=name)
        for lane in range(self.lanes):
            values = [Mux(included, keys[lane], 0) for keys, included in candidates]
            wins = [Cat(*(value > other for other in values[:i]),
                        *(value >= other for other in values[i + 1:])).all()
                    for i, value in enumerate(values)]
            selected = [Mux(win, value, 0) for win, value in zip(wins, values)]   # one-hot
            m.d.comb += result[lane].eq(reduce(operator.or_, selected))
        return result

    def _horizontal(self, m, sign_flip):
        """Horizontal stage: one segment in, one value per output column out."""
        beat_layout = data.ArrayLayout(8, self.lanes)
        h_position = Signal(range(self.max_width + 1))         # index of the arriving pixel
        h_count = Signal(range(self.max_out_width + 1))        # output columns emitted
        h_previous = [Signal(beat_layout, name=f"h_previous_{d}") for d in (1, 2)]
        h_valid = Signal()                                     # reduced pixel for the V stage
        h_data = Signal(beat_layout)
        h_ready = Signal()

        h_axis = _WindowAxis(m, h_position, self.in_w, self.kernel, self.pad, "h")
        h_outputs_done = h_count == self.out_w
        h_has_input = h_position <= h_axis.last
        h_emit_wanted = ~h_outputs_done & h_axis.at_or_after_end
        h_emit_uses_input = h_emit_wanted & h_axis.up_to_end
        h_accept_wanted = h_has_input & (h_outputs_done | h_axis.up_to_end)
        h_slot_free = ~h_valid | h_ready

        arriving = Signal(beat_layout)
        for lane in range(self.lanes):
            m.d.comb += arriving[lane].eq(self.i_stream.payload[lane] ^ sign_flip)
        h_accept = Signal()
        h_emit = Signal()
        i_ready = Signal()
        m.d.comb += [
            i_ready.eq(self.enable & h_accept_wanted & (~h_emit_wanted | h_slot_free)),
            h_accept.eq(i_ready & self.i_stream.valid),
            h_emit.eq(self.enable & h_emit_wanted & h_slot_free
                      & (~h_emit_uses_input | self.i_stream.valid)),
        ]
        h_maximum = self._key_max(m, [
            (arriving, h_emit_uses_input),
            (h_previous[0], h_axis.covered(1)),
            (h_previous[1], h_axis.covered(2)),
        ], "h_maximum")

        with m.If(h_accept):
            m.d.sync += [h_previous[0].eq(arriving), h_previous[1].eq(h_previous[0])]
        with m.If(h_emit):
            m.d.sync += [h_valid.eq(1), h_data.eq(h_maximum)]
        with m.Elif(h_ready):
            m.d.sync += h_valid.eq(0)
        next_h_position = h_position + h_accept
        next_h_count = h_count + h_emit
        segment_done = (_steps_to(h_position, h_accept, self.in_w, h_axis.last)
                        & _steps_to(h_count, h_emit, self.out_w,
                                    _config_register(m, self.out_w - 1, "h_count_last")))
        with m.If(segment_done):
            m.d.sync += [h_position.eq(0), h_count.eq(0)]
        with m.Else():
            m.d.sync += [h_position.eq(next_h_position), h_count.eq(next_h_count)]
        h_axis.advance(m, segment_done, h_accept, Mux(h_emit, self.stride, 0))
        return h_valid, h_data, h_ready, i_ready

    def _vertical(self, m, h_valid, h_data, h_ready):
        """Vertical stage: reduced rows in, output rows out."""
        beat_layout = data.ArrayLayout(8, self.lanes)
        # Row-level state: which input row arrives and which output row is next.
        v_position = Signal(range(self.max_height + 1))
        v_count = Signal(range(self.max_height + 3))
        # Position in the interleaved reduced row (the line buffers' address); with several
        # blocks also the column in the segment and the segment, to find the row's end.
        column = Signal(range(self.max_row_pixels))

        v_axis = _WindowAxis(m, v_position, self.in_h, self.kernel, self.pad, "v")
        v_outputs_done = v_count == self.out_h
        # Whether the row takes input, a register (it is on the input's ready): set at a row's
        # end from the next row's state; 1 at the start of a group, for any configuration
        # (in_h ≥ 1, out_h ≥ 1, pad < kernel).
        row_takes_input = Signal(init=1)
        row_emits = ~v_outputs_done & v_axis.at_or_after_end
        row_emit_uses_input = row_emits & v_axis.up_to_end

        # Transparent reads: with a one-pixel row the next row reads the pixel being written.
        (write_1, read_1), (write_2, read_2) = line_ports(
            m, self, 2, beat_layout, self.max_row_pixels, transparent=True)

        # Stage B: one column of the current row, with the buffered rows read for it.
        b_valid = Signal()
        b_emit = Signal()
        b_store = Signal()
        b_column = Signal.like(column)
        b_arriving = Signal(beat_layout)
        b_include = [Signal(name=f"b_include_{d}") for d in range(_MAX_KERNEL)]
        b_done = b_valid & (~b_emit | self._out.ready)
        b_free = ~b_valid | b_done
        available = Mux(row_takes_input, h_valid, 1)     # a row past the input: no data needed
        take = Signal()
        m.d.comb += [
            take.eq(self.enable & b_free & available),
            h_ready.eq(b_free & row_takes_input),
            read_1.addr.eq(column), read_1.en.eq(take),
            read_2.addr.eq(column), read_2.en.eq(take),
        ]
        with m.If(take):
            m.d.sync += [
                b_valid.eq(1),
                b_emit.eq(row_emits),
                b_store.eq(row_takes_input),
                b_column.eq(column),
                b_arriving.eq(h_data),
                b_include[0].eq(row_emit_uses_input),
                b_include[1].eq(v_axis.covered(1)),
                b_include[2].eq(v_axis.covered(2)),
            ]
        with m.Elif(b_done):
            m.d.sync += b_valid.eq(0)

        # End of a row (the last column of the last segment): advance the row-level state,
        # wrapping at the end of the group.
        row_end = self._row_end(m, take, column)
        next_v_position = v_position + row_takes_input
        next_v_count = v_count + row_emits
        with m.If(take):
            m.d.sync += column.eq(Mux(row_end, 0, column + 1))
        # The next row's tests from the current state, side by side: no adder on them.
        next_outputs_done = _steps_to(v_count, row_emits, self.out_h,
                                      _config_register(m, self.out_h - 1, "v_count_last"))
        group_done = next_outputs_done & _steps_to(v_position, row_takes_input, self.in_h,
                                                   v_axis.last)
        next_has_input = Mux(row_takes_input, v_position < v_axis.last,
                             v_position <= v_axis.last)
        next_takes_input = next_has_input & (
            next_outputs_done
            | v_axis.next_rel_up_to_reach(m, row_takes_input, row_emits, self.stride))
        with m.If(row_end):
            emitted_stride = Mux(row_emits, self.stride, 0)
            with m.If(group_done):
                m.d.sync += [v_position.eq(0), v_count.eq(0), row_takes_input.eq(1)]
            with m.Else():
                m.d.sync += [v_position.eq(next_v_position), v_count.eq(next_v_count),
                             row_takes_input.eq(next_takes_input)]
            v_axis.advance(m, group_done, row_takes_input, emitted_stride)

        # Row shift register: the arriving row becomes "one back", "one back" becomes "two".
        m.d.comb += [
            write_1.addr.eq(b_column), write_1.data.eq(b_arriving),
            write_2.addr.eq(b_column), write_2.data.eq(read_1.data),
            write_1.en.eq(b_done & b_store), write_2.en.eq(b_done & b_store),
        ]
        v_maximum = self._key_max(m, [
            (b_arriving, b_include[0]),
            (read_1.data, b_include[1]),
            (read_2.data, b_include[2]),
        ], "v_maximum")
        return b_valid, b_emit, v_maximum

    def _row_end(self, m, take, column):
        """Stage B takes the last column of the last segment of a row this cycle."""
        if self.max_blocks == 1:
            return take & (column == self.out_w - 1)
        # The counters plus one, in registers: the end tests are equalities with the
        # configuration, with no carry chain between them and the handshakes.
        segment_column = Signal(range(self.max_out_width + 1), init=1)
        segment = Signal(range(self.max_blocks + 1), init=1)
        segment_end = segment_column == self.out_w
        last_segment = segment == self.blocks
        row_end = take & segment_end & last_segment
        with m.If(take):
            m.d.sync += segment_column.eq(Mux(segment_end, 1, segment_column + 1))
            with m.If(segment_end):
                m.d.sync += segment.eq(Mux(last_segment, 1, segment + 1))
        return row_end


def _config_register(m, value, name):
    """``value``, formed from the configuration, as a register loaded every cycle (never
    reset, so it follows a new configuration a cycle late; see :class:`_WindowAxis`)."""
    register = Signal.like(value, name=name, reset_less=True)
    m.d.sync += register.eq(value)
    return register


def _steps_to(counter, step, size, size_less_one):
    """``counter + step == size`` from two equalities formed side by side (``step`` is the
    late signal: a handshake)."""
    return Mux(step, counter == size_less_one, counter == size)


class _WindowAxis:
    """The window rule of the module docstring along one axis, for the position ``p``
    arriving now and the next output window *o* (first position ``o·stride − pad``).

    The stage keeps ``rel = p − o·stride``, a register set with ``p`` and *o* (0 at the start
    of a row or segment, as both are), instead of *o*'s bounds: with ``reach = kernel − 1 −
    pad``, ``p ≤ end`` is ``rel ≤ reach`` and ``p ≤ size − 1``, ``p ≥ end`` is ``rel ≥ reach``
    or ``p ≥ size − 1``, and the element ``d`` back lies in the window when ``p ≥ d`` and
    ``rel ≥ d − pad``. ``reach``, ``size − 1`` and ``d − pad`` are registers formed from the
    configuration every cycle (never reset): no window bound is computed on the stages'
    handshakes. They follow the configuration a cycle late, which no beat sees: a stage
    takes its first beat in the cycle after the configuration is set at the earliest."""

    def __init__(self, m, position, size, kernel, pad, name):
        self.position = position
        self.rel = Signal(signed(16), name=f"{name}_rel")
        self.name, self.kernel, self.pad = name, kernel, pad
        self.reach = _config_register(m, (kernel - 1 - pad).as_signed(), f"{name}_reach")
        self.last = _config_register(m, (size - 1)[:len(size)], f"{name}_last")
        self.cover = {d: _config_register(m, (d - pad).as_signed(), f"{name}_cover_{d}")
                      for d in (1, 2)}
        self.up_to_end = (self.rel <= self.reach) & (position <= self.last)
        self.at_or_after_end = (self.rel >= self.reach) | (position >= self.last)

    def next_rel_up_to_reach(self, m, arrived, emitted, stride):
        """``next_rel(arrived, emitted · stride) ≤ reach``: ``rel`` against four thresholds
        (registers) side by side, one picked by the two late signals."""
        def threshold(a, e):
            if (a, e) == (0, 0):
                return self.reach
            value = (self.kernel - 1 - self.pad - a + (stride if e else 0)).as_signed()
            return _config_register(m, value, f"{self.name}_reach_{a}{e}")
        up_to = {(a, e): self.rel <= threshold(a, e) for a in (0, 1) for e in (0, 1)}
        return Mux(arrived, Mux(emitted, up_to[1, 1], up_to[1, 0]),
                   Mux(emitted, up_to[0, 1], up_to[0, 0]))

    def covered(self, distance: int):
        """The element ``distance`` positions back lies in the window."""
        return (self.position >= distance) & (self.rel >= self.cover[distance])

    def next_rel(self, arrived, emitted_stride):
        """``rel`` once ``p`` moved on by ``arrived`` and *o*·stride by ``emitted_stride``."""
        return self.rel + arrived - emitted_stride

    def advance(self, m, restart, arrived, emitted_stride):
        """``p`` moves on by ``arrived``, *o*·stride by ``emitted_stride``; both back to 0 on
        ``restart``."""
        with m.If(restart):
            m.d.sync += self.rel.eq(0)
        with m.Else():
            m.d.sync += self.rel.eq(self.next_rel(arrived, emitted_stride))
