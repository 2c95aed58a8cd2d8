"""A first-word-fall-through FIFO in block RAM with :class:`amaranth.lib.fifo.SyncFIFO`'s timing.

``SyncFIFO`` reads its storage asynchronously, so synthesis builds it from LUT RAM (on ECP5,
``TRELLIS_DPR16X4``: 16 × 4 bits each) and a multiplexer tree in front of ``r_data``. A
512 × 32-bit queue takes 256 of them. :class:`BlockRamFIFO` keeps the same storage behind a
synchronous read port. The port reads, every cycle, the entry that will be at the head in the
next cycle. An entry written into an empty queue is on ``r_data`` one cycle later from a
register beside the memory, as with ``SyncFIFO``. ``level``, ``w_rdy`` and
``r_rdy`` are computed the same way, so swapping one queue for the other changes no cycle.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Mux, Signal
from amaranth.lib.fifo import FIFOInterface
from amaranth.lib.memory import Memory

__all__ = ["BlockRamFIFO", "UNCHECKED_COLLISIONS", "unchecked_read"]

#: Memory attributes for :func:`unchecked_read`: Yosys may leave the value read in a
#: read-during-write collision undefined.
UNCHECKED_COLLISIONS = {"no_rw_check": 1}


def unchecked_read(m, memory, addr, name: str) -> Signal:
    """A synchronous read of ``memory`` (built with :data:`UNCHECKED_COLLISIONS`) at ``addr``,
    for a reader that never uses the value read in a cycle that writes the same address.

    An Amaranth read port promises the old value in that case. ECP5's DP16KD does not, so
    Yosys compares the addresses and keeps a copy of the output beside the block to provide
    it (on a read address behind a handshake, that comparison is on the critical path).
    Written as a combinational read into a register without reset, the port has no such
    promise: Yosys folds the register into the block RAM, and the simulation still reads the
    old value."""
    port = memory.read_port(domain="comb")
    data = Signal.like(port.data, name=name, reset_less=True)
    m.d.comb += port.addr.eq(addr)
    m.d.sync += data.eq(port.data)
    return data


class BlockRamFIFO(Elaboratable, FIFOInterface):
    """``SyncFIFO(width=width, depth=depth)``, cycle for cycle, with its storage behind one
    synchronous memory read port (block RAM).

    ``r_data`` is the head entry while ``r_rdy`` is 1, and unspecified while the queue is
    empty (``SyncFIFO`` shows a stale entry there). Wrapped in ``ResetInserter``, a reset
    empties the queue as ``SyncFIFO``'s does: the read register is not reset, and it is read
    again before the queue next holds an entry.
    """

    def __init__(self, *, width: int, depth: int):
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        super().__init__(width=width, depth=depth)
        self.level = Signal(range(depth + 1))

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        # Room and content as flags kept beside the level (``level != depth``, ``level != 0``
        # in every cycle): a producer's handshake starts at a flip-flop, not at a comparison.
        not_full = Signal(init=1)
        not_empty = Signal()
        m.d.comb += [
            self.w_rdy.eq(not_full),
            self.r_rdy.eq(not_empty),
            self.w_level.eq(self.level),
            self.r_level.eq(self.level),
        ]
        do_read = self.r_rdy & self.r_en
        do_write = self.w_rdy & self.w_en

        def following(pointer):
            return Mux(pointer == depth - 1, 0, pointer + 1)

        storage = m.submodules.storage = Memory(shape=self.width, depth=depth, init=[],
                                                attrs=UNCHECKED_COLLISIONS)
        w_port = storage.write_port()
        produce = Signal(range(depth))
        consume = Signal(range(depth))
        next_consume = Signal(range(depth))
        m.d.comb += [
            w_port.addr.eq(produce), w_port.data.eq(self.w_data), w_port.en.eq(do_write),
            next_consume.eq(Mux(do_read, following(consume), consume)),
        ]
        m.d.sync += consume.eq(next_consume)
        head = unchecked_read(m, storage, next_consume, "head")      # the next cycle's head
        # An entry written into a queue left empty is the head in the next cycle, before the
        # port can read it: it comes from a register. That is the case exactly when the
        # queue holds one entry and the last cycle wrote (a test of registers only), and
        # it is the only read that can collide with a write, so its value is never used.
        # The register loads every cycle (it is read only in the cycle after a write): the
        # write enable, at the end of the producer's handshake, has no wide fan-out.
        wrote = Signal()
        last_written = Signal(self.width)
        m.d.sync += [wrote.eq(do_write), last_written.eq(self.w_data)]
        m.d.comb += self.r_data.eq(Mux(wrote & (self.level == 1), last_written, head))
        with m.If(do_write):
            m.d.sync += produce.eq(following(produce))
        with m.If(do_write & ~do_read):
            m.d.sync += [self.level.eq(self.level + 1), not_empty.eq(1),
                         not_full.eq(self.level != depth - 1)]
        with m.If(do_read & ~do_write):
            m.d.sync += [self.level.eq(self.level - 1), not_full.eq(1),
                         not_empty.eq(self.level != 1)]
        return m
