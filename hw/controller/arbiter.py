"""Command arbiter: the DMA engine's one command port shared by the controller's agents."""

from __future__ import annotations

from amaranth.hdl import Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..dma import Direction

__all__ = ["CommandArbiter", "PRIORITY"]

#: Requesters of the compute phase, highest priority first: output writes (they free room in
#: the write buffer), streamed weights, shortcut, input, weight prefetch.
PRIORITY = ("write", "weights", "shortcut", "input", "prefetch")


class CommandArbiter(wiring.Component):
    """Fixed-priority selection of DMA commands.

    In the compute phase the highest-priority requester with a valid command drives ``cmd``
    and takes its ``ready``; outside it the control sequencer's ``control`` stream does. The
    choice is combinational: a requester's command is granted (``valid & ready``) in the
    cycle the DMA engine accepts it.

    Parameters
    ----------
    cmd_layout : Layout
        The DMA command (:func:`sfnpu.hw.dma.command_layout`).
    priority : tuple of str
        The compute phase's requesters, highest priority first.

    Signature
    ---------
    <name> : In(stream.Signature(cmd_layout)), one per ``priority`` entry
        A requester's commands (compute phase).
    control : In(stream.Signature(cmd_layout))
        The sequencer's commands (outside the compute phase).
    compute : In(1)
        The compute phase: requesters, not ``control``, reach ``cmd``.
    takes_read, takes_write : In(1)
        ``cmd.ready`` for a command of each direction (the DMA's): a requester's ready
        follows its own command's direction, not the selected one's, so the selection is
        not in front of the grants (``cmd.ready`` is the same value).
    cmd : Out(stream.Signature(cmd_layout))
        To the DMA engine.
    """

    def __init__(self, cmd_layout, priority=PRIORITY):
        self.priority = tuple(priority)
        members = {name: In(stream.Signature(cmd_layout)) for name in self.priority}
        members.update({
            "control": In(stream.Signature(cmd_layout)),
            "compute": In(1),
            "cmd": Out(stream.Signature(cmd_layout)),
            "takes_read": In(1),
            "takes_write": In(1),
        })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cmd = self.cmd
        with m.If(self.compute):
            for k, name in enumerate(self.priority):
                request = getattr(self, name)
                with (m.If if k == 0 else m.Elif)(request.valid):
                    m.d.comb += [cmd.valid.eq(1), cmd.payload.eq(request.payload),
                                 request.ready.eq(self._takes(request))]
        with m.Else():
            m.d.comb += [cmd.valid.eq(self.control.valid), cmd.payload.eq(self.control.payload),
                         self.control.ready.eq(self._takes(self.control))]
        return m

    def _takes(self, request):
        return Mux(request.payload.direction == Direction.WRITE, self.takes_write,
                   self.takes_read)
