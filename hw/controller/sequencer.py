"""Sequencer: the image header, the instruction fetch and decode, the group's loads and its
compute phase; the run's errors."""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu import image, isa, layout
from sfnpu.config import MAX_KERNEL, ROW_BUFFER_ROWS, HwConfig
from sfnpu.isa import (Activation, ConvKind, Eltwise, InputTransform, MemSpace, Opcode, Pool,
                       Reuse, eltwise_reads_map)
from sfnpu.limits import StoreSizes
from sfnpu.regmap import ErrorCode

from ..conv_array import depthwise_taps
from ..dma import Direction
from .common import (INSTRUCTION_BYTES, aligned_instruction, fetch_beats, instruction_shift,
                     log2, param_aligned, next_chunk, shifted_in, split_product)

__all__ = ["Sequencer", "group_layout"]

_HEADER_WORD = {name: image.field_offset(image.HEADER_FIELDS, name) // 4
                for name in ("magic", "version", "fingerprint", "section_count")}
_SECTION_WORDS = image.SECTION.size // 4
_SECTION_KIND_WORD = image.field_offset(image.SECTION_FIELDS, "kind") // 4
_SECTION_OFFSET_WORD = image.field_offset(image.SECTION_FIELDS, "offset") // 4
_STEPS = range(MAX_KERNEL * MAX_KERNEL + 1)
#: The group register each field of a window record (layout.WINDOW_RECORD) goes to.
_WINDOW_FIELDS = {"in_row": "in_row_bytes", "in_plane": "in_plane", "out_row": "out_row_bytes",
                  "out_plane": "out_plane", "sc_row": "sc_row_bytes", "sc_plane": "sc_plane"}
assert set(_WINDOW_FIELDS) == set(layout.WINDOW_RECORD.names)
_PITCH = 8 * layout.WINDOW_RECORD["in_row"].itemsize     # bits of a pitch: a record's field


def group_layout(sizes: StoreSizes) -> data.StructLayout:
    """The group's parameters derived from its instruction (registered in the decode states)
    and its current chunk of output-channel blocks."""
    return data.StructLayout({
        "depthwise": 1,
        "identity": 1,          # conv NONE
        "has_ct": 1,            # input transform: per-channel tables
        "streaming": 1,         # weights streamed from DRAM for every output row
        "staged": 1,            # the input is copied to the staging buffer (first chunk)
        # A later chunk of a staged group: the input comes from the staging buffer (set with
        # ob_base, so the operands need no test of ob_base in front of the input reader).
        "from_stage": 1,
        "in_blocks": 16,        # ⌈in_c / L⌉
        "out_blocks": 16,       # ⌈out_c / To⌉
        "ib_count": 16,         # input-channel blocks per output block (1: depthwise)
        "conv_h": 12,
        "conv_w": 12,
        "steps": _STEPS,        # P
        "taps": _STEPS,         # kh·kw
        "block_words": 22,      # one output block's weights: ib_count·steps
        "sets": 32,             # weight sets per output row: OB·IB (normal), CB
        "row_words": 32,        # in_blocks·in_w
        "places": range(sizes.row_words + 1),
        # Operand pitches in bytes (one channel block, one row): dense from the instruction,
        # a windowed group's from its window record, as wide as the record's words.
        "in_plane": _PITCH,
        "out_plane": _PITCH,
        "sc_plane": _PITCH,     # of the shortcut operand (CHANNEL_SCALE: a word)
        "in_row_bytes": _PITCH,
        "out_row_bytes": _PITCH,
        "sc_row_bytes": _PITCH,
        "mult_off": 24,         # parameter sections' byte offsets
        "wzp_off": 24,
        "post_off": 24,
        "act_off": 24,
        "ct_off": 24,
        "param_cp": 17,         # channels of the bias/multiplier/zero-point sections
        "out_block0": 16,       # the destination's first channel block
        "ob_base": 16,          # output-channel blocks of the current weight chunk
        "ob_count": 16,
        # The chunk's first block's byte offset in the shortcut operand (ob_base · sc_plane),
        # set with ob_base from a product formed beforehand: no multiplier behind the start
        # of a compute phase, where the shortcut reader takes its first address.
        "sc_chunk": 32,
        "chunk_obs": 16,        # blocks whose weights fit the store together
    })


