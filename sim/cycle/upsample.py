"""The 2× upsampler (:mod:`sfnpu.hw.upsample`) at the end of the post chain, and an ADD or MUL in
front of it whose pipeline it freezes (:mod:`sfnpu.hw.eltwise_add`, :mod:`sfnpu.hw.chscale`)."""

from __future__ import annotations

from sfnpu.isa import Pool

from .output_writer import OutputWriter
from .shape import ChunkPlan

__all__ = ["Upsampler"]


class Upsampler:
    """Each pooled row's first copy leaves as its words arrive, each pixel twice in two cycles
    (the input is taken on the second copy), then the replay, a beat per cycle.

    An ADD (or MUL) feeding the upsampler: its pipeline stops as a whole while its output waits (a
    clock enable), so a word waiting out a replay holds the words behind it; :attr:`frozen`
    holds the cycles it stood still, in order. Between the two are the post chain's
    registers (``PostChain.STREAM_REGISTERS``, each a
    :class:`sfnpu.hw.stream_register.StreamRegister`): a register takes a word when it is
    empty or its word moves on in the same cycle, so words wait in them before the ADD stops."""

    def __init__(self, plan: ChunkPlan, writer: OutputWriter):
        from sfnpu.hw.controller.post import PostChain

        self.registers = PostChain.STREAM_REGISTERS
        self.plan, self.writer = plan, writer
        self.frozen = [] if plan.reads_map and plan.instr.pool == Pool.NONE else None
        self.add_latency = plan.eltwise_latency if self.frozen is not None else 0
        self.first_span = 0                 # first frozen span not yet passed
        self.last_accept = 0                # the ADD's last accepted word
        # per register, the cycle its last word moved on (the upsampler's take for the last)
        self.moved_on = [None] * self.registers

    def row(self, post: int, arrivals: list[list[int]]) -> tuple[int, list[int]]:
        """The upsampler on a pooled row whose words arrive at ``arrivals[ob][px]``, the
        previous row's replay having ended at ``post``. Returns the replay's last beat and,
        per write command (the writer's order), its chunk's last beat + the chain's latency:
        a block's first-copy chunks wait for its own results."""
        obs, writer = self.plan.obs, self.writer
        out_w = 2 * self.plan.pooled_w
        first_pass = []                          # each block's beats
        for block in arrivals:
            beats = []
            for arrived in block:
                if self.frozen is None:
                    copy = max(arrived, post + 1)
                else:
                    copy = self.through_registers(self.through_add(arrived), post)
                beats += [copy, copy + 1]
                post = copy + 1
            first_pass.append(beats)
        replay_from = post + 1
        post += obs * out_w
        readies = []
        for sub in range(writer.rows_out):
            for ob in range(obs):
                for c in range(writer.per_block):
                    j = min((c + 1) * writer.chunk, out_w) - 1
                    beat = replay_from + ob * out_w + j if sub else first_pass[ob][j]
                    readies.append(beat + writer.latency)
        return post, readies

    def through_registers(self, arrived: int, post: int) -> int:
        """The first copy of a word that leaves the ADD unimpeded to reach the upsampler at
        ``arrived`` (it shows at the ADD's output :attr:`registers` cycles before), the previous
        replay having ended at ``post``. It moves into each register once that register's
        word moves on (or it is empty), and the upsampler takes it on its second copy; the
        ADD stands still while the word waits at its output."""
        n = self.registers
        ready = arrived - n                 # at the ADD's output
        for k in range(n):
            moved = ready if self.moved_on[k] is None else max(ready, self.moved_on[k])
            if k == 0 and moved > ready:
                # frozen from the word's arrival until the cycle before it moves on
                self.frozen.append((ready + n + self.add_latency,
                                    moved + n + self.add_latency - 1))
            if k:
                self.moved_on[k - 1] = moved
            ready = moved + 1               # in register k from the next cycle
        copy = max(ready, post + 1)
        self.moved_on[n - 1] = copy + 1     # taken with the second copy
        return copy

    def through_add(self, taken: int) -> int:
        """The cycle a word the ADD would take at ``taken`` shows at its output, less
        its latency: it enters after the word before it in a cycle the pipeline moves,
        and reaches the output after LATENCY such cycles."""
        frozen = self.frozen
        a = max(taken, self.last_accept + 1)
        while self.first_span < len(frozen) and frozen[self.first_span][1] < a:
            self.first_span += 1
        spans = frozen[self.first_span:]
        for lo, hi in spans:
            if lo <= a <= hi:
                a = hi + 1
        self.last_accept = a
        t, left = a, self.add_latency
        for lo, hi in spans:
            if hi < t:
                continue
            if lo >= t + left:
                break
            left -= lo - t                      # the cycles it moved before the span
            t = hi + 1
        return t + left - self.add_latency
