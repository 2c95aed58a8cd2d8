"""The shortcut reader (``hw.controller`` sc_*): the residual operand of an ADD, segment by
segment, or a CHANNEL_SCALE's vector once."""

from __future__ import annotations

from math import ceil
from typing import TYPE_CHECKING

from sfnpu.isa import Activation, ActOrder, Eltwise, MemSpace

from .dram import SHORTCUT_READER, CommandArbiter
from .shape import ChunkPlan

if TYPE_CHECKING:
    from .model import CycleModel

__all__ = ["ShortcutReader"]


class ShortcutReader:
    """ADD: the reader commands one (oy, ob) segment of conv_w words at a time, in the result
    order, once the shortcut FIFO has room for it counting the words in flight (sc_req: level
    + sc_outstanding + conv_w ≤ psum_words) — segment k once the ADD has taken (k + 1)·conv_w
    − psum_words shortcut words. CHANNEL_SCALE reads its vector once, before the first result
    needs it (:attr:`scale_ready`)."""

    def __init__(self, model: CycleModel, plan: ChunkPlan, dram: CommandArbiter):
        from sfnpu.hw.act_table import ActivationTable

        instr, s, L = plan.instr, plan.s, model.L
        self.plan, self.dram = plan, dram
        self.in_dram = instr.shortcut.space == MemSpace.DRAM
        # ADD: the residual tensor's pitches; CHANNEL_SCALE: the vector, read whole from the
        # chunk's first block
        self.plane, self.pitch = plan.geo.sc_plane, plan.geo.sc_row
        self.address = plan.base + instr.shortcut.offset + plan.ob_base * self.plane
        self.segments = s.conv_h * plan.obs if plan.is_add else 0
        self.segment = []       # per segment: its DRAM read, or the local reader's end
        self.local_free = 0     # the on-chip shortcut reader
        self.rows = []          # per conv row: start, last step before a hold, the hold
        self.psum_words = model.psum_words
        self.L = L
        # A result reaches the ADD a cycle after the result FIFO, behind a table before it.
        self.to_add = model.result_latency + 1 + (
            ActivationTable.LATENCY if instr.act == Activation.TABLE
            and instr.act_order == ActOrder.BEFORE_ELTWISE else 0)
        self.word_cycles = ceil((L // model.B) * model.beat)      # bus cycles of one word
        self.scale_ready = 0
        if instr.eltwise == Eltwise.CHANNEL_SCALE:
            self.scale_ready = dram.finish(dram.read(0, self.address, plan.obs * L, 1, 0,
                                                     SHORTCUT_READER)) if self.in_dram \
                else 1 + model.issue + plan.obs
        self.command()

    def arrival(self, k: int) -> int:
        """The cycle after segment ``k``'s last word is in the shortcut FIFO (its read's
        end: the local reader's)."""
        segment = self.segment[k]
        return self.dram.finish(segment) if self.in_dram else segment

    def taken(self, word: int) -> int:
        """The cycle the ADD takes shortcut word ``word`` (result order): with its result,
        once the word is in the shortcut FIFO."""
        plan, s = self.plan, self.plan.s
        r, i = divmod(word, plan.row_results)
        ob, x = divmod(i, s.conv_w)
        step = (ob * s.ib + s.ib - 1) * plan.pass_cycles + plan.first_step + x * plan.pixel_step
        start, held, hold = self.rows[r]
        result = start + step + (hold if step > held else 0) + self.to_add
        behind = s.conv_w - 1 - x                        # later words of its segment
        arrived = self.arrival(r * plan.obs + ob) \
            - behind * (self.word_cycles if self.in_dram else 1)
        return max(result, arrived)

    def command(self):
        """Command the segments whose FIFO room the ADD has made in the rows timed so far."""
        conv_w, obs = self.plan.s.conv_w, self.plan.obs
        while len(self.segment) < self.segments:
            taken = (len(self.segment) + 1) * conv_w - self.psum_words
            if taken > len(self.rows) * self.plan.row_results:
                return
            # the FIFO level and sc_outstanding are registers: room shows a cycle later
            request = self.taken(taken - 1) + 1 if taken > 0 else 0
            if self.in_dram:
                oy, ob = divmod(len(self.segment), obs)
                address = self.address + ob * self.plane + oy * self.pitch
                self.segment.append(self.dram.read(request, address, conv_w * self.L, 1, 0,
                                                   SHORTCUT_READER))
            else:
                # the local reader: granted when idle, a word per cycle from the next one
                self.local_free = max(self.local_free, request) + conv_w + 1
                self.segment.append(self.local_free)

    def row_timed(self, oy: int, timing: tuple[int, int, int]) -> int:
        """Conv row ``oy``'s array timing is known (start, last step before a hold, the
        hold): command the segments it makes room for; the cycle after the row's last
        segment is in."""
        self.rows.append(timing)
        self.command()
        return self.arrival(oy * self.plan.obs + self.plan.obs - 1)

    @property
    def read_bytes(self) -> int:
        if not self.in_dram:
            return 0
        if self.plan.is_add:
            return self.plan.row_results * self.L * self.plan.s.conv_h
        return self.plan.obs * self.L if self.plan.instr.eltwise == Eltwise.CHANNEL_SCALE else 0
