"""The compute phase's feature-map readers: the input and the shortcut stream."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, ResetInserter, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu import isa
from sfnpu.isa import Eltwise, MemSpace, eltwise_reads_map

from ..act_table import ActivationTable
from ..dma import Direction
from ..fifo import BlockRamFIFO
from .buffers import segment_layout
from .common import fifo_room, log2

__all__ = ["InputReader", "ShortcutReader"]


def _reader_members(lanes, addr_width, buffer_words, cmd_layout):
    """The ports both readers have (see :class:`InputReader`)."""
    return {
        "flush": In(1), "start": In(1), "compute": In(1),
        "instr": In(isa.InstructionLayout), "base": In(addr_width),
        "cmd": Out(stream.Signature(cmd_layout)),
        "local_cmd": Out(stream.Signature(segment_layout(buffer_words))),
        "dram_words": In(stream.Signature(8 * lanes, always_ready=True)),
        "local_words": In(stream.Signature(8 * lanes, always_ready=True)),
    }


def _command(m, reader, request, local, address, words, lanes):
    """Drive the reader's DMA or local command (a segment of ``words`` words at byte
    ``address``); returns the grant of either."""
    cmd, lcmd = reader.cmd, reader.local_cmd
    m.d.comb += [
        cmd.valid.eq(request & ~local), cmd.payload.address.eq(address),
        cmd.payload.length.eq(words << log2(lanes)), cmd.payload.direction.eq(Direction.READ),
        lcmd.valid.eq(reader.compute & local & request),
        lcmd.payload.address.eq(address >> log2(lanes)), lcmd.payload.count.eq(words),
    ]
    return (cmd.valid & cmd.ready) | (lcmd.valid & lcmd.ready)


def _fill(m, reader, fifo):
    """The segments' words (local or DRAM) into ``fifo``."""
    dram, local = reader.dram_words, reader.local_words
    m.d.comb += [fifo.w_data.eq(Mux(local.valid, local.payload, dram.payload)),
                 fifo.w_en.eq(dram.valid | local.valid)]


