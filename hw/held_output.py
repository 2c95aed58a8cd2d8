"""The output side of a free-running pipeline that behaves, at its ports, like the same
pipeline stalled as a whole by a clock enable.

A pipeline of ``latency`` stages that holds every stage while its output waits needs that
hold on the clock enable of every datapath register: thousands of flip-flops across the
lanes of the element-wise adder and the channel scaler, on the post chain's ready chain.
Here the datapath runs freely and its beats wait in a queue of ``2^⌈log2(latency + 1)⌉``
entries (LUT RAM); ``latency`` valid bits stand for where the held pipeline's beats would be
and advance together, exactly as the held pipeline's stage valids did. So the handshakes —
which cycle a beat enters, which cycle it leaves — are the held pipeline's, cycle for cycle,
while the hold reaches only those bits and the queue's read pointer.

Why the queue suffices: a beat entered in cycle *t* leaves the free-running datapath in
cycle *t + latency*, and the held pipeline shows it at its output in that cycle or later, so
every beat at the held output is in the queue or arriving. The held pipeline holds at most
``latency`` beats, and so does the queue.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["HeldOutput"]


class HeldOutput(wiring.Component):
    """Parameters
    ----------
    width : int
        Bits of a beat.
    latency : int
        Cycles from a beat's entry (``accept``) to the datapath's last register (``payload``).

    Signature
    ---------
    accept : In(1)
        A beat enters the datapath this cycle (only when ``advance``).
    payload : In(width)
        The datapath's last register: the beat that entered ``latency`` cycles ago.
    advance : Out(1)
        The held pipeline would move this cycle: its last stage is empty or being read.
    o_stream : Out(stream.Signature(width))
    """

    def __init__(self, width: int, latency: int):
        if latency < 1:
            raise ValueError(f"latency must be at least 1, not {latency}")
        self.width, self.latency = width, latency
        self.depth = 1 << latency.bit_length()           # ≥ latency + 1: full ≠ empty
        super().__init__({
            "accept": In(1),
            "payload": In(width),
            "advance": Out(1),
            "o_stream": Out(stream.Signature(width)),
        })

    def elaborate(self, platform):
        m = Module()
        n, out = self.latency, self.o_stream

        # Where the held pipeline's beats would be: stage i holds one if held[i].
        held = Signal(n)
        m.d.comb += [out.valid.eq(held[n - 1]),
                     self.advance.eq(~held[n - 1] | out.ready)]
        with m.If(self.advance):
            m.d.sync += held.eq(Cat(self.accept, held[:n - 1]))

        # Where the datapath's beats are: ``accept`` delayed by ``latency``.
        moving = Signal(n)
        m.d.sync += moving.eq(Cat(self.accept, moving[:n - 1]))
        arrived = moving[n - 1]

        m.submodules.queue = queue = Memory(shape=self.width, depth=self.depth, init=[])
        write, read = queue.write_port(), queue.read_port(domain="comb")
        tail = Signal(range(self.depth))
        head = Signal(range(self.depth))
        m.d.comb += [write.addr.eq(tail), write.data.eq(self.payload), write.en.eq(arrived),
                     read.addr.eq(head)]
        m.d.sync += tail.eq(tail + arrived)
        with m.If(out.valid & out.ready):
            m.d.sync += head.eq(head + 1)
        # An empty queue: the beat at the output is the one arriving (written this cycle).
        m.d.comb += out.payload.eq(Mux(head == tail, self.payload, read.data))
        return m
