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
  (ADD) or the other factor (MUL), or reads the scale vector once (CHANNEL_SCALE);
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
chain (activation tables before or after the element-wise stage, ADD, CHANNEL_SCALE and MUL
with the shortcut stream, CLAMP, MAX/AVG/GLOBAL_AVG pooling, 2× upsampling); output-channel offsets
that are multiples of ``L``; feature-map operands (input, output, shortcut) in DRAM or in one
of the three on-chip buffers {0, 1, 2} (a read port, which the input and shortcut readers
share, and a write port each; word = one pixel of one channel block), so the memory
optimizer's frame-mode placements run as allocated.
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
``ILLEGAL_FIELD``; a windowed group in frame reuse or with a feature-map operand on chip →
``UNSUPPORTED``; a layer whose rows, parameters, partial sums, pooled rows or depthwise
weights exceed the on-chip stores → ``BUFFER_OVERFLOW``.
Windowed groups (``windowed``): the input, output and shortcut are windows of larger DRAM
tensors, a column strip of a wide layer read and written in place; the sequencer takes their
row and channel-block pitches from the window record at the parameter block's end as it
loads, where other groups' are the dense ones it derives in DECODE/DECODE2.

Stall counters (:class:`~sfnpu.regmap.StallCause`): CONTROL in every running cycle outside
the compute phase; DRAM_WRITE while ``hold`` is set; DRAM_READ while the row buffer waits for
an input word and the input FIFO is empty; WEIGHTS while a window step waits for its weights.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Module, Mux, ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from sfnpu.config import HwConfig
from sfnpu.isa import Activation, Eltwise, MemSpace
from sfnpu.limits import StoreSizes, rtl_problems
from sfnpu.regmap import StallCause

from ..axi import Axi4Signature
from ..csr import ControlSignature
from ..datapath import ConvDatapath
from ..dma import DmaEngine
from ..pipeline import stage
from .accumulator import Accumulator
from .arbiter import CommandArbiter
from .buffers import FeatureBuffers
from .common import code_types, result_fifo_depth, results_in_flight
from .params import ParamStore
from .post import PostChain
from .prefetch import WeightPrefetch
from .readers import InputReader, ShortcutReader
from .router import ReadRouter
from .sequencer import Sequencer
from .weights import WeightReplay, WeightStore, WeightStream
from .writer import OutputWriter

__all__ = ["GroupController"]


