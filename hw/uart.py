"""8N1 UART receiver and transmitter with ``lib.stream`` byte ports.

Both count ``divisor`` clock cycles per bit (clock frequency / baud rate, at least 4). The
receiver samples each bit in its middle, after a two-register synchroniser on the pin; a byte
whose stop bit is low (a framing error) is dropped. It has no buffer: the consumer must take a
byte before the next one ends, which the bridge does (it needs a few cycles per byte).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["UartRx", "UartTx", "MIN_DIVISOR"]

MIN_DIVISOR = 4


def _check_divisor(divisor: int):
    if not isinstance(divisor, int) or divisor < MIN_DIVISOR:
        raise ValueError(f"UART divisor {divisor!r}: must be an integer of at least "
                         f"{MIN_DIVISOR} clock cycles per bit")


class UartRx(wiring.Component):
    """Signature: ``rx`` (the pin, idle high) in, ``o_stream`` (received bytes) out."""

    def __init__(self, divisor: int):
        _check_divisor(divisor)
        self.divisor = divisor
        super().__init__({"rx": In(1, init=1), "o_stream": Out(stream.Signature(8))})

    def elaborate(self, platform):
        m = Module()
        rx = Signal(init=1)
        m.submodules.sync_rx = FFSynchronizer(self.rx, rx, init=1)
        timer = Signal(range(self.divisor))
        bits = Signal(range(10))
        shift = Signal(9)           # data bits, then the stop bit

        with m.If(self.o_stream.ready):
            m.d.sync += self.o_stream.valid.eq(0)
        with m.FSM(name="rx"):
            with m.State("IDLE"):
                with m.If(~rx):
                    m.d.sync += timer.eq(self.divisor // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                m.d.sync += timer.eq(timer - 1)
                with m.If(timer == 0):
                    with m.If(rx):          # a glitch, not a start bit
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [timer.eq(self.divisor - 1), bits.eq(0)]
                        m.next = "DATA"
            with m.State("DATA"):
                m.d.sync += timer.eq(timer - 1)
                with m.If(timer == 0):
                    m.d.sync += [timer.eq(self.divisor - 1), shift.eq(Cat(shift[1:], rx)),
                                 bits.eq(bits + 1)]
                    with m.If(bits == 8):
                        m.next = "DONE"
            with m.State("DONE"):
                with m.If(shift[8]):
                    m.d.sync += [self.o_stream.payload.eq(shift[:8]),
                                 self.o_stream.valid.eq(1)]
                m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """Signature: ``i_stream`` (bytes to send) in, ``tx`` (the pin, idle high) out."""

    def __init__(self, divisor: int):
        _check_divisor(divisor)
        self.divisor = divisor
        super().__init__({"i_stream": In(stream.Signature(8)), "tx": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self.divisor))
        shift = Signal(10, init=0x3FF)      # start bit, data, stop bit; LSB first
        bits = Signal(range(11))

        m.d.comb += [self.tx.eq(shift[0]), self.i_stream.ready.eq(bits == 0)]
        with m.If(self.i_stream.valid & self.i_stream.ready):
            m.d.sync += [shift.eq(Cat(0, self.i_stream.payload, 1)), bits.eq(10),
                         timer.eq(self.divisor - 1)]
        with m.Elif(bits != 0):
            m.d.sync += timer.eq(timer - 1)
            with m.If(timer == 0):
                m.d.sync += [shift.eq(Cat(shift[1:], 1)), bits.eq(bits - 1),
                             timer.eq(self.divisor - 1)]
        return m
