"""AXI response codes (AXI4 spec, A3.4.4): one definition for the bus gateware
(:mod:`sfnpu.hw.axi`), the UART host link (:mod:`sfnpu.hostlink`) and host software."""

from amaranth.lib import enum

__all__ = ["Resp"]


class Resp(enum.Enum, shape=2):
    OKAY = 0
    EXOKAY = 1
    SLVERR = 2
    DECERR = 3
