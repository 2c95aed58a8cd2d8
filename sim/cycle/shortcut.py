"""The shortcut reader (``hw.controller`` sc_*): the residual operand of an ADD, segment by
segment, or a CHANNEL_SCALE's vector once."""

from __future__ import annotations

from bisect import bisect_right
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
    − psum_words shortcut words. The ADD takes a word with its result, so the segments are
    commanded as the results' timing becomes known: a conv row's at once (:meth:`row_timed`),
    or, when the weights stream, pass by pass (:meth:`run_pass`) — a row may hold more words
    than the FIFO, and its later segments must be read before its later blocks can pass the
    ADD. CHANNEL_SCALE reads its vector once, before the first result needs it
    (:attr:`scale_ready`).

    Streamed weights: the array's passes wait on the weight stream, which takes the bus first,
    so the shortcut's segments can fall behind the results. The results then wait in the
    result FIFO, and the datapath holds (hw.controller: result_fifo.level + in_flight ≥
    result_fifo_depth) until the ADD has taken enough of them: :meth:`run_pass` times each
    pass with that hold."""

    def __init__(self, model: CycleModel, plan: ChunkPlan, dram: CommandArbiter):
        from sfnpu.hw.act_table import ActivationTable
        from sfnpu.hw.controller import result_fifo_depth, results_in_flight

        instr, s, L = plan.instr, plan.s, model.L
        self.plan, self.dram = plan, dram
        self.in_dram = instr.shortcut.space == MemSpace.DRAM
        # ADD: the residual tensor's pitches; CHANNEL_SCALE: the vector, read whole from the
        # chunk's first block
        self.plane, self.pitch = plan.geo.sc_plane, plan.geo.sc_row
        self.address = plan.base + instr.shortcut.offset + plan.ob_base * self.plane
        self.segments = s.conv_h * plan.obs if plan.reads_map else 0
        self.segment = []       # per segment: its DRAM read, or the local reader's end
        self.local_free = 0     # the on-chip shortcut reader
        self.rows = []          # per conv row: start, last step before a hold, the hold
        self.streamed = plan.s.streaming
        self.steps = []         # streamed: each result's step (result order), as it ran
        self.takes = []         # streamed: the cycle the ADD takes each result
        self.timed = 0          # result words (result order) whose timing is known
        self.deferred = False   # a command waits for a segment's end (streamed)
        self.psum_words = model.psum_words
        self.L = L
        # A result reaches the ADD a cycle after the result FIFO, behind a table before it.
        self.table_before = ActivationTable.LATENCY if instr.act == Activation.TABLE \
            and instr.act_order == ActOrder.BEFORE_ELTWISE else 0
        self.to_add = model.result_latency + 1 + self.table_before
        self.word_cycles = ceil((L // model.B) * model.beat)      # bus cycles of one word
        self.word_beats = L // model.B
        # The datapath holds while the result FIFO holds hold_level results or more.
        self.hold_level = result_fifo_depth(model.config) - results_in_flight(model.config)
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
        if self.streamed:
            result = self.steps[word] + self.to_add      # its step, as the pass ran
        else:
            step = (ob * s.ib + s.ib - 1) * plan.pass_cycles + plan.first_step \
                + x * plan.pixel_step
            start, held, hold = self.rows[r]
            result = start + step + (hold if step > held else 0) + self.to_add
        if self.streamed and self.in_dram:
            # The cycle of the word's last beat (write beats may come between a segment's
            # words): the ADD takes it in the next, and these cycles are a cycle before the
            # ADD's (a result's: its step + to_add).
            arrived = self.dram.beat_cycle(self.segment[r * plan.obs + ob],
                                           (x + 1) * self.word_beats - 1)
        else:
            behind = s.conv_w - 1 - x                    # later words of its segment
            arrived = self.arrival(r * plan.obs + ob) \
                - behind * (self.word_cycles if self.in_dram else 1)
        return max(result, arrived)

    def command(self):
        """Command the segments whose FIFO room the ADD has made with the results timed so
        far."""
        conv_w, obs = self.plan.s.conv_w, self.plan.obs
        while len(self.segment) < self.segments:
            taken = (len(self.segment) + 1) * conv_w - self.psum_words
            if taken > self.timed or self.deferred:
                return
            if self.streamed and taken > 0 and not self._known(taken - 1):
                # its room is made once the word's segment is in: command it then, not by
                # running the bus ahead to it (the weight stream's requests until then are
                # not all known)
                self.deferred = True
                self.dram.when_done(self.segment[(taken - 1) // conv_w], self._deferred)
                return
            # the FIFO level and sc_outstanding are registers: room shows a cycle later
            request = self.taken(taken - 1) + 1 if taken > 0 else 0
            if self.in_dram:
                oy, ob = divmod(len(self.segment), obs)
                address = self.address + ob * self.plane + oy * self.pitch
                self.segment.append(self.dram.read(request, address, conv_w * self.L, 1, 0,
                                                   SHORTCUT_READER, beats=self.streamed))
            else:
                # the local reader: granted when idle, a word per cycle from the next one
                self.local_free = max(self.local_free, request) + conv_w + 1
                self.segment.append(self.local_free)

    def _deferred(self):
        """The segment a deferred command waited for is in."""
        self.deferred = False
        self.command()

    def row_timed(self, timing: tuple[int, int, int]):
        """The next conv row's array timing is known (start, last step before a hold, the
        hold): command the segments it makes room for. (A streamed row's passes are timed
        already, :meth:`run_pass`.)"""
        if not self.streamed:
            self.rows.append(timing)
            self.timed = len(self.rows) * self.plan.row_results
            self.command()

    # -- streamed weights: the datapath's hold ----------------------------------------------

    def _take(self, m: int) -> int:
        """:meth:`taken` of result ``m`` (its step is timed), computed once."""
        while len(self.takes) <= m:
            self.takes.append(self.taken(len(self.takes)))
        return self.takes[m]

    def _known(self, m: int) -> bool:
        """Whether result ``m``'s take is known without running the bus ahead."""
        if m < len(self.takes) or not self.in_dram:
            return True
        return self.segment[m // self.plan.s.conv_w] in self.dram.done

    def _resume(self, t: int) -> int:
        """The first cycle from ``t`` on in which the array may take a step: it takes none in
        cycle t while the results in the result FIFO by t + 1 (a result is in to_add cycles
        after its step), less those the ADD has taken by t, are hold_level or more (the hold
        is a comparison of the FIFO's level register, two cycles ahead of the array's step
        in these terms)."""
        steps, to_add, level = self.steps, self.to_add, self.hold_level
        landed = bisect_right(steps, t + 1 - to_add)
        while landed >= level:
            take = self._take(landed - level)
            if take <= t:
                break
            t = take
            landed = bisect_right(steps, t + 1 - to_add)
        return t

    def run_pass(self, start: int, results: bool, waits=None) -> tuple[int, int]:
        """A pass of the array over a streamed conv row, which may start at ``start`` and
        stops while the datapath holds; ``results``: it is its block's last (its pixels'
        results go to the ADD). Returns the cycle after its last step and the cycle after
        the step before it (its set's release follows that step). ``waits()`` runs before
        the pass may wait for the ADD: the weight stream takes the sets it can before the
        bus is run ahead to a late shortcut segment."""
        plan = self.plan
        n, first, pixel = plan.pass_cycles, plan.first_step, plan.pixel_step
        conv_w = plan.s.conv_w
        # Free run unless the FIFO could reach the hold level before the pass ends: the ADD
        # has taken all but hold_level − 1 of its results (this pass's too) before it starts.
        m = len(self.steps) + (conv_w if results else 0) - self.hold_level
        if m < 0 or (m < len(self.steps) and self._known(m) and self._take(m) < start):
            if results:
                self.steps += [start + first + x * pixel for x in range(conv_w)]
                self._timed()
            return start + n, start + n - 1
        if waits is not None:
            waits()
        # Step by step, a step per cycle (the array's pace unless fetching a window outlasts
        # the steps of a pixel).
        t = before = start
        for i in range(n):
            t = self._resume(t)
            if results and i >= first and (i - first) % pixel == 0:
                self.steps.append(t)
            if i == n - 2:
                before = t
            t += 1
        if results:
            self._timed()
        return t, before + 1 if n > 1 else t

    def _timed(self):
        """A pass's results are timed: command the segments their takes make room for."""
        self.timed = len(self.steps)
        self.command()

    @property
    def read_bytes(self) -> int:
        if not self.in_dram:
            return 0
        if self.plan.reads_map:
            return self.plan.row_results * self.L * self.plan.s.conv_h
        return self.plan.obs * self.L if self.plan.instr.eltwise == Eltwise.CHANNEL_SCALE else 0
