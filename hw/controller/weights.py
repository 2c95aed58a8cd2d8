"""The weight store (the paper's buffer 1) with its loads, the per-row weight replay into the
double weight-block buffer, and streamed weights for layers that do not fit the store."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu import isa
from sfnpu.config import MAX_KERNEL, HwConfig

from ..conv_array import depthwise_taps, weight_step_layout
from ..dma import Direction
from ..fifo import BlockRamFIFO
from .common import fifo_room, log2, one_hot

__all__ = ["WeightStore", "WeightReplay", "WeightStream"]

_STEPS = range(MAX_KERNEL * MAX_KERNEL + 1)


def _identity_weights(to: int, ti: int) -> Const:
    """A depthwise weight step whose first tap is 1 for every channel (the rest 0)."""
    return Const(sum(1 << (8 * c) for c in range(to)), 8 * ti * to)


class WeightStore(wiring.Component):
    """Weight words (one step: ``Ti·To`` bytes), written from bus beats by the sequencer's
    load and by the prefetch, read by the replay.

    A load of a normal convolution writes its beats in order from word 0; a depthwise load
    rearranges the layout ``[C/L][kh][kw][L]`` into steps of ``G`` taps (step, slot, lane
    chunk). A prefetch writes the normal layout from word ``pf_base``.

    Parameters
    ----------
    config : HwConfig
    words : int
        Store words.

    Signature
    ---------
    beat : In(8 · bus bytes)
    restart : In(1)
        A load starts (the depthwise position returns to step 0).
    load, beat_valid, beat_fire : In(1)
        The sequencer's load is on; a beat is on the bus; it is taken.
    pos : In(24)
        Byte offset of the load's beat.
    depthwise : In(1), taps : In(range(MAX_KERNEL² + 1))
        The load's layout and its kernel taps.
    pf_write : In(1), pf_base : In(range(words + 1)), pf_pos : In(24)
        A prefetch beat, the prefetch's first word, the beat's byte offset.
    r_addr : In(range(words)), r_en : In(1), r_data : Out(8 · Ti · To)
        The read port (one cycle).
    """

    def __init__(self, config: HwConfig, words: int):
        self.config = config
        self.words = words
        B = config.dram_bus_bytes
        super().__init__({
            "beat": In(8 * B), "restart": In(1),
            "load": In(1), "beat_valid": In(1), "beat_fire": In(1), "pos": In(24),
            "depthwise": In(1), "taps": In(_STEPS),
            "pf_write": In(1), "pf_base": In(range(words + 1)), "pf_pos": In(24),
            "r_addr": In(range(words)), "r_en": In(1),
            "r_data": Out(8 * config.ti * config.to),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        B, Ti, To = cfg.dram_bus_bytes, cfg.ti, cfg.to
        G = depthwise_taps(cfg)
        beats_per_word = cfg.lanes // B
        m.submodules.mem = mem = Memory(shape=8 * Ti * To, depth=self.words, init=[])
        w = mem.write_port(granularity=8 * B)
        r = mem.read_port()
        m.d.comb += [r.addr.eq(self.r_addr), r.en.eq(self.r_en), self.r_data.eq(r.data),
                     w.data.eq(Cat(*([self.beat] * (Ti * To // B))))]

        def write_beat(first_word, pos):
            """The beat at byte ``pos`` of the normal layout loaded from word ``first_word``."""
            m.d.comb += [w.addr.eq(first_word + (pos >> log2(Ti * To))),
                         w.en.eq(one_hot(pos[log2(B):log2(Ti * To)], Ti * To // B))]

        # Depthwise layout [C/L][kh][kw][L] → steps of G taps: (step, slot, lane chunk).
        dw_step = Signal(range(self.words + 1))
        dw_slot = Signal(range(G))
        dw_tap = Signal(range(MAX_KERNEL * MAX_KERNEL))
        dw_chunk = Signal(range(max(beats_per_word, 2)))
        with m.If(self.load & self.beat_valid):
            with m.If(self.depthwise):
                byte = Cat(Const(0, log2(B)), dw_chunk, dw_slot) if beats_per_word > 1 \
                    else Cat(Const(0, log2(B)), dw_slot)
                m.d.comb += [w.addr.eq(dw_step),
                             w.en.eq(one_hot(byte >> log2(B), Ti * To // B))]
            with m.Else():
                write_beat(0, self.pos)
        with m.If(self.load & self.beat_fire & self.depthwise):
            last_chunk = (dw_chunk == beats_per_word - 1) if beats_per_word > 1 else Const(1)
            with m.If(~last_chunk):
                m.d.sync += dw_chunk.eq(dw_chunk + 1)
            with m.Else():
                m.d.sync += dw_chunk.eq(0)
                with m.If(dw_tap + 1 == self.taps):         # the block's last tap
                    m.d.sync += [dw_tap.eq(0), dw_slot.eq(0), dw_step.eq(dw_step + 1)]
                with m.Else():
                    m.d.sync += dw_tap.eq(dw_tap + 1)
                    with m.If(dw_slot == G - 1):
                        m.d.sync += [dw_slot.eq(0), dw_step.eq(dw_step + 1)]
                    with m.Else():
                        m.d.sync += dw_slot.eq(dw_slot + 1)
        with m.If(self.restart):
            m.d.sync += [dw_step.eq(0), dw_slot.eq(0), dw_tap.eq(0), dw_chunk.eq(0)]
        with m.If(self.pf_write):
            write_beat(self.pf_base, self.pf_pos)
        return m


class WeightReplay(wiring.Component):
    """For every output row, the weight sets of all passes (``for ob: for ib``, ``P`` steps
    each) from the weight store into the datapath's double weight-block buffer, with the
    block's weight zero points; or, when the group streams its weights, the streamed steps.
    conv NONE runs as a 1×1 depthwise convolution with unit weights.

    Parameters
    ----------
    config : HwConfig
    words : int
        Weight-store words.

    Signature
    ---------
    flush, start : In(1)
    instr : In(InstructionLayout)
    streaming, identity : In(1)
        The weights are streamed; conv NONE.
    steps : In(range(MAX_KERNEL² + 1)), ib_count, ob_count, ob_base : In(16), conv_h : In(12)
        Steps per set; input blocks per output block; the chunk's output blocks; output rows.
    chunk_base, held_base : In(range(words + 1))
        Where the next double-buffered chunk / the held weights start in the store.
    base : Out(range(words + 1))
        Where the computing weights start (registered at ``start``).
    r_addr : Out(range(words)), r_en : Out(1), r_data : In(8 · Ti · To)
        The store's read port.
    wzp_addr : Out(17), wzp_en : Out(1), wzp : In(8 · To)
        The weight zero points' read port.
    streamed : In(stream.Signature(weight_step_layout))
        Streamed steps (:class:`WeightStream`).
    o_stream : Out(stream.Signature(weight_step_layout))
        To the datapath.
    waiting : Out(1)
        A step is due but not there.
    """

    def __init__(self, config: HwConfig, words: int):
        self.config = config
        self.words = words
        step = weight_step_layout(config)
        super().__init__({
            "flush": In(1), "start": In(1), "instr": In(isa.InstructionLayout),
            "streaming": In(1), "identity": In(1),
            "steps": In(_STEPS), "ib_count": In(16), "ob_count": In(16), "ob_base": In(16),
            "conv_h": In(12),
            "chunk_base": In(range(words + 1)), "held_base": In(range(words + 1)),
            "base": Out(range(words + 1)),
            "r_addr": Out(range(words)), "r_en": Out(1), "r_data": In(8 * config.ti * config.to),
            "wzp_addr": Out(17), "wzp_en": Out(1), "wzp": In(8 * config.to),
            "streamed": In(stream.Signature(step)),
            "o_stream": Out(stream.Signature(step)),
            "waiting": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        Ti, To = self.config.ti, self.config.to
        instr = self.instr
        w_addr = Signal(range(self.words + 1))
        w_step = Signal(_STEPS)
        w_ib = Signal(16)
        w_ob = Signal(16)
        w_row = Signal(12)
        w_active = Signal()
        w_out = self.o_stream
        w_valid = Signal()              # the store's read register holds a step
        w_advance = ~w_valid | w_out.ready
        w_fetch = w_active & w_advance
        weights_base = self.base
        m.d.comb += [
            self.r_addr.eq(w_addr), self.r_en.eq(w_advance),
            self.wzp_addr.eq(self.ob_base + w_ob), self.wzp_en.eq(w_advance),
            self.waiting.eq(~w_out.valid & w_active),
        ]
        with m.If(self.streaming):
            # Weights that do not fit the store come from DRAM, set by set.
            m.d.comb += [w_out.payload.eq(self.streamed.payload),
                         w_out.valid.eq(self.streamed.valid),
                         self.streamed.ready.eq(w_out.ready)]
        with m.Else():
            m.d.comb += [
                # conv NONE runs as a 1×1 depthwise convolution with unit weights.
                w_out.payload.weights.as_value().eq(Mux(self.identity,
                                                        _identity_weights(To, Ti),
                                                        self.r_data)),
                w_out.payload.zero_points.as_value().eq(Mux(self.identity, 0, self.wzp)),
                w_out.valid.eq(w_valid),
            ]
        with m.If(self.flush | self.start):
            # Held (or prefetched) weights stay where they were loaded; loads go to word 0.
            # A double-buffered chunk after the first is where the prefetch loaded it.
            replay_base = Mux(instr.double_buffer & (self.ob_base != 0), self.chunk_base,
                              Mux(instr.weights_held, self.held_base, 0))
            m.d.sync += [weights_base.eq(replay_base),
                         w_addr.eq(replay_base), w_step.eq(0), w_ib.eq(0), w_ob.eq(0),
                         w_row.eq(0),
                         w_active.eq(self.start & ~self.streaming), w_valid.eq(0)]
        with m.Else():
            with m.If(w_advance):
                m.d.sync += w_valid.eq(w_fetch)
            with m.If(w_fetch):
                with m.If(w_step + 1 < self.steps):
                    m.d.sync += [w_step.eq(w_step + 1), w_addr.eq(w_addr + 1)]
                with m.Else():
                    m.d.sync += [w_step.eq(0), w_addr.eq(w_addr + 1)]
                    with m.If(w_ib + 1 < self.ib_count):
                        m.d.sync += w_ib.eq(w_ib + 1)
                    with m.Else():
                        m.d.sync += w_ib.eq(0)
                        with m.If(w_ob + 1 < self.ob_count):
                            m.d.sync += w_ob.eq(w_ob + 1)
                        with m.Else():
                            m.d.sync += [w_ob.eq(0), w_addr.eq(weights_base),
                                         w_row.eq(w_row + 1)]
                            with m.If(w_row + 1 == self.conv_h):
                                m.d.sync += w_active.eq(0)
        return m


class WeightStream(wiring.Component):
    """Streamed weights (a normal convolution whose weights exceed the store): for every
    output row, every set (``P`` steps of ``Ti·To`` bytes, contiguous in the layout) is read
    from DRAM into the weight FIFO, its command issued once the FIFO has room for all of it
    (weights then cross the bus once per output row; frame reuse is the remedy).

    Parameters
    ----------
    config : HwConfig
    addr_width : int
    cmd_layout : Layout

    Signature
    ---------
    flush, start, compute, streaming : In(1)
    instr : In(InstructionLayout), base : In(addr_width)
    steps : In(range(MAX_KERNEL² + 1)), sets : In(32), conv_h : In(12)
        Steps per set, sets per output row, output rows.
    ib_count, out_blocks : In(16)
        Input blocks per output block; output blocks (the zero points' block of a step).
    cmd : Out(stream.Signature(cmd_layout))
        One DMA read per set.
    words : In(stream.Signature(8 · Ti · To, always_ready=True))
        The sets' steps from the DMA.
    wzp_addr : Out(16), wzp : In(8 · To)
        Weight zero points of the step at the FIFO's head: ``wzp_addr`` is the head's block
        in the next cycle, ``wzp`` its zero points read a cycle later (block RAM, transparent
        for the zero points' loads).
    o_stream : Out(stream.Signature(weight_step_layout))
        Steps with their zero points.
    """

    def __init__(self, config: HwConfig, addr_width: int, cmd_layout):
        self.config = config
        super().__init__({
            "flush": In(1), "start": In(1), "compute": In(1), "streaming": In(1),
            "instr": In(isa.InstructionLayout), "base": In(addr_width),
            "steps": In(_STEPS), "sets": In(32), "conv_h": In(12),
            "ib_count": In(16), "out_blocks": In(16),
            "cmd": Out(stream.Signature(cmd_layout)),
            "words": In(stream.Signature(8 * config.ti * config.to, always_ready=True)),
            "wzp_addr": Out(16), "wzp": In(8 * config.to),
            "o_stream": Out(stream.Signature(weight_step_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        Ti, To = self.config.ti, self.config.to
        instr, steps = self.instr, self.steps
        set_steps = MAX_KERNEL * MAX_KERNEL
        m.submodules.fifo = fifo = ResetInserter(self.flush)(
            BlockRamFIFO(width=8 * Ti * To, depth=2 * set_steps))
        aw = len(self.base)
        ws_set = Signal(32)             # sets commanded in this output row
        ws_row = Signal(12)
        ws_addr = Signal(aw)
        ws_done = Signal()
        ws_set_bytes = Signal(24)
        m.d.comb += ws_set_bytes.eq(steps << log2(Ti * To))
        cmd = self.cmd
        granted_steps = Signal.like(steps)
        room = fifo_room(m, fifo, steps, granted_steps, flush=self.flush, start=self.start,
                         name="ws")
        m.d.comb += [
            cmd.valid.eq(self.compute & self.streaming & ~ws_done & room),
            cmd.payload.address.eq(ws_addr), cmd.payload.length.eq(ws_set_bytes),
            cmd.payload.direction.eq(Direction.READ),
        ]
        grant = cmd.valid & cmd.ready
        push = self.words.valid
        with m.If(self.start):
            m.d.sync += [ws_set.eq(0), ws_row.eq(0), ws_done.eq(~self.streaming),
                         ws_addr.eq(self.base + instr.weights.offset)]
        with m.Elif(grant):
            with m.If(ws_set + 1 < self.sets):
                m.d.sync += [ws_set.eq(ws_set + 1), ws_addr.eq(ws_addr + ws_set_bytes)]
            with m.Else():
                m.d.sync += [ws_set.eq(0), ws_row.eq(ws_row + 1),
                             ws_addr.eq(self.base + instr.weights.offset)]
                with m.If(ws_row + 1 == self.conv_h):
                    m.d.sync += ws_done.eq(1)
        m.d.comb += [granted_steps.eq(Mux(grant, steps, 0)),
                     fifo.w_data.eq(self.words.payload), fifo.w_en.eq(push)]

        # The block of the step at the FIFO's head, for its weight zero points.
        out = self.o_stream
        wh_step = Signal(range(set_steps + 1))
        wh_ib = Signal(16)
        wh_ob = Signal(16)
        next_ob = Signal.like(wh_ob)    # the head's block in the next cycle
        m.d.comb += [
            self.wzp_addr.eq(next_ob),
            out.payload.weights.as_value().eq(fifo.r_data),
            out.payload.zero_points.as_value().eq(self.wzp),
            out.valid.eq(fifo.r_rdy), fifo.r_en.eq(out.ready),
        ]
        pop = fifo.r_en & fifo.r_rdy
        last_step, last_ib = wh_step + 1 >= steps, wh_ib + 1 >= self.ib_count
        with m.If(self.flush | self.start):
            m.d.comb += next_ob.eq(0)
        with m.Elif(pop & last_step & last_ib):
            m.d.comb += next_ob.eq(Mux(wh_ob + 1 < self.out_blocks, wh_ob + 1, 0))
        with m.Else():
            m.d.comb += next_ob.eq(wh_ob)
        m.d.sync += wh_ob.eq(next_ob)
        with m.If(self.flush | self.start):
            m.d.sync += [wh_step.eq(0), wh_ib.eq(0)]
        with m.Elif(pop):
            m.d.sync += wh_step.eq(Mux(last_step, 0, wh_step + 1))
            with m.If(last_step):
                m.d.sync += wh_ib.eq(Mux(last_ib, 0, wh_ib + 1))
        return m
