"""The cycle model: per-group latency and exact DRAM bytes of the accelerator's schedule.

It models the microarchitecture :mod:`sfnpu.hw.controller` implements, from the same
constants the RTL is built from (the hardware configuration, the DMA's issue latency, the
conv array's and requantiser's pipeline depths, the row buffer's fetch rules) — nothing is
fitted to measurements. The RTL is checked against it group by group (``tests/test_cycle.py``,
``sfnpu sim``).

DRAM bytes are exact: they are the bus beats of the DMA commands the controller issues — the
image header and section table (first group), the instruction, the parameter block, the
weights (once per output-channel chunk, or once per output row when a row-reuse layer's
weights do not fit the weight store, or not at all when ``weights_held``), the input (once per
chunk, or once when staged), the shortcut operand, and the output (write strobes: exactly the
output's bytes).

Latency, per group (the controller's states in order)::

    FETCH → FETCH_ALIGN → DECODE → DECODE2 → DIVIDE → [CHUNK] → PARAM → [WEIGHT]
          → (COMPUTE_START → COMPUTE → [WEIGHT of the next chunk]) … → GROUP_END

Control transfers use the DRAM model's closed form (:mod:`sfnpu.hw.axi_mem`): a read of *N*
beats takes ``ISSUE_LATENCY + latency + floor((N − 1) · B/bpc) + 1`` cycles from its command
state to its last beat, inclusive (the next state starts in the cycle after), unless short
bursts at a 4 KiB boundary let the outstanding limit delay a burst's address past the stream
(then burst by burst, :meth:`CycleModel.control_read`); beats of the activation table are
taken one byte per cycle. The compute phase is a row-level
schedule: input rows arrive through the DMA engine's bursts (a command accepted once the
previous one has issued its bursts, addresses ``ISSUE_LATENCY`` cycles after acceptance, at
most ``outstanding`` bursts in flight, data ``latency`` cycles after the address); the input
and shortcut readers command a segment once their FIFO has room for it counting the words in
flight, and the command arbiter takes the shortcut's first when both are requested; the row
buffer holds ``6 · places`` rows, each output row takes :func:`~sfnpu.hw.conv_array.row_cycles`
once its input rows are present, the post-processing chain passes one word per cycle (the
average pool sums window by window and holds the array when the result FIFO fills), the
output writer takes a chunk once all its words are in the write buffer, and the group ends
when the last output chunk's write response is back (its last word, for an on-chip output).
The output rows' writes are commanded as the rows leave the post-processing chain, and the
two directions' beats share the DRAM model's one bandwidth credit with its arbitration (a read
beat first unless the write side's turn has come: under load they alternate), simulated in
time order so that earlier rows' writes hold up later rows' reads. Every DRAM command
carries the controller's address (IMAGE_BASE, ``CycleModel.run``'s ``image_base``, plus the
location and the layout offset of its segment), and is split into bursts as the DMA splits it:
at most ``dram_max_burst`` beats, never across a 4 KiB boundary. Weights that do not fit the
store stream set by set at the top read priority, each set commanded once the weight FIFO has
room for it (:class:`_WeightStream`). Not modelled: the write buffer filling up and stalling
the datapath when the writes fall behind.

A group with ``prefetch`` ends no earlier than its prefetch: the next instruction's read, four
cycles of sizing and checks, and the read of the next group's weights, from the first cycle
of COMPUTE, timed as the control FSM's reads — the compiler sets it only where the compute
phase has the bus to itself (:func:`sfnpu.limits.prefetch_pays`); the next group then
finds its weights held.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import groupby
from math import ceil, floor
from typing import Sequence

from sfnpu import image, isa, layout
from sfnpu.config import MAX_KERNEL, ROW_BUFFER_ROWS, HwConfig
from sfnpu.hw.axi import BOUNDARY_BYTES
from sfnpu.limits import (StoreSizes, chunk_blocks, group_shape, stages_input,
                             staging_location,
                             streams_weights)
from sfnpu.isa import (Activation, ActOrder, Eltwise, InputTransform, Instruction, MemSpace,
                       Pool, Reuse)

__all__ = ["CycleModel", "GroupTiming", "ModelRun", "Comparison", "compare",
           "GROUP_TOLERANCE", "GROUP_SLACK", "RUN_TOLERANCE"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


#: The compute phase's DRAM readers in the controller's command-arbiter priority (after the
#: output writes): streamed weights, shortcut, input.
WEIGHT_READER, SHORTCUT_READER, INPUT_READER = range(3)


@dataclass(frozen=True)
class GroupTiming:
    """One group's modelled latency and DRAM traffic."""
    index: int
    cycles: int
    read_bytes: int
    write_bytes: int
    reuse: Reuse
    control: int            # fetch, decode, parameter and weight loading
    compute: int            # the compute phases (all chunks)
    bound: str              # what limits the compute phase: "mac" or "dram"


@dataclass
class ModelRun:
    """A whole program: per-group timings and totals."""
    config: HwConfig
    groups: list[GroupTiming] = field(default_factory=list)

    @property
    def cycles(self) -> int:
        return sum(g.cycles for g in self.groups)

    @property
    def read_bytes(self) -> int:
        return sum(g.read_bytes for g in self.groups)

    @property
    def write_bytes(self) -> int:
        return sum(g.write_bytes for g in self.groups)

    @property
    def seconds(self) -> float:
        return self.cycles / (self.config.clock_mhz * 1e6)


@dataclass(frozen=True)
class _Shape:
    """The quantities the controller derives in DECODE/DECODE2/DIVIDE/CHUNK."""
    depthwise: bool
    identity: bool
    in_blocks: int
    out_blocks: int
    ib: int                 # input-channel blocks per output block (1: depthwise)
    conv_h: int
    conv_w: int
    steps: int              # P
    taps: int
    row_words: int
    places: int
    streaming: bool         # row reuse, weights larger than the store: streamed per row
    chunk_obs: int          # output-channel blocks per chunk


