"""Wide circular row buffer and sliding-window generator (ShortcutFusion Sec. III-B, eq. 3).

Storage
-------
:data:`~sfnpu.config.ROW_BUFFER_ROWS` (6) banks of ``max_row_words = max_row_bytes / lanes``
words; a word is ``lanes`` bytes, one pixel of one channel block. An input row is ``row_words =
blocks · in_w`` words, streamed in the order ``[cb][x]`` (that row of every channel block of the
layout ``[C/L][H][W][L]``). Row ``r`` goes to bank ``r mod 6`` at *place* ``(r div 6) mod
places``, where ``places = ⌊max_row_words / row_words⌋`` rows fit in one bank, so the buffer
holds ``capacity = 6·places`` rows: with full-width rows, five feed a 5×5 window while the sixth
is prefetched, as in the paper; rows at most half as wide leave two places per bank, which a 6-
or 7-row kernel plus prefetch needs. ``kh ≤ capacity`` is required (:func:`window_params`
checks it; the compiler tiles wider rows).

Windows
-------
For output row ``oy`` (input rows ``y0 … y0+kh−1``, ``y0 = oy·sh − pad_top``), every pass
(``repeats × blocks``, channel block ``pass mod blocks``) and every output column, the reader
fetches the window's *columns*: the same word of up to six rows, one row per bank, in one cycle
(a 7-row column takes two cycles, *parts*; its 7th row shares the bank of its first). Columns
shift into a ``MAX_KERNEL × MAX_KERNEL`` window register; positions outside the image are marked
and read as ``zero_point``. The first window of a pass fetches all ``kw`` columns, the next ones
the ``min(sw, kw)`` columns that slide in. A complete window moves to the hold register, which
emits it as ``P`` steps (one tap, or ``Ti/2`` taps in depthwise mode, per step;
:func:`~sfnpu.hw.conv_array.steps_per_pixel`) while the next window is fetched.

Timing
------
Cycle exact; :func:`window_schedule` is this contract in executable form. Cycle 0 is the cycle
after ``start``; ``o_stream`` is assumed ready whenever valid (the conv array's join), except that
the very first step may wait for its weights.

* Writer: stores one word in every cycle in which ``i_stream`` is valid and the row being
  written, ``r``, fits: ``r < max(y0, 0) + capacity`` for the output row the reader is on. A row
  is complete from the cycle after its last word.
* Reader, one column part per cycle: a read is issued in the cycle in which stage 1 (the bank
  data register) frees — it is empty, or its part moves into the window register in that cycle
  — and, for the first read of an output row, no earlier than the first cycle in which rows
  ``y0 … min(y0 + kh, in_h) − 1`` are complete (``ready``). The reader moves to the next
  output row in the cycle after issuing its last read.
* Window register: a part moves in one cycle after its read, and the first part of window
  ``m`` not before cycle ``e_{m−1} − 1``, so a window's ``F`` parts move in on consecutive
  cycles ``s_m … s_m + F − 1`` with ``s_m = max(issue + 1, e_{m−1} − 1)``.
* Emission: ``e_m``, the cycle in which window ``m``'s first step is emitted (``o_stream``
  valid from ``e_m + 1``, step ``k`` emitted at ``e_m + k``), is ``max(s_m + F_m + 1,
  e_{m−1} + P)``. While input rows are present this is ``e_m = e_{m−1} + max(P, F_m)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu.config import MAX_KERNEL, ROW_BUFFER_ROWS, HwConfig
from sfnpu.isa import ConvKind, Instruction, InstructionLayout
from sfnpu.layout import channel_blocks, conv_output_hw

from . import pipeline
from .conv_array import _check, depthwise_taps, fetch_cycles, fetch_parts, steps_per_pixel, \
    window_step_layout

__all__ = ["RowBuffer", "window_params_layout", "window_params", "window_schedule"]

#: Rows of the window register: one per bank, plus the rows of a kernel taller than the banks.
_WINDOW_ROWS = ROW_BUFFER_ROWS + max(0, MAX_KERNEL - ROW_BUFFER_ROWS)
_MAX_PARTS = fetch_parts(MAX_KERNEL)
assert _MAX_PARTS <= 2, "a column is fetched in at most two parts"

_ISA = data.Layout.cast(InstructionLayout)


def window_params_layout(config: HwConfig) -> data.StructLayout:
    """Per-convolution parameters of the window generator (held while ``busy``). Fields taken
    from the instruction keep its widths."""
    max_words = config.max_row_bytes // config.lanes
    isa = {name: _ISA[name].shape for name in ("kh", "kw", "sh", "sw", "pad_top", "pad_left",
                                               "in_h", "in_w")}
    return data.StructLayout({
        "depthwise": 1,
        **isa,
        "out_h": _ISA["in_h"].shape,         # convolution output, before pooling
        "out_w": _ISA["in_w"].shape,
        "blocks": _ISA["in_c"].shape,        # channel blocks per input row
        "repeats": _ISA["out_c"].shape,      # output-channel blocks (normal), 1 (depthwise)
        "row_words": range(max_words + 1),   # blocks · in_w
        "places": range(max_words + 1),      # rows per bank
        "zero_point": _ISA["in_zp"].shape,   # padding value (raw 8 bits)
    })


@dataclass(frozen=True)
class _Params:
    depthwise: bool
    kh: int
    kw: int
    sh: int
    sw: int
    pad_top: int
    pad_left: int
    in_h: int
    in_w: int
    out_h: int
    out_w: int
    blocks: int
    repeats: int
    row_words: int
    places: int
    zero_point: int


def window_params(instr: Instruction, config: HwConfig, zero_point: int | None = None) -> dict:
    """The :func:`window_params_layout` values of a group's convolution; raises ``ValueError``
    when its input rows do not fit the row buffer. ``zero_point`` defaults to ``in_zp``."""
    _check(config)
    depthwise = instr.conv == ConvKind.DEPTHWISE
    blocks = channel_blocks(instr.in_c, config.lanes)
    row_words = blocks * instr.in_w
    max_words = config.max_row_bytes // config.lanes
    if row_words > max_words:
        raise ValueError(f"an input row of {instr.in_w}×{instr.in_c} needs {row_words} words; "
                         f"a row-buffer bank holds {max_words}")
    places = max_words // row_words
    if instr.kh > ROW_BUFFER_ROWS * places:
        raise ValueError(f"a {instr.kh}-row kernel needs {instr.kh} resident rows; rows of "
                         f"{row_words} words leave room for {ROW_BUFFER_ROWS * places}")
    out_h, out_w = conv_output_hw(instr)
    zp = instr.in_zp if zero_point is None else zero_point
    return dict(
        depthwise=int(depthwise), kh=instr.kh, kw=instr.kw, sh=instr.sh, sw=instr.sw,
        pad_top=instr.pad_top, pad_left=instr.pad_left, in_h=instr.in_h, in_w=instr.in_w,
        out_h=out_h, out_w=out_w, blocks=blocks,
        repeats=1 if depthwise else channel_blocks(instr.out_c, config.to),
        row_words=row_words, places=places, zero_point=zp & 0xFF)


def window_schedule(params: dict, config: HwConfig, first_word: int,
                    weights_ready: int) -> list[int]:
    """``e_m`` of every window, in emission order (output row, pass, column), under the timing
    contract of the module docstring: cycle 0 is the cycle after ``start``, input words are
    offered on every cycle from ``first_word`` on, the first weight step is valid from cycle
    ``weights_ready`` on, and nothing else stalls ``o_stream``.
    """
    p = _Params(**params)
    steps = steps_per_pixel(p.depthwise, p.kh, p.kw, config)
    capacity = ROW_BUFFER_ROWS * p.places
    write_end = []              # cycle after the last word of each row was written
    released = [0]              # released[k]: first cycle in which the reader is on row k

    def complete(row):
        """First cycle in which rows 0..row are complete (written in order, as allowed)."""
        while len(write_end) <= row:
            r = len(write_end)
            start = max(first_word, write_end[-1] if write_end else first_word)
            # Row r may start once the reader works on an output row whose first row is above
            # r − capacity.
            oy = 0
            while max(oy * p.sh - p.pad_top, 0) + capacity <= r and oy < p.out_h:
                oy += 1
            if oy >= len(released):
                raise RuntimeError("row needed before it can be written: kh > capacity")
            write_end.append(max(start, released[oy]) + p.row_words)
        return write_end[row]

    times, previous, previous_shift = [], None, None
    for oy in range(p.out_h):
        y_end = min(oy * p.sh - p.pad_top + p.kh, p.in_h)
        ready = complete(y_end - 1)             # first cycle the reader sees the rows
        first_of_row = True
        for _ in range(p.repeats * p.blocks):
            for ox in range(p.out_w):
                fetch = fetch_cycles(p.kh, p.kw, p.sw, ox == 0)
                # Stage 1 takes a read in the cycle its previous one moves into the window
                # register (at the end of `previous_shift`), and the reader starts an output
                # row only once its rows are complete.
                issue = ready if first_of_row else previous_shift
                if previous_shift is not None:
                    issue = max(issue, previous_shift)
                # A window's first column enters the window register one cycle after its read,
                # and not before the previous window has moved to the hold register (at the
                # end of cycle previous − 1); its other columns follow on consecutive cycles.
                first_shift = issue + 1 if previous is None else max(issue + 1, previous - 1)
                last_shift = first_shift + fetch - 1
                emitted = last_shift + 2
                if previous is None:            # the first step also waits for its weights
                    emitted = max(emitted, weights_ready - 1)
                else:
                    emitted = max(emitted, previous + steps)
                times.append(emitted)
                last_read = last_shift - 1 if fetch > 1 else issue
                previous, previous_shift, first_of_row = emitted, last_shift, False
        released.append(last_read + 1)          # the reader moves to the next output row
    return times


#: Signed row/column coordinates (input size is 12 bits).
_COORD = signed(16)


def _times_small(value, small):
    """``value · small`` as shift-and-add over the bits of the small operand (a multiplier
    would take a DSP block for a few adders' worth of logic)."""
    return sum(Mux(small[k], value << k, 0) for k in range(len(small)))


class _ReaderPosition:
    """The reader's position: output row, pass and column, and input row y0's place in the ring."""

    def __init__(self, max_words: int, params, capacity):
        # Row y0 sits in bank b0; offsets are the word offsets of its place and of the next two
        # (a window spans at most three places of a bank: b < b0, and part 2).
        self.oy = Signal(range(1 << len(params.out_h)))
        self.rep = Signal(len(params.repeats))
        self.cb = Signal(len(params.blocks))
        self.ox = Signal(range(1 << len(params.out_w)))
        self.y0 = Signal(_COORD)
        # Set with y0: the rows its windows need (min(y0 + kh, in_h)), and the first row the
        # writer may not store yet (max(y0, 0) + capacity): the read and write handshakes
        # compare with registers.
        self.y_end = Signal(_COORD)
        self.y_kh = Signal(_COORD)                        # y0 + kh, before the clamp
        self.room_end = Signal(signed(_COORD.width + 8))
        self.capacity = capacity                          # rows the ring holds
        self.b0 = Signal(range(ROW_BUFFER_ROWS))
        self.offsets = [Signal(range(max_words), name=f"place_offset_{k}") for k in range(3)]
        self.place2 = Signal(range(max_words + 1))       # index of the place at offsets[2]
        self.cb_offset = Signal(range(max_words + 1))    # cb · in_w
        self.window_x = Signal(_COORD)                    # leftmost column of the window
        self.column = Signal(_COORD)                      # column being fetched
        # Columns of this window still to fetch after the current one: a down-counter, so
        # that the window's last column is a test for zero, not an adder and a comparison.
        self.columns_left = Signal(range(MAX_KERNEL))
        self.part = Signal(range(_MAX_PARTS))


class _WindowRegister:
    """A window-register grid: words, their padding flags (if ``pads``), and the bank of
    kernel row 0."""

    def __init__(self, name: str, lanes: int, pads: bool = True):
        self.words = [[Signal(unsigned(8 * lanes), name=f"{name}_{r}_{c}", reset_less=True)
                       for c in range(MAX_KERNEL)] for r in range(_WINDOW_ROWS)]
        self.pads = [[Signal(name=f"{name}_pad_{r}_{c}", reset_less=True)
                      for c in range(MAX_KERNEL)] for r in range(_WINDOW_ROWS)] if pads else None
        self.b0 = Signal(range(ROW_BUFFER_ROWS), name=f"{name}_b0")


class RowBuffer(wiring.Component):
    """Circular row buffer producing sliding windows as a stream of steps.

    Parameters
    ----------
    config : HwConfig
        ``lanes`` (bytes per word), ``max_row_bytes`` (bank size), ``ti`` (taps per step in
        depthwise mode).

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(unsigned(8), lanes)))
        Input words, row by row, each row ``[cb][x]``; exactly ``in_h · row_words`` words.
    o_stream : Out(stream.Signature(window_step_layout(config)))
        Window steps: per output row, pass and column, ``steps`` steps.
    params : In(window_params_layout(config))
        The convolution; sampled at ``start`` and held while ``busy``.
    start : In(1)
        Begins a convolution (ignored while busy).
    busy : Out(1)
        From the cycle after ``start`` until every input word is taken and every step sent.
    steps : Out(range(MAX_KERNEL² + 1))
        Steps per window (``P``), valid while busy: the weight buffer replays that many.
    """

    def __init__(self, config: HwConfig):
        _check(config)
        self.config = config
        self.lanes = config.lanes
        self.taps = depthwise_taps(config)
        self.max_words = config.max_row_bytes // config.lanes
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(unsigned(8), self.lanes))),
            "o_stream": Out(stream.Signature(window_step_layout(config))),
            "params": In(window_params_layout(config)),
            "start": In(1),
            "busy": Out(1),
            "steps": Out(range(MAX_KERNEL * MAX_KERNEL + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        prm = self.params
        capacity, parts, slide = self._derived_params(m)
        read_ports, write_ports = self._banks(m)

        # -- control: start / busy ----------------------------------------------------------------
        reading = Signal()          # the reader still has column reads to issue
        start = self.start & ~self.busy

        rows_written, room_end, writing = self._writer(m, write_ports, start, reading)

        # -- reader, stage 0: column addresses ----------------------------------------------------
        reader = _ReaderPosition(self.max_words, prm, capacity)
        rows_ready = rows_written >= reader.y_end
        last_part = reader.part + 1 >= parts
        last_column = last_part & (reader.columns_left == 0)

        r1_valid = Signal()
        r1_load = Signal()            # stage 1 takes a new read this cycle
        issue = Signal()
        m.d.comb += issue.eq(reading & rows_ready & r1_load)
        pads = self._column_reads(m, read_ports, reader, r1_load)
        self._reader_sequence(m, reader, start, issue, reading, last_part, last_column, slide)
        m.d.comb += room_end.eq(reader.room_end)

        r1_part, r1_last, r1_b0, r1_pads, r1_consume, r1_valid_next = self._read_stage(
            m, start, issue, r1_valid, r1_load, reader, last_column, pads)

        # -- window register: columns shift in from the right --------------------------------------
        # The hold register keeps no padding flags: a padded word is the zero point there.
        fill = _WindowRegister("fill", self.lanes)
        hold = _WindowRegister("hold", self.lanes, pads=False)
        fill_valid = Signal()         # fill holds a complete window not yet moved to hold
        hold_valid = Signal()
        hold_valid_next = Signal()
        transfer = Signal()
        emit = Signal()
        self._shift_in(m, fill, read_ports, r1_part, r1_b0, r1_pads, r1_consume)
        fill_valid_next = Signal()
        m.d.comb += fill_valid_next.eq(
            Mux(start, 0, Mux(r1_consume & r1_last, 1, Mux(transfer, 0, fill_valid))))
        m.d.sync += fill_valid.eq(fill_valid_next)
        with m.If(~start & r1_consume & r1_last):
            m.d.sync += fill.b0.eq(r1_b0)

        step, last_step, last_step_next = self._hold(m, start, fill, hold, hold_valid,
                                                     hold_valid_next, transfer, emit)
        out_valid_next = self._taps(m, start, transfer, emit, step, last_step, fill, hold,
                                    hold_valid)
        self._handshake(m, r1_consume, transfer, emit,
                        dict(r1_valid=r1_valid_next, fill_valid=fill_valid_next,
                             hold_valid=hold_valid_next, last_step=last_step_next,
                             out_valid=out_valid_next))

        # -- busy ---------------------------------------------------------------------------------
        with m.If(start):
            m.d.sync += self.busy.eq(1)
        with m.Elif(self.busy & ~writing & ~reading & ~r1_valid & ~fill_valid & ~hold_valid
                    & ~self.o_stream.valid):
            m.d.sync += self.busy.eq(0)
        return m

    def _derived_params(self, m):
        """Steps per window and the column and capacity figures derived from ``params``."""
        prm, banks, taps = self.params, ROW_BUFFER_ROWS, self.taps
        kernel_taps = Signal(range(MAX_KERNEL * MAX_KERNEL + 1))
        m.d.comb += kernel_taps.eq(_times_small(prm.kw, prm.kh))
        shift = (taps - 1).bit_length()          # taps is a power of two
        m.d.comb += self.steps.eq(Mux(prm.depthwise, (kernel_taps + taps - 1) >> shift,
                                      kernel_taps))
        parts = Mux(prm.kh > banks, 2, 1) if _MAX_PARTS > 1 else Const(1)
        slide = Mux(prm.sw < prm.kw, prm.sw, prm.kw)          # columns that slide in
        capacity = Signal(range(banks * self.max_words + 1))
        m.d.comb += capacity.eq(_times_small(prm.places, Const(banks)))
        return capacity, parts, slide

    def _next_place(self, place, offset):
        """The place after ``place`` (index, word offset), wrapping at ``places``."""
        last = place + 1 >= self.params.places
        return Mux(last, 0, place + 1), Mux(last, 0, offset + self.params.row_words)

    def _banks(self, m):
        """The memories: one bank per row slot, with a read and a write port each."""
        read_ports, write_ports = [], []
        for b in range(ROW_BUFFER_ROWS):
            memory = Memory(shape=unsigned(8 * self.lanes), depth=self.max_words, init=[])
            m.submodules[f"bank_{b}"] = memory
            read_ports.append(memory.read_port())
            write_ports.append(memory.write_port())
        return read_ports, write_ports

    def _writer(self, m, write_ports, start, reading):
        """The writer: stores input words row by row into the ring while there is room."""
        prm, banks = self.params, ROW_BUFFER_ROWS
        rows_written = Signal(range(1 << len(prm.in_h)))
        word = Signal(range(self.max_words))
        w_bank = Signal(range(banks))
        w_place = Signal(range(self.max_words + 1))
        w_offset = Signal(range(self.max_words))
        room_end = Signal(signed(_COORD.width + 8))   # rows from here wait for the reader
        writing = Signal()
        m.d.comb += writing.eq(self.busy & (rows_written < prm.in_h))
        room = (rows_written < room_end) | ~reading
        m.d.comb += self.i_stream.ready.eq(writing & room)
        for b, port in enumerate(write_ports):
            m.d.comb += [
                port.addr.eq(w_offset + word),
                port.data.eq(self.i_stream.payload.as_value()),
                port.en.eq(self.i_stream.valid & self.i_stream.ready & (w_bank == b)),
            ]
        with m.If(start):
            m.d.sync += [rows_written.eq(0), word.eq(0), w_bank.eq(0), w_place.eq(0),
                         w_offset.eq(0)]
        with m.Elif(self.i_stream.valid & self.i_stream.ready):
            with m.If(word + 1 == prm.row_words):
                m.d.sync += [word.eq(0), rows_written.eq(rows_written + 1)]
                with m.If(w_bank == banks - 1):
                    place, offset = self._next_place(w_place, w_offset)
                    m.d.sync += [w_bank.eq(0), w_place.eq(place), w_offset.eq(offset)]
                with m.Else():
                    m.d.sync += w_bank.eq(w_bank + 1)
            with m.Else():
                m.d.sync += word.eq(word + 1)
        return rows_written, room_end, writing

    def _column_reads(self, m, read_ports, reader, r1_load):
        """Bank read addresses of the column part being fetched, and its padding flags."""
        prm, banks = self.params, ROW_BUFFER_ROWS
        b0, part, column, y0 = reader.b0, reader.part, reader.column, reader.y0
        # Which kernel row each bank serves in this part, and whether it is padding.
        pads = Signal(_WINDOW_ROWS)   # per window-register row (bank order, then extra rows)
        column_inside = (column >= 0) & (column < prm.in_w)
        for b, port in enumerate(read_ports):
            above = Const(b) < b0                        # the row wrapped past the last bank
            ky = Mux(above, b + banks, b) - b0 + part * banks
            place = above + part
            row = y0 + ky
            inside = (ky < prm.kh) & (row >= 0) & (row < prm.in_h) & column_inside
            m.d.comb += [
                port.addr.eq(Array(reader.offsets)[place] + reader.cb_offset + column),
                port.en.eq(r1_load),
            ]
            m.d.comb += pads[b].eq(~inside | (part != 0))    # part 2 writes extra rows only
        for extra in range(_WINDOW_ROWS - banks):        # kernel row banks + extra, part 2
            ky = banks + extra
            row = y0 + ky
            inside = (ky < prm.kh) & (row >= 0) & (row < prm.in_h) & column_inside
            m.d.comb += pads[banks + extra].eq(~inside)
        return pads

    def _advance_rows(self, m, reader):
        """Move the ring position from row y0 to row y0 + sh (sh ≤ 2 < banks)."""
        prm, banks, offsets = self.params, ROW_BUFFER_ROWS, reader.offsets
        bank = reader.b0 + prm.sh
        self._set_y0(m, reader, reader.y0 + prm.sh, reader.y_kh + prm.sh)
        with m.If(bank >= banks):
            place, offset = self._next_place(reader.place2, offsets[2])
            m.d.sync += [reader.b0.eq(bank - banks), offsets[0].eq(offsets[1]),
                         offsets[1].eq(offsets[2]), offsets[2].eq(offset),
                         reader.place2.eq(place)]
        with m.Else():
            m.d.sync += reader.b0.eq(bank)

    def _set_y0(self, m, reader, y0, y_kh):
        """Move the reader to input row ``y0``, with the registers derived from it; ``y_kh``
        is ``y0 + kh``, formed from the last one, as ``y0`` is: one adder before the clamp."""
        prm = self.params
        y0_value, y_kh_value = Signal(_COORD), Signal(_COORD)
        m.d.comb += [y0_value.eq(y0), y_kh_value.eq(y_kh)]
        m.d.sync += [
            reader.y0.eq(y0_value),
            reader.y_kh.eq(y_kh_value),
            reader.y_end.eq(Mux(y_kh_value < prm.in_h, y_kh_value, prm.in_h)),
            reader.room_end.eq(Mux(y0_value < 0, 0, y0_value) + reader.capacity),
        ]

    def _reader_start(self, m, reader):
        """Reader position at ``start``: the first window of row −pad_top."""
        prm, banks, offsets = self.params, ROW_BUFFER_ROWS, reader.offsets
        # Row −pad_top sits at bank (6 − pad_top) mod 6 of the place before row 0's.
        first_place, first_offset = Const(0), Const(0)
        second_place, second_offset = self._next_place(first_place, first_offset)
        third_place, third_offset = self._next_place(second_place, second_offset)
        with m.If(prm.pad_top == 0):
            m.d.sync += [reader.b0.eq(0), offsets[0].eq(0), offsets[1].eq(second_offset),
                         offsets[2].eq(third_offset), reader.place2.eq(third_place)]
        with m.Else():
            m.d.sync += [reader.b0.eq(Mux(prm.pad_top >= banks, prm.pad_top - banks,
                                          banks - prm.pad_top)),
                         offsets[0].eq(0), offsets[1].eq(0),
                         offsets[2].eq(second_offset), reader.place2.eq(second_place)]

    def _reader_sequence(self, m, reader, start, issue, reading, last_part, last_column, slide):
        """The reader's walk over column parts, windows, passes and output rows. Whether each
        of the window, block, pass and row counters has another value to go (``counter + 1 <
        limit``) is a register set with the counter: the walk's nested end tests are then
        flags, not a chain of comparisons in front of the ring's registers."""
        prm, r = self.params, reader
        counters = {"ox": prm.out_w, "cb": prm.blocks, "rep": prm.repeats, "oy": prm.out_h}
        more = {name: Signal(name=f"reader_{name}_more") for name in counters}

        def restart(*names):
            for name in names:
                m.d.sync += [getattr(r, name).eq(0), more[name].eq(1 < counters[name])]

        def step(name):
            value = getattr(r, name)
            m.d.sync += [value.eq(value + 1), more[name].eq(value + 2 < counters[name])]

        with m.If(start):
            self._reader_start(m, reader)
            self._set_y0(m, reader, -prm.pad_top, prm.kh - prm.pad_top)
            restart("oy", "rep", "cb", "ox")
            m.d.sync += [
                reading.eq(1), r.cb_offset.eq(0),
                r.window_x.eq(-prm.pad_left),
                r.column.eq(-prm.pad_left), r.columns_left.eq(prm.kw - 1), r.part.eq(0),
            ]
        with m.Elif(issue):
            with m.If(~last_part):
                m.d.sync += r.part.eq(r.part + 1)
            with m.Elif(~last_column):
                m.d.sync += [r.part.eq(0), r.columns_left.eq(r.columns_left - 1),
                             r.column.eq(r.column + 1)]
            with m.Else():
                m.d.sync += r.part.eq(0)
                with m.If(more["ox"]):
                    # Next window: only the columns that slide in.
                    step("ox")
                    m.d.sync += [r.window_x.eq(r.window_x + prm.sw),
                                 r.column.eq(r.window_x + prm.sw + prm.kw - slide),
                                 r.columns_left.eq(slide - 1)]
                with m.Else():
                    restart("ox")
                    m.d.sync += [r.window_x.eq(-prm.pad_left),
                                 r.column.eq(-prm.pad_left), r.columns_left.eq(prm.kw - 1)]
                    with m.If(more["cb"]):
                        step("cb")
                        m.d.sync += r.cb_offset.eq(r.cb_offset + prm.in_w)
                    with m.Else():
                        restart("cb")
                        m.d.sync += r.cb_offset.eq(0)
                        with m.If(more["rep"]):
                            step("rep")
                        with m.Else():
                            restart("rep")
                            with m.If(more["oy"]):
                                step("oy")
                                self._advance_rows(m, reader)
                            with m.Else():
                                m.d.sync += reading.eq(0)

    def _read_stage(self, m, start, issue, r1_valid, r1_load, reader, last_column, pads):
        """Reader stage 1: bank data (held by the ports' enables while blocked)."""
        r1_part = Signal(range(_MAX_PARTS))
        r1_last = Signal()            # last column part of a window
        r1_b0 = Signal(range(ROW_BUFFER_ROWS))
        r1_pads = Signal(_WINDOW_ROWS)
        r1_consume = Signal()
        r1_valid_next = Signal()
        m.d.comb += [r1_load.eq(~r1_valid | r1_consume),
                     r1_valid_next.eq(Mux(start, 0, Mux(r1_load, issue, r1_valid)))]
        m.d.sync += r1_valid.eq(r1_valid_next)
        with m.If(~start & r1_load):
            m.d.sync += [r1_part.eq(reader.part), r1_last.eq(last_column),
                         r1_b0.eq(reader.b0), r1_pads.eq(pads)]
        return r1_part, r1_last, r1_b0, r1_pads, r1_consume, r1_valid_next

    def _shift_in(self, m, fill, read_ports, r1_part, r1_b0, r1_pads, r1_consume):
        """Shifts a fetched column part into the rightmost column of the window register."""
        banks, cols = ROW_BUFFER_ROWS, MAX_KERNEL
        bank_data = [port.data for port in read_ports]
        with m.If(r1_consume):
            with m.If(r1_part == 0):
                for r in range(_WINDOW_ROWS):
                    for c in range(cols - 1):
                        m.d.sync += [fill.words[r][c].eq(fill.words[r][c + 1]),
                                     fill.pads[r][c].eq(fill.pads[r][c + 1])]
                    m.d.sync += [fill.words[r][cols - 1].eq(bank_data[r] if r < banks else 0),
                                 fill.pads[r][cols - 1].eq(r1_pads[r])]
            with m.Else():
                # Part 2 of a tall column: rows 6… come from the banks after b0, next place.
                for extra in range(_WINDOW_ROWS - banks):
                    source = Array(bank_data)[Mux(r1_b0 + extra >= banks,
                                                  r1_b0 + extra - banks, r1_b0 + extra)]
                    m.d.sync += [fill.words[banks + extra][cols - 1].eq(source),
                                 fill.pads[banks + extra][cols - 1].eq(r1_pads[banks + extra])]

    def _hold(self, m, start, fill, hold, hold_valid, hold_valid_next, transfer, emit):
        """The hold register: takes a complete window and counts its steps out."""
        step = Signal(range(MAX_KERNEL * MAX_KERNEL))
        # The window's last step index, a register: the kernel-size product and the
        # depthwise rounding behind ``steps`` stay off the hold register's handshake. The
        # parameters are the instruction's, set before ``start``; the first window reaches
        # the hold register cycles after it.
        final_step = Signal(range(MAX_KERNEL * MAX_KERNEL))
        final_step_next = Signal.like(final_step)
        m.d.comb += final_step_next.eq(self.steps - 1)
        m.d.sync += final_step.eq(final_step_next)
        last_step = step == final_step
        with m.If(transfer):
            for r in range(_WINDOW_ROWS):
                for c in range(MAX_KERNEL):
                    m.d.sync += hold.words[r][c].eq(
                        Mux(fill.pads[r][c], self._zero_word(), fill.words[r][c]))
            m.d.sync += hold.b0.eq(fill.b0)
        step_next = Signal.like(step)
        m.d.comb += [
            hold_valid_next.eq(Mux(start, 0, Mux(transfer, 1,
                                                 Mux(emit & last_step, 0, hold_valid)))),
            step_next.eq(Mux(start | transfer, 0, Mux(emit & ~last_step, step + 1, step))),
        ]
        m.d.sync += [hold_valid.eq(hold_valid_next), step.eq(step_next)]
        return step, last_step, step_next == final_step_next

    def _zero_word(self):
        """A word of the input's zero point in every lane: padding."""
        return Cat(*([self.params.zero_point] * self.lanes))

    def _handshake(self, m, r1_consume, transfer, emit, following):
        """The window path's handshake: a step leaves the hold register (``emit``), a
        window moves from the fill to the hold register (``transfer``), a column part
        moves into the fill register (``r1_consume``). Each is ``X0 | X1 & ready``, where
        ``ready`` is the array's and X0, X1 are registers formed from the next cycle's
        state (``following``): between the array's handshake and the thousands of window
        register enables there is one gate, not the chain of the valid flags."""
        ready = self.o_stream.ready
        n = SimpleNamespace(**following)
        idle_next = ~n.out_valid                 # o_stream's register is free
        hold_free_next = ~n.hold_valid | (n.last_step & idle_next)
        for out, name, x0, x1 in (
                (emit, "emit", n.hold_valid & idle_next, n.hold_valid),
                (transfer, "transfer", n.fill_valid & hold_free_next,
                 n.fill_valid & n.last_step),
                (r1_consume, "consume", n.r1_valid & (~n.fill_valid | hold_free_next),
                 n.r1_valid & n.last_step)):
            any_ready, on_ready = Signal(name=f"{name}_any"), Signal(name=f"{name}_on_ready")
            m.d.sync += [any_ready.eq(x0), on_ready.eq(x1)]
            m.d.comb += out.eq(any_ready | (on_ready & ready))

    def _taps(self, m, start, transfer, emit, step, last_step, fill, hold, hold_valid):
        """Step emission: each slot's tap (ky, kx), read from the hold register or padding.
        Each slot's place in the hold register (and whether its tap is in the kernel) is a
        register set with (ky, kx) from their next values and the hold register's next
        ``b0``: the bank arithmetic stays off the path through the hold register's
        multiplexer tree into the window register.

        What the kernel shape alone decides (the step's (rows, columns), each slot's first
        tap, the first column of the kernel in the grid) comes from registers loaded every
        cycle from the window parameters (:func:`~.pipeline.stage`): a cycle late after a new
        configuration, which no step sees (the first is emitted after a window is filled),
        and placed beside the slots rather than beside the parameters' own registers."""
        prm, banks, lanes, taps = self.params, ROW_BUFFER_ROWS, self.lanes, self.taps
        cols = MAX_KERNEL
        word_shape = unsigned(8 * lanes)
        out = self.o_stream
        advance = ~out.valid | out.ready
        # Tap k = step·G + s of slot s, tracked as (ky, kx) without dividing: each step adds
        # divmod(G, kw). G is 1 for a normal convolution (slot 0 only).
        step_rows, step_cols = Signal(range(taps + 1)), Signal(range(MAX_KERNEL))
        with m.Switch(prm.kw):
            for kw in range(1, MAX_KERNEL + 1):
                with m.Case(kw):
                    m.d.comb += [step_rows.eq(Mux(prm.depthwise, taps // kw, 1 // kw)),
                                 step_cols.eq(Mux(prm.depthwise, taps % kw, 1 % kw))]
        step_rows = pipeline.stage(m, step_rows, "step_rows")
        step_cols = pipeline.stage(m, step_cols, "step_cols")
        kernel_w = pipeline.stage(m, prm.kw, "kernel_width")
        col_base = pipeline.stage(m, cols - prm.kw, "kernel_first_column", signed(4))
        max_ky = MAX_KERNEL * MAX_KERNEL + taps
        zero_word = self._zero_word()
        # The hold register as a power-of-two grid indexed by Cat(column, row): each tap is a
        # binary mux tree (a one-hot case statement would cost several times the logic).
        row_bits, col_bits = (_WINDOW_ROWS - 1).bit_length(), (cols - 1).bit_length()

        def grid(cells, width):
            return Cat(*(cells[r][c] if r < _WINDOW_ROWS and c < cols else Const(0, width)
                         for r in range(1 << row_bits) for c in range(1 << col_bits)))

        hold_words = grid(hold.words, word_shape.width)
        b0_next = Mux(transfer, fill.b0, hold.b0)
        for s in range(taps):
            ky = Signal(range(max_ky), name=f"slot_{s}_ky")
            kx = Signal(range(MAX_KERNEL), name=f"slot_{s}_kx")
            ky_next, kx_next = Signal.like(ky), Signal.like(kx)
            m.d.comb += [ky_next.eq(ky), kx_next.eq(kx)]
            ky_first, kx_first = Signal.like(ky), Signal.like(kx)
            with m.Switch(prm.kw):
                for width in range(1, MAX_KERNEL + 1):
                    with m.Case(width):
                        m.d.comb += [ky_first.eq(s // width), kx_first.eq(s % width)]
            ky_first = pipeline.stage(m, ky_first, f"slot_{s}_ky_first")
            kx_first = pipeline.stage(m, kx_first, f"slot_{s}_kx_first")
            with m.If(transfer | start):
                m.d.comb += [ky_next.eq(ky_first), kx_next.eq(kx_first)]
            with m.Elif(emit):
                wrap = kx + step_cols >= kernel_w
                m.d.comb += [
                    kx_next.eq(Mux(wrap, kx + step_cols - kernel_w, kx + step_cols)),
                    ky_next.eq(ky + step_rows + wrap),
                ]
            m.d.sync += [ky.eq(ky_next), kx.eq(kx_next)]
            # Window-register row of kernel row ky: its bank, rotated by b0; or an extra row.
            rotated = b0_next + ky_next
            row = Mux(ky_next < banks, Mux(rotated >= banks, rotated - banks, rotated), ky_next)
            col = col_base + kx_next
            index = Signal(col_bits + row_bits, name=f"slot_{s}_index")
            valid = Signal(name=f"slot_{s}_valid")
            m.d.sync += [index.eq(Cat(col[:col_bits], row[:row_bits])),
                         valid.eq((ky_next < prm.kh) & (prm.depthwise | (s == 0)))]
            with m.If(emit):
                m.d.sync += out.payload.taps[s].as_value().eq(
                    Mux(valid, hold_words.word_select(index, word_shape.width), zero_word))
        with m.If(emit):
            m.d.sync += [out.payload.first.eq(step == 0), out.payload.last.eq(last_step)]
        out_valid_next = Signal()
        m.d.comb += out_valid_next.eq(Mux(start, 0, Mux(advance, hold_valid, out.valid)))
        m.d.sync += out.valid.eq(out_valid_next)
        return out_valid_next
