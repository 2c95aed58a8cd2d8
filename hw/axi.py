"""AXI4 and AXI4-Lite as Amaranth signatures: one ``lib.stream`` per channel.

Every AXI channel is a valid/ready stream, so a bus is five streams: ``ar``, ``aw`` and ``w``
flow from master to slave, ``r`` and ``b`` back. The signatures are written from the master's
side (``Out`` = driven by the master); a slave uses ``.flip()``. Only the signals sfnpu uses are
present: one transaction ID (IDs, ``cache``, ``prot``, ``lock``, ``qos`` and ``region`` are
constants a top-level wrapper ties off: ID 0, normal non-cacheable, unprivileged, secure).

Transfers are always full bus width (``size`` = log2 of the bus bytes) INCR bursts.
"""

from __future__ import annotations

from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu.bus import Resp

__all__ = ["Resp", "Burst", "BOUNDARY_BYTES", "MAX_BURST", "address_layout",
           "Axi4Signature", "AxiLiteSignature"]

#: An INCR burst must not cross a 4 KiB address boundary (AXI4 spec, A3.4.1).
BOUNDARY_BYTES = 4096
#: AXI4 INCR bursts are 1..256 beats (AxLEN = beats − 1).
MAX_BURST = 256


class Burst(enum.Enum, shape=2):
    FIXED = 0
    INCR = 1
    WRAP = 2


def address_layout(addr_width: int) -> data.StructLayout:
    """AR and AW payload: byte address, ``len`` = beats − 1, ``size`` = log2(bytes per beat)."""
    return data.StructLayout({"addr": addr_width, "len": 8, "size": 3, "burst": Burst})


class Axi4Signature(wiring.Signature):
    """AXI4 master port with ``addr_width``-bit addresses and ``data_width``-bit data."""

    def __init__(self, addr_width: int, data_width: int):
        if not 1 <= addr_width <= 64:
            raise ValueError(f"addr_width must be 1..64, not {addr_width}")
        if data_width < 8 or data_width & (data_width - 1) or data_width > 1024:
            raise ValueError(f"data_width must be a power of two 8..1024, not {data_width}")
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "ar": Out(stream.Signature(address_layout(addr_width))),
            "r": In(stream.Signature(data.StructLayout(
                {"data": data_width, "resp": Resp, "last": 1}))),
            "aw": Out(stream.Signature(address_layout(addr_width))),
            "w": Out(stream.Signature(data.StructLayout(
                {"data": data_width, "strb": data_width // 8, "last": 1}))),
            "b": In(stream.Signature(data.StructLayout({"resp": Resp}))),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)

    def __repr__(self):
        return f"Axi4Signature({self.addr_width}, {self.data_width})"


class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite master port (32-bit data: the width the register map is defined for)."""

    def __init__(self, addr_width: int, data_width: int = 32):
        if data_width not in (32, 64):
            raise ValueError(f"AXI4-Lite data_width is 32 or 64, not {data_width}")
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "ar": Out(stream.Signature(data.StructLayout({"addr": addr_width}))),
            "r": In(stream.Signature(data.StructLayout({"data": data_width, "resp": Resp}))),
            "aw": Out(stream.Signature(data.StructLayout({"addr": addr_width}))),
            "w": Out(stream.Signature(data.StructLayout(
                {"data": data_width, "strb": data_width // 8}))),
            "b": In(stream.Signature(data.StructLayout({"resp": Resp}))),
        })

    def __eq__(self, other):
        return (type(other) is type(self) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)

    def __repr__(self):
        return f"AxiLiteSignature({self.addr_width}, {self.data_width})"
