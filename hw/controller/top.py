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

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu import image, isa, layout, regmap
from sfnpu.config import MAX_KERNEL, ROW_BUFFER_ROWS, HwConfig
from sfnpu.isa import Activation, ConvKind, Eltwise, InputTransform, MemSpace, Opcode, \
    Pool, Reuse
from sfnpu.regmap import ErrorCode, StallCause

from ..act_table import ActivationTable
from ..axi import Axi4Signature
from ..conv_array import depthwise_taps
from ..csr import ControlSignature
from ..datapath import ConvDatapath
from ..dma import Direction, DmaEngine
from ..limits import StoreSizes
from .accumulator import Accumulator
from .arbiter import CommandArbiter
from .buffers import FeatureBuffers
from .common import INSTRUCTION_BYTES, ISA as _ISA, POST_WORDS, RESULT_FIFO_DEPTH, \
    TAG_INPUT as _TAG_INPUT, TAG_PREFETCH as _TAG_PREFETCH, TAG_SHORTCUT as _TAG_SHORTCUT, \
    TAG_WEIGHTS as _TAG_WEIGHTS, align16 as _align16, code_types, log2 as _log2, one_hot, \
    results_in_flight
from .params import ParamStore
from .post import PostChain
from .readers import InputReader, ShortcutReader
from .router import ReadRouter
from .weights import WeightReplay, WeightStore, WeightStream
from .writer import OutputWriter

__all__ = ["GroupController"]

_HEADER_WORD = {name: image.field_offset(image.HEADER_FIELDS, name) // 4
                for name in ("magic", "version", "fingerprint", "section_count")}
_SECTION_WORDS = image.SECTION.size // 4
_SECTION_KIND_WORD = image.field_offset(image.SECTION_FIELDS, "kind") // 4
_SECTION_OFFSET_WORD = image.field_offset(image.SECTION_FIELDS, "offset") // 4


def _identity_weights(to: int, ti: int) -> Const:
    """A depthwise weight step whose first tap is 1 for every channel (the rest 0)."""
    return Const(sum(1 << (8 * c) for c in range(to)), 8 * ti * to)