class CycleModel:
    """Latency and DRAM bytes of each group on one hardware configuration."""

    #: DMA: command accepted → first burst address (:attr:`sfnpu.hw.dma.DmaEngine.ISSUE_LATENCY`).
    #: Quotient bits per cycle of the average pool's dividers (the controller's default).
    AVG_DIVIDER_BITS = 2

    def __init__(self, config: HwConfig):
        from sfnpu.hw.conv_array import array_latency
        from sfnpu.hw.dma import DmaEngine
        from sfnpu.hw.requant import Requantizer

        self.config = config
        self.B = config.dram_bus_bytes
        self.L = config.lanes
        self.beat = Fraction(self.B) / config.dram_bytes_per_cycle   # cycles per beat
        self.latency = config.dram_latency
        self.sizes = StoreSizes.of(config)
        self.weight_words = self.sizes.weight_words
        self.row_words_max = self.sizes.row_words
        self.write_words = self.sizes.write_words
        self.psum_words = self.sizes.psum_words
        self.issue = DmaEngine.ISSUE_LATENCY
        self.reissue = DmaEngine.REISSUE_LATENCY
        self.outstanding = DmaEngine.outstanding_to_stream(config)
        self.max_burst = config.dram_max_burst
        self.page_words = BOUNDARY_BYTES // self.B          # bus words of a 4 KiB page
        # Array → psum stage → requantiser → result FIFO.
        self.result_latency = array_latency(config) + 1 + Requantizer.LATENCY + 1
        # The last row's end → the compute phase's cycles when only the datapath is left:
        # the last step a cycle after the end, the row buffer's busy falls two cycles later,
        # the datapath's busy array_latency + 1 cycles after that (its in_flight shift
        # register), compute_done in that cycle (+ 1: the cycle count).
        self.drain_latency = 1 + 2 + array_latency(config) + 1 + 1
        # The same from the cycle the row buffer holds the input's last row, when no window
        # reads it: its busy falls a cycle later.
        self.rows_drain_latency = 1 + array_latency(config) + 1 + 1

    # -- DRAM transfers -------------------------------------------------------------------

    def beats(self, address: int, length: int) -> int:
        """Bus beats of a command: every bus word the byte range touches."""
        if length <= 0:
            return 0
        return (address + length - 1) // self.B - address // self.B + 1

    def bursts(self, address: int, n_beats: int) -> list[int]:
        """Beats of each burst the DMA splits a command of ``n_beats`` beats from byte
        ``address`` into (:meth:`sfnpu.hw.dma.DmaEngine._burst_words`): at most
        ``dram_max_burst`` beats, never past a 4 KiB boundary."""
        mb, page = self.max_burst, self.page_words
        word = (address // self.B) % page
        if word + n_beats <= page or (word % mb == 0 and page % mb == 0):
            # no boundary inside, or every boundary falls between max_burst bursts
            full, rest = divmod(n_beats, mb)
            return [mb] * full + ([rest] if rest else [])
        lengths = []
        while n_beats:
            n = min(n_beats, mb, page - word)
            lengths.append(n)
            word = (word + n) % page
            n_beats -= n
        return lengths

    def _stream(self, n_beats: int) -> int:
        """Cycles from the first to the last beat of a back-to-back read, inclusive."""
        return floor((n_beats - 1) * self.beat) + 1 if n_beats else 0

    def read_transfer(self, n_beats: int) -> int:
        """Cycles of a control-FSM read: from the command state (the command is accepted
        there; its address follows ``issue`` cycles later) to the last beat, inclusive — the
        next state starts in the cycle after it."""
        return self.issue + self.latency + self._stream(n_beats)

    def control_read(self, address: int, length: int) -> tuple[int, int]:
        """(cycles, beats) of a control-FSM read of ``length`` bytes from byte ``address``
        (:meth:`read_transfer`). The DMA issues its bursts one per cycle, burst *j* + *O* no
        earlier than ``REISSUE_LATENCY`` cycles after burst *j*'s last beat was taken, and a
        burst's data is due ``latency`` cycles after its address: when a 4 KiB boundary leaves
        a short burst among full ones, the next address can come too late for the beats to
        stream on, and the read takes that much longer."""
        n = self.beats(address, length)
        cycles = self.read_transfer(n)
        lengths = self.bursts(address, n)
        if len(lengths) <= self.outstanding or all(k == self.max_burst for k in lengths[:-1]):
            return cycles, n                         # the closed form's bursts: no gap
        beat, O = self.beat, self.outstanding
        issued, done = self.issue - 1, []            # last address; bursts' last beats taken
        free = 0                                     # the credit's next beat
        taken = 0
        for j, k in enumerate(lengths):
            aw = issued + 1
            if j >= O:
                aw = max(aw, ceil(done[j - O]) + self.reissue)
            issued = aw
            taken = max(aw + self.latency, free) + (k - 1) * beat
            free = taken + beat
            done.append(taken)
        return floor(taken) + 1, n

    # -- the group's derived parameters ---------------------------------------------------

    def shape(self, instr: Instruction) -> _Shape:
        g = group_shape(instr, self.sizes)
        return _Shape(g.depthwise, g.identity, g.in_blocks, g.out_blocks, g.ib, g.conv_h,
                      g.conv_w, g.steps, g.taps, g.row_words, g.places,
                      streams_weights(instr, self.config), chunk_blocks(instr, self.config))

    def _chunks(self, s: _Shape) -> list[int]:
        if not s.chunk_obs:
            raise ValueError("one output block's weights do not fit the weight store (or half "
                             "of it with double_buffer): the controller stops the group with "
                             "BUFFER_OVERFLOW (sfnpu.limits.overflows)")
        full, rest = divmod(s.out_blocks, s.chunk_obs)
        return [s.chunk_obs] * full + ([rest] if rest else [])

    # -- one group ------------------------------------------------------------------------

    def group(self, instr: Instruction, index: int = 0, fetch_address: int = 0,
              section_count: int | None = None, base: int = 0,
              next_instr: Instruction | None = None) -> GroupTiming:
        """Model one group. ``fetch_address``: the instruction's byte offset in the image (its
        alignment decides the fetch's beats); ``section_count``: the image's sections, when
        the header and section table are read before this group; ``base``: the image's DRAM
        address (IMAGE_BASE): DRAM locations are offsets from it, and the DMA splits bursts
        at 4 KiB boundaries of the absolute addresses; ``next_instr``: the instruction after
        it, whose weights a group with ``prefetch`` loads."""
        cfg, B, L = self.config, self.B, self.L
        s = self.shape(instr)
        read = write = 0
        control = 0
        if section_count is not None:
            for address, length in ((base, image.HEADER.size),
                                    (base + image.HEADER.size,
                                     section_count * image.SECTION.size)):
                cycles, n = self.control_read(address, length)
                control += cycles + 1                         # + HEADER_CHECK / TABLE_CHECK
                read += n * B
        # FETCH, FETCH_ALIGN, DECODE, DECODE2, DIVIDE (one quotient bit per cycle, + 1).
        cycles, n = self.control_read(base + fetch_address, isa.WORDS * 4)
        read += n * B
        control += cycles + 3 + self.row_words_max.bit_length() + 1
        chunks = self._chunks(s)
        if s.chunk_obs != s.out_blocks:                      # CHUNK: one block per cycle
            control += s.chunk_obs + 1
        # PARAM: every store takes a beat per cycle (the activation tables too).
        cycles, n = self.control_read(base + instr.params.offset,
                                      layout.param_bytes(instr, cfg))
        control += cycles
        read += n * B
        loads_weights = not (s.identity or s.streaming or instr.weights_held)
        compute = 0
        bounds = []
        # A staged input (hw.limits.stages_input) comes from DRAM in the first chunk and from
        # the staging buffer in the others.
        later = instr.replace(input=staging_location(instr)) if stages_input(instr, cfg) \
            else instr
        ob_base = 0
        block_bytes = s.ib * s.steps * cfg.ti * cfg.to

        def chunk_read(first: int, blocks: int) -> tuple[int, int]:
            """(cycles, beats) of the weights of ``blocks`` output blocks from ``first`` on."""
            length = s.in_blocks * s.taps * L if s.depthwise else blocks * block_bytes
            return self.control_read(base + instr.weights.offset + first * block_bytes, length)
        for k, obs in enumerate(chunks):
            if loads_weights and not (k and instr.double_buffer):
                cycles, n = chunk_read(ob_base, obs)           # WEIGHT_CMD
                control += cycles
                read += n * B
            cycles, r, w, bound = self._compute(later if k else instr, s, obs, ob_base, base)
            if instr.double_buffer and k + 1 < len(chunks):
                # the next chunk loads behind this one: CHUNK, PLACE, then its read
                load, n = chunk_read(ob_base + obs, chunks[k + 1])
                cycles = max(cycles, 2 + load + 1)
                r += n * B
            elif instr.prefetch and k + 1 == len(chunks):
                prefetch, n = self._prefetch(next_instr, base + fetch_address + isa.WORDS * 4,
                                             base)
                cycles = max(cycles, prefetch)
                r += n
            ob_base += obs
            compute += cycles + 1                              # + COMPUTE_START
            read += r
            write += w
            bounds.append(bound)
        cycles = control + compute + 1                          # + GROUP_END
        return GroupTiming(index, cycles, read, write, instr.reuse, control, compute,
                           max(set(bounds), key=bounds.count))

    def _prefetch(self, nxt: Instruction | None, address: int, base: int) -> tuple[int, int]:
        """(cycles, read bytes) of a ``prefetch``: from the first cycle of COMPUTE to the one in
        which the controller's prefetch is done — the next instruction's read (``address``),
        ALIGN, BLOCKS, WORDS, CHECK and PLACE, and the read of its weights, each read issued at
        once.
        The compiler sets ``prefetch`` only where the compute phase has the bus to itself
        (:func:`sfnpu.limits.prefetch_pays`), so the reads are the control FSM's."""
        if nxt is None:
            raise ValueError("a group with prefetch set needs the next instruction")
        cfg = self.config
        cycles, n = self.control_read(address, isa.WORDS * 4)
        words = group_shape(nxt, self.sizes).weight_steps
        w_cycles, w_n = self.control_read(base + nxt.weights.offset, words * cfg.ti * cfg.to)
        return cycles + 5 + w_cycles + 1, (n + w_n) * self.B

    # -- the compute phase ------------------------------------------------------------------

    def _compute(self, instr: Instruction, s: _Shape, obs: int, ob_base: int = 0,
                 base: int = 0):
        """(cycles, read bytes, write bytes, bound) of one chunk of ``obs`` output blocks from
        block ``ob_base`` on, from the first cycle of COMPUTE to the cycle ``compute_done``
        rises. DRAM commands carry the controller's addresses (``base``: IMAGE_BASE)."""
        from sfnpu.hw.act_table import ActivationTable
        from sfnpu.hw.conv_array import fetch_cycles
        from sfnpu.hw.eltwise_add import EltwiseAdd
        from sfnpu.hw.requant import Requantizer

        cfg, L = self.config, self.L
        in_dram = instr.input.space == MemSpace.DRAM
        out_dram = instr.output.space == MemSpace.DRAM
        sc_dram = instr.shortcut.space == MemSpace.DRAM
        is_add = instr.eltwise == Eltwise.ADD
        dram = _Dram(self)

        row_bytes = s.row_words * L                        # one input row, every block
        pooled_h = instr.out_h >> 1 if instr.upsample else instr.out_h
        pooled_w = instr.out_w >> 1 if instr.upsample else instr.out_w
        out_row_bytes = obs * instr.out_w * L              # one output row of this chunk
        w_row_bytes = obs * s.ib * s.steps * cfg.ti * cfg.to if s.streaming else 0
        sc_row_bytes = obs * s.conv_w * L if is_add else 0
        # The agents' DRAM addresses (the controller's segment address registers).
        in_plane = instr.in_h * instr.in_w * L             # one channel block of the input
        in_address = base + instr.input.offset
        sc_plane = s.conv_h * s.conv_w * L
        sc_address = base + instr.shortcut.offset + ob_base * (sc_plane if is_add else L)
        out_plane = instr.out_h * instr.out_w * L
        out_first = base + instr.output.offset \
            + (instr.out_c_offset // L + ob_base) * out_plane
        set_bytes = s.steps * cfg.ti * cfg.to               # a streamed weight set

        # The array: one conv row of every pass of this chunk.
        passes = (1 if s.depthwise else obs) * s.in_blocks
        p = s.steps
        f0 = fetch_cycles(instr.kh, instr.kw, instr.sw, True)
        f1 = fetch_cycles(instr.kh, instr.kw, instr.sw, False)
        pass_cycles = max(p, f0) + (s.conv_w - 1) * max(p, f1)
        row = passes * pass_cycles
        # An output block's results leave the array in its last input-block pass.
        block_cycles = s.ib * pass_cycles
        capacity = ROW_BUFFER_ROWS * s.places
        local_free = [0]                                   # the on-chip input reader

        # CHANNEL_SCALE reads its vector once, before the first result needs it.
        scale_ready = 0
        if instr.eltwise == Eltwise.CHANNEL_SCALE:
            scale_ready = dram.finish(dram.read(0, sc_address, obs * L, 1, 0,
                                                SHORTCUT_READER)) if sc_dram \
                else 1 + self.issue + obs
        # ADD: the shortcut reader commands one (oy, ob) segment of conv_w words at a time, in
        # the result order, once the shortcut FIFO has room for it counting the words in
        # flight (sc_req: level + sc_outstanding + conv_w ≤ psum_words) — segment k once the
        # ADD has taken (k + 1)·conv_w − psum_words shortcut words.
        row_results = obs * s.conv_w                       # result words of one conv row
        sc_segments = s.conv_h * obs if is_add else 0
        sc_segment = []           # per segment: its DRAM read, or the local reader's end
        sc_local_free = [0]
        row_timing = []           # per conv row: start, last step before a hold, the hold
        first_step, pixel_step = max(p, f0) - 1, max(p, f1)
        # A result reaches the ADD a cycle after the result FIFO, behind a table before it.
        to_add = self.result_latency + 1 + (
            ActivationTable.LATENCY if instr.act == Activation.TABLE
            and instr.act_order == ActOrder.BEFORE_ELTWISE else 0)
        word_cycles = ceil((L // self.B) * self.beat)      # bus cycles of one word

        def shortcut_taken(word):
            """The cycle the ADD takes shortcut word ``word`` (result order): with its result,
            once the word is in the shortcut FIFO."""
            r, i = divmod(word, row_results)
            ob, x = divmod(i, s.conv_w)
            step = (ob * s.ib + s.ib - 1) * pass_cycles + first_step + x * pixel_step
            start, held, hold = row_timing[r]
            result = start + step + (hold if step > held else 0) + to_add
            segment = sc_segment[r * obs + ob]
            behind = s.conv_w - 1 - x                        # later words of its segment
            arrived = dram.finish(segment) - behind * word_cycles if sc_dram \
                else segment - behind
            return max(result, arrived)

        def command_shortcuts():
            """Command the segments whose FIFO room the ADD has made in the rows timed so far."""
            while len(sc_segment) < sc_segments:
                taken = (len(sc_segment) + 1) * s.conv_w - self.psum_words
                if taken > len(row_timing) * row_results:
                    return
                # the FIFO level and sc_outstanding are registers: room shows a cycle later
                request = shortcut_taken(taken - 1) + 1 if taken > 0 else 0
                if sc_dram:
                    oy, ob = divmod(len(sc_segment), obs)
                    address = sc_address + ob * sc_plane + oy * s.conv_w * L
                    sc_segment.append(dram.read(request, address, s.conv_w * L, 1, 0,
                                                SHORTCUT_READER))
                else:
                    # the local reader: granted when idle, a word per cycle from the next one
                    sc_local_free[0] = max(sc_local_free[0], request) + s.conv_w + 1
                    sc_segment.append(sc_local_free[0])
        command_shortcuts()

        # Input rows: row r enters the FIFO once row r − 1 has left it for the row buffer,
        # and the row buffer takes row r once the reader's first row is above r − capacity.
        row_in = [0] * instr.in_h                          # cycle row r is in the row buffer
        reader_moved = []                   # cycle the reader moved to output row oy
        next_row = 0

        def room(r):
            """First cycle the row buffer may take row r (the reader has moved past)."""
            if r < capacity:
                return 0
            oy = 0
            while max(oy * instr.sh - instr.pad_top, 0) + capacity <= r:
                oy += 1
            return reader_moved[oy] if oy < len(reader_moved) else None

        in_fifo = [0] * instr.in_h                          # cycle row r is in the FIFO
        # The input transform's per-channel table sits between the FIFO and the row buffer.
        transform = ActivationTable.LATENCY \
            if instr.in_transform == InputTransform.CHANNEL_TABLE else 0
        next_in = [0]

        def fetch_rows(until, move=True):
            """Read rows into the FIFO and (``move``) move them into the row buffer as far as
            the reader's position allows, up to row ``until``."""
            nonlocal next_row
            while next_row <= until:
                r = next_row
                # A segment is commanded when the input FIFO (a row-buffer bank's words) has
                # room for it counting the words in flight (in_credit_ok): segment j once
                # (j + 1)·in_w − row_words_max words have left the FIFO, the row buffer
                # taking a row's words one per cycle from the cycle it may take the row.
                requests = []
                gates = {}
                for j in range(r * s.in_blocks, (r + 1) * s.in_blocks):
                    taken = (j + 1) * instr.in_w - self.row_words_max
                    if taken <= 0:
                        requests.append(0)
                        continue
                    row_taken, word = divmod(taken - 1, s.row_words)
                    if row_taken not in gates:
                        gates[row_taken] = room(row_taken)
                    if gates[row_taken] is None:
                        break
                    # the FIFO level and in_outstanding are registers: room shows a cycle later
                    requests.append(gates[row_taken] + word + 1)
                if len(requests) < s.in_blocks:
                    break
                cb = 0
                for request, together in groupby(requests):
                    segments = len(list(together))
                    if in_dram:
                        # segments cb … of row r: in_plane apart
                        address = in_address + cb * in_plane + r * instr.in_w * L
                        in_fifo[r] = dram.read(request, address, segments * instr.in_w * L,
                                               segments, in_plane)
                        cb += segments
                        continue
                    # The local reader streams a granted segment a word per cycle, one cycle
                    # after the grant, and is granted the next one when it is idle.
                    for _ in range(segments):
                        local_free[0] = max(request, local_free[0]) + instr.in_w + 1
                    in_fifo[r] = local_free[0] + 1
                next_row += 1
            while move and next_in[0] < next_row and next_in[0] <= until:
                r = next_in[0]
                gate = room(r)
                if gate is None:
                    break
                arrived = dram.finish(in_fifo[r]) if in_dram else in_fifo[r]
                row_in[r] = max(arrived, row_in[r - 1] if r else 0, gate + s.row_words) + 1 \
                    + transform
                next_in[0] += 1

        # The post-processing chain, pooled row by pooled row, and the writer.
        chunk = min(instr.out_w, max(1, self.write_words // 2))
        rows_out = instr.out_h // pooled_h               # 2 with upsampling
        per_block = _ceil_div(instr.out_w, chunk)        # segments of a block's row
        commands = obs * per_block * rows_out
        last_segment = (instr.out_w - chunk * (_ceil_div(instr.out_w, chunk) - 1)) * L
        latency = _post_latency(instr)
        post_state = [0, 0, 0]                            # next pooled row, post, last write
        rows_written = [0]                                # pooled rows commanded

        def out_address(k):
            """Address of write command k of a pooled row (controller order: chunks of a
            segment, then blocks, then the output rows of the pooled row)."""
            sub, rest = divmod(k, obs * per_block)
            ob, c = divmod(rest, per_block)
            oy = rows_written[0] * rows_out + sub
            return out_first + ob * out_plane + oy * instr.out_w * L + c * chunk * L

        def write_row(done, span, last_write, readies=None):
            """Command the writes of a pooled row whose last word is in the write buffer at
            ``done``, its words having entered over ``span`` cycles (or chunk k's at
            ``readies[k]``); the local writer's end. A streamed row's DRAM writes are already
            commanded (block by block, :func:`write_block`)."""
            if out_dram:
                # segments complete evenly over the row; each is commanded once its
                # words are in the write buffer, the last one when the row is done
                for k in range(commands if not streamed_writes else 0):
                    ready = readies[k] if readies else done - span + (k + 1) * span // commands
                    dram.write(ready, out_address(k),
                               last_segment if (k + 1) % per_block == 0 else chunk * L)
            else:
                # The local writer takes a chunk once all its words are in the write
                # buffer and it is idle: a grant cycle, then a word per cycle. Its chunks
                # complete evenly over the row.
                span = max(span, 1)
                for k in range(commands):
                    ready = readies[k] if readies \
                        else done - span + _ceil_div((k + 1) * span, commands)
                    words = last_segment // L \
                        if (k + 1) % (commands // (obs * rows_out)) == 0 else chunk
                    last_write = max(last_write, ready) + words + 1
            rows_written[0] += 1
            return last_write

        # A streamed row's blocks finish as their weights arrive, far apart: each block's
        # writes are commanded as its results leave (before the bus simulation goes past
        # them), and the row's post-chain pass only times them.
        streamed_writes = s.streaming and instr.pool in (Pool.NONE, Pool.GLOBAL_AVG) \
            and not instr.upsample
        # GlobalAvgPool: a block's output follows its last conv row's sums (_post_row)
        gap_output = self.L + Requantizer.LATENCY + 1 if instr.pool == Pool.GLOBAL_AVG else 0

        def chunk_lag(c):
            """Cycles between chunk ``c``'s last pixel and its block's last pixel leaving
            the array (a pixel every pixel_step cycles of the block's last pass)."""
            return (s.conv_w - min((c + 1) * chunk, instr.out_w)) * pixel_step

        def write_block(ob, block_end):
            """Block ``ob``'s chunks of the current row, its last pass ending at
            ``block_end``: chunk c is in the write buffer once its last pixel's result has
            passed the post chain. Returns the chunks' ready cycles."""
            readies = []
            results_out = max(block_end + self.result_latency, scale_ready)
            if is_add and sc_segments:
                # the ADD passes the block's results as its shortcut words are in
                segment = sc_segment[oy * obs + ob]
                results_out = max(results_out,
                                  (dram.finish(segment) if sc_dram else segment) + 1)
            for c in range(per_block):
                ready = results_out + gap_output + latency \
                    - (0 if gap_output else chunk_lag(c))
                readies.append(ready)
                if out_dram:
                    dram.write(ready, out_address(ob * per_block + c),
                               last_segment if c == per_block - 1 else chunk * L)
            return readies

        def upsample_row(post, arrivals):
            """The upsampler on a pooled row whose words arrive at ``arrivals[ob][px]``, the
            previous row's replay having ended at ``post`` (hw.upsample): the first copy
            leaves as the words arrive, each pixel twice in two cycles (the input is taken
            on the second copy), then the replay, a beat per cycle. Returns the replay's
            last beat and, per write command (the writer's order), its chunk's last beat
            + ``latency``: a block's first-copy chunks wait for its own results."""
            out_w = 2 * pooled_w
            first_pass = []                          # each block's beats
            for block in arrivals:
                beats = []
                for arrived in block:
                    if frozen is not None:
                        arrived = through_add(arrived)
                    copy = max(arrived, post + 1)
                    if frozen is not None:
                        # the word waits at the ADD's output, its pipeline frozen, until the
                        # upsampler takes it with its second copy
                        frozen.append((arrived + EltwiseAdd.LATENCY,
                                       copy + EltwiseAdd.LATENCY))
                    beats += [copy, copy + 1]
                    post = copy + 1
                first_pass.append(beats)
            replay_from = post + 1
            post += obs * out_w
            readies = []
            for sub in range(rows_out):
                for ob in range(obs):
                    for c in range(per_block):
                        j = min((c + 1) * chunk, out_w) - 1
                        beat = replay_from + ob * out_w + j if sub else first_pass[ob][j]
                        readies.append(beat + latency)
            return post, readies

        # An ADD feeding the upsampler: its pipeline stops as a whole while its output waits
        # (hw.eltwise_add, a clock enable), so a word waiting out a replay holds the words
        # behind it. The cycles it stood still, in order.
        frozen = [] if instr.upsample and is_add and instr.pool == Pool.NONE else None
        add_state = [0, 0]                  # first frozen span not yet passed, last accept

        def through_add(taken):
            """The cycle a word the ADD would take at ``taken`` shows at its output, less
            its latency: it enters after the word before it in a cycle the pipeline moves,
            and reaches the output after LATENCY such cycles."""
            a = max(taken, add_state[1] + 1)
            while add_state[0] < len(frozen) and frozen[add_state[0]][1] < a:
                add_state[0] += 1
            spans = frozen[add_state[0]:]
            for lo, hi in spans:
                if lo <= a <= hi:
                    a = hi + 1
            add_state[1] = a
            t, left = a, EltwiseAdd.LATENCY
            for lo, hi in spans:
                if hi < t:
                    continue
                if lo >= t + left:
                    break
                left -= lo - t                      # the cycles it moved before the span
                t = hi + 1
            return t + left - EltwiseAdd.LATENCY

        def pooled_arrivals(need):
            """When each word of pooled row reaches the upsampler, its last conv row being
            ``need``: a pooled word follows its window's last column's result, a block's in
            its last pass, and with an ADD the shortcut word too."""
            last = results[need]
            columns = [min(px * pool_stride - pool_pad + pool_size, s.conv_w) - 1
                       for px in range(pooled_w)]
            if sc_segments and instr.pool == Pool.NONE:
                return [[shortcut_taken(need * row_results + ob * s.conv_w + x) for x in columns]
                        for ob in range(obs)]
            return [[last - (obs - 1 - ob) * block_cycles - (s.conv_w - 1 - x) * pixel_step
                     for x in columns] for ob in range(obs)]

        pool_size, pool_stride, pool_pad = (instr.pool_size, instr.pool_stride,
                                            instr.pool_pad) if instr.pool == Pool.MAX \
            else (1, 1, 0)
        avg = _AvgSchedule(self, instr, s, obs, pooled_w, pooled_h, p, f0, f1, pass_cycles,
                           row, latency - 2) if instr.pool == Pool.AVG else None

        def post_rows(computed):
            """Pass the pooled rows whose conv rows are all out (up to ``computed``) through
            the post chain and command their writes."""
            py, post, last_write = post_state
            if avg is not None:
                for done, span, words in avg.advance(computed, results):
                    if instr.upsample:
                        # the pool's words leave it ``latency`` before the write buffer
                        post, readies = upsample_row(post, [
                            [w - latency for w in words[ob * pooled_w:(ob + 1) * pooled_w]]
                            for ob in range(obs)])
                        last_write = write_row(post + latency, span, last_write, readies)
                    else:
                        # a block's chunk is ready with its last window's word
                        readies = [words[ob * pooled_w + min((c + 1) * chunk, pooled_w) - 1]
                                   for ob in range(obs) for c in range(per_block)]
                        last_write = write_row(done, span, last_write, readies)
                post_state[1:] = post, last_write
                return
            while py < pooled_h:
                need, cost = self._post_row(instr, s, obs, py, pooled_h, pooled_w,
                                            block_cycles)
                if need > computed:
                    break
                readies = streamed_readies.get(py)
                if instr.pool == Pool.GLOBAL_AVG:
                    post = max(post, results[need]) + cost
                    if readies is None:
                        # each block's words are in the write buffer as its output leaves
                        readies = [post - cost + o + latency
                                   for o in self._gap_outputs(obs, block_cycles)
                                   for _ in range(per_block)]
                elif instr.upsample:
                    post, readies = upsample_row(post, pooled_arrivals(need))
                else:
                    chained = post + cost                # the chain's pace, when it is behind
                    post = max(chained, results[need])
                # Unpooled and max-pooled words follow the last conv row's results, which
                # leave the array over the whole row (a block's in its last input-block
                # pass): its segments complete over the row, for either writer. (The rows
                # before it pass the pool without output.)
                span = max(obs * s.conv_w, row) if instr.pool in (Pool.NONE, Pool.MAX) \
                    else cost
                if readies is None and instr.pool == Pool.NONE and not instr.upsample \
                        and not s.streaming and per_block > 1:
                    # A chunk is ready when its last pixel's result has passed (the writer's
                    # o_req: write_fifo.level ≥ o_committed + o_chunk), its block's results
                    # leaving in the block's last pass, a pixel every pixel_step cycles.
                    readies = [post + latency - (obs - 1 - ob) * block_cycles - chunk_lag(c)
                               for ob in range(obs) for c in range(per_block)]
                done = post
                if instr.pool == Pool.MAX and not instr.upsample:
                    # Columns right of the last window pass the pool after its last word.
                    tail = s.conv_w - min((pooled_w - 1) * pool_stride - pool_pad + pool_size,
                                          s.conv_w)
                    done = max(results[need] - tail * pixel_step, chained - tail)
                last_write = write_row(done + latency, span, last_write, readies)
                py += 1
            post_state[:] = py, post, last_write

        # The array, output row by output row (cycle its last result is out), and the post
        # chain behind it: the writes of earlier rows share the bus with later rows' reads.
        # The reader's last read of a row is its last window's last column (hw/row_buffer.py
        # advance_rows, on issue): with f1 ≥ 2 columns a window, fetched faster than its p
        # steps, that window's first column waits in stage 1 until the window before it moves
        # into the hold register (transfer, at the last step of the window two before), and
        # its others follow a cycle apart — 2·p − f1 + 2 cycles before the row's end.
        move_lead = 2 * p - f1 + 2 if 2 <= f1 <= p and s.conv_w >= 3 and avg is None else 0
        end = 0
        results = []
        streamed_readies = {}             # pooled row → its streamed chunks' ready cycles
        if s.streaming:
            weights = _WeightStream(self, dram, base + instr.weights.offset, obs * s.ib,
                                    s.conv_h, p, set_bytes, s.conv_w)
        for oy in range(s.conv_h):
            y_end = min(oy * instr.sh - instr.pad_top + instr.kh, instr.in_h)
            # The reader moves on after its last read of the previous row; rows behind the
            # new first row become free then.
            reader_moved.append(end - move_lead if oy else end)
            fetch_rows(y_end - 1)
            start = max(end, row_in[y_end - 1] + f0 + 1)
            # rows that fit behind this one are commanded meanwhile
            fetch_rows(min(instr.in_h - 1, max(oy * instr.sh - instr.pad_top, 0) + capacity),
                       move=False)
            if avg is not None:
                start = avg.resume_row(oy, start)
            end = start + row
            if avg is not None:
                end = avg.held_row(oy, start, end)
            if s.streaming:
                # The row's passes, each once its set can be replayed; a block's writes are
                # commanded as its last pass ends.
                block_end = start
                readies = []
                # the global average's outputs come in the last row only
                writes = streamed_writes and (instr.pool == Pool.NONE or oy == s.conv_h - 1)
                for ob in range(obs):
                    for k in range((oy * obs + ob) * s.ib, (oy * obs + ob + 1) * s.ib):
                        block_end = max(block_end, weights.ready(k) - 1) + pass_cycles
                        weights.release(k, block_end)
                    if writes:
                        readies += write_block(ob, block_end)
                if writes:
                    streamed_readies[0 if gap_output else oy] = readies
                end = max(end, block_end)
            ready = end + self.result_latency
            if sc_segments:
                row_timing.append(avg.rows[-1] if avg is not None else (start, row, 0))
                command_shortcuts()
                last = sc_segment[oy * obs + obs - 1]
                arrived = dram.finish(last) if sc_dram else last
                ready = max(ready, arrived + 1)
            results.append(max(ready, scale_ready))
            post_rows(oy)
            if s.streaming:
                weights.advance()
        # Input rows below the last window (a stride that steps over them) are read too, and
        # the row buffer is busy until it has taken them.
        reader_moved.append(end)
        fetch_rows(instr.in_h - 1)
        last_write = post_state[2]
        if out_dram:
            # compute_done follows the last write response by one cycle.
            cycles = dram.drain() + 2
        else:
            cycles = last_write + 1
        # The datapath must drain too (~dp.busy): rows no pooling window uses are still
        # computed, but only the array's pipeline, not the post chain, is waited for.
        cycles = max(cycles, end + self.drain_latency, row_in[-1] + self.rows_drain_latency)
        read = (instr.in_h * row_bytes if in_dram else 0) + w_row_bytes * s.conv_h
        if is_add and sc_dram:
            read += sc_row_bytes * s.conv_h
        elif instr.eltwise == Eltwise.CHANNEL_SCALE and sc_dram:
            read += obs * L
        write = out_row_bytes * instr.out_h if out_dram else 0
        bound = "dram" if dram.busy * 1.05 >= cycles else "mac"
        return ceil(cycles), read, write, bound

    def _gap_outputs(self, obs: int, block_cycles: int) -> list[int]:
        """The cycle each block's GlobalAvgPool output is ready, from the cycle the last
        block's last result leaves the array. A block's sums are fed to the one requantiser
        lane by lane after its last beat, its output beat is ready L + LATENCY + 1 cycles
        after that beat, and the next block's last beat is taken only once the output has
        left (one cycle later); the last row's blocks arrive block_cycles apart."""
        from sfnpu.hw.requant import Requantizer

        output = self.L + Requantizer.LATENCY + 1
        last = -(obs - 1) * block_cycles
        outputs = [last + output]
        for b in range(1, obs):
            last = max(-(obs - 1 - b) * block_cycles, last + output + 1)
            outputs.append(last + output)
        return outputs

    def _post_row(self, instr: Instruction, s: _Shape, obs: int, py: int, pooled_h: int,
                  pooled_w: int, block_cycles: int) -> tuple[int, int]:
        """(last conv row needed, cycles) of pooled row ``py`` in the post chain, which passes
        one word per cycle except in the global average pool (one requantiser for every lane
        of a block); the average pool has its own schedule (:class:`_AvgSchedule`).
        ``block_cycles``: the array's cycles between two output blocks' results in a row."""
        words = obs * s.conv_w                             # one conv row
        up = 4 if instr.upsample else 1
        if instr.pool == Pool.NONE:
            return py, max(words, up * obs * pooled_w)
        if instr.pool == Pool.GLOBAL_AVG:
            return s.conv_h - 1, self._gap_outputs(obs, block_cycles)[-1]
        k, stride, pad = instr.pool_size, instr.pool_stride, instr.pool_pad
        first = py * stride - pad
        need = min(first + k, s.conv_h) - 1
        previous = min((py - 1) * stride - pad + k, s.conv_h) if py else 0
        new_rows = need + 1 - previous
        return need, max(new_rows * words, up * obs * pooled_w)          # Pool.MAX

    # -- programs ---------------------------------------------------------------------------

    def run(self, program: Sequence[Instruction] | bytes, *,
            instructions_offset: int | None = None, section_count: int | None = None,
            image_base: int = 0) -> ModelRun:
        """Model a whole program: a DRAM image (bytes) or a list of instructions (then the
        instruction section's offset and the section count default to a typical image's),
        loaded at DRAM address ``image_base`` (IMAGE_BASE: a multiple of ``SECTION_ALIGN``;
        :meth:`sfnpu.tb.system.SystemHarness.run`'s ``base``)."""
        if isinstance(program, (bytes, bytearray)):
            img = image.unpack(bytes(program), self.config)
            instructions = list(img.program)
            instructions_offset = img.layout.of_kind(image.SectionKind.INSTRUCTIONS)[0].offset
            section_count = len(img.layout.sections)
        else:
            instructions = list(program)
            instructions_offset = image.SECTION_ALIGN if instructions_offset is None \
                else instructions_offset
            section_count = 5 if section_count is None else section_count
        if image_base % image.SECTION_ALIGN:
            raise ValueError(f"image base {image_base:#x} is not a multiple of "
                             f"{image.SECTION_ALIGN} (the controller refuses it)")
        run = ModelRun(self.config)
        for k, instr in enumerate(instructions):
            address = instructions_offset + k * isa.WORDS * 4
            nxt = instructions[k + 1] if k + 1 < len(instructions) else None
            run.groups.append(self.group(instr, k, address, section_count if k == 0 else None,
                                         image_base, nxt))
        return run


class _Dram:
    """The DMA engine's two directions (:mod:`sfnpu.hw.dma`) and the DRAM model's one data bus
    (:mod:`sfnpu.hw.axi_mem`), simulated burst by burst in time order.

    Each direction accepts a command once the previous one has issued its last burst; a
    command accepted in cycle *c* issues its bursts' addresses from *c* + ``ISSUE_LATENCY``,
    one per cycle, at most ``outstanding`` in flight: burst *j* + *O* is issued
    ``REISSUE_LATENCY`` cycles after burst *j* completes (its last read beat; its write
    response). A read burst's beats are due ``latency`` cycles after its address, a write
    burst's from the cycle after its address; its response comes at ``max(aw + latency,
    last W + 1)``.

    Both directions' beats share one bandwidth credit: a beat moves at most every
    ``B / bytes_per_cycle`` cycles, whichever direction it belongs to. When beats of both are
    due, the memory's arbitration decides: a read beat goes first, except when the last beat
    was a read and a write beat was already waiting in the previous cycle; under a saturated
    load of both the beats alternate. Beats of one direction move in bulk while the other has
    none due; they are placed one at a time only while both compete.

    Read commands come from the readers (streamed weights, shortcut, input), each in its own
    order. When the read side can accept a command (the previous one has issued its last
    burst, no write command is requested), the command arbiter grants the highest-priority
    reader whose next command is requested by then, or else the first to request.

    Commands are submitted as the compute schedule meets them (:meth:`read`, :meth:`write`:
    a handle) and the bus is simulated only as far as an answer needs (:meth:`finish`), so
    the writes of earlier rows compete with the reads of later ones. A reader's command must
    be submitted before the simulation reaches its request (the compute schedule knows it by
    then: it follows from earlier data)."""

    def __init__(self, model: "CycleModel"):
        self.m = model
        # cycles per beat: an int when whole (the arithmetic below is then on ints, fast)
        self.beat = int(model.beat) if model.beat.denominator == 1 else model.beat
        self.lead = (model.latency, 1)              # address → first beat due, per direction
        self.pending = (deque(), deque())           # bursts not issued: [n, request, handle]
        # read commands not yet accepted, per reader: [request, burst lengths, handle]
        self.readers = (deque(), deque(), deque())  # WEIGHT_, SHORTCUT_, INPUT_READER
        self.inflight = (deque(), deque())          # issued: [due, beats left, aw, handle]
        self.completed = ([], [])                   # completion cycles, the last O
        self.accept = [0, 0]                        # cycle the current command was accepted
        self.write_commands = deque()               # [request, accepted or None]
        self.issued = [-1, -1]                      # last address cycle
        self.free = 0                               # first cycle the credit allows a beat
        self.prefer_write = True                    # the last beat was a read
        self.done = {}                              # handle → cycle after its last beat
        self.left = {}                              # handle → bursts not yet complete
        self.handles = 0
        self.beats_moved = 0                        # bus beats of both directions
        self.last_response = 0                      # the last write response

    @property
    def busy(self) -> Fraction:
        """Bus cycles of both directions' beats."""
        return self.beats_moved * self.m.beat

    # -- submitting and answering -----------------------------------------------------------

    def _submit(self, request: int, address: int, nbytes: int, commands: int, stride: int,
                write: bool, reader: int = INPUT_READER) -> int:
        m = self.m
        handle = self.handles
        self.handles += 1
        if nbytes <= 0:
            self.done[handle] = ceil(request)
            return handle
        per = nbytes // commands
        pending = self.pending[write]
        bursts = beats = 0
        for k in range(commands):
            # the DMA splits each command at max_burst beats and at 4 KiB boundaries
            n_cmd = m.beats(address + k * stride, per)
            lengths = m.bursts(address + k * stride, n_cmd)
            beats += n_cmd
            bursts += len(lengths)
            if not write:
                self.readers[reader].append([ceil(request), lengths, handle])
                continue
            command = [ceil(request), None]
            self.write_commands.append(command)
            for j, n in enumerate(lengths):
                # a command's first burst carries it; the others follow its address
                pending.append([n, command if j == 0 else None, handle])
        self.left[handle] = bursts
        self.beats_moved += beats
        return handle

    def read(self, request: int, address: int, nbytes: int, commands: int = 1, stride: int = 0,
             reader: int = INPUT_READER) -> int:
        """Submit ``commands`` equal reads of ``reader`` (``nbytes`` in all, command *k* from
        byte ``address + k·stride``), requested from ``request`` on; :meth:`finish` of the
        handle is the cycle after the last beat (the data is in its FIFO from then on)."""
        return self._submit(request, address, nbytes, commands, stride, False, reader)

    def write(self, request: int, address: int, nbytes: int) -> int:
        """Submit a write of ``nbytes`` to byte ``address`` (its data is in the write buffer
        from ``request``); :attr:`last_response` is the last write response once
        :meth:`drain` has run."""
        return self._submit(request, address, nbytes, 1, 0, True)

    def finish(self, handle: int) -> int:
        """The cycle after the last beat of a submitted transfer."""
        while handle not in self.done:
            if not self._step():
                raise RuntimeError("DMA transfer that never completes")
        return self.done[handle]

    def drain(self) -> int:
        """Run every submitted transfer to its end; the last write response."""
        while self._step():
            pass
        return self.last_response

    # -- the simulation ---------------------------------------------------------------------

    def _issue(self, write: bool):
        """Issue the addresses of the direction's pending bursts the outstanding limit allows."""
        pending, inflight = self.pending[write], self.inflight[write]
        m = self.m
        O = m.outstanding
        completed = self.completed[write]
        while len(inflight) < O:
            if not pending and (write or not self._accept_read()):
                return
            n, command, handle = pending.popleft()
            issued = self.issued[write]
            if command is not None:                 # a new write command: accepted after the
                command[1] = self._accepted(command)    # last one's last address
                self.accept[write] = command[1]
            aw = max(self.accept[write] + m.issue, issued + 1)
            back = O - len(inflight)                # burst j − O has completed
            if len(completed) >= back and completed[-back] + m.reissue > aw:
                aw = completed[-back] + m.reissue
            self.issued[write] = aw
            inflight.append([aw + self.lead[write], n, aw, handle])
        # The outstanding limit holds the next write command's bursts, not its acceptance
        # (the previous command has issued its last burst): the reads it holds back need it.
        if write and pending and pending[0][1] is not None:
            pending[0][1][1] = self._accepted(pending[0][1])

    def _accepted(self, command) -> int:
        """The cycle a write command whose predecessors have issued every burst is accepted."""
        return max(command[0], self.issued[True], 0)

    def _accept_read(self) -> bool:
        """Accept the next read command (the arbiter's choice, see the class docstring) and
        queue its bursts; False when none can be accepted yet."""
        if not any(self.readers):
            return False
        first = min(queue[0][0] for queue in self.readers if queue)
        # the previous command has issued its last burst; the writes have their turn first
        accept = self._past_writes(max(first, self.issued[False], 0))
        if accept is None:
            return False
        queue = next(q for q in self.readers if q and q[0][0] <= accept)
        _, lengths, handle = queue.popleft()
        self.accept[False] = accept
        self.pending[False].extend([n, None, handle] for n in lengths)
        return True

    def _past_writes(self, accept: int):
        """The first cycle from ``accept`` on at which the command arbiter presents a read:
        a write command takes priority from its request to the cycle it is accepted. None
        while a write command requested by then is not yet accepted (not yet known)."""
        commands = self.write_commands
        while commands and commands[0][1] is not None and commands[0][1] < accept:
            commands.popleft()
        moved = True
        while moved:
            moved = False
            for request, accepted in commands:
                if request > accept:
                    continue
                if accepted is None:
                    return None
                if accepted >= accept:
                    accept, moved = accepted + 1, True
        return accept

    def _complete(self, write: bool, last):
        """The head burst of a direction has moved its last beat in cycle ``last``."""
        due, n, aw, handle = self.inflight[write].popleft()
        done = max(aw + self.m.latency, ceil(last) + 1) if write else ceil(last)
        completed = self.completed[write]
        completed.append(done)
        if len(completed) > self.m.outstanding:
            del completed[0]
        if write:
            self.last_response = max(self.last_response, done)
        self.left[handle] -= 1
        if not self.left[handle]:
            self.done[handle] = ceil(last) + 1

    def _step(self) -> bool:
        """Move the next beats on the bus; False when nothing is left to move."""
        self._issue(True)
        self._issue(False)
        rd, wr = self.inflight
        if not rd and not wr:
            return False
        beat, free = self.beat, self.free
        r_due = max(rd[0][0], free) if rd else None
        w_due = max(wr[0][0], free) if wr else None
        if r_due is not None and w_due is not None and r_due == w_due:
            # Both due in the same cycle: the write goes if the last beat was a read and the
            # write beat was already waiting in the previous cycle; then they alternate until
            # one of the two bursts is done.
            t = r_due
            write = bool(self.prefer_write and wr[0][0] <= t - 1)
            first, second = (wr, rd) if write else (rd, wr)
            n = min(first[0][1], second[0][1])
            last = t + 2 * (n - 1) * beat
            self.free = last + 2 * beat
            self.prefer_write = write
            first[0][1] -= n
            second[0][1] -= n
            if not first[0][1]:
                self._complete(write, last)
            if not second[0][1]:
                self._complete(not write, last + beat)
            return True
        write = r_due is None or (w_due is not None and w_due < r_due)
        t, other = (w_due, r_due) if write else (r_due, w_due)
        n = self.inflight[write][0][1]
        if other is not None:
            # alone until the other direction's next beat is due
            n = min(n, ceil((other - t) / beat))
        head = self.inflight[write][0]
        last = t + (n - 1) * beat
        self.free = last + beat
        head[1] -= n
        self.prefer_write = not write
        if not head[1]:
            self._complete(write, last)
        return True


class _WeightStream:
    """Weights streamed from DRAM (a normal convolution whose weights exceed the store), as
    the controller streams them (``hw.controller``, ws_*): for every output row, each pass's
    set (P steps of Ti·To bytes, contiguous in the layout) in one command, at the top read
    priority, requested once the weight FIFO has room for it counting the steps in flight
    (ws_req: level + outstanding + P ≤ 2·MAX_KERNEL²; the level is a register). The weight
    buffer (``hw.weight_buffer``) takes a set's steps from the FIFO a step per cycle, into a
    bank free from the cycle after the set two before it was released, and replays it from two
    cycles after its last step, ``uses`` times (once per output pixel).

    A set is released as its last word's last replay moves into the buffer's output register,
    the cycle the array takes the word before it: in a pass that runs without a break, the
    cycle before the array takes the pass's last word. A set of one word (one step, one use)
    moves there once it is in its bank and the array has taken the last set's word, however
    long the array then waits for its input: the group's first set as soon as it is in its
    bank, so a third set is taken, and one more set commanded, before any input has arrived."""

    def __init__(self, model: "CycleModel", dram: "_Dram", address: int, sets_per_row: int,
                 rows: int, steps: int, set_bytes: int, uses: int):
        self.dram, self.address, self.per_row = dram, address, sets_per_row
        self.total, self.steps, self.set_bytes = sets_per_row * rows, steps, set_bytes
        self.one_word = steps == 1 and uses == 1
        self.word_taken = -1                    # the cycle the array took the last set's word
        self.passed = 0                         # sets whose pass is scheduled
        self.room = 2 * MAX_KERNEL * MAX_KERNEL
        # bus cycles between two steps' last beats within a set's burst
        self.step_cycles = ceil((model.config.ti * model.config.to // model.B) * model.beat)
        self.handles, self.requests = [], []
        self.taken = []                         # per set: the cycle each step left the FIFO
        self.released = []                      # per set: its last step's last read
        self._request()
        # Both banks are free at the start: the first two sets leave the FIFO as they come,
        # making room for more before any input has arrived.
        for k in range(min(2, self.total)):
            self._take(k)
        self.advance()

    def _request(self):
        """Command every set whose FIFO room is known by now."""
        while len(self.handles) < self.total:
            k = len(self.handles)
            request = self.requests[-1] if self.requests else 0
            need = (k + 1) * self.steps - self.room     # steps that must have left the FIFO
            if need > 0:
                set_, step = divmod(need - 1, self.steps)
                if set_ >= len(self.taken):
                    return
                # The step leaves the FIFO in cycle t, its level register drops in t + 1 and
                # the arbiter grants the set then: t + 2 in the DMA model's cycles, which
                # count a command from the cycle after its grant.
                request = max(request, self.taken[set_][step] + 2)
            self.requests.append(request)
            self.handles.append(self.dram.read(
                request, self.address + (k % self.per_row) * self.set_bytes, self.set_bytes,
                reader=WEIGHT_READER))

    def _take(self, k: int):
        """Set ``k`` into its bank: a step per cycle once it has arrived and the bank is free."""
        self._request()
        done = self.dram.finish(self.handles[k])
        free = self.released[k - 2] + 1 if k >= 2 else 0
        taken, last = [], free - 1
        for i in range(self.steps):
            # step i's last beat (the set's beats move back to back)
            last = max(last + 1, done - 1 - (self.steps - 1 - i) * self.step_cycles)
            taken.append(last)
        self.taken.append(taken)
        self._request()

    def ready(self, k: int) -> int:
        """The first cycle set ``k`` (in pass order) can be replayed."""
        while len(self.taken) <= k:
            self._take(len(self.taken))
        return self.taken[k][-1] + 2

    def advance(self):
        """Take every set whose bank is known to be free (the weight buffer loads the next
        row's first sets while the row's last passes run, whatever the input does)."""
        while True:
            if self.one_word and len(self.released) == self.passed < self.total:
                self.released.append(max(self.ready(self.passed) - 1, self.word_taken))
            elif len(self.taken) < min(len(self.released) + 2, self.total):
                self._take(len(self.taken))
            else:
                return

    def release(self, k: int, pass_end: int):
        """The array takes set ``k``'s last word in ``pass_end``; the set's bank is free
        from the cycle after its release."""
        if not self.one_word:
            self.released.append(pass_end - 1)
            return
        if k == len(self.released):
            self.released.append(max(self.ready(k) - 1, self.word_taken))
        self.word_taken, self.passed = pass_end, k + 1


class _AvgSchedule:
    """The average pool (:class:`sfnpu.hw.avgpool.AvgPool`) behind the array, conv row by conv
    row, and the hold it puts on the array.

    Input: the pool takes a conv row a word per cycle once the row is storable (its three line
    buffers keep rows ``max(u, 0)`` … ``+ 2`` of the output row being walked, ``u`` its first
    window row) and once the row's words have come through the post stages ahead of it.

    Walk: a window of ``m`` elements takes ``2m + 4`` cycles from NEXT to its sum (NEXT, an
    element every other cycle, the sum's three stages, SUM); the sum waits in SUM while the
    hand-over register is full, and the first divider empties it when idle (one division every
    ``iterations + 2`` cycles). An output row's first window starts once its last row is stored.

    Hold: while the pool walks, the stages ahead of it fill (a word each), then the result
    FIFO up to the datapath's hold level; the array stops ``in_flight`` steps after the step
    whose result reaches that level and steps again once the pool has taken the results that
    landed after it."""

    def __init__(self, model: "CycleModel", instr: Instruction, s: _Shape, obs: int,
                 pooled_w: int, pooled_h: int, p: int, f0: int, f1: int, pass_cycles: int,
                 row: int, stages: int):
        from sfnpu.hw.avgpool import _MAX_KERNEL, Float32Divider
        from sfnpu.hw.controller import RESULT_FIFO_DEPTH, results_in_flight

        self.k, self.stride, self.pad = instr.pool_size, instr.pool_stride, instr.pool_pad
        self.obs, self.pooled_w, self.pooled_h = obs, pooled_w, pooled_h
        self.conv_w, self.H, self.W = s.conv_w, s.conv_h, obs * s.conv_w
        self.ib = s.ib
        self.pass_cycles, self.row = pass_cycles, row
        self.first_step = max(p, f0) - 1        # a pass's first result: its pixel's last step
        self.pixel_step = max(p, f1)
        self.in_flight = results_in_flight(model.config)
        self.hold_level = RESULT_FIFO_DEPTH - self.in_flight
        self.stages = stages                    # post stages ahead of the pool: a word each
        # A step's result: result FIFO (result_latency + 1), the stages, then taken.
        self.to_pool = model.result_latency + stages + 2
        self.divide = Float32Divider.iterations(model.AVG_DIVIDER_BITS) + 2
        self.line_buffers = _MAX_KERNEL
        self.rows = []                          # per conv row: start, held step, delay
        self.taken = []                         # per conv row: cycle its last word is taken
        self.storable = [0] * min(self.line_buffers, self.H)     # cycle row r may be taken
        self.holds = {}                         # conv row → (word, cycle the pool takes again)
        self.carry = None                       # a hold reaching into the next row
        self.py = 0
        self.sum_ready = -1                     # the last window's sum handed over
        self.division = -self.divide            # the last division's start

    # -- the array -------------------------------------------------------------------------

    def _step(self, word: int) -> int:
        """Step offset in its conv row of the step that completes a word (``ob``, ``x``)."""
        ob, x = divmod(word, self.conv_w)
        return (ob * self.ib + self.ib - 1) * self.pass_cycles + self.first_step \
            + x * self.pixel_step

    def _results(self, a: int, b: int) -> int:
        """Results among a conv row's step offsets ``a`` … ``b``."""
        count = 0
        for ob in range(self.obs):
            base = (ob * self.ib + self.ib - 1) * self.pass_cycles + self.first_step
            lo = max(0, -(-(a - base) // self.pixel_step))
            hi = min(self.conv_w - 1, (b - base) // self.pixel_step)
            count += max(0, hi - lo + 1)
        return count

    def resume_row(self, oy: int, start: int) -> int:
        """The first cycle conv row ``oy`` may start (free run: ``start``): a hold that
        reached into it. Only the steps it took before the hold (cycle ``hold``) land; it
        steps again once the pool has taken them. A row's first step is emitted two cycles
        after its start (hw.row_buffer: o_stream valid from e_m + 1), so a row whose first
        window waited out the hold (the hold withholds o_stream.ready, hw.datapath) starts
        two cycles before the resume."""
        if self.carry is not None:
            hold, takes, landed = self.carry
            self.carry = None
            ahead = hold - start                    # the row's steps before the hold
            if ahead > 0:
                landed += self._results(0, ahead - 1)
            start = max(start, takes + landed + 1 - max(2, ahead))
        return start

    def held_row(self, oy: int, start: int, end: int) -> int:
        """The end of conv row ``oy`` (free run: ``start`` … ``end``) after any hold in it."""
        delay, held = 0, self.row
        if oy in self.holds:
            word, takes = self.holds.pop(oy)
            step = self._step(word)
            if start + step + self.in_flight < takes:
                held = step + self.in_flight        # the last step taken
                landed = self._results(step + 1, min(held, self.row - 1))
                if held + 1 < self.row:
                    # the level drops below the hold level after the landed results are taken
                    delay = max(0, takes + landed + 1 - (start + held + 1))
                else:
                    # the next row's steps before the hold depend on when it may start
                    self.carry = (start + held + 1, takes, landed)
                    held = self.row
        self.rows.append((start, held, delay))
        return end + delay

    # -- the pool --------------------------------------------------------------------------

    def _arrival(self, r: int, step: int) -> int:
        start, held, delay = self.rows[r]
        return start + step + self.to_pool + (delay if step > held else 0)

    def advance(self, computed: int, results: list[int]):
        """Take the conv rows up to ``computed`` (``results``: the cycle each row's last
        result, with its shortcut, is in the result FIFO) and walk the output rows they
        complete: (cycle the row's last word is in the write buffer, cycles its words took,
        the cycle each of its words is in the write buffer), each."""
        out = []
        while True:
            r = len(self.taken)
            while r <= computed and r < len(self.storable):
                begin = max(self.taken[-1] + 1 if r else 0, self.storable[r],
                            self._arrival(r, self._step(0)))
                self.taken.append(max(begin + self.W - 1, results[r] + self.stages + 1))
                r += 1
            if self.py == self.pooled_h:
                return out
            u = self.py * self.stride - self.pad
            need = min(u + self.k, self.H) - 1
            if need >= len(self.taken):
                return out
            rows = need + 1 - max(u, 0)
            walk = next_window = max(self.sum_ready + 1, self.taken[need] + 1)
            ready, division = self.sum_ready, self.division
            words = []
            for _ in range(self.obs):
                for ox in range(self.pooled_w):
                    x0 = ox * self.stride - self.pad
                    m = rows * (min(x0 + self.k, self.conv_w) - max(x0, 0))
                    ready = max(next_window + 2 * m + 3, division + 1)
                    division = max(ready + 1, division + self.divide)
                    next_window = ready + 1
                    # the second division, the output register, the write buffer
                    words.append(division + 2 * self.divide + 2)
            self.sum_ready, self.division = ready, division
            out.append((words[-1], words[-1] - walk, words))
            # The next output row's buffers, or all rows after the last output row.
            self.py += 1
            if self.py < self.pooled_h:
                first = max(self.py * self.stride - self.pad, 0)
                limit = min(first + self.line_buffers, self.H)
            else:
                limit = self.H
            self.storable += [ready + 1] * (limit - len(self.storable))
            # While this row was walked the FIFO filled beyond the rows it could take.
            word = self.W * min(max(u, 0) + self.line_buffers, self.H) + self.stages \
                + self.hold_level - 1
            if word < self.H * self.W:
                self.holds[word // self.W] = (word % self.W, ready + 1)


def _post_latency(instr: Instruction) -> int:
    """Pipeline depth of the enabled post-processing stages."""
    from sfnpu.hw.act_table import ActivationTable
    from sfnpu.hw.chscale import ChannelScale
    from sfnpu.hw.eltwise_add import EltwiseAdd
    from sfnpu.hw.maxpool import MaxPool

    depth = 2                                   # result FIFO, write FIFO
    if instr.act == Activation.TABLE:
        depth += ActivationTable.LATENCY
    if instr.eltwise == Eltwise.ADD:
        depth += EltwiseAdd.LATENCY
    elif instr.eltwise == Eltwise.CHANNEL_SCALE:
        depth += ChannelScale.LATENCY
    if instr.pool == Pool.MAX:
        depth += MaxPool.LATENCY
    return depth


#: Largest relative difference between the model's and the RTL's cycles accepted in any one
#: group (or up to GROUP_SLACK cycles), and over a whole run: none. Every group measured is
#: exact (the system tests, PP-LCNet in ``make sim``, and the random networks of regress mode
#: on ``tiny`` and ``ecp5``), so a cycle's difference is a model or RTL change to explain. The
#: one behaviour not modelled, a full write buffer stalling the datapath, would show here.
#: ``Comparison.problems`` takes looser limits for exploratory use.
GROUP_TOLERANCE = 0.0
GROUP_SLACK = 0
RUN_TOLERANCE = 0.0


@dataclass(frozen=True)
class Comparison:
    """The model against measured per-group cycles and DRAM bytes (the RTL's group log)."""
    model: ModelRun
    cycles: tuple[int, ...]
    read_bytes: tuple[int, ...]
    write_bytes: tuple[int, ...]

    @property
    def errors(self) -> list[float]:
        """Relative cycle error of each group, (model − measured) / measured."""
        return [(g.cycles - c) / c for g, c in zip(self.model.groups, self.cycles)]

    @property
    def run_error(self) -> float:
        return (self.model.cycles - sum(self.cycles)) / sum(self.cycles)

    @property
    def exact(self) -> int:
        return sum(g.cycles == c for g, c in zip(self.model.groups, self.cycles))

    @property
    def max_error(self) -> float:
        return max(map(abs, self.errors), default=0.0)

    def within(self, tolerance: float) -> int:
        return sum(abs(e) <= tolerance for e in self.errors)

    @property
    def bytes_mismatches(self) -> list[int]:
        """Groups whose DRAM bytes (read or written) differ from the model's."""
        return [g.index for g, r, w in zip(self.model.groups, self.read_bytes, self.write_bytes)
                if (g.read_bytes, g.write_bytes) != (r, w)]

    def problems(self, group_tolerance: float = GROUP_TOLERANCE,
                 run_tolerance: float = RUN_TOLERANCE,
                 group_slack: int = GROUP_SLACK) -> list[str]:
        """Every disagreement beyond the tolerances, as sentences; empty when they agree."""
        out = []
        if len(self.cycles) != len(self.model.groups):
            out.append(f"{len(self.cycles)} groups measured, {len(self.model.groups)} modelled")
        for k in self.bytes_mismatches:
            g = self.model.groups[k]
            out.append(f"group {k}: DRAM bytes read/written {self.read_bytes[k]}/"
                       f"{self.write_bytes[k]}, model {g.read_bytes}/{g.write_bytes}")
        limit = f"tolerance {group_tolerance:.1%} or {group_slack} cycles" \
            if group_tolerance or group_slack else "the model is exact"
        for g, c, e in zip(self.model.groups, self.cycles, self.errors):
            if abs(e) > group_tolerance and abs(g.cycles - c) > group_slack:
                out.append(f"group {g.index}: {c} cycles, model {g.cycles} "
                           f"({g.cycles - c:+d}, {e:+.2%}; {limit})")
        if self.cycles and abs(self.run_error) > run_tolerance:
            out.append(f"run: {sum(self.cycles)} cycles, model {self.model.cycles} "
                       f"({self.run_error:+.2%}, tolerance {run_tolerance:.2%})")
        return out

    def summary(self) -> str:
        n = len(self.cycles)
        return (f"{n} groups: {self.exact} exact, {self.within(0.01)} within 1 %, "
                f"{self.within(0.05)} within 5 %, largest error {self.max_error:.1%}; run "
                f"{self.run_error:+.2%}; DRAM bytes identical in "
                f"{n - len(self.bytes_mismatches)}/{n} groups")


def compare(model: ModelRun, cycles: Sequence[int], read_bytes: Sequence[int],
            write_bytes: Sequence[int]) -> Comparison:
    return Comparison(model, tuple(cycles), tuple(read_bytes), tuple(write_bytes))