class Sequencer(wiring.Component):
    """The controller's state machine.

    Run: read the image header at ``image_base`` (a multiple of
    :data:`~sfnpu.image.SECTION_ALIGN`) and check magic, format version and hardware
    fingerprint; read the section table and take the INSTRUCTIONS section's offset (any
    mismatch: IMAGE_MISMATCH). Per group: fetch the instruction, decode it (checks, derived
    parameters, ``places`` by restoring division, the frame-reuse chunk search), load the
    parameter block, load the weights unless they are held or streamed, then the compute
    phase (``start`` for one cycle, then ``compute`` until ``compute_done``), chunk by chunk.
    A DMA error or an abort ends the run from any running state; ERROR reports, DRAIN waits
    for the DMA, FLUSH resets the compute path (``flush``, a register).

    Parameters
    ----------
    config : HwConfig
    addr_width : int
    cmd_layout : Layout
        The DMA command.

    Signature
    ---------
    start, soft_reset : In(1), image_base : In(addr_width)
        From the CSR block.
    done, group_done, error : Out(1), error_code : Out(ErrorCode), error_addr : Out(64)
    pc : Out(32)
        The group's index.
    idle : Out(1)
        In the IDLE state.
    dma_error : In(1), dma_error_code : In(ErrorCode), dma_error_addr : In(64), dma_idle : In(1)
    cmd : Out(stream.Signature(cmd_layout))
        Reads of header, table, instructions, parameters and weights.
    beat : In(StructLayout({"data", "last"})), beat_valid, beat_fire : In(1)
        The DMA's read data outside the compute phase.
    instr : Out(InstructionLayout), group : Out(group_layout)
        The group's instruction and derived parameters (registers).
    base, fetch_addr : Out(addr_width)
        The image base; the instruction's address.
    flush, start_compute, compute : Out(1)
    compute_done : In(1)
        The output is written and the compute path idle.
    loading_params, loading_weights : Out(1), load_pos : Out(24), weight_restart : Out(1)
        The parameter block's / weights' beats are on the bus at byte ``load_pos``; a
        weight load starts.
    held_base : Out(range(weight words + 1))
        Where held (or prefetched) weights start in the store.
    load_words : Out(32)
        Weight words of the current chunk (of the whole weights when there is one chunk).
    next_src : Out(addr_width), next_words : Out(32)
        Registers, from the cycle after ``start_compute``: the DRAM address and weight words
        of the group's next chunk (frame reuse), for the prefetch.
    pf_loaded : In(1), pf_offset : In(30), pf_base : In(range(weight words + 1))
        The prefetch loaded the next group's weights.
    pf_busy, pf_failed : In(1), pf_error : In(ErrorCode)
    """

    def __init__(self, config: HwConfig, addr_width: int, cmd_layout):
        self.config = config
        self.sizes = sizes = StoreSizes.of(config)
        B = config.dram_bus_bytes
        ww = range(sizes.weight_words + 1)
        super().__init__({
            "start": In(1), "soft_reset": In(1), "image_base": In(addr_width),
            "done": Out(1), "group_done": Out(1), "error": Out(1),
            "error_code": Out(ErrorCode), "error_addr": Out(64), "pc": Out(32),
            "idle": Out(1),
            "dma_error": In(1), "dma_error_code": In(ErrorCode), "dma_error_addr": In(64),
            "dma_idle": In(1),
            "cmd": Out(stream.Signature(cmd_layout)),
            "beat": In(data.StructLayout({"data": 8 * B, "last": 1})),
            "beat_valid": In(1), "beat_fire": In(1),
            "instr": Out(isa.InstructionLayout), "group": Out(group_layout(sizes)),
            "base": Out(addr_width), "fetch_addr": Out(addr_width),
            "flush": Out(1), "start_compute": Out(1), "compute": Out(1),
            "compute_done": In(1),
            "loading_params": Out(1), "loading_weights": Out(1), "load_pos": Out(24),
            "weight_restart": Out(1),
            "held_base": Out(ww),
            "load_words": Out(32), "next_src": Out(addr_width), "next_words": Out(32),
            "pf_loaded": In(1), "pf_offset": In(30), "pf_base": In(ww),
            "pf_busy": In(1), "pf_failed": In(1), "pf_error": In(ErrorCode),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.config.dram_bus_bytes
        instr = self.instr
        r = SimpleNamespace(
            instr_offset=Signal(32), found=Signal(), section_count=Signal(32),
            beat_index=Signal(16), header_ok=Signal(), entry_is_instr=Signal(),
            table_word=Signal(3),                       # word of the entry at the beat's start
            fetch_buf=Signal(fetch_beats(B) * B * 8),
            error_code=Signal(ErrorCode), error_addr=Signal(64),
            weight_steps=Signal(32),                    # sets·P
            param_len=Signal(24),
            window_off=Signal(24),                      # the window record in the block
            chunk_steps=Signal(32),                     # weight steps of chunk_obs + 1 blocks
            # The chunk's weight load. Its words are kept by additions (the current chunk's,
            # a full chunk's, those after it): no product between the group's registers and
            # the DMA command.
            weight_src=Signal(len(self.base)),
            weight_len=Signal(24),
            chunk_words=Signal(32), load_words=self.load_words, rest_words=Signal(32),
            depthwise_bytes=Signal(24),                 # in_blocks·taps·L, every cycle
            kernel_places=Signal(range(MAX_KERNEL + 1)),  # places the kernel's rows need
            # What the weight store holds: the whole weights at this DRAM offset.
            held_valid=Signal(), held_offset=Signal(len(instr.weights.offset)),
            held_depthwise=Signal(),
            # The last group held its partial sums (psum_hold) for this one (psum_keep).
            psum_held=Signal(),
            # Restoring division places = ⌊row_words_max / row_words⌋.
            div_rem=Signal(range(2 * self.sizes.row_words + 1)),
            div_bit=Signal(range(self.quotient_bits(self.sizes) + 1)),
            # The store checks' products, registered every cycle and compared in DIVIDE's
            # last cycle: no multiplier between the instruction and the FSM's state.
            overflow=Signal(),                          # the capacity checks
            sc_area=Signal(24),                         # conv_h·conv_w
        )
        g = self.group
        # Products of DECODE's registers, registered every cycle (final from DIVIDE on):
        # unconditional, so synthesis shares no multiplier with DECODE's products (a shared
        # one takes its operands through a multiplexer on the state register).
        m.d.sync += [r.weight_steps.eq(g.sets * g.steps),
                     g.block_words.eq(g.ib_count * g.steps),
                     r.sc_area.eq(g.conv_h * g.conv_w)]
        # The operand extents: products of group registers in two register stages, formed
        # every cycle and read in DIVIDE's last cycle. DIVIDE lasts a cycle per quotient bit,
        # at least three, then that one: sc_plane, set in DIVIDE from sc_area, is final from
        # its second cycle, its extent from the fourth.
        assert self.sizes.row_words.bit_length() >= 3
        r.in_extent = split_product(m, g.in_blocks, g.in_plane, "in_extent")
        # (the output's block count, a sum, one register stage before: final from the third)
        out_block_end = Signal(len(g.out_blocks) + 1, name="out_block_end")
        m.d.sync += out_block_end.eq(g.out_block0 + g.out_blocks)
        r.out_extent = split_product(m, out_block_end, g.out_plane, "out_extent")
        r.sc_extent = split_product(m, g.out_blocks, g.sc_plane, "sc_extent")
        # Read data outside compute: a beat per cycle.
        with m.If(self.beat_fire & ~self.compute):
            m.d.sync += [self.load_pos.eq(self.load_pos + B), r.beat_index.eq(r.beat_index + 1)]
        # Products of registers set in DECODE, read from PARAM_CMD on: unconditional, so
        # synthesis shares no multiplier (and no input multiplexer) with other states.
        m.d.sync += r.depthwise_bytes.eq(g.in_blocks * g.taps * self.config.lanes)
        with m.If(self.pf_loaded):
            m.d.sync += [r.held_valid.eq(1), r.held_offset.eq(self.pf_offset),
                         r.held_depthwise.eq(0), self.held_base.eq(self.pf_base)]
        r.fetch_shift = instruction_shift(m, self.fetch_addr, B, "fetch_shift")
        # ``flush`` (high in FLUSH) resets most of the compute path: a register of its own, so
        # the reset net's long routes start at a flip-flop, not behind the DMA's idle logic.
        m.d.sync += self.flush.eq(0)
        with m.FSM() as fsm:
            self._image_states(m, r)
            self._decode_states(m, r)
            self._divide_states(m, r)
            self._group_states(m, r)
        m.d.comb += self.idle.eq(fsm.ongoing("IDLE"))
        return m

    # -- helpers ---------------------------------------------------------------------------

    #: States whose decode is a register (high exactly in the state), named by the port.
    _PHASES = {"start_compute": "COMPUTE_START", "compute": "COMPUTE"}

    #: One-cycle states between an instruction's fetch and DIVIDE: FETCH_ALIGN, DECODE and
    #: DECODE2.
    DECODE_STATES = 3

    @staticmethod
    def quotient_bits(sizes) -> int:
        """DIVIDE's quotient bits, a cycle each: places = ⌊row_words_max / row_words⌋."""
        return sizes.row_words.bit_length()

    @classmethod
    def decode_cycles(cls, sizes) -> int:
        """Cycles from the instruction's fetch to the state after DIVIDE (the cycle model's
        count): the decode states, a cycle per quotient bit and DIVIDE's last."""
        return cls.DECODE_STATES + cls.quotient_bits(sizes) + 1

    def _goto(self, m, state):
        """``m.next = state`` on a transition into or out of a phase state
        (:attr:`_PHASES`), whose ports are registers set here: no decode of the state
        register sits in front of the agents (``compute`` gates every request the arbiter
        sees). Every transition into or out of those states comes here, the guards' and
        failures' included."""
        m.next = state
        m.d.sync += [getattr(self, port).eq(state == phase)
                     for port, phase in self._PHASES.items()]

    def _fail(self, m, r, code):
        m.d.sync += r.error_code.eq(code)
        self._goto(m, "ERROR")

    def _read(self, m, address, length):
        m.d.comb += [self.cmd.valid.eq(1), self.cmd.payload.address.eq(address),
                     self.cmd.payload.length.eq(length),
                     self.cmd.payload.direction.eq(Direction.READ)]

    def _guard(self, m, r):
        """A DMA error or an abort ends the run from any running state."""
        with m.If(self.soft_reset):
            self._goto(m, "DRAIN")
        with m.Elif(self.dma_error):
            m.d.sync += [r.error_code.eq(self.dma_error_code),
                         r.error_addr.eq(self.dma_error_addr)]
            self._goto(m, "ERROR")

    def _transfer(self, m, r, name, address, length, after, *, on_cmd=None, on_beat=None,
                  loading=None):
        """States ``<name>_CMD`` (issue one read; ``on_cmd`` there) and ``<name>_DATA``
        (``loading`` set, ``on_beat`` for every beat), then ``after`` (a state, or a function
        that chooses it)."""
        with m.State(f"{name}_CMD"):
            self._read(m, address, length)
            if on_cmd is not None:
                on_cmd()
            with m.If(self.cmd.ready):
                m.next = f"{name}_DATA"
            self._guard(m, r)
        with m.State(f"{name}_DATA"):
            if loading is not None:
                m.d.comb += loading.eq(1)
            with m.If(self.beat_fire):
                if on_beat is not None:
                    on_beat()
                with m.If(self.beat.last):
                    if callable(after):
                        after()
                    else:
                        m.next = after
            self._guard(m, r)

    # -- header, section table, fetch ---------------------------------------------------------

    def _image_states(self, m, r):
        cfg = self.config
        B = cfg.dram_bus_bytes
        wpb = B // 4                                   # 32-bit words per bus beat
        beat = self.beat.data
        beat_words = [beat[32 * j:32 * (j + 1)] for j in range(wpb)]
        base, fetch_addr = self.base, self.fetch_addr
        expect = {
            _HEADER_WORD["magic"]: int.from_bytes(image.MAGIC[:4], "little"),
            _HEADER_WORD["magic"] + 1: int.from_bytes(image.MAGIC[4:8], "little"),
            _HEADER_WORD["version"]: image.FORMAT_VERSION,
            _HEADER_WORD["fingerprint"]: cfg.fingerprint & 0xFFFFFFFF,
            _HEADER_WORD["fingerprint"] + 1: cfg.fingerprint >> 32,
        }

        def parse_header():
            for word, value in expect.items():
                with m.If(r.beat_index == word // wpb):
                    with m.If(beat_words[word % wpb] != value):
                        m.d.sync += r.header_ok.eq(0)
            word = _HEADER_WORD["section_count"]
            with m.If(r.beat_index == word // wpb):
                m.d.sync += r.section_count.eq(beat_words[word % wpb])

        def parse_table():
            flag = r.entry_is_instr
            for j in range(wpb):
                rel = (r.table_word + j) % _SECTION_WORDS if wpb < _SECTION_WORDS else \
                    Const(j % _SECTION_WORDS, 3)
                flag = Mux(rel == _SECTION_KIND_WORD,
                           beat_words[j][:8] == image.SectionKind.INSTRUCTIONS, flag)
                with m.If((rel == _SECTION_OFFSET_WORD) & flag & ~r.found):
                    m.d.sync += [r.instr_offset.eq(beat_words[j]), r.found.eq(1)]
            m.d.sync += [r.entry_is_instr.eq(flag), r.table_word.eq(r.table_word + wpb)]

        def shift_in_instruction():
            m.d.sync += r.fetch_buf.eq(shifted_in(r.fetch_buf, beat))

        def restart():
            m.d.sync += r.beat_index.eq(0)

        with m.State("IDLE"):
            with m.If(self.start):
                m.d.sync += [base.eq(self.image_base), self.pc.eq(0), r.found.eq(0),
                             r.header_ok.eq(1), r.error_addr.eq(0), r.held_valid.eq(0),
                             r.psum_held.eq(0)]
                with m.If(self.image_base[:log2(image.SECTION_ALIGN)] != 0):
                    self._fail(m, r, ErrorCode.IMAGE_MISMATCH)
                with m.Else():
                    m.next = "HEADER_CMD"
        self._transfer(m, r, "HEADER", base, image.HEADER.size, "HEADER_CHECK",
                       on_cmd=restart, on_beat=parse_header)
        with m.State("HEADER_CHECK"):
            m.d.sync += [r.table_word.eq(0), r.entry_is_instr.eq(0)]
            with m.If(~r.header_ok | (r.section_count == 0)):
                self._fail(m, r, ErrorCode.IMAGE_MISMATCH)
            with m.Else():
                m.next = "TABLE_CMD"
            self._guard(m, r)
        # The table's read, from registers: its operands are final a state (HEADER_CHECK)
        # before TABLE_CMD, and the command's adder stays off the arbiter's path to the DMA.
        table_addr = Signal.like(self.cmd.payload.address, name="table_addr")
        table_len = Signal.like(self.cmd.payload.length, name="table_len")
        m.d.sync += [table_addr.eq(base + image.HEADER.size),
                     table_len.eq(r.section_count * image.SECTION.size)]
        self._transfer(m, r, "TABLE", table_addr, table_len, "TABLE_CHECK",
                       on_cmd=restart, on_beat=parse_table)
        with m.State("TABLE_CHECK"):
            m.d.sync += fetch_addr.eq(base + r.instr_offset)
            with m.If(~r.found):
                self._fail(m, r, ErrorCode.IMAGE_MISMATCH)
            with m.Else():
                m.next = "FETCH_CMD"
            self._guard(m, r)
        self._transfer(m, r, "FETCH", fetch_addr, INSTRUCTION_BYTES, "FETCH_ALIGN",
                       on_cmd=restart, on_beat=shift_in_instruction)
        with m.State("FETCH_ALIGN"):
            m.d.sync += self.instr.as_value().eq(aligned_instruction(r.fetch_buf, r.fetch_shift))
            m.next = "DECODE"
            self._guard(m, r)

    # -- decode ------------------------------------------------------------------------------

    def _decode_checks(self):
        """(undefined enum values or bad sizes, unsupported operands). Every bit of the
        instruction is a field (``sfnpu.isa`` reserves none)."""
        instr, L = self.instr, self.config.lanes
        kh, kw = instr.kh, instr.kw

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
                     | (instr.prefetch & instr.last)
                     # partial sums carry a normal convolution in row reuse (one output row:
                     # checked in DECODE2, where the conv height is known)
                     | ((instr.psum_keep | instr.psum_hold)
                        & ((instr.conv != ConvKind.NORMAL) | (instr.reuse != Reuse.ROW))))
        # A windowed group: row reuse, feature-map operands in DRAM (isa.validate).
        on_chip = ((instr.input.space != MemSpace.DRAM) | (instr.output.space != MemSpace.DRAM)
                   | ((instr.eltwise != Eltwise.NONE) & (instr.shortcut.space != MemSpace.DRAM)))
        # One read port per buffer, given to the shortcut's buffer: input and shortcut in
        # different buffers, no shortcut without an element-wise stage (isa.validate).
        shared_read_port = ((instr.shortcut.space != MemSpace.DRAM)
                            & ((instr.eltwise == Eltwise.NONE)
                               | (instr.shortcut.space == instr.input.space)))
        unsupported = ((instr.weights.space != MemSpace.DRAM)
                       | (instr.params.space != MemSpace.DRAM)
                       | (instr.out_c_offset[:log2(L)] != 0)
                       | (instr.windowed & ((instr.reuse != Reuse.ROW) | on_chip)))
        return bad_enum | bad_shape | shared_read_port, unsupported

    def _decode_states(self, m, r):
        cfg, sizes = self.config, self.sizes
        L, Ti, To = cfg.lanes, cfg.ti, cfg.to
        G = depthwise_taps(cfg)
        instr, g = self.instr, self.group
        kh, kw = instr.kh, instr.kw
        taps = Signal(_STEPS)
        m.d.comb += taps.eq(kh * kw)
        illegal, unsupported = self._decode_checks()
        padded_h = instr.in_h + instr.pad_top + instr.pad_bottom
        padded_w = instr.in_w + instr.pad_left + instr.pad_right
        # The instruction's own field checks, registered every cycle (the instruction holds
        # from FETCH_ALIGN on) and read in DECODE2: no adder or wide OR in front of DECODE's
        # next state.
        fields_illegal = Signal()
        m.d.sync += fields_illegal.eq(illegal | (padded_h < kh) | (padded_w < kw))
        with m.State("DECODE"):
            none = instr.conv == ConvKind.NONE
            dw = (instr.conv == ConvKind.DEPTHWISE) | none
            ib = (instr.in_c + Ti - 1) >> log2(Ti)
            ob = (instr.out_c + To - 1) >> log2(To)
            ch = ((padded_h - kh) >> (instr.sh - 1).as_unsigned()) + 1
            cw = ((padded_w - kw) >> (instr.sw - 1).as_unsigned()) + 1
            p = Mux(dw, (taps + G - 1) >> log2(G), taps)
            m.d.sync += [
                g.depthwise.eq(dw),
                g.identity.eq(none),
                g.has_ct.eq(instr.in_transform == InputTransform.CHANNEL_TABLE),
                g.param_cp.eq(Mux(none, 0, ob << log2(To))),
                g.in_blocks.eq((instr.in_c + L - 1) >> log2(L)),
                g.out_blocks.eq(ob),
                g.ib_count.eq(Mux(dw, 1, ib)),
                g.conv_h.eq(ch), g.conv_w.eq(cw),
                g.steps.eq(p), g.taps.eq(taps),
                g.out_block0.eq(instr.out_c_offset >> log2(L)),
                g.in_row_bytes.eq(instr.in_w << log2(L)),
                g.out_row_bytes.eq(instr.out_w << log2(L)),
                g.in_plane.eq((instr.in_h * instr.in_w) << log2(L)),
                g.out_plane.eq((instr.out_h * instr.out_w) << log2(L)),
                g.row_words.eq(((instr.in_c + L - 1) >> log2(L)) * instr.in_w),
                g.sets.eq(Mux(dw, ob, ob * ib)),
            ]
            with m.If(instr.opcode != Opcode.GROUP):
                self._fail(m, r, ErrorCode.ILLEGAL_OPCODE)
            with m.Else():
                m.next = "DECODE2"
            self._guard(m, r)
        self._param_sections(m, r)
        self._capacity(m, r)
        with m.State("DECODE2"):
            m.d.sync += [
                g.sc_row_bytes.eq(g.conv_w << log2(L)),
                g.mult_off.eq(g.param_cp << 2),
                g.wzp_off.eq(g.param_cp << 3),
                r.div_rem.eq(sizes.row_words), r.div_bit.eq(self.quotient_bits(sizes)),
                g.places.eq(0),
                # kh > places·ROW_BUFFER_ROWS ⇔ places < ⌈kh / ROW_BUFFER_ROWS⌉
                r.kernel_places.eq((instr.kh + ROW_BUFFER_ROWS - 1) // ROW_BUFFER_ROWS),
            ]
            pooled_h = Mux(instr.upsample, instr.out_h >> 1, instr.out_h)
            pooled_w = Mux(instr.upsample, instr.out_w >> 1, instr.out_w)
            no_pool = (instr.pool == Pool.NONE) & ((g.conv_h != pooled_h)
                                                   | (g.conv_w != pooled_w))
            global_pool = (instr.pool == Pool.GLOBAL_AVG) & ((pooled_h != 1) | (pooled_w != 1))
            odd = instr.upsample & (instr.out_h[0] | instr.out_w[0])
            window = ((instr.pool == Pool.MAX) | (instr.pool == Pool.AVG)) & (
                (instr.pool_size < 2) | (instr.pool_stride == 0) | (instr.pool_stride > 2)
                | (instr.pool_pad >= instr.pool_size) | (pooled_h == 0) | (pooled_w == 0))
            carry = instr.psum_keep | instr.psum_hold
            with m.If(fields_illegal | no_pool | global_pool | odd | window
                      | (carry & (g.conv_h != 1))
                      | (instr.psum_keep & ~r.psum_held)):
                self._fail(m, r, ErrorCode.ILLEGAL_FIELD)
            with m.Elif(unsupported):
                self._fail(m, r, ErrorCode.UNSUPPORTED)
            with m.Else():
                m.next = "DIVIDE"
            self._guard(m, r)

    def _param_sections(self, m, r):
        """The parameter block's section offsets (sfnpu.layout.param_sections, in order, each
        starting a beat), from DECODE's registers in four register stages formed every
        cycle, an adder or two each: final when PARAM_CMD reads them (after DECODE2 and at
        least three DIVIDE cycles)."""
        cfg, instr, g = self.config, self.instr, self.group

        def align(value):
            return param_aligned(value, cfg)

        ct_start, post_start, act_end = Signal(24), Signal(24), Signal(24)
        ct_bytes = Signal(24)
        m.d.sync += [
            ct_start.eq(align((g.param_cp << 3) + g.param_cp)),         # 9 bytes a channel
            ct_bytes.eq(Mux(g.has_ct, (g.in_blocks << log2(cfg.lanes)) << 8, 0)),
            post_start.eq(align(ct_start + ct_bytes)),
            g.ct_off.eq(ct_start),
            g.post_off.eq(post_start),
            g.act_off.eq(align(post_start + layout.POST_RECORD.itemsize)),
            act_end.eq(align(post_start + layout.POST_RECORD.itemsize)
                       + Mux(instr.act == Activation.TABLE, 256, 0)),
            r.window_off.eq(align(act_end)),
            r.param_len.eq(Mux(instr.windowed,
                               align(act_end) + align(layout.WINDOW_RECORD.itemsize), act_end)),
        ]

    def _capacity(self, m, r):
        """The line stores', partial sums' and tables' capacities (BUFFER_OVERFLOW at the end
        of DIVIDE): the products registered every cycle from DECODE's registers, their
        comparisons in the next stage."""
        sizes, instr, g = self.sizes, self.instr, self.group
        pooled_w = Mux(instr.upsample, instr.out_w >> 1, instr.out_w)
        pool_row, conv_row = Signal(28), Signal(28)
        m.d.sync += [pool_row.eq(g.out_blocks * pooled_w), conv_row.eq(g.out_blocks * g.conv_w)]
        rows = sizes.pool_row_pixels
        carry = instr.psum_keep | instr.psum_hold
        m.d.sync += r.overflow.eq(
            (g.out_blocks > sizes.max_channels // self.config.to)
            | (g.row_words > sizes.row_words)
            | (((instr.pool == Pool.MAX) | instr.upsample) & (pool_row > rows))
            | ((instr.pool == Pool.AVG) & (conv_row > rows))
            | (carry & (conv_row > sizes.psum_words))
            | (g.has_ct & (g.in_blocks > sizes.max_table_channels // self.config.lanes))
            | (g.conv_w > sizes.psum_words))

    def _divide_states(self, m, r):
        cfg, sizes = self.config, self.sizes
        L = cfg.lanes
        instr, g = self.instr, self.group
        block_words = g.block_words
        out_local = instr.output.space != MemSpace.DRAM
        sc_local = instr.shortcut.space != MemSpace.DRAM
        with m.State("DIVIDE"):
            m.d.sync += g.sc_plane.eq(Mux(eltwise_reads_map(instr.eltwise), r.sc_area << log2(L),
                                          L))
            # places = ⌊row_words_max / row_words⌋, one quotient bit per cycle.
            with m.If(r.div_bit == 0):
                too_big = r.weight_steps > sizes.weight_words
                frame = instr.reuse == Reuse.FRAME
                stage = (too_big & frame & (instr.conv == ConvKind.NORMAL)
                         & (instr.input.space == MemSpace.DRAM))
                m.d.sync += [g.streaming.eq(too_big & ~frame), g.staged.eq(stage),
                             g.ob_base.eq(0), g.ob_count.eq(g.out_blocks),
                             g.sc_chunk.eq(0), g.from_stage.eq(0),
                             g.chunk_obs.eq(Mux(too_big & frame, 0, g.out_blocks)),
                             r.chunk_steps.eq(block_words), r.chunk_words.eq(0),
                             r.load_words.eq(r.weight_steps)]    # out_blocks·block_words
                size = sizes.buffer_words << log2(L)
                in_end = instr.input.offset + r.in_extent
                out_end = instr.output.offset + r.out_extent
                sc_end = instr.shortcut.offset + r.sc_extent
                with m.If(r.overflow
                          | (g.places < r.kernel_places)
                          | ((r.weight_steps > sizes.weight_words) & g.depthwise)
                          | ((instr.input.space != MemSpace.DRAM) & (in_end > size))
                          | (stage & (r.in_extent > size))
                          | (out_local & (out_end > size))
                          | (sc_local & (instr.eltwise != Eltwise.NONE) & (sc_end > size))):
                    self._fail(m, r, ErrorCode.BUFFER_OVERFLOW)
                with m.Elif(instr.weights_held & ~(r.held_valid & ~too_big
                                                   & (r.held_offset == instr.weights.offset)
                                                   & (r.held_depthwise == g.depthwise))):
                    self._fail(m, r, ErrorCode.WEIGHTS_NOT_HELD)
                with m.Elif(too_big & frame):
                    m.next = "CHUNK"
                with m.Else():
                    m.next = "PARAM_CMD"
            with m.Else():
                bit = (r.div_bit - 1).as_unsigned()
                shifted = g.row_words << bit
                with m.If(r.div_rem >= shifted):
                    m.d.sync += [r.div_rem.eq(r.div_rem - shifted),
                                 g.places.eq(g.places | (Const(1, len(g.places)) << bit))]
                m.d.sync += r.div_bit.eq(r.div_bit - 1)
            self._guard(m, r)
        with m.State("CHUNK"):
            # Frame reuse reads every weight once: as many output-channel blocks as fit
            # the store are computed over the whole frame, then the next ones.
            limit = Mux(instr.double_buffer, sizes.weight_words >> 1, sizes.weight_words)
            with m.If((r.chunk_steps <= limit) & (g.chunk_obs < g.out_blocks)):
                m.d.sync += [g.chunk_obs.eq(g.chunk_obs + 1), r.chunk_words.eq(r.chunk_steps),
                             r.chunk_steps.eq(r.chunk_steps + block_words)]
            with m.Elif(g.chunk_obs == 0):
                self._fail(m, r, ErrorCode.BUFFER_OVERFLOW)     # one block does not fit
            with m.Else():
                m.d.sync += [g.ob_count.eq(g.chunk_obs), r.load_words.eq(r.chunk_words)]
                m.next = "PARAM_CMD"
            self._guard(m, r)

    # -- loads, compute, end -----------------------------------------------------------------

    def _group_states(self, m, r):
        cfg = self.config
        instr, g, base = self.instr, self.group, self.base
        next_ob, next_obs, more_chunks = next_chunk(g.ob_base, g.ob_count, g.out_blocks,
                                                    g.chunk_obs)
        # Read in COMPUTE only: the chunk is final in COMPUTE_START, a cycle before (the
        # comparison then needs no cycle of its own in front of the state register).
        more_chunks_r = Signal(name="more_chunks")
        m.d.sync += more_chunks_r.eq(more_chunks)
        # The next chunk's shortcut offset, in three register stages (the block, then the
        # product's) from registers final in COMPUTE_START (sc_plane: before it): read at
        # COMPUTE's end, which the datapath's drain puts more than three cycles later.
        next_ob_r = Signal.like(next_ob, name="next_ob")
        m.d.sync += next_ob_r.eq(next_ob)
        next_sc_chunk = split_product(m, next_ob_r, g.sc_plane, "next_sc_chunk")
        word_bytes = log2(cfg.ti * cfg.to)

        def param_cmd():
            # The first chunk's weight load: blocks 0 … ob_count − 1, load_words words
            # (depthwise weights are a multiple of the bus width; normal ones too).
            m.d.sync += [
                self.load_pos.eq(0),
                r.weight_src.eq(base + instr.weights.offset),
                r.weight_len.eq(Mux(g.depthwise, r.depthwise_bytes, r.load_words << word_bytes)),
                r.rest_words.eq(r.weight_steps - r.load_words),
            ]

        # The next chunk's: after the current one; a full chunk or the rest.
        m.d.sync += [
            self.next_src.eq(r.weight_src + (r.load_words << word_bytes)),
            self.next_words.eq(Mux(r.rest_words < r.chunk_words, r.rest_words, r.chunk_words)),
        ]

        def next_weight_load():
            words = self.next_words
            m.d.sync += [
                r.weight_src.eq(self.next_src), r.weight_len.eq(words << word_bytes),
                r.load_words.eq(words), r.rest_words.eq(r.rest_words - words),
            ]

        def after_params():
            with m.If(g.identity | g.streaming | instr.weights_held):
                self._goto(m, "COMPUTE_START")
            with m.Else():
                m.next = "WEIGHT_CMD"

        def weight_cmd():
            m.d.sync += self.load_pos.eq(0)
            m.d.comb += self.weight_restart.eq(1)

        def after_weights():
            # Whole weights stay valid for a later group with weights_held set.
            m.d.sync += [r.held_valid.eq((g.ob_base == 0) & (g.ob_count == g.out_blocks)),
                         r.held_offset.eq(instr.weights.offset),
                         r.held_depthwise.eq(g.depthwise), self.held_base.eq(0)]
            self._goto(m, "COMPUTE_START")

        def window_record():
            # A windowed group's pitches, from its record's fields as their beats pass (the
            # last lands before COMPUTE_START, where the agents take them). The record starts
            # a beat (layout.param_align), so a field sits at byte at % B of its beat.
            rel = self.load_pos - r.window_off
            for name, register in _WINDOW_FIELDS.items():
                dtype, at = layout.WINDOW_RECORD.fields[name]
                k = at % cfg.dram_bus_bytes
                assert k + dtype.itemsize <= cfg.dram_bus_bytes
                with m.If(instr.windowed & (rel == at - k)):
                    m.d.sync += g[register].eq(self.beat.data[8 * k:8 * (k + dtype.itemsize)])

        # The parameter block's address, a register: the instruction is final several
        # states (DECODE …) before PARAM_CMD.
        param_addr = Signal.like(self.cmd.payload.address, name="param_addr")
        m.d.sync += param_addr.eq(base + instr.params.offset)
        self._transfer(m, r, "PARAM", param_addr, r.param_len, after_params,
                       on_cmd=param_cmd, on_beat=window_record, loading=self.loading_params)
        self._transfer(m, r, "WEIGHT", r.weight_src, r.weight_len, after_weights,
                       on_cmd=weight_cmd, loading=self.loading_weights)
        with m.State("COMPUTE_START"):
            # Agents initialise in this cycle and act from the next one.
            self._goto(m, "COMPUTE")
            self._guard(m, r)
        with m.State("COMPUTE"):
            with m.If(self.pf_failed):
                self._fail(m, r, self.pf_error)
            with m.Elif(self.compute_done & ~self.pf_busy):
                with m.If(more_chunks_r):
                    # Next chunk of output-channel blocks (frame reuse).
                    m.d.sync += [g.ob_base.eq(next_ob), g.ob_count.eq(next_obs),
                                 g.sc_chunk.eq(next_sc_chunk),
                                 g.from_stage.eq(g.staged & (next_ob != 0))]
                    next_weight_load()
                    with m.If(instr.double_buffer):
                        self._goto(m, "COMPUTE_START")    # the prefetch loaded it
                    with m.Else():
                        self._goto(m, "WEIGHT_CMD")
                with m.Else():
                    self._goto(m, "GROUP_END")
            self._guard(m, r)
        with m.State("GROUP_END"):
            m.d.comb += self.group_done.eq(1)
            m.d.sync += [self.pc.eq(self.pc + 1),
                         self.fetch_addr.eq(self.fetch_addr + INSTRUCTION_BYTES),
                         r.psum_held.eq(instr.psum_hold)]
            with m.If(instr.last):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"
            with m.Else():
                m.next = "FETCH_CMD"
            self._guard(m, r)
        with m.State("ERROR"):
            m.d.comb += [self.error.eq(1), self.error_code.eq(r.error_code),
                         self.error_addr.eq(r.error_addr)]
            m.next = "DRAIN"
        with m.State("DRAIN"):
            # Accept read data still due (the read router takes every beat outside the
            # compute phase); write data of issued commands is in the buffer.
            with m.If(self.dma_idle):
                m.d.sync += self.flush.eq(1)
                m.next = "FLUSH"
        with m.State("FLUSH"):
            m.next = "IDLE"