class GroupController(wiring.Component):
    """The DMA engine, the sequencer and the compute path's components, wired.

    Components (each in its module of this package): :class:`~.sequencer.Sequencer` (header,
    fetch, decode, loads, phases, errors), :class:`~.params.ParamStore`,
    :class:`~.weights.WeightStore`, :class:`~.weights.WeightReplay`,
    :class:`~.weights.WeightStream`, :class:`~.prefetch.WeightPrefetch`,
    :class:`~.buffers.FeatureBuffers`, :class:`~.readers.InputReader`,
    :class:`~.readers.ShortcutReader`, :class:`~.router.ReadRouter`,
    :class:`~.arbiter.CommandArbiter`, the datapath, :class:`~.accumulator.Accumulator`, the
    result FIFO, :class:`~.post.PostChain` and :class:`~.writer.OutputWriter`.

    Parameters
    ----------
    config : HwConfig
        ``ti == to == lanes`` (the datapath's requirement), a bus width that divides
        ``lanes``.
    addr_width : int
        Bus address bits.

    Every store is sized by :class:`~sfnpu.limits.StoreSizes`, whose :func:`overflows`
    states the sequencer's ``BUFFER_OVERFLOW`` checks for the compiler.

    Signature
    ---------
    control : In(ControlSignature(config.dram_bus_bytes))
        From the CSR block: start, abort, image base, DMA window; back: events and counters.
    bus : Out(Axi4Signature(addr_width, config.dram_bus_bits))
        The DMA's AXI4 master port.
    """

    def __init__(self, config: HwConfig, *, addr_width: int = 32):
        if problems := rtl_problems(config):
            raise ValueError(f"config {config.name!r}: {'; '.join(problems)}")
        B = config.dram_bus_bytes
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
        cfg, aw = self.config, self.addr_width
        B, L, To, Ti = cfg.dram_bus_bytes, cfg.lanes, cfg.to, cfg.ti
        m.submodules.dma = dma = DmaEngine(cfg, addr_width=aw, length_bits=24)
        cmd_layout = dma.cmd.payload.shape()
        cb_max = self.max_channels // To
        m.submodules.sequencer = seq = Sequencer(cfg, aw, cmd_layout)
        m.submodules.params = params = ParamStore(To, B, cb_max)
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
        m.submodules.prefetch = prefetch = WeightPrefetch(cfg, aw, self.weight_words,
                                                          cmd_layout)
        m.submodules.datapath = dp = ResetInserter(seq.flush)(ConvDatapath(cfg))
        m.submodules.accumulator = acc = Accumulator(To, self.psum_words, cb_max)
        m.submodules.result_fifo = result_fifo = ResetInserter(seq.flush)(
            SyncFIFO(width=8 * L, depth=result_fifo_depth(cfg)))
        m.submodules.post = chain = PostChain(
            L, B, psum_words=self.psum_words, pool_row_pixels=self.pool_row_pixels,
            max_blocks=cb_max)
        m.submodules.writer = writer = OutputWriter(L, B, aw, self.write_words,
                                                    self.buffer_words, cmd_layout)
        units = SimpleNamespace(
            dma=dma, seq=seq, params=params, store=store, buffers=buffers, arbiter=arbiter,
            router=router, reader=reader, shortcut=shortcut, streamer=streamer, replay=replay,
            prefetch=prefetch, dp=dp, acc=acc, result_fifo=result_fifo, chain=chain,
            writer=writer)
        self._control(m, units)
        self._commands(m, units)
        self._phase(m, units)
        self._operands(m, units)
        self._weights(m, units)
        self._results(m, units)
        self._loads(m, units)
        return m

    def _control(self, m, u):
        """The CSR block's control interface: run, events, errors, counters, stall causes."""
        ctl, dma, seq = self.control, u.dma, u.seq
        wiring.connect(m, dma.bus, wiring.flipped(self.bus))
        m.d.comb += [
            dma.window_base.eq(ctl.window_base),
            dma.window_limit.eq(ctl.window_limit),
            dma.watchdog.eq(ctl.watchdog),
            ctl.read_bytes.eq(dma.read_bytes),
            ctl.write_bytes.eq(dma.write_bytes),
            dma.clear.eq(ctl.start),
            seq.start.eq(ctl.start), seq.soft_reset.eq(ctl.soft_reset),
            seq.image_base.eq(ctl.image_base),
            ctl.done.eq(seq.done), ctl.group_done.eq(seq.group_done),
            ctl.error.eq(seq.error), ctl.error_code.eq(seq.error_code),
            ctl.error_addr.eq(seq.error_addr), ctl.error_group.eq(seq.pc),
            ctl.idle.eq(dma.idle & seq.idle),
            seq.dma_error.eq(dma.error), seq.dma_error_code.eq(dma.error_code),
            seq.dma_error_addr.eq(dma.error_addr), seq.dma_idle.eq(dma.idle),
            seq.compute_done.eq(u.writer.drained & ~dma.write_busy & ~u.dp.busy),
        ]
        # Stall counters: CONTROL in every running cycle outside the compute phase;
        # DRAM_WRITE while the datapath holds; DRAM_READ while the row buffer waits for an
        # input word and the input FIFO is empty; WEIGHTS while a step waits for its weights.
        stall = Signal(len(StallCause))
        running, compute = ctl.running, seq.compute
        m.d.comb += [
            stall[StallCause.CONTROL.value].eq(running & ~compute),
            stall[StallCause.DRAM_WRITE.value].eq(running & compute & u.dp.hold),
            stall[StallCause.DRAM_READ.value].eq(running & compute & u.dp.i_stream.ready
                                                  & u.reader.empty),
            stall[StallCause.WEIGHTS.value].eq(running & compute & u.replay.waiting),
            ctl.stall.eq(stall),
        ]

    def _commands(self, m, u):
        """DMA commands: the agents' in the arbiter's priority order in the compute phase, the
        sequencer's otherwise; local segments to the buffers; DMA read data to the agents
        whose commands they answer, by tag."""
        arbiter, router, buffers, dma = u.arbiter, u.router, u.buffers, u.dma
        wiring.connect(m, arbiter.cmd, dma.cmd)
        m.d.comb += [arbiter.takes_read.eq(dma.takes_read),
                     arbiter.takes_write.eq(dma.takes_write)]
        wiring.connect(m, u.seq.cmd, arbiter.control)
        wiring.connect(m, u.writer.cmd, arbiter.write)
        wiring.connect(m, u.streamer.cmd, arbiter.weights)
        wiring.connect(m, u.shortcut.cmd, arbiter.shortcut)
        wiring.connect(m, u.reader.cmd, arbiter.input)
        wiring.connect(m, u.prefetch.cmd, arbiter.prefetch)
        wiring.connect(m, u.reader.local_cmd, buffers.input_cmd)
        wiring.connect(m, u.shortcut.local_cmd, buffers.shortcut_cmd)
        wiring.connect(m, u.writer.local_cmd, buffers.o_cmd)
        wiring.connect(m, u.writer.local_data, buffers.o_data)
        wiring.connect(m, u.writer.bus, dma.write_data)
        wiring.connect(m, u.reader.stage_write, buffers.stage)
        wiring.connect(m, dma.read_data, router.read)

        def granted(port):
            return port.valid & port.ready
        m.d.comb += [
            arbiter.compute.eq(u.seq.compute),
            router.grant_input.eq(granted(arbiter.input)),
            router.grant_weights.eq(granted(arbiter.weights)),
            router.grant_shortcut.eq(granted(arbiter.shortcut)),
            router.grant_prefetch.eq(granted(arbiter.prefetch)),
        ]
        wiring.connect(m, router.input, u.reader.dram_words)
        wiring.connect(m, buffers.input_data, u.reader.local_words)
        wiring.connect(m, router.shortcut, u.shortcut.dram_words)
        wiring.connect(m, buffers.shortcut_data, u.shortcut.local_words)
        wiring.connect(m, router.weights, u.streamer.words)
        wiring.connect(m, router.prefetch, u.prefetch.beats)

    def _phase(self, m, u):
        """The sequencer's phase, instruction and group parameters to every agent."""
        seq = u.seq
        for unit in (u.buffers, u.reader, u.shortcut, u.streamer, u.replay, u.acc, u.chain,
                     u.writer, u.router, u.prefetch):
            m.d.comb += [unit.flush.eq(seq.flush), unit.start.eq(seq.start_compute)]
        for unit in (u.reader, u.shortcut, u.streamer, u.chain, u.writer, u.router):
            m.d.comb += unit.compute.eq(seq.compute)
        for unit in (u.reader, u.shortcut, u.streamer, u.replay, u.chain, u.writer,
                     u.prefetch):
            m.d.comb += unit.instr.eq(seq.instr)
        for unit in (u.reader, u.shortcut, u.streamer, u.writer, u.prefetch):
            m.d.comb += unit.base.eq(seq.base)
        g = seq.group
        for unit, names in (
                (u.shortcut, ("sc_chunk", "ob_count", "conv_h", "conv_w", "sc_plane",
                              "sc_row_bytes")),
                (u.streamer, ("streaming", "steps", "sets", "conv_h", "ib_count",
                              "out_blocks")),
                (u.replay, ("streaming", "identity", "steps", "ib_count", "ob_count",
                            "ob_base", "conv_h")),
                (u.prefetch, ("ob_base", "ob_count", "out_blocks", "identity", "streaming")),
                (u.acc, ("conv_w", "ib_count", "ob_count", "ob_base", "identity")),
                (u.chain, ("conv_h", "conv_w", "ob_count", "ob_base")),
                (u.writer, ("ob_base", "ob_count", "out_block0", "out_plane",
                            "out_row_bytes")),
                (u.reader, ("in_blocks", "in_plane", "in_row_bytes"))):
            m.d.comb += [getattr(unit, name).eq(getattr(g, name)) for name in names]

    def _operands(self, m, u):
        """Where the input, shortcut and output are: DRAM, an on-chip buffer or, for the
        later chunks of a staged group, the staging buffer."""
        seq, buffers = u.seq, u.buffers
        instr, g = seq.instr, seq.group
        # Input staging (sfnpu.limits.stages_input): a frame-reuse convolution taken in
        # several output-channel chunks copies its DRAM input into the staging buffer (offset
        # 0 of the lowest buffer holding neither output nor shortcut) during the first chunk,
        # and the later chunks read it there: DRAM delivers the input once.
        # The input reader's operands take one gate after group and instruction registers:
        # its local flag gates the commands the arbiter grants.
        in_from_stage = g.from_stage

        def occupied(space):
            return ((instr.output.space == space)
                    | ((instr.shortcut.space == space) & (instr.eltwise != Eltwise.NONE)))
        # A register: the instruction is final several states before the compute phase.
        stage_space = Signal(MemSpace)
        m.d.sync += stage_space.eq(Mux(~occupied(MemSpace.BUF0), MemSpace.BUF0,
                                       Mux(~occupied(MemSpace.BUF1), MemSpace.BUF1,
                                           MemSpace.BUF2)))
        in_space = Mux(in_from_stage, stage_space, instr.input.space)
        m.d.comb += [
            buffers.input_space.eq(in_space),
            buffers.shortcut_space.eq(instr.shortcut.space),
            buffers.o_space.eq(instr.output.space),
            buffers.stage_space.eq(stage_space),
            u.reader.local.eq(in_from_stage | (instr.input.space != MemSpace.DRAM)),
            u.reader.offset.eq(Mux(in_from_stage, 0, instr.input.offset)),
            u.reader.stage.eq(g.staged & ~in_from_stage),
            u.reader.channel_table.eq(g.has_ct),
        ]

    def _weights(self, m, u):
        """Weights: loaded or prefetched into the store, replayed from it or streamed."""
        seq, store, replay, params, prefetch = u.seq, u.store, u.replay, u.params, u.prefetch
        m.d.comb += [
            params.wzp_stream_addr.eq(u.streamer.wzp_addr),
            u.streamer.wzp.eq(params.wzp_stream),
            replay.chunk_base.eq(prefetch.chunk_base), replay.held_base.eq(seq.held_base),
            store.r_addr.eq(replay.r_addr), store.r_en.eq(replay.r_en),
            replay.r_data.eq(store.r_data),
            params.wzp_addr.eq(replay.wzp_addr), params.wzp_en.eq(replay.wzp_en),
            replay.wzp.eq(params.wzp),
            prefetch.fetch_addr.eq(seq.fetch_addr),
            prefetch.load_words.eq(seq.load_words), prefetch.next_src.eq(seq.next_src),
            prefetch.next_words.eq(seq.next_words),
            prefetch.weights_base.eq(replay.base),
            store.pf_write.eq(prefetch.pf_write), store.pf_base.eq(prefetch.pf_base),
            store.pf_pos.eq(prefetch.pf_pos),
            seq.pf_loaded.eq(prefetch.loaded), seq.pf_offset.eq(prefetch.held_offset),
            seq.pf_base.eq(prefetch.pf_base), seq.pf_busy.eq(prefetch.busy),
            seq.pf_failed.eq(prefetch.failed), seq.pf_error.eq(prefetch.error),
        ]
        wiring.connect(m, u.streamer.o_stream, replay.streamed)
        wiring.connect(m, replay.o_stream, u.dp.w_stream)

    def _results(self, m, u):
        """Input → datapath → accumulator → result FIFO → post chain → writer."""
        seq, dp, acc, chain, params = u.seq, u.dp, u.acc, u.chain, u.params
        instr, g = seq.instr, seq.group
        # The convolution's input: the transformed one (zero point and type from the post
        # record; also the padding value) or the instruction's.
        x_signed, x_zp, conv_signed, conv_zp = code_types(instr, params.post, g.has_ct,
                                                          g.identity)
        wiring.connect(m, u.reader.o_stream, dp.i_stream)
        prm = dp.params
        # The row buffer's geometry from the instruction, through registers: the instruction
        # is fetched several cycles before the compute phase starts (its parameter block
        # loads in between), so they change no cycle, and they keep the instruction
        # register's fan-out off the row buffer's window logic.
        geometry = {name: stage(m, instr[name], f"rows_{name}")
                    for name in ("kh", "kw", "sh", "sw", "pad_top", "pad_left", "in_h", "in_w")}
        m.d.comb += [
            prm.depthwise.eq(g.depthwise),
            *(getattr(prm, name).eq(value) for name, value in geometry.items()),
            prm.out_h.eq(g.conv_h), prm.out_w.eq(g.conv_w),
            prm.blocks.eq(g.in_blocks),
            prm.repeats.eq(Mux(g.depthwise, 1, g.ob_count)),
            prm.row_words.eq(g.row_words),
            prm.places.eq(g.places),
            prm.zero_point.eq(x_zp[:8]),
            dp.x_signed.eq(x_signed),
            dp.uses.eq(g.conv_w),
            dp.start.eq(seq.start_compute),
            acc.out_signed.eq(conv_signed), acc.zero_point.eq(conv_zp),
            acc.psum_keep.eq(instr.psum_keep), acc.psum_hold.eq(instr.psum_hold),
            params.rq_addr.eq(acc.param_addr),
            acc.bias.eq(params.bias), acc.mult.eq(params.mult),
            chain.post.eq(params.post),
            chain.conv_signed.eq(conv_signed), chain.conv_zp.eq(conv_zp),
        ]
        wiring.connect(m, dp.o_stream, acc.i_stream)
        result_fifo = u.result_fifo
        m.d.comb += [result_fifo.w_data.eq(acc.o_stream.payload),
                     result_fifo.w_en.eq(acc.o_stream.valid)]
        # The datapath stops taking steps while the result FIFO lacks room for every result
        # still in flight (array, partial-sum stage, requantiser): the array's output never
        # overflows it. ``hold`` is a register holding the test on the FIFO's next level: it
        # enables most of the row buffer's registers, so its fan-out starts at a flip-flop.
        # The read (the post chain's ready, a long path) picks one of two comparisons made
        # without it.
        threshold = result_fifo_depth(self.config) - results_in_flight(self.config)
        written = result_fifo.level + (result_fifo.w_en & result_fifo.w_rdy)
        read = result_fifo.r_stream.valid & result_fifo.r_stream.ready
        hold = Signal()
        m.d.sync += hold.eq(Mux(read, written >= threshold + 1, written >= threshold))
        with m.If(u.seq.flush):
            m.d.sync += hold.eq(0)
        m.d.comb += dp.hold.eq(hold)
        wiring.connect(m, result_fifo.r_stream, chain.i_stream)
        wiring.connect(m, u.shortcut.o_stream, chain.s_stream)
        wiring.connect(m, chain.o_stream, u.writer.i_stream)

    def _loads(self, m, u):
        """The sequencer's parameter and weight loads: every store takes a bus beat per
        cycle (the activation tables a bus word of entries into every lane's copy)."""
        seq, params, store, rd = u.seq, u.params, u.store, u.dma.read_data
        instr, g = seq.instr, seq.group
        beat = rd.payload.data
        m.d.comb += [
            seq.beat.eq(rd.payload), seq.beat_valid.eq(rd.valid),
            seq.beat_fire.eq(rd.valid & rd.ready),
            params.load.eq(seq.loading_params & rd.valid), params.beat.eq(beat),
            params.pos.eq(seq.load_pos),
            params.mult_off.eq(g.mult_off), params.wzp_off.eq(g.wzp_off),
            params.post_off.eq(g.post_off), params.act_off.eq(g.act_off),
            params.ct_off.eq(g.ct_off), params.channels.eq(g.param_cp),
            params.act_table.eq(instr.act == Activation.TABLE),
            params.channel_table.eq(g.has_ct),
            u.chain.table_write_addr.eq(params.act_write_addr),
            u.chain.table_write_data.eq(beat), u.chain.table_write_en.eq(params.act_write_en),
            u.reader.table_write_addr.eq(params.ct_write_addr),
            u.reader.table_write_data.eq(beat), u.reader.table_write_en.eq(params.ct_write_en),
            store.beat.eq(beat), store.load.eq(seq.loading_weights),
            store.beat_valid.eq(rd.valid), store.beat_fire.eq(rd.valid & rd.ready),
            store.pos.eq(seq.load_pos), store.restart.eq(seq.weight_restart),
            store.depthwise.eq(g.depthwise), store.taps.eq(g.taps),
        ]