class GroupController(wiring.Component):
    """DMA, decoder, parameter and weight stores, convolution datapath and post-processing.

    Parameters
    ----------
    config : HwConfig
        ``ti == to == lanes`` (the datapath's requirement), bus width at most
        :data:`~sfnpu.layout.PARAM_ALIGN` bytes and dividing ``lanes``.
    addr_width : int
        Bus address bits.

    Every store is sized by :class:`~sfnpu.hw.limits.StoreSizes`, whose :func:`overflows`
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
        compute = Signal()             # in the compute phase
        start_compute = Signal()

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
        chunk_base = Signal(range(self.weight_words + 1))    # the next double-buffered chunk
        ob_base = Signal(16)            # output-channel blocks of the current weight chunk
        ob_count = Signal(16)
        chunk_obs = Signal(16)          # blocks whose weights fit the store together
        chunk_steps = Signal(32)        # weight steps of chunk_obs + 1 blocks (search)
        has_ct = Signal()               # input transform: per-channel tables
        ct_off = Signal(24)
        sc_plane = Signal(32)           # bytes of one channel block of the residual tensor
        param_cp = Signal(17)           # channels of the bias/multiplier/zero-point sections

        kh, kw = instr.kh, instr.kw
        m.d.comb += taps.eq(kh * kw)
        block_words = ib_count * steps  # one output block's weights (normal: IB·P words)

        # -- compute path ---------------------------------------------------------------------
        cb_max = self.max_channels // To
        cmd_layout = dma.cmd.payload.shape()
        m.submodules.params = params = ParamStore(To, B, cb_max)
        post = params.post
        m.submodules.weight_store = store = WeightStore(cfg, self.weight_words)
        m.submodules.buffers = buffers = FeatureBuffers(L, self.buffer_words,
                                                        max(1, self.write_words // 2))
        m.submodules.arbiter = arbiter = CommandArbiter(cmd_layout)
        m.submodules.router = router = ReadRouter(B, L, Ti * To)
        m.submodules.input = reader = InputReader(L, aw, self.row_words, self.buffer_words,
                                                  self.max_table_channels, B, cmd_layout)
        m.submodules.shortcut = shortcut = ShortcutReader(L, aw, self.psum_words,
                                                          self.buffer_words, cmd_layout)
        m.submodules.weight_stream = streamer = WeightStream(cfg, aw, cmd_layout)
        m.submodules.replay = replay = WeightReplay(cfg, self.weight_words)
        m.submodules.datapath = dp = ResetInserter(flush)(ConvDatapath(cfg))
        m.submodules.accumulator = acc = Accumulator(To, self.psum_words, cb_max)
        m.submodules.result_fifo = result_fifo = ResetInserter(flush)(
            SyncFIFO(width=8 * L, depth=RESULT_FIFO_DEPTH))
        m.submodules.post = chain = PostChain(
            L, B, psum_words=self.psum_words, pool_row_pixels=self.pool_row_pixels,
            max_blocks=self.max_channels // To)
        m.submodules.writer = writer = OutputWriter(L, B, aw, self.write_words,
                                                    self.buffer_words, cmd_layout)
        for unit in (buffers, reader, shortcut, streamer, replay, acc, chain, writer, router):
            m.d.comb += [unit.flush.eq(flush), unit.start.eq(start_compute)]
        for unit in (reader, shortcut, streamer, chain, writer, router):
            m.d.comb += unit.compute.eq(compute)
        for unit in (reader, shortcut, streamer, replay, chain, writer):
            m.d.comb += unit.instr.eq(instr)
        for unit in (reader, shortcut, streamer, writer):
            m.d.comb += unit.base.eq(base)

        # Input staging (sfnpu.hw.limits.stages_input): a frame-reuse convolution taken in
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
        out_local = instr.output.space != MemSpace.DRAM
        sc_local = instr.shortcut.space != MemSpace.DRAM
        is_add = instr.eltwise == Eltwise.ADD

        # Commands: the agents' in the arbiter's priority order (compute phase), the control
        # FSM's otherwise; local segments go to the buffers.
        wiring.connect(m, arbiter.cmd, dma.cmd)
        wiring.connect(m, writer.cmd, arbiter.write)
        wiring.connect(m, streamer.cmd, arbiter.weights)
        wiring.connect(m, shortcut.cmd, arbiter.shortcut)
        wiring.connect(m, reader.cmd, arbiter.input)
        wiring.connect(m, reader.local_cmd, buffers.input_cmd)
        wiring.connect(m, shortcut.local_cmd, buffers.shortcut_cmd)
        wiring.connect(m, writer.local_cmd, buffers.o_cmd)
        wiring.connect(m, writer.local_data, buffers.o_data)
        wiring.connect(m, writer.bus, dma.write_data)
        wiring.connect(m, reader.stage_write, buffers.stage)
        pf_req = Signal()
        pf_addr = Signal(aw)
        pf_len = Signal(24)
        grant_prefetch = arbiter.prefetch.valid & arbiter.prefetch.ready
        m.d.comb += [
            arbiter.compute.eq(compute),
            arbiter.control.valid.eq(fsm_cmd_valid), arbiter.control.payload.eq(fsm_cmd),
            arbiter.prefetch.valid.eq(pf_req), arbiter.prefetch.payload.address.eq(pf_addr),
            arbiter.prefetch.payload.length.eq(pf_len),
            arbiter.prefetch.payload.direction.eq(Direction.READ),
            buffers.input_space.eq(in_space),
            buffers.shortcut_space.eq(instr.shortcut.space),
            buffers.o_space.eq(instr.output.space),
            buffers.stage_space.eq(stage_space),
        ]

        # Read data: the compute phase's to the agents, by tag; the FSM's otherwise.
        wiring.connect(m, dma.read_data, router.read)
        m.d.comb += [
            router.grant_input.eq(arbiter.input.valid & arbiter.input.ready),
            router.grant_weights.eq(arbiter.weights.valid & arbiter.weights.ready),
            router.grant_shortcut.eq(arbiter.shortcut.valid & arbiter.shortcut.ready),
            router.grant_prefetch.eq(grant_prefetch),
        ]
        wiring.connect(m, router.input, reader.dram_words)
        wiring.connect(m, buffers.input_data, reader.local_words)
        wiring.connect(m, router.shortcut, shortcut.dram_words)
        wiring.connect(m, buffers.shortcut_data, shortcut.local_words)
        wiring.connect(m, router.weights, streamer.words)

        # The convolution's input: the transformed one (zero point and type from the post
        # record; also the padding value) or the instruction's.
        x_signed, x_zp, conv_signed, conv_zp = code_types(instr, post, has_ct, identity)
        m.d.comb += [
            reader.local.eq(in_space != MemSpace.DRAM),
            reader.offset.eq(Mux(in_from_stage, 0, instr.input.offset)),
            reader.stage.eq(staged & (ob_base == 0)),
            reader.in_blocks.eq(in_blocks), reader.in_plane.eq(in_plane),
            reader.in_row_bytes.eq(in_row_bytes), reader.channel_table.eq(has_ct),
            shortcut.ob_base.eq(ob_base), shortcut.ob_count.eq(ob_count),
            shortcut.conv_h.eq(conv_h), shortcut.conv_w.eq(conv_w),
            shortcut.sc_plane.eq(sc_plane),
        ]
        wiring.connect(m, reader.o_stream, dp.i_stream)

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

        # Weights: replayed from the store, or streamed from DRAM.
        m.d.comb += [
            streamer.streaming.eq(streaming), streamer.steps.eq(steps),
            streamer.sets.eq(sets), streamer.conv_h.eq(conv_h),
            streamer.ib_count.eq(ib_count), streamer.out_blocks.eq(out_blocks),
            params.wzp_async_addr.eq(streamer.wzp_addr), streamer.wzp.eq(params.wzp_async),
            replay.streaming.eq(streaming), replay.identity.eq(identity),
            replay.steps.eq(steps), replay.ib_count.eq(ib_count),
            replay.ob_count.eq(ob_count), replay.ob_base.eq(ob_base), replay.conv_h.eq(conv_h),
            replay.chunk_base.eq(chunk_base), replay.held_base.eq(held_base),
            store.r_addr.eq(replay.r_addr), store.r_en.eq(replay.r_en),
            replay.r_data.eq(store.r_data),
            params.wzp_addr.eq(replay.wzp_addr), params.wzp_en.eq(replay.wzp_en),
            replay.wzp.eq(params.wzp),
        ]
        wiring.connect(m, streamer.o_stream, replay.streamed)
        wiring.connect(m, replay.o_stream, dp.w_stream)
        weights_base = replay.base

        # Accumulation over input-channel blocks, bias, requantisation.
        wiring.connect(m, dp.o_stream, acc.i_stream)
        m.d.comb += [
            acc.conv_w.eq(conv_w), acc.ib_count.eq(ib_count), acc.ob_count.eq(ob_count),
            acc.ob_base.eq(ob_base), acc.identity.eq(identity),
            acc.out_signed.eq(conv_signed), acc.zero_point.eq(conv_zp),
            params.rq_addr.eq(acc.param_addr),
            acc.bias.eq(params.bias), acc.mult.eq(params.mult),
            result_fifo.w_data.eq(acc.o_stream.payload),
            result_fifo.w_en.eq(acc.o_stream.valid),
        ]
        # Results in flight after the array takes a step: array, psum stage, requantiser.
        in_flight = results_in_flight(cfg)
        assert RESULT_FIFO_DEPTH > 2 * in_flight
        hold = Signal()
        m.d.comb += [hold.eq(result_fifo.level + in_flight >= RESULT_FIFO_DEPTH),
                     dp.hold.eq(hold)]

        # Post-processing (activation tables, ADD or CHANNEL_SCALE with the shortcut stream,
        # clamp, pooling, upsampling, padding-lane mask) into the write buffer, and out.
        m.d.comb += [
            chain.post.eq(post),
            chain.conv_h.eq(conv_h), chain.conv_w.eq(conv_w),
            chain.ob_count.eq(ob_count), chain.ob_base.eq(ob_base),
            chain.conv_signed.eq(conv_signed), chain.conv_zp.eq(conv_zp),
            writer.ob_base.eq(ob_base), writer.ob_count.eq(ob_count),
            writer.out_block0.eq(out_block0),
            writer.out_plane.eq(out_plane), writer.out_row_bytes.eq(out_row_bytes),
        ]
        wiring.connect(m, result_fifo.r_stream, chain.i_stream)
        wiring.connect(m, shortcut.o_stream, chain.s_stream)
        wiring.connect(m, chain.o_stream, writer.i_stream)
        compute_done = writer.drained & ~dma.write_busy & ~dp.busy

        # -- parameter and weight loading (beats of the control FSM's reads) ------------------
        load_pos = Signal(24)          # byte offset of the beat within the loaded block
        loading_params = Signal()
        loading_weights = Signal()
        m.d.comb += [
            params.load.eq(loading_params & rd.valid), params.beat.eq(beat),
            params.pos.eq(load_pos),
            params.mult_off.eq(mult_off), params.wzp_off.eq(wzp_off),
            params.post_off.eq(post_off), params.act_off.eq(act_off), params.ct_off.eq(ct_off),
            params.channels.eq(param_cp),
            params.act_table.eq(instr.act == Activation.TABLE), params.channel_table.eq(has_ct),
            chain.table_write_addr.eq(params.act_write_addr), chain.table_write_data.eq(beat),
            chain.table_write_en.eq(params.act_write_en),
            reader.table_write_addr.eq(params.ct_write_addr),
            reader.table_write_data.eq(beat), reader.table_write_en.eq(params.ct_write_en),
            store.beat.eq(beat), store.load.eq(loading_weights), store.beat_valid.eq(rd.valid),
            store.beat_fire.eq(beat_fire), store.pos.eq(load_pos),
            store.depthwise.eq(depthwise), store.taps.eq(taps),
        ]
        # Read data outside compute: every store takes a beat per cycle (the activation
        # tables a bus word of entries into every lane's copy).
        with m.If(beat_fire & ~compute):
            m.d.sync += [load_pos.eq(load_pos + B), beat_index.eq(beat_index + 1)]

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
        m.d.comb += [store.pf_base.eq(pf_base), store.pf_pos.eq(pf_pos)]
        pf_error = Signal(ErrorCode)
        pf_beat = router.prefetch.valid
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
                    m.d.comb += store.pf_write.eq(1)
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
                with m.If(arbiter.control.ready):
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
                with m.If(arbiter.control.ready):
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
                m.d.sync += load_pos.eq(0)
                m.d.comb += store.restart.eq(1)
                with m.If(arbiter.control.ready):
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
                # Accept read data still due (the router takes every beat outside the compute
                # phase); write data of issued commands is in the buffer.
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
                                                  & reader.empty),
            stall[StallCause.WEIGHTS.value].eq(running & compute & replay.waiting),
            ctl.stall.eq(stall),
        ]
        return m