class InputReader(wiring.Component):
    """The input, one *segment* (one row of one channel block, ``in_w`` words) per command —
    a DMA read, or a local read when the input is in an on-chip buffer — in the order
    ``for y: for cb``, the row buffer's input order; through the input FIFO and the input
    transform's per-channel tables into ``o_stream``.

    A segment is requested only when the input FIFO has room for all of it, so read data
    never blocks the DMA (which would deadlock against the output path). A staged group's
    first chunk also writes every DRAM word to the staging buffer, at its place in the
    channel-blocked layout (words arrive ``y, cb, x``).

    Parameters
    ----------
    lanes, addr_width : int
    row_words : int
        Input FIFO words (the row buffer's row).
    buffer_words : int
        Words of an on-chip buffer.
    max_table_channels, bus_bytes : int
        Channels of the per-channel tables; bytes per table write.
    cmd_layout : Layout
        The DMA command.

    Signature
    ---------
    flush, start, compute : In(1)
        Abort; a compute phase's first cycle; the compute phase.
    instr : In(InstructionLayout), base : In(addr_width)
    local : In(1), offset : In(32)
        The input is in an on-chip buffer (or the staging buffer); its byte offset.
    stage : In(1)
        Copy the DRAM words to the staging buffer.
    in_blocks : In(16), in_plane : In(32), in_row_bytes : In(32)
        Input channel blocks; bytes from one block to the next and from one row to the next
        (the whole tensor's, when the input is a window of it).
    channel_table : In(1)
        The input transform's per-channel tables are on.
    table_write_addr : In(24), table_write_data : In(8 · bus_bytes), table_write_en : In(1)
        Their load.
    cmd : Out(stream.Signature(cmd_layout)), local_cmd : Out(stream.Signature(segment))
        Segment commands.
    dram_words, local_words : In(stream.Signature(8 · lanes, always_ready=True))
        The segments' words from the DMA and from the on-chip buffer.
    stage_write : Out(stream.Signature(StructLayout({"address", "data"}), always_ready=True))
        Staging writes.
    o_stream : Out(stream.Signature(ArrayLayout(8, lanes)))
        To the row buffer.
    empty : Out(1)
        The input FIFO is empty.
    """

    def __init__(self, lanes, addr_width, row_words, buffer_words, max_table_channels,
                 bus_bytes, cmd_layout):
        self.lanes = lanes
        self.row_words = row_words
        self.buffer_words = buffer_words
        self.max_table_channels = max_table_channels
        self.bus_bytes = bus_bytes
        members = _reader_members(lanes, addr_width, buffer_words, cmd_layout)
        members.update({
            "local": In(1), "offset": In(32), "stage": In(1),
            "in_blocks": In(16), "in_plane": In(32), "in_row_bytes": In(32),
            "channel_table": In(1),
            "table_write_addr": In(24), "table_write_data": In(8 * bus_bytes),
            "table_write_en": In(1),
            "stage_write": Out(stream.Signature(data.StructLayout({
                "address": range(buffer_words + 1), "data": 8 * lanes}), always_ready=True)),
            "o_stream": Out(stream.Signature(data.ArrayLayout(8, lanes))),
            "empty": Out(1),
        })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        L, instr = self.lanes, self.instr
        flush, start = self.flush, self.start
        m.submodules.fifo = fifo = ResetInserter(flush)(
            BlockRamFIFO(width=8 * L, depth=self.row_words))
        aw = len(self.base)
        in_y = Signal(12)
        in_cb = Signal(16)
        in_seg_addr = Signal(aw)
        in_row_addr = Signal(aw)
        in_done = Signal()
        granted_words = Signal.like(instr.in_w)
        in_req = self.compute & ~in_done & fifo_room(m, fifo, instr.in_w, granted_words,
                                                     flush=flush, start=start, name="in")
        grant = _command(m, self, in_req, self.local, in_seg_addr, instr.in_w, L)
        m.d.comb += granted_words.eq(Mux(grant, instr.in_w, 0))

        # Segments y-major, cb-minor.
        with m.If(start):
            first = Mux(self.local, 0, self.base) + self.offset
            m.d.sync += [in_y.eq(0), in_cb.eq(0), in_done.eq(0),
                         in_seg_addr.eq(first), in_row_addr.eq(first)]
        with m.Elif(grant):
            with m.If(in_cb + 1 < self.in_blocks):
                m.d.sync += [in_cb.eq(in_cb + 1), in_seg_addr.eq(in_seg_addr + self.in_plane)]
            with m.Else():
                m.d.sync += [in_cb.eq(0), in_y.eq(in_y + 1),
                             in_seg_addr.eq(in_row_addr + self.in_row_bytes),
                             in_row_addr.eq(in_row_addr + self.in_row_bytes)]
                with m.If(in_y + 1 == instr.in_h):
                    m.d.sync += in_done.eq(1)
        _fill(m, self, fifo)
        self._staging(m)

        # The input transform; the channel block of its word: words come (y, cb, x).
        in_table = ResetInserter(flush)(
            ActivationTable(L, per_channel=True, max_channels=self.max_table_channels,
                            write_bytes=self.bus_bytes))
        m.submodules.in_table = in_table
        t_x = Signal(12)
        t_cb = Signal(range(self.max_table_channels // L))
        with m.If(flush | start):
            m.d.sync += [t_x.eq(0), t_cb.eq(0)]
        with m.Elif(in_table.i_stream.valid & in_table.i_stream.ready):
            with m.If(t_x + 1 < instr.in_w):
                m.d.sync += t_x.eq(t_x + 1)
            with m.Else():
                m.d.sync += [t_x.eq(0), t_cb.eq(Mux(t_cb + 1 < self.in_blocks, t_cb + 1, 0))]
        m.d.comb += [
            in_table.write_addr.eq(self.table_write_addr),
            in_table.write_data.eq(self.table_write_data),
            in_table.write_en.eq(self.table_write_en),
            in_table.i_stream.payload.eq(fifo.r_data),
            in_table.i_stream.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(in_table.i_stream.ready),
            in_table.enable.eq(self.channel_table),
            in_table.channel_block.eq(t_cb),
            self.empty.eq(~fifo.r_rdy),
        ]
        wiring.connect(m, in_table.o_stream, wiring.flipped(self.o_stream))
        return m

    def _staging(self, m):
        """Each DRAM word to the staging buffer (first chunk of a staged group)."""
        L, instr = self.lanes, self.instr
        dram = self.dram_words
        stage_write = dram.valid & self.stage
        st_x = Signal(12)
        st_cb = Signal(16)
        st_row = Signal(range(self.buffer_words + 1))
        st_seg = Signal(range(self.buffer_words + 1))
        st_addr = Signal(range(self.buffer_words + 1))
        with m.If(self.start):
            m.d.sync += [st_x.eq(0), st_cb.eq(0), st_row.eq(0), st_seg.eq(0), st_addr.eq(0)]
        with m.Elif(stage_write):
            with m.If(st_x + 1 < instr.in_w):
                m.d.sync += [st_x.eq(st_x + 1), st_addr.eq(st_addr + 1)]
            with m.Elif(st_cb + 1 < self.in_blocks):
                seg = st_seg + (self.in_plane >> log2(L))
                m.d.sync += [st_x.eq(0), st_cb.eq(st_cb + 1), st_seg.eq(seg), st_addr.eq(seg)]
            with m.Else():
                row = st_row + instr.in_w
                m.d.sync += [st_x.eq(0), st_cb.eq(0), st_row.eq(row), st_seg.eq(row),
                             st_addr.eq(row)]
        m.d.comb += [self.stage_write.valid.eq(stage_write),
                     self.stage_write.payload.address.eq(st_addr),
                     self.stage_write.payload.data.eq(dram.payload)]


class ShortcutReader(wiring.Component):
    """The shortcut stream into the post chain's element-wise stage. ADD and MUL: the other
    operand, a tensor of the conv output's shape, one ``(oy, ob)`` segment of ``conv_w`` words per command, in the
    result order, each issued when the shortcut FIFO has room for it. CHANNEL_SCALE: the
    C×1×1 vector in one command at the start (the scale unit stores every beat as it comes,
    so it never blocks the DMA). Commands are DMA reads, or local reads when the shortcut is
    in an on-chip buffer.

    Parameters
    ----------
    lanes, addr_width, buffer_words : int
    words : int
        Shortcut FIFO words (the widest convolution output row).
    cmd_layout : Layout

    Signature
    ---------
    flush, start, compute : In(1)
    instr : In(InstructionLayout), base : In(addr_width)
    sc_chunk : In(32)
        The chunk's first output block's byte offset in the shortcut operand.
    ob_count : In(16)
        The chunk's output blocks.
    conv_h, conv_w : In(12)
        Convolution output shape.
    sc_plane, sc_row_bytes : In(32)
        Bytes from one channel block of the shortcut operand to the next (a CHANNEL_SCALE
        vector's: one word) and from one row of the residual tensor to the next.
    cmd, local_cmd, dram_words, local_words
        As :class:`InputReader`'s.
    o_stream : Out(stream.Signature(8 · lanes))
        The shortcut words.
    """

    def __init__(self, lanes, addr_width, words, buffer_words, cmd_layout):
        self.lanes = lanes
        self.words = words
        members = _reader_members(lanes, addr_width, buffer_words, cmd_layout)
        members.update({
            "sc_chunk": In(32), "ob_count": In(16), "conv_h": In(12), "conv_w": In(12),
            "sc_plane": In(32), "sc_row_bytes": In(32),
            "o_stream": Out(stream.Signature(8 * lanes)),
        })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        L, instr = self.lanes, self.instr
        conv_w, ob_count = self.conv_w, self.ob_count
        m.submodules.fifo = fifo = ResetInserter(self.flush)(
            BlockRamFIFO(width=8 * L, depth=self.words))
        aw = len(self.base)
        sc_oy = Signal(12)
        sc_ob = Signal(16)
        sc_addr = Signal(aw)
        sc_row_addr = Signal(aw)
        sc_done = Signal()
        sc_plane = self.sc_plane
        reads_map = eltwise_reads_map(instr.eltwise)
        sc_local = instr.shortcut.space != MemSpace.DRAM
        sc_first = Mux(sc_local, 0, self.base) + instr.shortcut.offset + self.sc_chunk
        sc_words = Mux(reads_map, conv_w, ob_count)
        # The FIFO's room for a row (the row's words are the group's, final before start).
        grant_words = Signal.like(conv_w)
        sc_req = self.compute & ~sc_done & (
            ~reads_map | fifo_room(m, fifo, conv_w, grant_words, flush=self.flush,
                                    start=self.start, counted=reads_map, name="sc"))
        grant = _command(m, self, sc_req, sc_local, sc_addr, sc_words, L)
        with m.If(self.start):
            m.d.sync += [sc_oy.eq(0), sc_ob.eq(0), sc_done.eq(instr.eltwise == Eltwise.NONE),
                         sc_addr.eq(sc_first), sc_row_addr.eq(sc_first)]
        with m.Elif(grant):
            with m.If(~reads_map):
                m.d.sync += sc_done.eq(1)
            with m.Elif(sc_ob + 1 < ob_count):
                m.d.sync += [sc_ob.eq(sc_ob + 1), sc_addr.eq(sc_addr + sc_plane)]
            with m.Else():
                row = sc_row_addr + self.sc_row_bytes
                m.d.sync += [sc_ob.eq(0), sc_oy.eq(sc_oy + 1), sc_addr.eq(row),
                             sc_row_addr.eq(row)]
                with m.If(sc_oy + 1 == self.conv_h):
                    m.d.sync += sc_done.eq(1)
        m.d.comb += grant_words.eq(Mux(grant & reads_map, conv_w, 0))
        _fill(m, self, fifo)
        wiring.connect(m, fifo.r_stream, wiring.flipped(self.o_stream))
        return m
