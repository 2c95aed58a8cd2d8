"""The average pool (:class:`sfnpu.hw.avgpool.AvgPool`) behind the array and its hold on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .shape import ChunkPlan

if TYPE_CHECKING:
    from .model import CycleModel

__all__ = ["AvgPool"]


class AvgPool:
    """The average pool (:class:`sfnpu.hw.avgpool.AvgPool`) behind the array, conv row by conv
    row, and the hold it puts on the array.

    Input: the pool takes a conv row a word per cycle once the row is storable (its three line
    buffers keep rows ``max(u, 0)`` … ``+ 2`` of the output row being walked, ``u`` its first
    window row) and once the row's words have come through the post stages ahead of it.

    Walk: a window of ``m`` elements takes ``2m + 6`` cycles from NEXT to its sum (NEXT, an
    element every other cycle, the sum's four stages, its read-out, SUM); the sum waits in SUM
    while the hand-over register is full, and the first divider empties it when idle (one
    division every ``iterations + 2`` cycles). An output row's first window starts once its last row is stored.

    Hold: while the pool walks, the stages ahead of it fill (a word each), then the result
    FIFO up to the datapath's hold level; the array stops ``in_flight`` steps after the step
    whose result reaches that level and steps again once the pool has taken the results that
    landed after it."""

    def __init__(self, model: CycleModel, plan: ChunkPlan, stages: int):
        from sfnpu.hw.avgpool import _MAX_KERNEL, Float32Divider, QuantizeLane, SumLane
        from sfnpu.hw.avgpool import AvgPool as AvgPoolUnit
        from sfnpu.hw.controller import result_fifo_depth, results_in_flight

        instr, s, obs = plan.instr, plan.s, plan.obs
        self.k, self.stride, self.pad = instr.pool_size, instr.pool_stride, instr.pool_pad
        self.obs, self.pooled_w, self.pooled_h = obs, plan.pooled_w, plan.pooled_h
        self.conv_w, self.H, self.W = s.conv_w, s.conv_h, obs * s.conv_w
        self.ib = s.ib
        self.pass_cycles, self.row = plan.pass_cycles, plan.row
        self.first_step = plan.first_step        # a pass's first result: its pixel's last step
        self.pixel_step = plan.pixel_step
        self.in_flight = results_in_flight(model.config)
        self.hold_level = result_fifo_depth(model.config) - self.in_flight
        self.stages = stages                    # post stages ahead of the pool: a word each
        # A step's result: result FIFO (result_latency + 1), the stages, then taken.
        self.to_pool = model.result_latency + stages + 2
        self.divide = Float32Divider.iterations(AvgPoolUnit.DIVIDER_BITS) + 2
        # NEXT → the window's sum: an element every other cycle, its product stages to B,
        # then B, C, the float read-out and SUM.
        self.walk_extra = SumLane.TO_B + 2 + SumLane.READ_OUT
        # The second division's result → the write buffer: the requantiser's stages, the
        # output register, the write buffer.
        self.output_extra = QuantizeLane.LATENCY + 2
        self.line_buffers = _MAX_KERNEL
        self.rows = []                          # per conv row: start, held step, delay
        self.taken = []                         # per conv row: cycle its last word is taken
        self.storable = [0] * min(self.line_buffers, self.H)     # cycle row r may be taken
        self.holds = {}                         # conv row → (word, cycle the pool takes again)
        self.carry = None                       # a hold reaching into the next row
        self.py = 0
        self.sum_ready = -1                     # the last window's sum handed over
        self.division = -self.divide            # the last division's start

    # -- the array -------------------------------------------------------------------------

    def _step(self, word: int) -> int:
        """Step offset in its conv row of the step that completes a word (``ob``, ``x``)."""
        ob, x = divmod(word, self.conv_w)
        return (ob * self.ib + self.ib - 1) * self.pass_cycles + self.first_step \
            + x * self.pixel_step

    def _results(self, a: int, b: int) -> int:
        """Results among a conv row's step offsets ``a`` … ``b``."""
        count = 0
        for ob in range(self.obs):
            base = (ob * self.ib + self.ib - 1) * self.pass_cycles + self.first_step
            lo = max(0, -(-(a - base) // self.pixel_step))
            hi = min(self.conv_w - 1, (b - base) // self.pixel_step)
            count += max(0, hi - lo + 1)
        return count

    def resume_row(self, oy: int, start: int) -> int:
        """The first cycle conv row ``oy`` may start (free run: ``start``): a hold that
        reached into it. Only the steps it took before the hold (cycle ``hold``) land; it
        steps again once the pool has taken them. A row's first step is emitted two cycles
        after its start (hw.row_buffer: o_stream valid from e_m + 1), so a row whose first
        window waited out the hold (the hold withholds o_stream.ready, hw.datapath) starts
        two cycles before the resume."""
        if self.carry is not None:
            hold, takes, landed = self.carry
            self.carry = None
            ahead = hold - start                    # the row's steps before the hold
            if ahead > 0:
                landed += self._results(0, ahead - 1)
            start = max(start, takes + landed + 1 - max(2, ahead))
        return start

    def held_row(self, oy: int, start: int, end: int) -> int:
        """The end of conv row ``oy`` (free run: ``start`` … ``end``) after any hold in it."""
        delay, held = 0, self.row
        if oy in self.holds:
            word, takes = self.holds.pop(oy)
            step = self._step(word)
            if start + step + self.in_flight < takes:
                held = step + self.in_flight        # the last step taken
                landed = self._results(step + 1, min(held, self.row - 1))
                if held + 1 < self.row:
                    # the level drops below the hold level after the landed results are taken
                    delay = max(0, takes + landed + 1 - (start + held + 1))
                else:
                    # the next row's steps before the hold depend on when it may start
                    self.carry = (start + held + 1, takes, landed)
                    held = self.row
        self.rows.append((start, held, delay))
        return end + delay

    # -- the pool --------------------------------------------------------------------------

    def _arrival(self, r: int, step: int) -> int:
        start, held, delay = self.rows[r]
        return start + step + self.to_pool + (delay if step > held else 0)

    def advance(self, computed: int, results: list[int]):
        """Take the conv rows up to ``computed`` (``results``: the cycle each row's last
        result, with its shortcut, is in the result FIFO) and walk the output rows they
        complete: (cycle the row's last word is in the write buffer, cycles its words took,
        the cycle each of its words is in the write buffer), each."""
        out = []
        while True:
            r = len(self.taken)
            while r <= computed and r < len(self.storable):
                begin = max(self.taken[-1] + 1 if r else 0, self.storable[r],
                            self._arrival(r, self._step(0)))
                self.taken.append(max(begin + self.W - 1, results[r] + self.stages + 1))
                r += 1
            if self.py == self.pooled_h:
                return out
            u = self.py * self.stride - self.pad
            need = min(u + self.k, self.H) - 1
            if need >= len(self.taken):
                return out
            rows = need + 1 - max(u, 0)
            walk = next_window = max(self.sum_ready + 1, self.taken[need] + 1)
            ready, division = self.sum_ready, self.division
            words = []
            for _ in range(self.obs):
                for ox in range(self.pooled_w):
                    x0 = ox * self.stride - self.pad
                    m = rows * (min(x0 + self.k, self.conv_w) - max(x0, 0))
                    ready = max(next_window + 2 * m + self.walk_extra, division + 1)
                    division = max(ready + 1, division + self.divide)
                    next_window = ready + 1
                    words.append(division + 2 * self.divide + self.output_extra)
            self.sum_ready, self.division = ready, division
            out.append((words[-1], words[-1] - walk, words))
            # The next output row's buffers, or all rows after the last output row.
            self.py += 1
            if self.py < self.pooled_h:
                first = max(self.py * self.stride - self.pad, 0)
                limit = min(first + self.line_buffers, self.H)
            else:
                limit = self.H
            self.storable += [ready + 1] * (limit - len(self.storable))
            # While this row was walked the FIFO filled beyond the rows it could take.
            word = self.W * min(max(u, 0) + self.line_buffers, self.H) + self.stages \
                + self.hold_level - 1
            if word < self.H * self.W:
                self.holds[word // self.W] = (word % self.W, ready + 1)
