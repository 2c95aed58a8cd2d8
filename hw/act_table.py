"""Activation table stage: every 8-bit code of a beat looked up in a 256-entry table.

A unary op between DequantizeLinear and QuantizeLinear (HardSwish, Sigmoid, LeakyRelu, …) and
the per-channel input transform (:attr:`sfnpu.isa.InputTransform.CHANNEL_TABLE`) are exact
int8 → int8 tables indexed by the raw byte (:func:`sfnpu.numeric.apply_table`). Codes travel as
raw bytes, so the lookup needs no signedness: the table already holds the output type's bytes.

A beat carries ``lanes`` codes, all looked up in the same cycle, so every lane has its own copy
of the table (one memory per lane; in the shared mode all copies are written together). The
tables are loaded from the group's parameter block before the stream starts, ``write_bytes``
bytes (a bus beat) per cycle: the shared table ``write_bytes`` consecutive codes at a time
(each lane's copy holds them in one word, and the lookup selects the code's byte), the
per-channel tables ``write_bytes`` lanes at a time (the section's order ``[C/L][256][L]``,
:func:`sfnpu.layout.pack_channel_tables`, puts one code's entries for consecutive lanes in one
bus beat).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .beat import code_beat, pass_through
from .held_output import HeldOutput

__all__ = ["ActivationTable", "TABLE_ENTRIES"]

#: Entries of one table: one per 8-bit code.
TABLE_ENTRIES = 256


class ActivationTable(wiring.Component):
    """``y[lane] = table[x[lane] & 0xFF]`` for every lane of every beat.

    Parameters
    ----------
    lanes : int
        Codes per beat (``HwConfig.lanes``); a power of two.
    per_channel : bool
        False: one table shared by all channels (``act_table`` section, :class:`Activation.TABLE
        <sfnpu.isa.Activation>`). True: one table per channel (``channel_table`` section,
        :class:`InputTransform.CHANNEL_TABLE <sfnpu.isa.InputTransform>`); lane *l* of a beat of
        channel block *b* uses the table of channel ``b·lanes + l``.
    max_channels : int
        Per-channel mode: channels whose tables fit on chip (a multiple of ``lanes``).
    write_bytes : int
        Entries written per cycle (the bus width in bytes): in the shared mode of consecutive
        codes (a power of two up to 256), per channel of consecutive lanes (a power of two
        dividing ``lanes``).

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        Codes, one channel block of one pixel per beat (raw bytes, int8 or uint8).
    o_stream : Out(stream.Signature(ArrayLayout(8, lanes)))
        Looked-up codes (raw bytes of the table's output type).
    enable : In(1)
        Configuration: 0 bypasses the stage (``o_stream`` is ``i_stream``, combinationally).
    channel_block : In(range(max_channels // lanes))
        Per-channel mode only: channel block of the beat on ``i_stream`` (sampled with it).
    write_addr : In(range(256)) or In(range(256 · max_channels))
        Table entry to write: the first of the ``write_bytes`` codes (a multiple of it);
        per-channel, ``(block·256 + code)·lanes + lane`` of the first of the ``write_bytes``
        lanes — the byte offset within the parameter section, so a DMA copies the section
        unchanged.
    write_data : In(8 · write_bytes)
        Entry values (raw bytes; byte *k* for code ``code + k``, per-channel for lane
        ``lane + k``).
    write_en : In(1)
        Write ``write_data`` at ``write_addr`` this cycle.

    Configuration and table contents may change only between groups: once every input beat
    has been accepted and every output beat delivered.

    Timing: one beat per cycle; latency :attr:`LATENCY` (the table memories' read register,
    then an output register). A stall on ``o_stream`` holds both stages and stalls
    ``i_stream``. Bypass has no latency.
    """

    #: Cycles from an accepted input beat to its output beat (when not stalled).
    LATENCY = 2

    def __init__(self, lanes: int, *, per_channel: bool = False, max_channels: int | None = None,
                 write_bytes: int = 1):
        if lanes < 1 or lanes & (lanes - 1):
            raise ValueError(f"lanes must be a power of two, not {lanes}")
        self.lanes = lanes
        self.per_channel = bool(per_channel)
        if self.per_channel:
            if not max_channels or max_channels % lanes:
                raise ValueError(f"max_channels must be a positive multiple of {lanes} "
                                 f"(lanes), not {max_channels}")
            if write_bytes < 1 or write_bytes & (write_bytes - 1) or lanes % write_bytes:
                raise ValueError(f"write_bytes must be a power of two dividing {lanes} "
                                 f"(lanes), not {write_bytes}")
            self.blocks = max_channels // lanes
        else:
            if max_channels is not None:
                raise ValueError("max_channels applies to the per-channel mode only")
            if write_bytes < 1 or write_bytes & (write_bytes - 1) or write_bytes > TABLE_ENTRIES:
                raise ValueError(f"write_bytes must be a power of two up to {TABLE_ENTRIES}, "
                                 f"not {write_bytes}")
            self.blocks = 1
        self.write_bytes = write_bytes
        self.max_channels = self.blocks * lanes
        beat = code_beat(lanes)
        members = {
            "i_stream": In(beat),
            "o_stream": Out(beat),
            "enable": In(1),
            "write_addr": In(range(TABLE_ENTRIES * (self.max_channels if self.per_channel
                                                     else 1))),
            "write_data": In(8 * write_bytes),
            "write_en": In(1),
        }
        if self.per_channel:
            members["channel_block"] = In(range(self.blocks))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        lanes, blocks = self.lanes, self.blocks
        lane_bits = (lanes - 1).bit_length()

        # Per-channel write address → (block, code, lane); the shared table goes to every lane.
        W = self.write_bytes
        if self.per_channel:
            write_lane = self.write_addr[:lane_bits]
            write_code = self.write_addr[lane_bits:lane_bits + 8]
            write_block = self.write_addr[lane_bits + 8:]

        # Two stages: the memories' read registers, then the output register (a block RAM's
        # output drives no logic in the cycle it is read). They run freely; their beats wait
        # in ``held``, whose handshakes are those of the two stages held together while the
        # output waits (hw.held_output), so the hold reaches no block RAM's enable.
        m.submodules.held = held = HeldOutput(8 * lanes, 2)
        advance = held.advance

        # Shared table: W codes per word of each lane's copy; the looked-up code's byte is
        # selected behind the memory's read register.
        code_bits = (W - 1).bit_length() if not self.per_channel else 0
        for lane in range(lanes):
            table = Memory(shape=8 << code_bits, depth=(TABLE_ENTRIES >> code_bits) * blocks,
                           init=[])
            m.submodules[f"table_{lane}"] = table
            write = table.write_port()
            read = table.read_port()
            looked_up = read.data
            if self.per_channel:
                # The write covers lanes write_lane … write_lane + W − 1 (write_lane a
                # multiple of W): this lane takes byte lane mod W when its group is addressed.
                group_bits = lane_bits - (W - 1).bit_length()
                selected = (write_lane[lane_bits - group_bits:] == lane // W) if group_bits \
                    else 1
                m.d.comb += [
                    write.addr.eq(Cat(write_code, write_block)),
                    write.en.eq(self.write_en & selected),
                    write.data.eq(self.write_data.word_select(lane % W, 8)),
                    read.addr.eq(Cat(self.i_stream.payload[lane], self.channel_block)),
                ]
            else:
                code = self.i_stream.payload[lane]
                m.d.comb += [
                    write.addr.eq(self.write_addr[code_bits:]),
                    write.en.eq(self.write_en),
                    write.data.eq(self.write_data),
                    read.addr.eq(code[code_bits:]),
                ]
                if code_bits:
                    byte = Signal(code_bits, name=f"byte_{lane}")
                    m.d.sync += byte.eq(code[:code_bits])
                    looked_up = read.data.word_select(byte, 8)
            out = Signal(8, name=f"out_{lane}")
            m.d.sync += out.eq(looked_up)
            m.d.comb += held.payload[8 * lane:8 * (lane + 1)].eq(out)

        with m.If(self.enable):
            m.d.comb += [
                held.accept.eq(self.i_stream.valid & advance),
                self.i_stream.ready.eq(advance),
                self.o_stream.valid.eq(held.o_stream.valid),
                self.o_stream.payload.eq(held.o_stream.payload),
                held.o_stream.ready.eq(self.o_stream.ready),
            ]
        with m.Else():
            m.d.comb += pass_through(self.i_stream, self.o_stream)
        return m
