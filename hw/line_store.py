"""Line stores outside the pools, so that pools never enabled together share one memory per row.

The max pool keeps two rows of codes and the average pool three, each row a block-RAM memory
``pool_row_pixels`` deep and a beat wide (8 DP16KD per row on ``ecp5``). At most one pool is
enabled in a group (``instr.pool``), so their rows can be the same memories: a pool built with
``shared_lines`` hands each row's write and read port out through a :class:`LinePort`, and
:func:`share_lines` builds one memory per row for all of them, the enabled pool's addresses,
data and enables chosen by the pools' configuration registers. A pool built without it keeps
memories of its own (:func:`line_ports`), as its unit tests use it.
"""

from __future__ import annotations

from amaranth.hdl import Mux, Value
from amaranth.lib import wiring
from amaranth.lib.memory import Memory, ReadPort, WritePort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

__all__ = ["LinePort", "line_members", "line_ports", "share_lines"]


class LinePort(wiring.Signature):
    """A unit's port to one line store: the write port and the read port of a memory of
    ``depth`` entries of ``shape``, as the unit drives them (address, data and enable out,
    the read data in, a cycle after its address)."""

    def __init__(self, shape, depth: int):
        self.shape, self.depth = shape, depth
        width = ceil_log2(depth)            # the memory's own address width
        super().__init__({
            "write": In(WritePort.Signature(addr_width=width, shape=shape)),
            "read": In(ReadPort.Signature(addr_width=width, shape=shape)),
        })


def line_members(count: int, shape, depth: int, shared: bool) -> dict:
    """A pool's signature members for ``count`` line stores: ``lines``, one
    :class:`LinePort` per row, when they are ``shared``."""
    return {"lines": Out(LinePort(shape, depth)).array(count)} if shared else {}


def _memory(m, shape, depth: int, name: str, transparent: bool):
    memory = Memory(shape=shape, depth=depth, init=[])
    m.submodules[name] = memory
    write = memory.write_port()
    read = memory.read_port(transparent_for=(write,) if transparent else ())
    return write, read


def line_ports(m, unit, count: int, shape, depth: int, transparent: bool, name: str = "rows"):
    """The ``(write, read)`` ports of ``unit``'s ``count`` line stores: its ``lines`` when it
    shares them (``unit.shared_lines``), else memories of its own, named ``<name>_<row>``,
    whose reads see a write to the same address in the same cycle when ``transparent``."""
    if unit.shared_lines:
        return [(port.write, port.read) for port in unit.lines]
    return [_memory(m, shape, depth, f"{name}_{row}", transparent) for row in range(count)]


def share_lines(m, users, *, name: str = "lines"):
    """One memory per row for the :class:`LinePort` arrays of ``users``, a list of
    ``(enabled, lines, transparent)``: row *r* serves every user with more than *r* lines,
    driven by the first whose ``enabled`` is set (the last user's ports when none is).
    ``enabled`` must be configuration, constant while a user has accesses in flight; at most
    one is set. A row's read is transparent (it sees a same-cycle write to its address) when
    one of its users needs that; a user that never reads a row it writes in the same cycle
    reads the same either way."""
    rows = max(len(lines) for _, lines, _ in users)
    for row in range(rows):
        ports = [(enabled, lines[row]) for enabled, lines, _ in users if len(lines) > row]
        transparent = any(wants for _, lines, wants in users if len(lines) > row)
        signature = ports[0][1].signature
        write, read = _memory(m, signature.shape, signature.depth, f"{name}_{row}",
                              transparent)
        for field, target in (("addr", write.addr), ("data", write.data), ("en", write.en)):
            m.d.comb += target.eq(_chosen(ports, lambda port: getattr(port.write, field)))
        for field, target in (("addr", read.addr), ("en", read.en)):
            m.d.comb += target.eq(_chosen(ports, lambda port: getattr(port.read, field)))
        for _, port in ports:
            m.d.comb += port.read.data.eq(read.data)


def _chosen(ports, field):
    """``field`` of the first port whose user is enabled, else of the last."""
    value = Value.cast(field(ports[-1][1]))
    for enabled, port in reversed(ports[:-1]):
        value = Mux(enabled, Value.cast(field(port)), value)
    return value
