"""Group controller: runs a DRAM image group by group on the convolution datapath.

The controller owns the DMA engine (:mod:`sfnpu.hw.dma`) and the compute path; the CSR block
(:mod:`sfnpu.hw.csr`) starts it through :class:`~sfnpu.hw.csr.ControlSignature`.

Run
---
1. *Header*: read the image header at ``IMAGE_BASE`` (which must be a multiple of
   :data:`~sfnpu.image.SECTION_ALIGN`) and check magic, format version and hardware
   fingerprint; then read the section table and take the offset of the INSTRUCTIONS section.
   Any mismatch stops the run with ``IMAGE_MISMATCH``. (The CRCs are the loader's business.)
2. Per group: *fetch* the 11-word instruction, *decode* it (the one
   :class:`~sfnpu.isa.InstructionLayout`), load the *parameter block* into the bias,
   multiplier, weight-zero-point, post-record and activation-table stores, load the layer's
   *weights* into the weight store (buffer 1 in row reuse, as in the paper) unless they are
   there already (``weights_held``), then *compute*.
   The program ends after the group with ``last`` set.

Compute
-------
Agents run concurrently until the group's last output word is in DRAM or its buffer:

* input reader: the input, one *segment* (one row of one channel block, ``in_w`` words) per
  DMA command — or per local read when the input is in an on-chip buffer — in the order
  ``for y: for cb``, the row buffer's input order. A segment is requested only when the input
  FIFO has room for all of it, so read data never blocks the DMA (which would deadlock
  against the output path); the shortcut reader works the same way for the residual tensor
  (ADD) or reads the scale vector once (CHANNEL_SCALE);
* weight replay: for every output row, the weight sets of all passes (``for ob: for ib``) from
  the weight store into the double weight-block buffer, with the block's weight zero points.
  A normal convolution whose weights exceed the store (buffer 1) streams them instead: one DMA
  read per set and output row into a weight FIFO, issued when the FIFO has room for the whole
  set (weights then cross the bus once per output row; frame reuse is the remedy);
* accumulation: the array's per-pass results are summed over the ``IB`` input-channel blocks in
  the 32-bit partial-sum buffer (one output row of ``To`` lanes), the bias is added and the
  ``To`` float32-exact requantisers produce one beat per output pixel and channel block, in
  the order ``(oy, ob, ox)``;
* post-processing (activation table, clamp) into the write buffer, and the output writer: one
  DMA write per chunk of a row segment (``out_w`` words at the destination's channel block
  ``ob + out_c_offset / L``), issued only once the write buffer holds the whole chunk.

The datapath stops taking steps (``hold``) while the result FIFO lacks room for every result
still in flight, so the array's no-back-pressure output never overflows.

This build implements row reuse with every operand in DRAM; normal and depthwise convolution,
and conv NONE as a 1×1 depthwise pass with unit weights (multiplier 1.0, the input's zero
point: codes pass unchanged); the per-channel input tables (input transform, in front of the
row buffer, their output zero point also padding the convolution); the whole post-processing
chain (activation tables before or after the element-wise stage, ADD and CHANNEL_SCALE with
the shortcut stream, CLAMP, MAX/AVG/GLOBAL_AVG pooling, 2× upsampling); output-channel offsets
that are multiples of ``L``; feature-map operands (input, output, shortcut) in DRAM or in one
of the three on-chip buffers {0, 1, 2} (two read ports and a write port each, word = one pixel
of one channel block), so the memory optimizer's frame-mode placements run as allocated.
Weight reuse. ROW: the layer's weights are preloaded into the weight store (the paper's
buffer 1), or, when they do not fit, streamed from DRAM once per output row. FRAME: every
weight crosses the bus once — the output-channel blocks are taken in chunks whose weights fit
the store, and each chunk runs over the whole frame (input re-read per chunk, from the
on-chip buffer where the memory optimizer put it; an input in DRAM is copied into a staging
buffer during the first chunk and read there by the later ones, so DRAM delivers it once).
The paper's finer schedule (one weight block at a time, double-buffered, with frame-wide
partial sums) is not built: chunks of whole output blocks need no frame-sized partial-sum
buffer. Weights or parameters in an on-chip
buffer stop the run with ``UNSUPPORTED``. Shared weights: a group with ``weights_held`` set
skips the weight load, because the store still holds its weights — the last weight load was
of the whole weights at the same DRAM offset (a detection head run over pyramid levels reads
its weights once); anything else stops the run with ``WEIGHTS_NOT_HELD``.
Weight prefetch: weights load while the group computes, so that their DRAM time hides
behind its array time — at the lowest bus priority, at the other end of the weight store from
the weights computing (the top when those start at word 0, else word 0), and the chunk or group
ends once they are in. ``double_buffer`` (frame reuse whose weights exceed the store): chunks
of at most half the store, each next chunk loaded while the current one computes, so only the
first waits for its weights. ``prefetch``, during the group's (last) chunk: the controller
reads the next instruction, sizes its weights (OB·IB·kh·kw words of a normal convolution) and
loads them whole; the store then holds them like a load (``held_*``, with their first word),
and the next group sets ``weights_held``. A next group that is not a normal convolution with
DRAM weights stops the run with ``UNSUPPORTED``; weights that do not fit beside the chunk's own
(frame-reuse chunks of the whole store fill it) with ``BUFFER_OVERFLOW``; ``prefetch`` on the
last group is an ``ILLEGAL_FIELD``.
Decode errors: opcode ≠ GROUP → ``ILLEGAL_OPCODE``; reserved bits, undefined
enum values, zero sizes, kernel/stride/pool window out of range, depthwise or conv NONE with
``in_c ≠ out_c``, an output shape that pooling and upsampling cannot give →
``ILLEGAL_FIELD``; a layer whose rows, parameters, partial sums, pooled rows or depthwise
weights exceed the on-chip stores → ``BUFFER_OVERFLOW``.

Stall counters (:class:`~sfnpu.regmap.StallCause`): CONTROL in every running cycle outside
the compute phase; DRAM_WRITE while ``hold`` is set; DRAM_READ while the row buffer waits for
an input word and the input FIFO is empty; WEIGHTS while a window step waits for its weights.
"""

from __future__ import annotations

from math import ceil

from amaranth.hdl import Array, Cat, Const, Module, Mux, ResetInserter, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu import image, isa, layout, regmap
from sfnpu.config import MAX_KERNEL, ROW_BUFFER_ROWS, HwConfig
from sfnpu.isa import Activation, ActOrder, ConvKind, Eltwise, InputTransform, MemSpace, Opcode, \
    Pool, Reuse
from sfnpu.regmap import ErrorCode, StallCause

from .act_table import ActivationTable
from .avgpool import AvgPool
from .chscale import ChannelScale
from .eltwise_add import EltwiseAdd
from .gap import GlobalAvgPool
from .maxpool import MaxPool
from .upsample import Upsample2x
from .axi import Axi4Signature
from .conv_array import array_latency, depthwise_taps
from .csr import ControlSignature
from .datapath import ConvDatapath
from .dma import Direction, DmaEngine
from sfnpu.limits import StoreSizes
from .requant import Requantizer

__all__ = ["GroupController", "INSTRUCTION_BYTES", "POST_WORDS", "RESULT_FIFO_DEPTH",
           "results_in_flight"]

INSTRUCTION_BYTES = isa.WORDS * isa.WORD_BITS // 8
#: The post record (:data:`sfnpu.layout.POST_RECORD`) as 32-bit words.
POST_WORDS = layout.POST_RECORD.itemsize // 4
#: Words of the result FIFO between the requantisers and the post-processing chain.
RESULT_FIFO_DEPTH = 32


def results_in_flight(config) -> int:
    """Results still on their way to the result FIFO after the array takes a step (array,
    partial-sum stage, requantiser): the datapath holds while the FIFO's level plus these
    would overflow it."""
    return array_latency(config) + 1 + Requantizer.LATENCY + 2

_STAGE = {name: k for k, name in enumerate(layout.STAGES)}
_POST_FIELD_WORD = {name: layout.POST_RECORD.fields[name][1] // 4
                    for name in layout.POST_RECORD.names}
_HEADER_WORD = {name: image.field_offset(image.HEADER_FIELDS, name) // 4
                for name in ("magic", "version", "fingerprint", "section_count")}
_SECTION_WORDS = image.SECTION.size // 4
_SECTION_KIND_WORD = image.field_offset(image.SECTION_FIELDS, "kind") // 4
_SECTION_OFFSET_WORD = image.field_offset(image.SECTION_FIELDS, "offset") // 4
_ISA = data.Layout.cast(isa.InstructionLayout)
_FLOAT32_ONE = 0x3F800000
_TAG_INPUT, _TAG_WEIGHTS, _TAG_SHORTCUT, _TAG_PREFETCH = 0, 1, 2, 3


def _identity_weights(to: int, ti: int) -> Const:
    """A depthwise weight step whose first tap is 1 for every channel (the rest 0)."""
    return Const(sum(1 << (8 * c) for c in range(to)), 8 * ti * to)


def _log2(n: int) -> int:
    assert n & (n - 1) == 0, n
    return n.bit_length() - 1


def _align16(value):
    shift = _log2(layout.PARAM_ALIGN)
    return ((value + layout.PARAM_ALIGN - 1) >> shift) << shift


