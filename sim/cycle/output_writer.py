"""The output writer (``hw.controller`` o_*): one write per chunk of a row segment, issued once
the write buffer holds the whole chunk; on chip, the local writer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from sfnpu.isa import MemSpace, Pool

from .dram import CommandArbiter
from .shape import ChunkPlan
from .shortcut import ShortcutReader

if TYPE_CHECKING:
    from .model import CycleModel

__all__ = ["OutputWriter"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class OutputWriter:
    """The writes of the output rows as they leave the post-processing chain (``latency``: its
    depth), in the controller's order: the chunks of a segment, then the blocks, then the
    output rows of a pooled row. :attr:`last_write` is the local writer's last word."""

    def __init__(self, model: CycleModel, plan: ChunkPlan, dram: CommandArbiter,
                 shortcut: ShortcutReader, latency: int):
        from sfnpu.hw.gap import GlobalAvgPool

        instr, obs, L = plan.instr, plan.obs, model.L
        self.plan, self.dram, self.shortcut, self.latency, self.L = plan, dram, shortcut, \
            latency, L
        self.result_latency = model.result_latency
        self.out_dram = instr.output.space == MemSpace.DRAM
        self.chunk = min(instr.out_w, max(1, model.write_words // 2))
        self.rows_out = instr.out_h // plan.pooled_h          # 2 with upsampling
        self.per_block = _ceil_div(instr.out_w, self.chunk)   # segments of a block's row
        self.commands = obs * self.per_block * self.rows_out
        self.last_segment = (instr.out_w - self.chunk * (self.per_block - 1)) * L
        self.plane, self.pitch = plan.geo.out_plane, plan.geo.out_row
        self.first = plan.base + instr.output.offset \
            + (instr.out_c_offset // L + plan.ob_base) * self.plane
        # A streamed row's blocks finish as their weights arrive, far apart: each block's
        # writes are commanded as its results leave (before the bus simulation goes past
        # them; behind an ADD, once the block's shortcut segment is in), and the row's
        # post-chain pass only times them.
        self.streamed = plan.s.streaming and instr.pool in (Pool.NONE, Pool.GLOBAL_AVG) \
            and not instr.upsample
        # GlobalAvgPool: a block's output follows its last conv row's sums (PostChain)
        self.gap_output = GlobalAvgPool.output_latency(L) if instr.pool == Pool.GLOBAL_AVG \
            else 0
        self.streamed_readies = {}      # pooled row → its streamed chunks' ready cycles
        self.rows_written = 0           # pooled rows commanded
        # the write buffer (hw.controller.writer): its words, and the bus beats of one
        self.buffer_words, self.word_beats = model.write_words, L // model.B
        self.words_commanded = 0        # words of the DRAM writes submitted so far
        self.last_write = 0

    def _write(self, ready: int, address: int, nbytes: int):
        """Command a DRAM write of ``nbytes`` whose words are in the write buffer at
        ``ready`` (the chunk is commanded once its last word is in) — or later: a word
        enters the write buffer (``buffer_words`` deep) only once the word that many before
        it has left with its last bus beat, so the post chain waits on a full buffer."""
        self.words_commanded += nbytes // self.L
        full = self.words_commanded - self.buffer_words      # words that must have left
        gate = full * self.word_beats - 1 if full > 0 else None
        self.dram.write(ready, address, nbytes, gate)

    def address(self, k: int) -> int:
        """Address of write command k of a pooled row (controller order: chunks of a
        segment, then blocks, then the output rows of the pooled row)."""
        obs, per_block = self.plan.obs, self.per_block
        sub, rest = divmod(k, obs * per_block)
        ob, c = divmod(rest, per_block)
        oy = self.rows_written * self.rows_out + sub
        return self.first + ob * self.plane + oy * self.pitch + c * self.chunk * self.L

    def write_row(self, done: int, span: int, readies: list[int] | None = None):
        """Command the writes of a pooled row whose last word is in the write buffer at
        ``done``, its words having entered over ``span`` cycles (or chunk k's at
        ``readies[k]``). A streamed row's DRAM writes are already commanded (block by
        block, :meth:`write_block`)."""
        commands, chunk, L = self.commands, self.chunk, self.L
        if self.out_dram:
            # segments complete evenly over the row; each is commanded once its
            # words are in the write buffer, the last one when the row is done
            for k in range(commands if not self.streamed else 0):
                ready = readies[k] if readies else done - span + (k + 1) * span // commands
                self._write(ready, self.address(k),
                            self.last_segment if (k + 1) % self.per_block == 0
                            else chunk * L)
        else:
            # The local writer takes a chunk once all its words are in the write
            # buffer and it is idle: a grant cycle, then a word per cycle. Its chunks
            # complete evenly over the row.
            span = max(span, 1)
            for k in range(commands):
                ready = readies[k] if readies \
                    else done - span + _ceil_div((k + 1) * span, commands)
                words = self.last_segment // L \
                    if (k + 1) % (commands // (self.plan.obs * self.rows_out)) == 0 else chunk
                self.last_write = max(self.last_write, ready) + words + 1
        self.rows_written += 1

    def chunk_lag(self, c: int) -> int:
        """Cycles between chunk ``c``'s last pixel and its block's last pixel leaving
        the array (a pixel every pixel_step cycles of the block's last pass)."""
        plan = self.plan
        return (plan.s.conv_w - min((c + 1) * self.chunk, plan.instr.out_w)) * plan.pixel_step

    def write_block(self, oy: int, ob: int, block_end: int) -> list[int]:
        """Block ``ob``'s chunks of row ``oy``, its last pass ending at ``block_end``: chunk
        c is in the write buffer once its last pixel's result has passed the post chain.
        Returns the chunks' ready cycles (they time an on-chip output's writer only). Behind
        an ADD whose shortcut is in DRAM, the writes are submitted once the block's shortcut
        segment is in: its last word may come long after the results (the weight stream takes
        the bus first), and the bus is not run ahead to it."""
        shortcut = self.shortcut
        if self.out_dram and shortcut.segments and shortcut.in_dram:
            self.dram.when_done(shortcut.segment[oy * self.plan.obs + ob],
                                lambda: self._write_block(oy, ob, block_end))
            return []
        return self._write_block(oy, ob, block_end)

    def _write_block(self, oy: int, ob: int, block_end: int) -> list[int]:
        readies = []
        results_out = max(block_end + self.result_latency, self.shortcut.scale_ready)
        if self.shortcut.segments and self.shortcut.in_dram:
            # the ADD passes the block's last result with its shortcut word
            last = (oy * self.plan.obs + ob + 1) * self.plan.s.conv_w - 1
            results_out = max(results_out, self.shortcut.taken(last))
        elif self.shortcut.segments:
            # the ADD passes the block's results as its shortcut words are in
            results_out = max(results_out,
                              self.shortcut.arrival(oy * self.plan.obs + ob) + 1)
        for c in range(self.per_block):
            ready = results_out + self.gap_output + self.latency \
                - (0 if self.gap_output else self.chunk_lag(c))
            readies.append(ready)
            if self.out_dram:
                self._write(ready, self.address(ob * self.per_block + c),
                            self.last_segment if c == self.per_block - 1
                            else self.chunk * self.L)
        return readies

    def streamed_row(self, oy: int, block_ends: Iterable[int]) -> int:
        """A streamed row's blocks, ending at ``block_ends`` (in turn): a block's writes are
        commanded as its last pass ends. The row's end."""
        plan = self.plan
        # the global average's outputs come in the last row only
        writes = self.streamed and (plan.instr.pool == Pool.NONE or oy == plan.s.conv_h - 1)
        readies = []
        for ob, block_end in enumerate(block_ends):
            if writes:
                readies += self.write_block(oy, ob, block_end)
        if writes:
            self.streamed_readies[0 if self.gap_output else oy] = readies
        return block_end

    def done(self) -> int:
        """The compute phase's end as far as the writes go: compute_done follows the last
        write response by one cycle (the last word, for an on-chip output)."""
        return self.dram.drain() + 2 if self.out_dram else self.last_write + 1

    @property
    def write_bytes(self) -> int:
        instr = self.plan.instr
        return self.plan.obs * instr.out_w * self.L * instr.out_h if self.out_dram else 0