class GroupController(wiring.Component):
    """DMA, decoder, parameter and weight stores, convolution datapath and post-processing.

    Parameters
    ----------
    config : HwConfig
        ``ti == to == lanes`` (the datapath's requirement), bus width at most
        :data:`~sfnpu.layout.PARAM_ALIGN` bytes and dividing ``lanes``.
    addr_width : int
        Bus address bits.

    Every store is sized by :class:`~sfnpu.limits.StoreSizes`, whose :func:`overflows`
    states the ``BUFFER_OVERFLOW`` checks below for the compiler.

    Signature
    ---------
    control : In(ControlSignature(config.dram_bus_bytes))
        From the CSR block: start, abort, image base, DMA window; back: events and counters.
    bus : Out(Axi4Signature(addr_width, config.dram_bus_bits))
        The DMA's AXI4 master port.
    """

    def __init__(self, config: HwConfig, *, addr_width: int = 32):
        B, L = config.dram_bus_bytes, config.lanes
        if config.ti != config.to:
            raise ValueError("the group controller needs ti == to")
        if B > layout.PARAM_ALIGN or L % B:
            raise ValueError(f"config {config.name!r}: the controller needs a bus of at most "
                             f"{layout.PARAM_ALIGN} bytes that divides the {L}-byte word "
                             f"(bus: {B} bytes)")
        if len(set(config.buffer_bytes)) != 1:
            raise ValueError("the controller's on-chip buffers {0, 1, 2} are of one size")
        self.config = config
        self.addr_width = addr_width
        sizes = StoreSizes.of(config)
        self.max_channels = sizes.max_channels
        self.max_table_channels = sizes.max_table_channels
        self.pool_row_pixels = sizes.pool_row_pixels
        self.weight_words = sizes.weight_words
        self.row_words = sizes.row_words
        self.psum_words = sizes.psum_words
        self.write_words = sizes.write_words
        self.buffer_words = sizes.buffer_words
        super().__init__({
            "control": In(ControlSignature(B)),
            "bus": Out(Axi4Signature(addr_width, config.dram_bus_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        B, L, To, Ti = cfg.dram_bus_bytes, cfg.lanes, cfg.to, cfg.ti
        G = depthwise_taps(cfg)
        wpb = B // 4                                   # 32-bit words per bus beat
        beats_per_word = L // B
        ctl = self.control
        aw = self.addr_width

        # -- DMA -----------------------------------------------------------------------------
        m.submodules.dma = dma = DmaEngine(cfg, addr_width=aw, length_bits=24)
        wiring.connect(m, dma.bus, wiring.flipped(self.bus))
        m.d.comb += [
            dma.window_base.eq(ctl.window_base),
            dma.window_limit.eq(ctl.window_limit),
            dma.watchdog.eq(ctl.watchdog),
            ctl.read_bytes.eq(dma.read_bytes),
            ctl.write_bytes.eq(dma.write_bytes),
        ]
        rd = dma.read_data
        beat = rd.payload.data
        beat_words = [beat[32 * j:32 * (j + 1)] for j in range(wpb)]
        beat_fire = rd.valid & rd.ready

        # Flush of the compute path after an abort or error (FIFOs, datapath, pipelines).
        flush = Signal()

        # -- run state --------------------------------------------------------------------------
        base = Signal(aw)
        instr_offset = Signal(32)
        found = Signal()
        section_count = Signal(32)
        pc = Signal(32)
        fetch_addr = Signal(aw)
        beat_index = Signal(16)
        header_ok = Signal()
        entry_is_instr = Signal()
        table_word = Signal(3)                         # word of the entry at the beat's start
        fetch_beats = ceil((B - 4 + INSTRUCTION_BYTES) / B)
        fetch_buf = Signal(fetch_beats * B * 8)
        instr_bits = Signal(_ISA.size)
        instr = data.View(isa.InstructionLayout, instr_bits)
        error_code = Signal(ErrorCode)
        error_addr = Signal(64)

        def shifted_in(buf):
            """An instruction buffer with the bus beat shifted in at the top."""
            return Cat(buf[8 * B:], beat)

        def aligned_instruction(buf, beats, address):
            """The instruction at byte ``address`` from ``buf`` after ``beats`` beats of its
            read (the first beat holds it from the address's byte in the bus word on)."""
            offset = (((fetch_beats - beats) * B + address[:_log2(B)]) * 8).as_unsigned()
            return buf.bit_select(offset, _ISA.size)

        # Command from the control FSM (header, table, fetch, params, weights).
        fsm_cmd = Signal(dma.cmd.payload.shape())
        fsm_cmd_valid = Signal()

        # -- derived group parameters (registered in DECODE) -------------------------------------
        depthwise = Signal()
        in_blocks = Signal(16)          # ⌈in_c / L⌉
        out_blocks = Signal(16)         # ⌈out_c / To⌉
        ib_count = Signal(16)           # input-channel blocks per output block (1: depthwise)
        conv_h = Signal(12)
        conv_w = Signal(12)
        steps = Signal(range(MAX_KERNEL * MAX_KERNEL + 1))   # P
        taps = Signal(range(MAX_KERNEL * MAX_KERNEL + 1))    # kh·kw
        sets = Signal(32)               # weight sets per output row: OB·IB (normal), CB
        weight_steps = Signal(32)       # sets·P
        row_words = Signal(32)          # in_blocks·in_w
        places = Signal(range(self.row_words + 1))
        in_plane = Signal(32)           # bytes of one channel block of the input
        out_plane = Signal(32)
        in_row_bytes = Signal(24)
        out_row_bytes = Signal(24)
        param_len = Signal(24)
        mult_off = Signal(24)
        wzp_off = Signal(24)
        post_off = Signal(24)
        act_off = Signal(24)
        out_block0 = Signal(16)
        identity = Signal()             # conv NONE
        streaming = Signal()            # weights streamed from DRAM for every output row
        # What the weight store holds: the whole weights at this DRAM offset (weights_held).
        held_valid = Signal()
        held_offset = Signal(len(instr.weights.offset))
        held_depthwise = Signal()
        held_base = Signal(range(self.weight_words + 1))   # its first word in the store
        weights_base = Signal(range(self.weight_words + 1))  # the computing group's weights
        chunk_base = Signal(range(self.weight_words + 1))    # the next double-buffered chunk
        ob_base = Signal(16)            # output-channel blocks of the current weight chunk
        ob_count = Signal(16)
        chunk_obs = Signal(16)          # blocks whose weights fit the store together
        chunk_steps = Signal(32)        # weight steps of chunk_obs + 1 blocks (search)
        has_ct = Signal()               # input transform: per-channel tables
        ct_off = Signal(24)
        param_cp = Signal(17)           # channels of the bias/multiplier/zero-point sections

        kh, kw = instr.kh, instr.kw
        m.d.comb += taps.eq(kh * kw)
        block_words = ib_count * steps  # one output block's weights (normal: IB·P words)

        # -- stores --------------------------------------------------------------------------
        cb_max = self.max_channels // To
        m.submodules.bias = bias_mem = Memory(shape=32 * To, depth=cb_max, init=[])
        m.submodules.mult = mult_mem = Memory(shape=32 * To, depth=cb_max, init=[])
        m.submodules.wzp = wzp_mem = Memory(shape=8 * To, depth=cb_max, init=[])
        m.submodules.weights = weight_mem = Memory(shape=8 * Ti * To, depth=self.weight_words,
                                                   init=[])
        bias_w = bias_mem.write_port(granularity=8 * B)
        mult_w = mult_mem.write_port(granularity=8 * B)
        wzp_w = wzp_mem.write_port(granularity=8 * B)
        weight_w = weight_mem.write_port(granularity=8 * B)
        post = Array(Signal(32, name=f"post_{k}") for k in range(POST_WORDS))
        m.submodules.act = act = ResetInserter(flush)(ActivationTable(L, write_bytes=B))
        m.submodules.act_after = act_after = ResetInserter(flush)(
            ActivationTable(L, write_bytes=B))

        m.submodules.in_table = in_table = ResetInserter(flush)(
            ActivationTable(L, per_channel=True, max_channels=self.max_table_channels,
                            write_bytes=B))

        def post_word(field, index=0):
            return post[_POST_FIELD_WORD[field] + index]

        def stage_zp(stage):
            return post_word("zp", _STAGE[stage])[:9].as_signed()

        def stage_signed(stage):
            return post_word("signed", _STAGE[stage])[0]

        # -- the three on-chip buffers {0, 1, 2} (feature maps of frame-mode groups) -----------
        # Word = one pixel of one channel block. Two read ports (input and shortcut stream) and
        # one write port (the output) per buffer.
        buffer_read = [[], []]
        buffer_write = []
        for k in range(3):
            mem = Memory(shape=8 * L, depth=self.buffer_words, init=[])
            m.submodules[f"buffer_{k}"] = mem
            for reader in (0, 1):
                buffer_read[reader].append(mem.read_port())
            buffer_write.append(mem.write_port())
        # Input staging (sfnpu.limits.stages_input): a frame-reuse convolution taken in
        # several output-channel chunks copies its DRAM input into the staging buffer (offset
        # 0 of the lowest buffer holding neither output nor shortcut) during the first chunk,
        # and the later chunks read it there: DRAM delivers the input once.
        staged = Signal()
        in_from_stage = staged & (ob_base != 0)

        def occupied(space):
            return ((instr.output.space == space)
                    | ((instr.shortcut.space == space) & (instr.eltwise != Eltwise.NONE)))
        stage_space = Mux(~occupied(MemSpace.BUF0), MemSpace.BUF0,
                          Mux(~occupied(MemSpace.BUF1), MemSpace.BUF1, MemSpace.BUF2))
        in_space = Mux(in_from_stage, stage_space, instr.input.space)
        in_offset = Mux(in_from_stage, 0, instr.input.offset)
        in_local = in_space != MemSpace.DRAM
        sc_local = instr.shortcut.space != MemSpace.DRAM
        out_local = instr.output.space != MemSpace.DRAM
        in_reader_idle = Signal()
        sc_reader_idle = Signal()

        def local_reader(name, local, space, grant, byte_addr, words, reader):
            """Streams a granted segment of ``words`` words from the buffer at ``space``, one
            word per cycle; returns (push, word) for the FIFO behind it."""
            addr = Signal(range(self.buffer_words + 1), name=f"{name}_local_addr")
            left = Signal(16, name=f"{name}_local_left")
            issued = Signal(name=f"{name}_local_issued")
            idle = in_reader_idle if reader == 0 else sc_reader_idle
            m.d.comb += idle.eq(left == 0)
            with m.If(flush | start_compute):
                m.d.sync += left.eq(0)
            with m.Elif(local & grant):
                m.d.sync += [addr.eq(byte_addr >> _log2(L)), left.eq(words)]
            with m.Elif(left != 0):
                m.d.sync += [addr.eq(addr + 1), left.eq(left - 1)]
            m.d.sync += issued.eq((left != 0) & ~flush)
            for port in buffer_read[reader]:
                m.d.comb += [port.addr.eq(addr), port.en.eq(1)]
            data_out = Array(port.data for port in buffer_read[reader])[
                (Value.cast(space) - 1)[:2]]
            return issued, data_out

        # -- compute path ---------------------------------------------------------------------
        datapath = ResetInserter(flush)(ConvDatapath(cfg))
        m.submodules.datapath = datapath
        in_fifo = ResetInserter(flush)(SyncFIFO(width=8 * L, depth=self.row_words))
        m.submodules.in_fifo = in_fifo
        result_depth = RESULT_FIFO_DEPTH
        m.submodules.result_fifo = result_fifo = ResetInserter(flush)(
            SyncFIFO(width=8 * L, depth=result_depth))
        m.submodules.write_fifo = write_fifo = ResetInserter(flush)(
            SyncFIFO(width=8 * L, depth=self.write_words))

        compute = Signal()             # in the compute phase
        start_compute = Signal()

        # Input reader ---------------------------------------------------------------------
        in_y = Signal(12)
        in_cb = Signal(16)
        in_seg_addr = Signal(aw)
        in_row_addr = Signal(aw)
        in_done = Signal()
        in_outstanding = Signal(range(self.row_words * 2 + 1))
        in_credit_ok = (in_fifo.level + in_outstanding + instr.in_w) <= self.row_words
        in_req = compute & ~in_done & in_credit_ok
        in_push = Signal()

        # Output writer --------------------------------------------------------------------
        chunk_words = max(1, self.write_words // 2)
        o_oy = Signal(12)
        o_ob = Signal(16)
        o_left = Signal(12)            # words of the current segment not yet commanded
        o_addr = Signal(aw)
        o_row_addr = Signal(aw)
        o_seg_base = Signal(aw)        # first word of the current segment
        o_done = Signal()
        o_committed = Signal(range(self.write_words + 1))
        o_chunk = Signal(range(chunk_words + 1))
        m.d.comb += o_chunk.eq(Mux(o_left < chunk_words, o_left, chunk_words))
        o_req = compute & ~o_done & (write_fifo.level >= o_committed + o_chunk)

        # Streamed weights (normal convolution whose weights exceed the store): for every
        # output row, every set (P steps of Ti·To bytes, contiguous in the layout) is read
        # from DRAM; a set's command is issued once the weight FIFO has room for all of it.
        set_steps = MAX_KERNEL * MAX_KERNEL
        grant_weights = Signal()
        weight_beat = Signal()
        ws_fifo = ResetInserter(flush)(SyncFIFO(width=8 * Ti * To, depth=2 * set_steps))
        m.submodules.ws_fifo = ws_fifo
        wzp_async = wzp_mem.read_port(domain="comb")
        ws_set = Signal(32)             # sets commanded in this output row
        ws_row = Signal(12)
        ws_addr = Signal(aw)
        ws_done = Signal()
        ws_outstanding = Signal(range(4 * set_steps + 1))
        ws_set_bytes = Signal(24)
        m.d.comb += ws_set_bytes.eq(steps << _log2(Ti * To))
        ws_req = compute & streaming & ~ws_done & (
            ws_fifo.level + ws_outstanding + steps <= 2 * set_steps)
        ws_push = Signal()
        with m.If(start_compute):
            m.d.sync += [ws_set.eq(0), ws_row.eq(0), ws_done.eq(~streaming),
                         ws_addr.eq(base + instr.weights.offset)]
        with m.Elif(grant_weights):
            with m.If(ws_set + 1 < sets):
                m.d.sync += [ws_set.eq(ws_set + 1), ws_addr.eq(ws_addr + ws_set_bytes)]
            with m.Else():
                m.d.sync += [ws_set.eq(0), ws_row.eq(ws_row + 1),
                             ws_addr.eq(base + instr.weights.offset)]
                with m.If(ws_row + 1 == conv_h):
                    m.d.sync += ws_done.eq(1)
        with m.If(flush | start_compute):
            m.d.sync += ws_outstanding.eq(0)
        with m.Else():
            m.d.sync += ws_outstanding.eq(ws_outstanding + Mux(grant_weights, steps, 0)
                                          - Mux(ws_push, 1, 0))
        # The block of the step at the FIFO's head, for its weight zero points.
        wh_step = Signal(range(set_steps + 1))
        wh_ib = Signal(16)
        wh_ob = Signal(16)
        m.d.comb += wzp_async.addr.eq(wh_ob)
        with m.If(flush | start_compute):
            m.d.sync += [wh_step.eq(0), wh_ib.eq(0), wh_ob.eq(0)]
        with m.Elif(ws_fifo.r_en & ws_fifo.r_rdy):
            with m.If(wh_step + 1 < steps):
                m.d.sync += wh_step.eq(wh_step + 1)
            with m.Else():
                m.d.sync += wh_step.eq(0)
                with m.If(wh_ib + 1 < ib_count):
                    m.d.sync += wh_ib.eq(wh_ib + 1)
                with m.Else():
                    m.d.sync += [wh_ib.eq(0),
                                 wh_ob.eq(Mux(wh_ob + 1 < out_blocks, wh_ob + 1, 0))]

        # Shortcut reader. ADD: the residual tensor (conv-output shape) one (oy, ob) segment of
        # conv_w words per command, in the result order, each issued when the shortcut FIFO
        # has room for it. CHANNEL_SCALE: the C×1×1 vector in one command at the start (the
        # scale unit stores every beat as it comes, so it never blocks the DMA).
        m.submodules.sc_fifo = sc_fifo = ResetInserter(flush)(
            SyncFIFO(width=8 * L, depth=self.psum_words))
        grant_shortcut = Signal()
        sc_push = Signal()
        sc_oy = Signal(12)
        sc_ob = Signal(16)
        sc_addr = Signal(aw)
        sc_row_addr = Signal(aw)
        sc_done = Signal()
        sc_outstanding = Signal(range(2 * self.psum_words + 1))
        sc_plane = Signal(32)
        is_add = instr.eltwise == Eltwise.ADD
        sc_first = (Mux(sc_local, 0, base) + instr.shortcut.offset
                    + Mux(is_add, ob_base * sc_plane, ob_base << _log2(L)))
        sc_words = Mux(is_add, conv_w, ob_count)
        sc_req = compute & ~sc_done & (~is_add | (
            sc_fifo.level + sc_outstanding + conv_w <= self.psum_words))
        with m.If(start_compute):
            m.d.sync += [sc_oy.eq(0), sc_ob.eq(0), sc_done.eq(instr.eltwise == Eltwise.NONE),
                         sc_addr.eq(sc_first), sc_row_addr.eq(sc_first)]
        with m.Elif(grant_shortcut):
            with m.If(~is_add):
                m.d.sync += sc_done.eq(1)
            with m.Elif(sc_ob + 1 < ob_count):
                m.d.sync += [sc_ob.eq(sc_ob + 1), sc_addr.eq(sc_addr + sc_plane)]
            with m.Else():
                row = sc_row_addr + (conv_w << _log2(L))
                m.d.sync += [sc_ob.eq(0), sc_oy.eq(sc_oy + 1), sc_addr.eq(row),
                             sc_row_addr.eq(row)]
                with m.If(sc_oy + 1 == conv_h):
                    m.d.sync += sc_done.eq(1)
        with m.If(flush | start_compute):
            m.d.sync += sc_outstanding.eq(0)
        with m.Else():
            m.d.sync += sc_outstanding.eq(sc_outstanding + Mux(grant_shortcut & is_add, conv_w, 0)
                                          - Mux(sc_push & is_add, 1, 0))

        # Weight prefetch (instr.prefetch): its reads, at the lowest priority (below).
        pf_req = Signal()
        pf_addr = Signal(aw)
        pf_len = Signal(24)
        grant_prefetch = Signal()

        # Command arbitration in the compute phase, in priority order: output writes (they free
        # room), streamed weights, shortcut, input, prefetch; outside it, the control FSM's
        # reads.
        cmd = dma.cmd
        grant_write = Signal()
        grant_read = Signal()
        requests = [
            (o_req & ~out_local, o_addr, o_chunk * L, Direction.WRITE, grant_write),
            (ws_req, ws_addr, ws_set_bytes, Direction.READ, grant_weights),
            (sc_req & ~sc_local, sc_addr, sc_words << _log2(L), Direction.READ, grant_shortcut),
            (in_req & ~in_local, in_seg_addr, instr.in_w * L, Direction.READ, grant_read),
            (pf_req, pf_addr, pf_len, Direction.READ, grant_prefetch),
        ]
        with m.If(compute):
            for k, (request, address, length, direction, grant) in enumerate(requests):
                with (m.If if k == 0 else m.Elif)(request):
                    m.d.comb += [
                        cmd.valid.eq(1),
                        cmd.payload.address.eq(address),
                        cmd.payload.length.eq(length),
                        cmd.payload.direction.eq(direction),
                        grant.eq(cmd.ready),
                    ]
        with m.Else():
            m.d.comb += [cmd.valid.eq(fsm_cmd_valid), cmd.payload.eq(fsm_cmd)]

        # On-chip operands: a segment is granted at once when the local reader is free.
        with m.If(compute & in_local):
            m.d.comb += grant_read.eq(in_req & in_reader_idle)
        with m.If(compute & sc_local):
            m.d.comb += grant_shortcut.eq(sc_req & sc_reader_idle)

        # Input reader: issue segments y-major, cb-minor.
        with m.If(start_compute):
            m.d.sync += [in_y.eq(0), in_cb.eq(0), in_done.eq(0),
                         in_seg_addr.eq(Mux(in_local, 0, base) + in_offset),
                         in_row_addr.eq(Mux(in_local, 0, base) + in_offset)]
        with m.Elif(grant_read):
            with m.If(in_cb + 1 < in_blocks):
                m.d.sync += [in_cb.eq(in_cb + 1), in_seg_addr.eq(in_seg_addr + in_plane)]
            with m.Else():
                m.d.sync += [in_cb.eq(0), in_y.eq(in_y + 1),
                             in_seg_addr.eq(in_row_addr + in_row_bytes),
                             in_row_addr.eq(in_row_addr + in_row_bytes)]
                with m.If(in_y + 1 == instr.in_h):
                    m.d.sync += in_done.eq(1)
        in_outstanding_next = (in_outstanding + Mux(grant_read, instr.in_w, 0)
                               - Mux(in_push, 1, 0))
        with m.If(flush | start_compute):
            m.d.sync += in_outstanding.eq(0)
        with m.Else():
            m.d.sync += in_outstanding.eq(in_outstanding_next)

        # Read data in the compute phase: input segments, streamed weight sets, shortcut
        # segments and prefetch reads, in the order their commands were granted (one tag per
        # command).
        m.submodules.read_tags = read_tags = ResetInserter(flush)(SyncFIFO(width=2, depth=16))
        m.d.comb += [
            # (a local segment's grant can coincide with a DMA command's: it gets no tag)
            read_tags.w_data.eq(Mux(grant_weights, _TAG_WEIGHTS,
                                    Mux(grant_shortcut & ~sc_local, _TAG_SHORTCUT,
                                        Mux(grant_prefetch, _TAG_PREFETCH, _TAG_INPUT)))),
            read_tags.w_en.eq((grant_read & ~in_local) | grant_weights
                              | (grant_shortcut & ~sc_local) | grant_prefetch),
            read_tags.r_en.eq(beat_fire & rd.payload.last & compute),
        ]
        tag = read_tags.r_data
        data_beat = beat_fire & compute          # other phases' beats belong to the FSM
        m.d.comb += weight_beat.eq(data_beat & (tag == _TAG_WEIGHTS))
        with m.If(compute):
            m.d.comb += rd.ready.eq(read_tags.r_rdy)

        def assemble(beat_valid, word_bytes, name):
            """Bus beats → words of ``word_bytes`` (beats in address order): the word and the
            strobe of its last beat."""
            parts = word_bytes // B
            if parts == 1:
                return beat_valid, beat
            word = Signal(8 * word_bytes, name=f"{name}_word")
            part = Signal(range(parts), name=f"{name}_part")
            with m.If(flush | start_compute):
                m.d.sync += part.eq(0)
            with m.Elif(beat_valid):
                m.d.sync += [word.eq(Cat(word[8 * B:], beat)),
                             part.eq(Mux(part == parts - 1, 0, part + 1))]
            return beat_valid & (part == parts - 1), Cat(word[8 * B:], beat)

        push, word = assemble(data_beat & (tag == _TAG_INPUT), L, "input")
        # The first chunk of a staged group writes each DRAM input word to the staging
        # buffer, at its place in the channel-blocked layout (words arrive y, cb, x).
        stage_write = push & staged & (ob_base == 0)
        stage_word = word
        st_x = Signal(12)
        st_cb = Signal(16)
        st_row = Signal(range(self.buffer_words + 1))
        st_seg = Signal(range(self.buffer_words + 1))
        st_addr = Signal(range(self.buffer_words + 1))
        with m.If(start_compute):
            m.d.sync += [st_x.eq(0), st_cb.eq(0), st_row.eq(0), st_seg.eq(0), st_addr.eq(0)]
        with m.Elif(stage_write):
            with m.If(st_x + 1 < instr.in_w):
                m.d.sync += [st_x.eq(st_x + 1), st_addr.eq(st_addr + 1)]
            with m.Elif(st_cb + 1 < in_blocks):
                seg = st_seg + (in_plane >> _log2(L))
                m.d.sync += [st_x.eq(0), st_cb.eq(st_cb + 1), st_seg.eq(seg), st_addr.eq(seg)]
            with m.Else():
                row = st_row + instr.in_w
                m.d.sync += [st_x.eq(0), st_cb.eq(0), st_row.eq(row), st_seg.eq(row),
                             st_addr.eq(row)]
        local_push, local_word = local_reader("input", in_local, in_space,
                                              grant_read, in_seg_addr, instr.in_w, 0)
        m.d.comb += [in_push.eq(push | local_push),
                     in_fifo.w_data.eq(Mux(local_push, local_word, word)),
                     in_fifo.w_en.eq(in_push)]
        push, word = assemble(data_beat & (tag == _TAG_SHORTCUT), L, "shortcut")
        local_push, local_word = local_reader("shortcut", sc_local, instr.shortcut.space,
                                              grant_shortcut, sc_addr, sc_words, 1)
        m.d.comb += [sc_push.eq(push | local_push),
                     sc_fifo.w_data.eq(Mux(local_push, local_word, word)),
                     sc_fifo.w_en.eq(sc_push)]
        push, word = assemble(weight_beat, Ti * To, "weights")
        m.d.comb += [ws_push.eq(push), ws_fifo.w_data.eq(word), ws_fifo.w_en.eq(ws_push)]

        # Channel block of the word entering the input transform: words come (y, cb, x).
        t_x = Signal(12)
        t_cb = Signal(range(self.max_table_channels // L))
        with m.If(flush | start_compute):
            m.d.sync += [t_x.eq(0), t_cb.eq(0)]
        with m.Elif(in_table.i_stream.valid & in_table.i_stream.ready):
            with m.If(t_x + 1 < instr.in_w):
                m.d.sync += t_x.eq(t_x + 1)
            with m.Else():
                m.d.sync += [t_x.eq(0), t_cb.eq(Mux(t_cb + 1 < in_blocks, t_cb + 1, 0))]
        # The convolution's input: the transformed one (zero point and type from the post
        # record; also the padding value) or the instruction's.
        x_signed = Mux(has_ct, stage_signed("in_transform"), instr.in_signed)
        x_zp = Mux(has_ct, stage_zp("in_transform"),
                   Mux(instr.in_signed, instr.in_zp.as_signed(), instr.in_zp))

        # Row buffer input.
        dp = datapath
        m.d.comb += [
            in_table.i_stream.payload.eq(in_fifo.r_data),
            in_table.i_stream.valid.eq(in_fifo.r_rdy),
            in_fifo.r_en.eq(in_table.i_stream.ready),
            in_table.enable.eq(has_ct),
            in_table.channel_block.eq(t_cb),
            dp.i_stream.payload.eq(in_table.o_stream.payload),
            dp.i_stream.valid.eq(in_table.o_stream.valid),
            in_table.o_stream.ready.eq(dp.i_stream.ready),
        ]

        # Datapath parameters.
        prm = dp.params
        m.d.comb += [
            prm.depthwise.eq(depthwise),
            prm.kh.eq(kh), prm.kw.eq(kw), prm.sh.eq(instr.sh), prm.sw.eq(instr.sw),
            prm.pad_top.eq(instr.pad_top), prm.pad_left.eq(instr.pad_left),
            prm.in_h.eq(instr.in_h), prm.in_w.eq(instr.in_w),
            prm.out_h.eq(conv_h), prm.out_w.eq(conv_w),
            prm.blocks.eq(in_blocks),
            prm.repeats.eq(Mux(depthwise, 1, ob_count)),
            prm.row_words.eq(row_words),
            prm.places.eq(places),
            prm.zero_point.eq(x_zp[:8]),
            dp.x_signed.eq(x_signed),
            dp.uses.eq(conv_w),
            dp.start.eq(start_compute),
        ]

        # Weight replay: for every output row, sets 0 … sets−1, P steps each.
        weight_r = weight_mem.read_port()
        wzp_r = wzp_mem.read_port()
        w_addr = Signal(range(self.weight_words + 1))
        w_step = Signal(range(MAX_KERNEL * MAX_KERNEL + 1))
        w_ib = Signal(16)
        w_ob = Signal(16)
        w_row = Signal(12)
        w_active = Signal()
        w_out = dp.w_stream
        w_valid = Signal()              # the store's read register holds a step
        w_advance = ~w_valid | w_out.ready
        w_fetch = w_active & w_advance
        m.d.comb += [
            weight_r.addr.eq(w_addr),
            weight_r.en.eq(w_advance),
            wzp_r.addr.eq(ob_base + w_ob),
            wzp_r.en.eq(w_advance),
        ]
        with m.If(streaming):
            # Weights that do not fit the store come from DRAM, set by set (ws_* below).
            m.d.comb += [
                w_out.payload.weights.as_value().eq(ws_fifo.r_data),
                w_out.payload.zero_points.as_value().eq(wzp_async.data),
                w_out.valid.eq(ws_fifo.r_rdy),
                ws_fifo.r_en.eq(w_out.ready),
            ]
        with m.Else():
            m.d.comb += [
                # conv NONE runs as a 1×1 depthwise convolution with unit weights.
                w_out.payload.weights.as_value().eq(Mux(identity, _identity_weights(To, Ti),
                                                        weight_r.data)),
                w_out.payload.zero_points.as_value().eq(Mux(identity, 0, wzp_r.data)),
                w_out.valid.eq(w_valid),
            ]
        with m.If(flush | start_compute):
            # Held (or prefetched) weights stay where they were loaded; loads go to word 0.
            # A double-buffered chunk after the first is where the prefetch loaded it.
            replay_base = Mux(instr.double_buffer & (ob_base != 0), chunk_base,
                              Mux(instr.weights_held, held_base, 0))
            m.d.sync += [weights_base.eq(replay_base),
                         w_addr.eq(replay_base), w_step.eq(0), w_ib.eq(0), w_ob.eq(0),
                         w_row.eq(0),
                         w_active.eq(start_compute & ~streaming), w_valid.eq(0)]
        with m.Else():
            with m.If(w_advance):
                m.d.sync += w_valid.eq(w_fetch)
            with m.If(w_fetch):
                with m.If(w_step + 1 < steps):
                    m.d.sync += [w_step.eq(w_step + 1), w_addr.eq(w_addr + 1)]
                with m.Else():
                    m.d.sync += [w_step.eq(0), w_addr.eq(w_addr + 1)]
                    with m.If(w_ib + 1 < ib_count):
                        m.d.sync += w_ib.eq(w_ib + 1)
                    with m.Else():
                        m.d.sync += w_ib.eq(0)
                        with m.If(w_ob + 1 < ob_count):
                            m.d.sync += w_ob.eq(w_ob + 1)
                        with m.Else():
                            m.d.sync += [w_ob.eq(0), w_addr.eq(weights_base),
                                         w_row.eq(w_row + 1)]
                            with m.If(w_row + 1 == conv_h):
                                m.d.sync += w_active.eq(0)

        # Accumulation over input-channel blocks, bias, requantisation.
        acc_in = dp.o_stream
        r_ox = Signal(12)
        r_ib = Signal(16)
        r_ob = Signal(16)
        psum = Memory(shape=32 * To, depth=self.psum_words, init=[])
        m.submodules.psum = psum
        psum_w = psum.write_port()
        psum_r = psum.read_port(transparent_for=(psum_w,))
        bias_r = bias_mem.read_port()
        mult_r = mult_mem.read_port()
        a_valid = Signal()
        a_first = Signal()
        a_last = Signal()
        a_ox = Signal(12)
        a_acc = Signal(32 * To)
        m.d.comb += [
            psum_r.addr.eq(r_ox), psum_r.en.eq(1),
            bias_r.addr.eq(ob_base + r_ob), bias_r.en.eq(1),
            mult_r.addr.eq(ob_base + r_ob), mult_r.en.eq(1),
        ]
        m.d.sync += [
            a_valid.eq(acc_in.valid & ~flush),
            a_first.eq(r_ib == 0),
            a_last.eq(r_ib + 1 == ib_count),
            a_ox.eq(r_ox),
            a_acc.eq(acc_in.payload.as_value()),
        ]
        with m.If(flush | start_compute):
            m.d.sync += [r_ox.eq(0), r_ib.eq(0), r_ob.eq(0)]
        with m.Elif(acc_in.valid):
            with m.If(r_ox + 1 < conv_w):
                m.d.sync += r_ox.eq(r_ox + 1)
            with m.Else():
                m.d.sync += r_ox.eq(0)
                with m.If(r_ib + 1 < ib_count):
                    m.d.sync += r_ib.eq(r_ib + 1)
                with m.Else():
                    m.d.sync += r_ib.eq(0)
                    with m.If(r_ob + 1 < ob_count):
                        m.d.sync += r_ob.eq(r_ob + 1)
                    with m.Else():
                        m.d.sync += r_ob.eq(0)
        sums = []
        for lane in range(To):
            part = a_acc[32 * lane:32 * (lane + 1)].as_signed()
            prev = psum_r.data[32 * lane:32 * (lane + 1)].as_signed()
            s = Signal(signed(32), name=f"psum_{lane}")
            m.d.comb += s.eq(part + Mux(a_first, 0, prev))
            sums.append(s)
        m.d.comb += [
            psum_w.addr.eq(a_ox),
            psum_w.data.eq(Cat(*sums)),
            psum_w.en.eq(a_valid & ~a_last),
        ]
        # conv NONE: codes pass unchanged (acc = x − x_zp, multiplier 1.0, zero point x_zp).
        conv_signed = Mux(identity, x_signed, stage_signed("conv"))
        conv_zp = Mux(identity, x_zp, stage_zp("conv"))
        lo = Mux(conv_signed, -128, 0)
        hi = Mux(conv_signed, 127, 255)
        requant_valid = Signal()
        result_codes = []
        for lane in range(To):
            rq = ResetInserter(flush)(Requantizer())
            m.submodules[f"requant_{lane}"] = rq
            b = Mux(identity, 0, bias_r.data[32 * lane:32 * (lane + 1)].as_signed())
            m.d.comb += [
                rq.acc.eq(sums[lane] + b),
                rq.multiplier.eq(Mux(identity, _FLOAT32_ONE,
                                     mult_r.data[32 * lane:32 * (lane + 1)])),
                rq.zero_point.eq(conv_zp),
                rq.lo.eq(lo), rq.hi.eq(hi),
                rq.valid.eq(a_valid & a_last),
            ]
            result_codes.append(rq.y[:8])
            if lane == 0:
                m.d.comb += requant_valid.eq(rq.y_valid)
        m.d.comb += [
            result_fifo.w_data.eq(Cat(*result_codes)),
            result_fifo.w_en.eq(requant_valid),
        ]
        # Results in flight after the array takes a step: array, psum stage, requantiser.
        in_flight = results_in_flight(cfg)
        assert result_depth > 2 * in_flight
        hold = Signal()
        m.d.comb += [hold.eq(result_fifo.level + in_flight >= result_depth), dp.hold.eq(hold)]

        # Post-processing, in the order of sfnpu.isa's chain: activation table (before the
        # element-wise stage) → ADD or CHANNEL_SCALE with the shortcut stream → activation
        # table (after it) → clamp → max, average or global-average pool → 2× upsample →
        # padding-lane mask → write buffer. Every stage passes beats (oy, ob, ox) of the chunk's
        # `ob_count` blocks.
        # The type (zero point, signedness) of the codes after each stage, as the golden model
        # tracks it: the post record's entry of each stage that changes it.
        table_first = (instr.act == Activation.TABLE) & (
            (instr.eltwise == Eltwise.NONE) | (instr.act_order == ActOrder.BEFORE_ELTWISE))
        table_after = (instr.act == Activation.TABLE) & (instr.eltwise != Eltwise.NONE) & (
            instr.act_order == ActOrder.AFTER_ELTWISE)
        t1_signed = Mux(table_first, stage_signed("act"), conv_signed)
        t1_zp = Mux(table_first, stage_zp("act"), conv_zp)
        has_eltwise = instr.eltwise != Eltwise.NONE
        t2_signed = Mux(has_eltwise, stage_signed("eltwise"), t1_signed)
        t2_zp = Mux(has_eltwise, stage_zp("eltwise"), t1_zp)
        t3_signed = Mux(table_after, stage_signed("act_after"), t2_signed)
        t3_zp = Mux(table_after, stage_zp("act_after"), t2_zp)
        sc_zp = Mux(instr.sc_signed, instr.sc_zp.as_signed(), instr.sc_zp)

        max_blocks = self.max_channels // To
        # The stages keep state across beats even when bypassed: they are held in reset
        # outside the compute phase, so each group starts them afresh.
        restart = flush | ~compute
        m.submodules.add = add = ResetInserter(restart)(EltwiseAdd(L))
        m.submodules.scale = scale = ResetInserter(restart)(
            ChannelScale(L, max_width=self.psum_words, max_blocks=max_blocks))
        m.submodules.maxpool = maxpool = ResetInserter(restart)(
            MaxPool(L, max_width=self.psum_words, max_blocks=max_blocks,
                    max_row_pixels=self.pool_row_pixels))
        m.submodules.avgpool = avgpool = ResetInserter(restart)(
            AvgPool(L, max_width=self.psum_words, max_blocks=max_blocks,
                    max_row_pixels=self.pool_row_pixels))
        m.submodules.gap = gap = ResetInserter(restart)(
            GlobalAvgPool(L, max_width=self.psum_words, max_blocks=max_blocks))
        m.submodules.upsample = upsample = ResetInserter(restart)(
            Upsample2x(L, max_width=self.pool_row_pixels))
        pooled_h = Mux(instr.upsample, instr.out_h >> 1, instr.out_h)
        pooled_w = Mux(instr.upsample, instr.out_w >> 1, instr.out_w)
        m.d.comb += [
            act.enable.eq(table_first),
            act_after.enable.eq(table_after),
            add.enable.eq(instr.eltwise == Eltwise.ADD),
            add.stream_signed.eq(t1_signed),
            add.shortcut_signed.eq(instr.sc_signed),
            add.swap.eq(post_word("eltwise_swap")[0]),
            add.r_a.eq(post_word("eltwise_const", 0)),
            add.r_b.eq(post_word("eltwise_const", 1)),
            add.fixed.eq(post_word("eltwise_const", 2)),
            add.out_signed.eq(stage_signed("eltwise")),
            scale.enable.eq(instr.eltwise == Eltwise.CHANNEL_SCALE),
            scale.in_h.eq(conv_h), scale.in_w.eq(conv_w), scale.blocks.eq(ob_count),
            scale.a_signed.eq(t1_signed), scale.a_zp.eq(t1_zp),
            scale.b_signed.eq(instr.sc_signed), scale.b_zp.eq(sc_zp),
            scale.multiplier.eq(post_word("eltwise_const", 0)),
            scale.y_zp.eq(stage_zp("eltwise")), scale.out_signed.eq(stage_signed("eltwise")),
            maxpool.enable.eq(instr.pool == Pool.MAX),
            maxpool.signed.eq(t3_signed),
            maxpool.kernel.eq(instr.pool_size), maxpool.stride.eq(instr.pool_stride),
            maxpool.pad.eq(instr.pool_pad),
            maxpool.in_h.eq(conv_h), maxpool.in_w.eq(conv_w),
            maxpool.out_h.eq(pooled_h), maxpool.out_w.eq(pooled_w),
            maxpool.blocks.eq(ob_count),
            avgpool.enable.eq(instr.pool == Pool.AVG),
            avgpool.in_signed.eq(t3_signed), avgpool.x_zp.eq(t3_zp),
            avgpool.out_signed.eq(stage_signed("pool")), avgpool.y_zp.eq(stage_zp("pool")),
            avgpool.x_scale.eq(post_word("pool_const", 0)),
            avgpool.y_scale.eq(post_word("pool_const", 1)),
            avgpool.kernel.eq(instr.pool_size), avgpool.stride.eq(instr.pool_stride),
            avgpool.pad.eq(instr.pool_pad), avgpool.count_include_pad.eq(instr.pool_count_pad),
            avgpool.in_h.eq(conv_h), avgpool.in_w.eq(conv_w),
            avgpool.out_h.eq(pooled_h), avgpool.out_w.eq(pooled_w),
            avgpool.blocks.eq(ob_count),
            gap.enable.eq(instr.pool == Pool.GLOBAL_AVG),
            gap.in_h.eq(conv_h), gap.in_w.eq(conv_w), gap.blocks.eq(ob_count),
            gap.in_signed.eq(t3_signed), gap.in_zp.eq(t3_zp),
            gap.multiplier.eq(post_word("pool_const", 0)),
            gap.out_signed.eq(stage_signed("pool")), gap.out_zp.eq(stage_zp("pool")),
            upsample.enable.eq(instr.upsample),
            upsample.in_w.eq(ob_count * pooled_w),
        ]
        # The shortcut stream: a residual tensor (ADD) or the scale vector (CHANNEL_SCALE).
        m.d.comb += [
            add.s_stream.payload.eq(sc_fifo.r_data),
            scale.s_stream.payload.eq(sc_fifo.r_data),
            add.s_stream.valid.eq(sc_fifo.r_rdy & (instr.eltwise == Eltwise.ADD)),
            scale.s_stream.valid.eq(sc_fifo.r_rdy & (instr.eltwise == Eltwise.CHANNEL_SCALE)),
            sc_fifo.r_en.eq(Mux(instr.eltwise == Eltwise.ADD, add.s_stream.ready,
                                scale.s_stream.ready)),
        ]
        # Clamp (Activation.CLAMP) between the tables and the pooling.
        clamp = stream.Signature(data.ArrayLayout(8, L)).create()
        out_signed = instr.out_signed
        clamp_lo = Mux(out_signed, instr.clamp_lo.as_signed(), instr.clamp_lo)
        clamp_hi = Mux(out_signed, instr.clamp_hi.as_signed(), instr.clamp_hi)
        for lane in range(L):
            code = act_after.o_stream.payload[lane]
            value = Mux(t3_signed, code.as_signed(), code)
            clamped = Mux(instr.act == Activation.CLAMP,
                          Mux(value < clamp_lo, clamp_lo, Mux(value > clamp_hi, clamp_hi, value)),
                          value)
            m.d.comb += clamp.payload[lane].eq(clamped[:8])
        m.d.comb += [clamp.valid.eq(act_after.o_stream.valid),
                     act_after.o_stream.ready.eq(clamp.ready)]
        # Eltwise: both units in series, at most one enabled (the other passes through).
        wiring.connect(m, result_fifo.r_stream, act.i_stream)
        wiring.connect(m, act.o_stream, add.i_stream)
        wiring.connect(m, add.o_stream, scale.i_stream)
        wiring.connect(m, scale.o_stream, act_after.i_stream)
        wiring.connect(m, clamp, maxpool.i_stream)
        wiring.connect(m, maxpool.o_stream, avgpool.i_stream)
        wiring.connect(m, avgpool.o_stream, gap.i_stream)
        wiring.connect(m, gap.o_stream, upsample.i_stream)
        chain = upsample.o_stream

        p_ob = Signal(16)              # channel block of the beat leaving the chain
        p_ox = Signal(12)
        lanes_valid = Signal(range(L + 1))
        remaining = instr.out_c - ((ob_base + p_ob) << _log2(To))
        m.d.comb += lanes_valid.eq(Mux(remaining >= L, L, remaining))
        masked = [Mux(lane < lanes_valid, chain.payload[lane], 0) for lane in range(L)]
        post_fire = chain.valid & write_fifo.w_rdy
        m.d.comb += [
            write_fifo.w_data.eq(Cat(*masked)),
            write_fifo.w_en.eq(chain.valid),
            chain.ready.eq(write_fifo.w_rdy),
        ]
        with m.If(flush | start_compute):
            m.d.sync += [p_ob.eq(0), p_ox.eq(0)]
        with m.Elif(post_fire):
            with m.If(p_ox + 1 < instr.out_w):
                m.d.sync += p_ox.eq(p_ox + 1)
            with m.Else():
                m.d.sync += p_ox.eq(0)
                m.d.sync += p_ob.eq(Mux(p_ob + 1 < ob_count, p_ob + 1, 0))

        # Output writer: commands per chunk of a (oy, ob) segment.
        with m.If(start_compute):
            first_out = (Mux(out_local, 0, base) + instr.output.offset
                         + (out_block0 + ob_base) * out_plane)
            m.d.sync += [o_oy.eq(0), o_ob.eq(0), o_left.eq(instr.out_w), o_done.eq(0),
                         o_addr.eq(first_out), o_row_addr.eq(first_out),
                         o_seg_base.eq(first_out)]
        with m.Elif(grant_write):
            with m.If(o_left > o_chunk):
                m.d.sync += [o_left.eq(o_left - o_chunk), o_addr.eq(o_addr + o_chunk * L)]
            with m.Elif(o_ob + 1 < ob_count):
                m.d.sync += [o_ob.eq(o_ob + 1), o_left.eq(instr.out_w),
                             o_addr.eq(o_seg_base + out_plane),
                             o_seg_base.eq(o_seg_base + out_plane)]
            with m.Else():
                m.d.sync += [o_ob.eq(0), o_oy.eq(o_oy + 1), o_left.eq(instr.out_w),
                             o_addr.eq(o_row_addr + out_row_bytes),
                             o_row_addr.eq(o_row_addr + out_row_bytes),
                             o_seg_base.eq(o_row_addr + out_row_bytes)]
                with m.If(o_oy + 1 == instr.out_h):
                    m.d.sync += o_done.eq(1)
        # Write data: words → bus beats.
        wd = dma.write_data
        w_part = Signal(range(max(beats_per_word, 2)))
        word_sent = Signal()
        if beats_per_word == 1:
            m.d.comb += [wd.payload.eq(write_fifo.r_data), word_sent.eq(wd.valid & wd.ready)]
        else:
            m.d.comb += [wd.payload.eq(write_fifo.r_data.word_select(w_part, 8 * B)),
                         word_sent.eq(wd.valid & wd.ready & (w_part == beats_per_word - 1))]
            with m.If(flush):
                m.d.sync += w_part.eq(0)
            with m.Elif(wd.valid & wd.ready):
                m.d.sync += w_part.eq(Mux(w_part == beats_per_word - 1, 0, w_part + 1))
        # Only words of commands already issued leave the buffer.
        # Local output (an on-chip buffer): a granted chunk is written word by word.
        lw_addr = Signal(range(self.buffer_words + 1))
        lw_left = Signal(range(chunk_words + 1))
        local_sent = Signal()
        with m.If(out_local):
            m.d.comb += [
                grant_write.eq(o_req & (lw_left == 0)),
                local_sent.eq(write_fifo.r_rdy & (lw_left != 0)),
                write_fifo.r_en.eq(local_sent),
            ]
        with m.Else():
            m.d.comb += [
                wd.valid.eq(write_fifo.r_rdy & (o_committed != 0)),
                write_fifo.r_en.eq(word_sent),
            ]
        with m.If(flush | start_compute):
            m.d.sync += lw_left.eq(0)
        with m.Elif(out_local & grant_write):
            m.d.sync += [lw_addr.eq(o_addr >> _log2(L)), lw_left.eq(o_chunk)]
        with m.Elif(local_sent):
            m.d.sync += [lw_addr.eq(lw_addr + 1), lw_left.eq(lw_left - 1)]
        for k, port in enumerate(buffer_write):
            staging_here = stage_write & (stage_space == MemSpace(k + 1))
            m.d.comb += [port.addr.eq(Mux(staging_here, st_addr, lw_addr)),
                         port.data.eq(Mux(staging_here, stage_word, write_fifo.r_data)),
                         port.en.eq(staging_here | (local_sent
                                                    & (instr.output.space == MemSpace(k + 1))))]
        with m.If(flush):
            m.d.sync += o_committed.eq(0)
        with m.Else():
            m.d.sync += o_committed.eq(o_committed + Mux(grant_write, o_chunk, 0)
                                       - Mux(word_sent | local_sent, 1, 0))

        compute_done = (o_done & (o_committed == 0) & ~dma.write_busy & ~dp.busy
                        & ~write_fifo.r_rdy)

        # -- parameter and weight loading (beats of the control FSM's reads) ------------------
        load_pos = Signal(24)          # byte offset of the beat within the loaded block
        in_act = ((instr.act == Activation.TABLE) & (load_pos >= act_off)
                  & (load_pos < act_off + 256))
        in_ct = has_ct & (load_pos >= ct_off) & (load_pos < post_off)
        loading_params = Signal()
        loading_weights = Signal()
        # Depthwise weight layout [C/L][kh][kw][L] → steps of G taps: (step, slot, lane chunk).
        dw_step = Signal(range(self.weight_words + 1))
        dw_slot = Signal(range(G))
        dw_tap = Signal(range(MAX_KERNEL * MAX_KERNEL))
        dw_chunk = Signal(range(max(beats_per_word, 2)))

        def one_hot(index, count):
            return Const(1, count) << index

        def write_weight_beat(first_word, pos):
            """The bus beat at byte ``pos`` of weights loaded from store word ``first_word``
            (the normal-convolution layout: words of Ti·To bytes, in order)."""
            m.d.comb += [weight_w.addr.eq(first_word + (pos >> _log2(Ti * To))),
                         weight_w.en.eq(one_hot(pos[_log2(B):_log2(Ti * To)], Ti * To // B))]

        bias_chunks = 4 * To // B
        wzp_chunks = To // B
        m.d.comb += [
            bias_w.data.eq(Cat(*([beat] * bias_chunks))),
            mult_w.data.eq(Cat(*([beat] * bias_chunks))),
            wzp_w.data.eq(Cat(*([beat] * wzp_chunks))),
            weight_w.data.eq(Cat(*([beat] * (Ti * To // B)))),
            act.write_data.eq(beat),
            act_after.write_data.eq(beat),
            in_table.write_data.eq(beat),
        ]
        with m.If(loading_params & rd.valid):
            pos = load_pos
            with m.If(pos < mult_off):
                rel = pos
                m.d.comb += [bias_w.addr.eq(rel >> _log2(4 * To)),
                             bias_w.en.eq(one_hot(rel[_log2(B):_log2(4 * To)], bias_chunks))]
            with m.Elif(pos < wzp_off):
                rel = pos - mult_off
                m.d.comb += [mult_w.addr.eq(rel >> _log2(4 * To)),
                             mult_w.en.eq(one_hot(rel[_log2(B):_log2(4 * To)], bias_chunks))]
            with m.Elif(pos < wzp_off + param_cp):
                rel = pos - wzp_off
                if wzp_chunks > 1:
                    en = one_hot(rel[_log2(B):_log2(To)], wzp_chunks)
                else:
                    en = Const(1, 1)
                m.d.comb += [wzp_w.addr.eq(rel >> _log2(To)), wzp_w.en.eq(en)]
            with m.Elif((pos >= post_off) & (pos < post_off + layout.POST_RECORD.itemsize)):
                word0 = (pos - post_off) >> 2
                for j in range(wpb):
                    with m.If(word0 + j < POST_WORDS):
                        m.d.sync += post[word0 + j].eq(beat_words[j])
            with m.Elif(in_act):
                m.d.comb += [act.write_addr.eq(pos - act_off), act.write_en.eq(1),
                             act_after.write_addr.eq(pos - act_off),
                             act_after.write_en.eq(1)]
            with m.Elif(in_ct):
                m.d.comb += [in_table.write_addr.eq(pos - ct_off), in_table.write_en.eq(1)]
        with m.If(loading_weights & rd.valid):
            with m.If(depthwise):
                byte = Cat(Const(0, _log2(B)), dw_chunk, dw_slot) if beats_per_word > 1 \
                    else Cat(Const(0, _log2(B)), dw_slot)
                m.d.comb += [weight_w.addr.eq(dw_step),
                             weight_w.en.eq(one_hot(byte >> _log2(B), Ti * To // B))]
            with m.Else():
                write_weight_beat(0, load_pos)
        # Read data outside compute: every store takes a beat per cycle (the activation
        # tables a bus word of entries into every lane's copy).
        with m.If(~compute):
            m.d.comb += rd.ready.eq(1)
        with m.If(beat_fire & ~compute):
            m.d.sync += [load_pos.eq(load_pos + B), beat_index.eq(beat_index + 1)]
        with m.If(loading_weights & beat_fire & depthwise):
            last_chunk = (dw_chunk == beats_per_word - 1) if beats_per_word > 1 else Const(1)
            with m.If(~last_chunk):
                m.d.sync += dw_chunk.eq(dw_chunk + 1)
            with m.Else():
                m.d.sync += dw_chunk.eq(0)
                with m.If(dw_tap + 1 == taps):         # the block's last tap
                    m.d.sync += [dw_tap.eq(0), dw_slot.eq(0), dw_step.eq(dw_step + 1)]
                with m.Else():
                    m.d.sync += dw_tap.eq(dw_tap + 1)
                    with m.If(dw_slot == G - 1):
                        m.d.sync += [dw_slot.eq(0), dw_step.eq(dw_step + 1)]
                    with m.Else():
                        m.d.sync += dw_slot.eq(dw_slot + 1)

        # -- weight prefetch (instr.prefetch, instr.double_buffer) ------------------------------
        # In the compute phase, at the lowest bus priority, the next weights load at the other
        # end of the weight store from the ones computing (word 0 when those are above it,
        # else the top). double_buffer: while a chunk computes, the group's next chunk
        # (chunks of at most half the store). prefetch, during the group's last chunk: read the
        # next instruction, size its weights (a normal convolution: OB·IB·kh·kw words), check
        # that they fit beside this chunk's, load them whole; the store then holds them as if
        # the next group had loaded them (held_*), and that group sets weights_held.
        PF_IDLE, PF_INSTR_CMD, PF_INSTR_DATA, PF_ALIGN, PF_BLOCKS, PF_WORDS, PF_CHECK, \
            PF_CHUNK, PF_PLACE, PF_WEIGHT_CMD, PF_WEIGHT_DATA, PF_DONE, PF_FAIL = range(13)
        pf_state = Signal(range(13))
        pf_buf = Signal(fetch_beats * B * 8)
        pf_beats = Signal(range(fetch_beats + 1))
        pf_bits = Signal(_ISA.size)
        pf_next = data.View(isa.InstructionLayout, pf_bits)
        pf_blocks = Signal(32)
        pf_words = Signal(32)
        pf_src = Signal(aw)             # DRAM address of the weights to load
        pf_chunk = Signal()             # they are this group's next chunk
        pf_base = Signal(range(self.weight_words + 1))
        pf_pos = Signal(24)
        pf_error = Signal(ErrorCode)
        pf_beat = data_beat & (tag == _TAG_PREFETCH)
        pf_busy = (pf_state != PF_IDLE) & (pf_state != PF_DONE) & (pf_state != PF_FAIL)
        pf_instr_addr = fetch_addr + INSTRUCTION_BYTES
        own_words = Signal(32)          # the computing chunk's words in the store
        next_ob = ob_base + ob_count
        next_rest = out_blocks - next_ob
        next_obs = Mux(next_rest < chunk_obs, next_rest, chunk_obs)   # the next chunk's blocks
        more_chunks = next_ob < out_blocks
        with m.Switch(pf_state):
            with m.Case(PF_INSTR_CMD):
                m.d.comb += [pf_req.eq(1), pf_addr.eq(pf_instr_addr),
                             pf_len.eq(INSTRUCTION_BYTES)]
                with m.If(grant_prefetch):
                    m.d.sync += [pf_state.eq(PF_INSTR_DATA), pf_beats.eq(0)]
            with m.Case(PF_INSTR_DATA):
                with m.If(pf_beat):
                    m.d.sync += [pf_buf.eq(shifted_in(pf_buf)), pf_beats.eq(pf_beats + 1)]
                    with m.If(rd.payload.last):
                        m.d.sync += pf_state.eq(PF_ALIGN)
            with m.Case(PF_ALIGN):
                m.d.sync += [pf_bits.eq(aligned_instruction(pf_buf, pf_beats, pf_instr_addr)),
                             pf_state.eq(PF_BLOCKS)]
            with m.Case(PF_BLOCKS):
                m.d.sync += [pf_blocks.eq(((pf_next.out_c + To - 1) >> _log2(To))
                                          * ((pf_next.in_c + Ti - 1) >> _log2(Ti))),
                             pf_state.eq(PF_WORDS)]
            with m.Case(PF_WORDS):
                m.d.sync += [pf_words.eq(pf_blocks * (pf_next.kh * pf_next.kw)),
                             pf_state.eq(PF_CHECK)]
            with m.Case(PF_CHECK):
                with m.If((pf_next.opcode != Opcode.GROUP) | (pf_next.conv != ConvKind.NORMAL)
                          | (pf_next.weights.space != MemSpace.DRAM)):
                    m.d.sync += [pf_error.eq(ErrorCode.UNSUPPORTED), pf_state.eq(PF_FAIL)]
                with m.Elif(own_words + pf_words > self.weight_words):
                    m.d.sync += [pf_error.eq(ErrorCode.BUFFER_OVERFLOW), pf_state.eq(PF_FAIL)]
                with m.Else():
                    m.d.sync += [pf_src.eq(base + pf_next.weights.offset), pf_chunk.eq(0),
                                 pf_state.eq(PF_PLACE)]
            with m.Case(PF_CHUNK):
                m.d.sync += [pf_words.eq(next_obs * block_words),
                             pf_src.eq(base + instr.weights.offset
                                       + ((next_ob * block_words) << _log2(Ti * To))),
                             pf_chunk.eq(1), pf_state.eq(PF_PLACE)]
            with m.Case(PF_PLACE):
                m.d.sync += [pf_base.eq(Mux(weights_base == 0, self.weight_words - pf_words, 0)),
                             pf_pos.eq(0), pf_state.eq(PF_WEIGHT_CMD)]
            with m.Case(PF_WEIGHT_CMD):
                m.d.comb += [pf_req.eq(1), pf_addr.eq(pf_src),
                             pf_len.eq(pf_words << _log2(Ti * To))]
                with m.If(grant_prefetch):
                    m.d.sync += pf_state.eq(PF_WEIGHT_DATA)
            with m.Case(PF_WEIGHT_DATA):
                with m.If(pf_beat):
                    write_weight_beat(pf_base, pf_pos)
                    m.d.sync += pf_pos.eq(pf_pos + B)
                    with m.If(rd.payload.last):
                        m.d.sync += pf_state.eq(PF_DONE)
                        with m.If(pf_chunk):
                            m.d.sync += chunk_base.eq(pf_base)
                        with m.Else():
                            m.d.sync += [held_valid.eq(1),
                                         held_offset.eq(pf_next.weights.offset),
                                         held_depthwise.eq(0), held_base.eq(pf_base)]
        with m.If(flush):
            m.d.sync += pf_state.eq(PF_IDLE)
        with m.Elif(start_compute):
            m.d.sync += [pf_state.eq(Mux(instr.double_buffer & more_chunks, PF_CHUNK,
                                         Mux(instr.prefetch, PF_INSTR_CMD, PF_IDLE))),
                         own_words.eq(Mux(identity | streaming, 0, ob_count * block_words))]

        # -- header parse ---------------------------------------------------------------------
        magic_lo = int.from_bytes(image.MAGIC[:4], "little")
        magic_hi = int.from_bytes(image.MAGIC[4:8], "little")
        expect = {
            _HEADER_WORD["magic"]: magic_lo,
            _HEADER_WORD["magic"] + 1: magic_hi,
            _HEADER_WORD["version"]: image.FORMAT_VERSION,
            _HEADER_WORD["fingerprint"]: cfg.fingerprint & 0xFFFFFFFF,
            _HEADER_WORD["fingerprint"] + 1: cfg.fingerprint >> 32,
        }

        def parse_header():
            for word, value in expect.items():
                with m.If(beat_index == word // wpb):
                    with m.If(beat_words[word % wpb] != value):
                        m.d.sync += header_ok.eq(0)
            word = _HEADER_WORD["section_count"]
            with m.If(beat_index == word // wpb):
                m.d.sync += section_count.eq(beat_words[word % wpb])

        def parse_table():
            flag = entry_is_instr
            for j in range(wpb):
                rel = (table_word + j) % _SECTION_WORDS if wpb < _SECTION_WORDS else \
                    Const(j % _SECTION_WORDS, 3)
                flag = Mux(rel == _SECTION_KIND_WORD,
                           beat_words[j][:8] == image.SectionKind.INSTRUCTIONS, flag)
                with m.If((rel == _SECTION_OFFSET_WORD) & flag & ~found):
                    m.d.sync += [instr_offset.eq(beat_words[j]), found.eq(1)]
            m.d.sync += [entry_is_instr.eq(flag), table_word.eq(table_word + wpb)]

        def shift_in_instruction():
            m.d.sync += fetch_buf.eq(shifted_in(fetch_buf))

        # -- decode checks ----------------------------------------------------------------------
        reserved = instr.reserved_w0.any() | instr.reserved_w1.any()

        def undefined(field, enum_type):
            return field.as_value() > max(k.value for k in enum_type)

        bad_enum = (undefined(instr.conv, ConvKind) | undefined(instr.act, Activation)
                    | undefined(instr.eltwise, Eltwise)
                    | undefined(instr.in_transform, InputTransform))
        bad_shape = ((kh == 0) | (kw == 0) | (instr.sh == 0) | (instr.sw == 0)
                     | (instr.sh > 2) | (instr.sw > 2)
                     | (instr.in_h == 0) | (instr.in_w == 0) | (instr.in_c == 0)
                     | (instr.out_c == 0)
                     | ((instr.conv != ConvKind.NORMAL) & (instr.in_c != instr.out_c))
                     | ((instr.conv == ConvKind.NONE) & instr.weights_held)
                     | (instr.prefetch & instr.last))
        unsupported = ((instr.weights.space != MemSpace.DRAM)
                       | (instr.params.space != MemSpace.DRAM)
                       | (instr.out_c_offset[:_log2(L)] != 0))
        padded_h = instr.in_h + instr.pad_top + instr.pad_bottom
        padded_w = instr.in_w + instr.pad_left + instr.pad_right

        # Restoring division places = ⌊row_words_max / row_words⌋.
        div_rem = Signal(range(2 * self.row_words + 1))
        div_bit = Signal(range(self.row_words.bit_length() + 1))

        def fail(code):
            m.d.sync += error_code.eq(code)
            m.next = "ERROR"

        def read(address, length):
            m.d.comb += [fsm_cmd_valid.eq(1), fsm_cmd.address.eq(address),
                         fsm_cmd.length.eq(length), fsm_cmd.direction.eq(Direction.READ)]

        m.d.comb += dma.clear.eq(ctl.start)
        group_done = Signal()
        m.d.comb += ctl.group_done.eq(group_done)
        m.d.comb += ctl.error_group.eq(pc)

        def guard():
            """A DMA error or an abort ends the run from any running state."""
            with m.If(ctl.soft_reset):
                m.next = "DRAIN"
            with m.Elif(dma.error):
                m.d.sync += [error_code.eq(dma.error_code), error_addr.eq(dma.error_addr)]
                m.next = "ERROR"

        def transfer(name, address, length, on_beat, after):
            """States ``<name>_CMD`` (issue one read) and ``<name>_DATA`` (``on_beat`` for every
            beat), then ``after``."""
            with m.State(f"{name}_CMD"):
                read(address, length)
                m.d.sync += beat_index.eq(0)
                with m.If(cmd.ready):
                    m.next = f"{name}_DATA"
                guard()
            with m.State(f"{name}_DATA"):
                with m.If(beat_fire):
                    on_beat()
                    with m.If(rd.payload.last):
                        m.next = after
                guard()

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(ctl.start):
                    m.d.sync += [base.eq(ctl.image_base), pc.eq(0), found.eq(0),
                                 header_ok.eq(1), error_addr.eq(0), held_valid.eq(0)]
                    with m.If(ctl.image_base[:_log2(image.SECTION_ALIGN)] != 0):
                        fail(ErrorCode.IMAGE_MISMATCH)
                    with m.Else():
                        m.next = "HEADER_CMD"
            transfer("HEADER", base, image.HEADER.size, parse_header, "HEADER_CHECK")
            with m.State("HEADER_CHECK"):
                m.d.sync += [table_word.eq(0), entry_is_instr.eq(0)]
                with m.If(~header_ok | (section_count == 0)):
                    fail(ErrorCode.IMAGE_MISMATCH)
                with m.Else():
                    m.next = "TABLE_CMD"
                guard()
            transfer("TABLE", base + image.HEADER.size, section_count * image.SECTION.size,
                     parse_table, "TABLE_CHECK")
            with m.State("TABLE_CHECK"):
                m.d.sync += fetch_addr.eq(base + instr_offset)
                with m.If(~found):
                    fail(ErrorCode.IMAGE_MISMATCH)
                with m.Else():
                    m.next = "FETCH_CMD"
                guard()
            transfer("FETCH", fetch_addr, INSTRUCTION_BYTES, shift_in_instruction, "FETCH_ALIGN")
            with m.State("FETCH_ALIGN"):
                m.d.sync += instr_bits.eq(aligned_instruction(fetch_buf, beat_index, fetch_addr))
                m.next = "DECODE"
                guard()
            with m.State("DECODE"):
                none = instr.conv == ConvKind.NONE
                dw = (instr.conv == ConvKind.DEPTHWISE) | none
                ib = (instr.in_c + Ti - 1) >> _log2(Ti)
                ob = (instr.out_c + To - 1) >> _log2(To)
                ch = ((padded_h - kh) >> (instr.sh - 1).as_unsigned()) + 1
                cw = ((padded_w - kw) >> (instr.sw - 1).as_unsigned()) + 1
                p = Mux(dw, (taps + G - 1) >> _log2(G), taps)
                m.d.sync += [
                    depthwise.eq(dw),
                    identity.eq(none),
                    has_ct.eq(instr.in_transform == InputTransform.CHANNEL_TABLE),
                    param_cp.eq(Mux(none, 0, ob << _log2(To))),
                    in_blocks.eq((instr.in_c + L - 1) >> _log2(L)),
                    out_blocks.eq(ob),
                    ib_count.eq(Mux(dw, 1, ib)),
                    conv_h.eq(ch), conv_w.eq(cw),
                    steps.eq(p),
                    out_block0.eq(instr.out_c_offset >> _log2(L)),
                    in_row_bytes.eq(instr.in_w << _log2(L)),
                    out_row_bytes.eq(instr.out_w << _log2(L)),
                    in_plane.eq((instr.in_h * instr.in_w) << _log2(L)),
                    out_plane.eq((instr.out_h * instr.out_w) << _log2(L)),
                    row_words.eq(((instr.in_c + L - 1) >> _log2(L)) * instr.in_w),
                    sets.eq(Mux(dw, ob, ob * ib)),
                ]
                with m.If(instr.opcode != Opcode.GROUP):
                    fail(ErrorCode.ILLEGAL_OPCODE)
                with m.Elif(reserved | bad_enum | bad_shape | (padded_h < kh)
                            | (padded_w < kw)):
                    fail(ErrorCode.ILLEGAL_FIELD)
                with m.Else():
                    m.next = "DECODE2"
                guard()
            with m.State("DECODE2"):
                # The sections of sfnpu.layout.param_sections, in order, 16-byte aligned.
                ct_start = _align16(param_cp * 9)
                ct_bytes = Mux(has_ct, (in_blocks << _log2(L)) << 8, 0)
                post_start = _align16(ct_start + ct_bytes)
                act_start = _align16(post_start + layout.POST_RECORD.itemsize)
                m.d.sync += [
                    weight_steps.eq(sets * steps),
                    sc_plane.eq((conv_h * conv_w) << _log2(L)),
                    mult_off.eq(param_cp << 2),
                    wzp_off.eq(param_cp << 3),
                    ct_off.eq(ct_start),
                    post_off.eq(post_start),
                    act_off.eq(act_start),
                    param_len.eq(Mux(instr.act == Activation.TABLE, act_start + 256,
                                     act_start)),
                    div_rem.eq(self.row_words), div_bit.eq(self.row_words.bit_length()),
                    places.eq(0),
                ]
                pooled_h = Mux(instr.upsample, instr.out_h >> 1, instr.out_h)
                pooled_w = Mux(instr.upsample, instr.out_w >> 1, instr.out_w)
                no_pool = (instr.pool == Pool.NONE) & ((conv_h != pooled_h)
                                                       | (conv_w != pooled_w))
                global_pool = (instr.pool == Pool.GLOBAL_AVG) & ((pooled_h != 1)
                                                                 | (pooled_w != 1))
                odd = instr.upsample & (instr.out_h[0] | instr.out_w[0])
                window = ((instr.pool == Pool.MAX) | (instr.pool == Pool.AVG)) & (
                    (instr.pool_size < 2) | (instr.pool_stride == 0) | (instr.pool_stride > 2)
                    | (instr.pool_pad >= instr.pool_size) | (pooled_h == 0) | (pooled_w == 0))
                with m.If(no_pool | global_pool | odd | window):
                    fail(ErrorCode.ILLEGAL_FIELD)
                with m.Elif(unsupported):
                    fail(ErrorCode.UNSUPPORTED)
                with m.Elif((out_blocks > cb_max) | (row_words > self.row_words)
                            | (out_blocks * Mux(instr.pool == Pool.MAX, pooled_w, 0)
                               > self.pool_row_pixels)
                            | (out_blocks * Mux(instr.upsample, pooled_w, 0)
                               > self.pool_row_pixels)
                            | (out_blocks * Mux(instr.pool == Pool.AVG, conv_w, 0)
                               > self.pool_row_pixels)
                            | (has_ct & (in_blocks > self.max_table_channels // L))
                            | (conv_w > self.psum_words)):
                    fail(ErrorCode.BUFFER_OVERFLOW)
                with m.Else():
                    m.next = "DIVIDE"
                guard()
            with m.State("DIVIDE"):
                # places = ⌊row_words_max / row_words⌋, one quotient bit per cycle.
                with m.If(div_bit == 0):
                    too_big = weight_steps > self.weight_words
                    frame = instr.reuse == Reuse.FRAME
                    stage = (too_big & frame & (instr.conv == ConvKind.NORMAL)
                             & (instr.input.space == MemSpace.DRAM))
                    m.d.sync += [streaming.eq(too_big & ~frame), staged.eq(stage),
                                 ob_base.eq(0), ob_count.eq(out_blocks),
                                 chunk_obs.eq(Mux(too_big & frame, 0, out_blocks)),
                                 chunk_steps.eq(block_words)]
                    size = self.buffer_words << _log2(L)
                    in_end = instr.input.offset + in_blocks * in_plane
                    out_end = instr.output.offset + (out_block0 + out_blocks) * out_plane
                    sc_end = instr.shortcut.offset + out_blocks * Mux(is_add, sc_plane, L)
                    with m.If((kh > places * ROW_BUFFER_ROWS)
                              | ((weight_steps > self.weight_words) & depthwise)
                              | ((instr.input.space != MemSpace.DRAM) & (in_end > size))
                              | (stage & (in_blocks * in_plane > size))
                              | (out_local & (out_end > size))
                              | (sc_local & (instr.eltwise != Eltwise.NONE) & (sc_end > size))):
                        fail(ErrorCode.BUFFER_OVERFLOW)
                    with m.Elif(instr.weights_held & ~(held_valid & ~too_big
                                                       & (held_offset == instr.weights.offset)
                                                       & (held_depthwise == depthwise))):
                        fail(ErrorCode.WEIGHTS_NOT_HELD)
                    with m.Elif(too_big & frame):
                        m.next = "CHUNK"
                    with m.Else():
                        m.next = "PARAM_CMD"
                with m.Else():
                    bit = (div_bit - 1).as_unsigned()
                    shifted = row_words << bit
                    with m.If(div_rem >= shifted):
                        m.d.sync += [div_rem.eq(div_rem - shifted),
                                     places.eq(places | (Const(1, len(places)) << bit))]
                    m.d.sync += div_bit.eq(div_bit - 1)
                guard()
            with m.State("CHUNK"):
                # Frame reuse reads every weight once: as many output-channel blocks as fit
                # the store are computed over the whole frame, then the next ones.
                limit = Mux(instr.double_buffer, self.weight_words >> 1, self.weight_words)
                with m.If((chunk_steps <= limit) & (chunk_obs < out_blocks)):
                    m.d.sync += [chunk_obs.eq(chunk_obs + 1),
                                 chunk_steps.eq(chunk_steps + block_words)]
                with m.Elif(chunk_obs == 0):
                    fail(ErrorCode.BUFFER_OVERFLOW)     # one block's weights do not fit
                with m.Else():
                    m.d.sync += ob_count.eq(chunk_obs)
                    m.next = "PARAM_CMD"
                guard()
            with m.State("PARAM_CMD"):
                read(base + instr.params.offset, param_len)
                m.d.sync += load_pos.eq(0)
                with m.If(cmd.ready):
                    m.next = "PARAM_DATA"
                guard()
            with m.State("PARAM_DATA"):
                m.d.comb += loading_params.eq(1)
                with m.If(beat_fire & rd.payload.last):
                    with m.If(identity | streaming | instr.weights_held):
                        m.next = "COMPUTE_START"
                    with m.Else():
                        m.next = "WEIGHT_CMD"
                guard()
            with m.State("WEIGHT_CMD"):
                # Depthwise weights are a multiple of the bus width; normal ones too.
                read(base + instr.weights.offset + ((ob_base * block_words) << _log2(Ti * To)),
                     Mux(depthwise, in_blocks * taps * L,
                         (ob_count * block_words) << _log2(Ti * To)))
                m.d.sync += [load_pos.eq(0), dw_step.eq(0), dw_slot.eq(0), dw_tap.eq(0),
                             dw_chunk.eq(0)]
                with m.If(cmd.ready):
                    m.next = "WEIGHT_DATA"
                guard()
            with m.State("WEIGHT_DATA"):
                m.d.comb += loading_weights.eq(1)
                with m.If(beat_fire & rd.payload.last):
                    # Whole weights stay valid for a later group with weights_held set.
                    m.d.sync += [held_valid.eq((ob_base == 0) & (ob_count == out_blocks)),
                                 held_offset.eq(instr.weights.offset),
                                 held_depthwise.eq(depthwise), held_base.eq(0)]
                    m.next = "COMPUTE_START"
                guard()
            with m.State("COMPUTE_START"):
                # Agents initialise in this cycle and act from the next one.
                m.d.comb += start_compute.eq(1)
                m.next = "COMPUTE"
                guard()
            with m.State("COMPUTE"):
                m.d.comb += compute.eq(1)
                with m.If(pf_state == PF_FAIL):
                    fail(pf_error)
                with m.Elif(compute_done & ~pf_busy):
                    with m.If(more_chunks):
                        # Next chunk of output-channel blocks (frame reuse).
                        m.d.sync += [ob_base.eq(next_ob), ob_count.eq(next_obs)]
                        with m.If(instr.double_buffer):
                            m.next = "COMPUTE_START"    # the prefetch loaded it
                        with m.Else():
                            m.next = "WEIGHT_CMD"
                    with m.Else():
                        m.next = "GROUP_END"
                guard()
            with m.State("GROUP_END"):
                m.d.comb += group_done.eq(1)
                m.d.sync += [pc.eq(pc + 1), fetch_addr.eq(fetch_addr + INSTRUCTION_BYTES)]
                with m.If(instr.last):
                    m.d.comb += ctl.done.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.next = "FETCH_CMD"
                guard()
            with m.State("ERROR"):
                m.d.comb += [ctl.error.eq(1), ctl.error_code.eq(error_code),
                             ctl.error_addr.eq(error_addr)]
                m.next = "DRAIN"
            with m.State("DRAIN"):
                # Accept read data still due; write data of issued commands is in the buffer.
                m.d.comb += rd.ready.eq(1)
                with m.If(dma.idle):
                    m.d.comb += flush.eq(1)
                    m.next = "IDLE"
        m.d.comb += ctl.idle.eq(dma.idle & fsm.ongoing("IDLE"))

        # -- stall causes -----------------------------------------------------------------------
        stall = Signal(len(StallCause))
        running = ctl.running
        m.d.comb += [
            stall[StallCause.CONTROL.value].eq(running & ~compute),
            stall[StallCause.DRAM_WRITE.value].eq(running & compute & hold),
            stall[StallCause.DRAM_READ.value].eq(running & compute & dp.i_stream.ready
                                                  & ~in_fifo.r_rdy),
            stall[StallCause.WEIGHTS.value].eq(running & compute & ~w_out.valid & w_active),
            ctl.stall.eq(stall),
        ]
        return m
