"""The post-processing chain behind the array (``hw.datapath``): the result FIFO, activation
table, ADD or CHANNEL_SCALE, the pools and the upsampler, into the write buffer.

It passes one word per cycle, except the global average pool (one requantiser for every lane
of a block) and the average pool (its own schedule, :class:`~.avg_pool.AvgPool`), pooled row
by pooled row as the array's conv rows are out, and hands each row's words to the output
writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sfnpu.isa import Activation, Eltwise, Instruction, Pool, eltwise_multiplies

from .avg_pool import AvgPool
from .output_writer import OutputWriter
from .shape import ChunkPlan
from .shortcut import ShortcutReader
from .upsample import Upsampler

if TYPE_CHECKING:
    from .model import CycleModel

__all__ = ["PostChain", "post_latency", "gap_outputs"]


def post_latency(instr: Instruction) -> int:
    """Pipeline depth of the enabled post-processing stages."""
    from sfnpu.hw.act_table import ActivationTable
    from sfnpu.hw.chscale import ChannelScale
    from sfnpu.hw.eltwise_add import EltwiseAdd
    from sfnpu.hw.controller.post import PostChain
    from sfnpu.hw.maxpool import MaxPool
    from sfnpu.hw.stream_register import StreamRegister

    # result FIFO, write FIFO, the registers behind the element-wise stage and the clamp
    depth = 2 + PostChain.STREAM_REGISTERS * StreamRegister.LATENCY
    if instr.act == Activation.TABLE:
        depth += ActivationTable.LATENCY
    if instr.eltwise == Eltwise.ADD:
        depth += EltwiseAdd.LATENCY
    elif eltwise_multiplies(instr.eltwise):
        depth += ChannelScale.LATENCY
    if instr.pool == Pool.MAX:
        depth += MaxPool.LATENCY
    return depth


def gap_outputs(lanes: int, obs: int, block_cycles: int) -> list[int]:
    """The cycle each block's GlobalAvgPool output is ready, from the cycle the last
    block's last result leaves the array. A block's last beat is added to its sums
    INPUT_LATENCY cycles after it is taken, or — waiting in the input register — the cycle
    after the previous block's output has left; the sums are then fed to the one
    requantiser lane by lane, and the output is ready output_latency − INPUT_LATENCY cycles
    after the addition. The last row's blocks arrive block_cycles apart."""
    from sfnpu.hw.gap import GlobalAvgPool

    summed_to_output = GlobalAvgPool.output_latency(lanes) - GlobalAvgPool.INPUT_LATENCY
    outputs = []
    for b in range(obs):
        summed = -(obs - 1 - b) * block_cycles + GlobalAvgPool.INPUT_LATENCY
        if outputs:
            summed = max(summed, outputs[-1] + 1)
        outputs.append(summed + summed_to_output)
    return outputs


def _window_ends(size: int, out: int, k: int, stride: int, pad: int) -> list[int]:
    """Per output position of one axis, the input position whose arrival completes its
    window in :class:`sfnpu.hw.maxpool.MaxPool`: window *o*'s last position
    ``o·stride − pad + k − 1``, clipped to the input. Windows that end at the last position or
    beyond (padding, ceil mode) complete together; the first of them goes out with the
    arriving element, each later one costs the stage a cycle of its own with no input."""
    return [min(o * stride - pad + k - 1, size - 1) for o in range(out)]


class PostChain:
    """The chain's pace, pooled row by pooled row (:attr:`py`; :attr:`post`: the cycle its
    last word passed), behind the array's conv rows (:attr:`results`: the cycle each row's
    last result, with its shortcut, is in the result FIFO)."""

    def __init__(self, model: CycleModel, plan: ChunkPlan, shortcut: ShortcutReader,
                 writer: OutputWriter):
        instr = plan.instr
        self.plan, self.shortcut, self.writer, self.L = plan, shortcut, writer, model.L
        self.result_latency = model.result_latency
        self.latency = writer.latency
        self.pool_size, self.pool_stride, self.pool_pad = (
            instr.pool_size, instr.pool_stride, instr.pool_pad) if instr.pool == Pool.MAX \
            else (1, 1, 0)
        self.avg = AvgPool(model, plan, self.latency - 2) if instr.pool == Pool.AVG else None
        self.upsampler = Upsampler(plan, writer) if instr.upsample else None
        self.results = []
        self.py = 0                     # the next pooled row
        self.post = 0                   # the chain's last word (the upsampler's replay)
        if instr.pool == Pool.MAX:
            # The max pool's horizontal stage: the conv column completing each pooled column's
            # window, and the cycles per segment (a row of one block) in which it emits
            # windows from stored pixels with no input (stride 1 with padding: the last
            # ``pad`` windows; ceil mode). It takes a pixel per cycle otherwise, so a segment
            # occupies it for conv_w + pool_extra cycles: with a result per cycle
            # (pixel_step 1) the pool, not the array, sets the pace.
            self.pool_ends = _window_ends(plan.s.conv_w, plan.pooled_w, self.pool_size,
                                          self.pool_stride, self.pool_pad)
            self.pool_extra = max(self.pool_ends.count(plan.s.conv_w - 1) - 1, 0)
        self.pool_time = 0              # the max pool's last cycle on the conv rows it took
        self.pool_rows = 0              # conv rows the max pool took

    def take_row(self, oy: int, start: int, end: int):
        """The array ran conv row ``oy`` from ``start`` to ``end``: its results (with their
        shortcut words) enter the chain, and the pooled rows they complete pass it."""
        plan = self.plan
        ready = end + self.result_latency
        if self.shortcut.segments:
            timing = self.avg.rows[-1] if self.avg is not None else (start, plan.row, 0)
            self.shortcut.row_timed(timing)
            # (the writer has a streamed row's writes, each block's behind its shortcut:
            # the bus is not run ahead to the row's last segment)
            if not (self.writer.streamed and self.writer.out_dram):
                ready = max(ready, self.shortcut.arrival((oy + 1) * plan.obs - 1) + 1)
        self.results.append(max(ready, self.shortcut.scale_ready))
        if self.avg is not None:
            self._avg_rows(oy)
            return
        while self.py < plan.pooled_h:
            need, cost = self.row_cost(self.py)
            if need > oy:
                break
            self._pass_row(need, cost)
            self.py += 1

    def row_cost(self, py: int) -> tuple[int, int]:
        """(last conv row needed, cycles) of pooled row ``py`` in the chain."""
        plan, instr, s = self.plan, self.plan.instr, self.plan.s
        obs = plan.obs
        words = obs * s.conv_w                             # one conv row
        up = 4 if instr.upsample else 1
        if instr.pool == Pool.NONE:
            return py, max(words, up * obs * plan.pooled_w)
        if instr.pool == Pool.GLOBAL_AVG:
            return s.conv_h - 1, gap_outputs(self.L, obs, plan.block_cycles)[-1]
        k, stride, pad = instr.pool_size, instr.pool_stride, instr.pool_pad
        first = py * stride - pad
        need = min(first + k, s.conv_h) - 1
        previous = min((py - 1) * stride - pad + k, s.conv_h) if py else 0
        new_rows = need + 1 - previous
        return need, max(new_rows * words, up * obs * plan.pooled_w)          # Pool.MAX

    def _avg_rows(self, computed: int):
        """The average pool's output rows completed by the conv rows up to ``computed``."""
        obs, pooled_w, writer, latency = self.plan.obs, self.plan.pooled_w, self.writer, \
            self.latency
        for done, span, words in self.avg.advance(computed, self.results):
            if self.upsampler is not None:
                # the pool's words leave it ``latency`` before the write buffer
                self.post, readies = self.upsampler.row(self.post, [
                    [w - latency for w in words[ob * pooled_w:(ob + 1) * pooled_w]]
                    for ob in range(obs)])
                writer.write_row(self.post + latency, span, readies)
            else:
                # a block's chunk is ready with its last window's word
                readies = [words[ob * pooled_w + min((c + 1) * writer.chunk, pooled_w) - 1]
                           for ob in range(obs) for c in range(writer.per_block)]
                writer.write_row(done, span, readies)

    def _pass_row(self, need: int, cost: int):
        """Pooled row :attr:`py`, its last conv row ``need``, through the chain (``cost``
        cycles at its pace) into the writer."""
        plan, instr, writer, latency = self.plan, self.plan.instr, self.writer, self.latency
        obs, results = plan.obs, self.results
        readies = writer.streamed_readies.get(self.py)
        # A max-pooled row with conv rows the pool has not taken yet goes out at the pool's
        # own pace (pool_emits); the rows after the input's last (windows in the bottom
        # padding) are passes over the stored rows, a pooled word per cycle.
        takes = instr.pool == Pool.MAX and need >= self.pool_rows
        if instr.pool == Pool.GLOBAL_AVG:
            self.post = max(self.post, results[need]) + cost
            if readies is None:
                # each block's words are in the write buffer as its output leaves
                readies = [self.post - cost + o + latency
                           for o in gap_outputs(self.L, obs, plan.block_cycles)
                           for _ in range(writer.per_block)]
        elif self.upsampler is not None:
            self.post, readies = self.upsampler.row(self.post, self.pooled_arrivals(need))
        elif takes:
            emits = self.pool_emits(need)
            self.post = self.pool_time
            # a chunk is in the write buffer once its last word has passed the pool
            readies = [emits[ob][min((c + 1) * writer.chunk, plan.pooled_w) - 1] + latency
                       for ob in range(obs) for c in range(writer.per_block)]
        elif instr.pool == Pool.MAX:
            # a pass over the stored rows: its words leave a block after another, one per
            # cycle, right after the pool's last word
            self.post += cost
            readies = [self.post + latency - (obs - 1 - ob) * plan.pooled_w
                       - (plan.pooled_w - min((c + 1) * writer.chunk, plan.pooled_w))
                       for ob in range(obs) for c in range(writer.per_block)]
        else:
            chained = self.post + cost           # the chain's pace, when it is behind
            self.post = max(chained, results[need])
        # Unpooled and max-pooled words follow the last conv row's results, which leave the
        # array over the whole row (a block's in its last input-block pass): its segments
        # complete over the row, for either writer. (The rows before it pass the pool
        # without output.)
        span = max(obs * plan.s.conv_w, plan.row) if instr.pool in (Pool.NONE, Pool.MAX) \
            else cost
        if readies is None and instr.pool == Pool.NONE and not instr.upsample \
                and not plan.s.streaming and writer.per_block > 1:
            # A chunk is ready when its last pixel's result has passed (the writer's o_req:
            # write_fifo.level ≥ o_committed + o_chunk), its block's results leaving in the
            # block's last pass, a pixel every pixel_step cycles.
            readies = [self.post + latency - (obs - 1 - ob) * plan.block_cycles
                       - writer.chunk_lag(c)
                       for ob in range(obs) for c in range(writer.per_block)]
        writer.write_row(self.post + latency, span, readies)

    def pool_emits(self, need: int) -> list[list[int]]:
        """The max pool takes the conv rows up to ``need``: the cycle it emits each pooled
        column's window of row ``need``, per block (in the results' time: a word in the
        result FIFO at cycle t passes the chain unimpeded at t).

        Its horizontal stage (:class:`sfnpu.hw.maxpool.MaxPool`) takes a row's segments (one
        per block, a block's pixels in its last pass, a pixel every pixel_step cycles, the
        row's last at ``results[r]``) a pixel per cycle as they arrive; a window goes out as
        its last pixel is taken, and the windows after the first that end at the segment's
        last pixel one per cycle after it, with no input (:attr:`pool_extra`). The next
        segment's first pixel is taken only after that."""
        plan, ends = self.plan, self.pool_ends
        width, obs, step = plan.s.conv_w, plan.obs, plan.pixel_step
        at_end = ends.index(width - 1) if width - 1 in ends else len(ends)
        for r in range(self.pool_rows, need + 1):
            emits = []
            for ob in range(obs):
                last = self.results[r] - (obs - 1 - ob) * plan.block_cycles
                start = self.pool_time           # the stage's last cycle on earlier pixels
                # pixel e is taken once it has arrived and the pixels before it are taken
                emits.append([max(start + 1 + e, last - (width - 1 - e) * step)
                              + max(px - at_end, 0) for px, e in enumerate(ends)])
                self.pool_time = max(start + width, last) + self.pool_extra
        self.pool_rows = need + 1
        return emits

    def pooled_arrivals(self, need: int) -> list[list[int]]:
        """When each word of a pooled row reaches the upsampler, its last conv row being
        ``need``: a pooled word follows its window's last column's result, a block's in
        its last pass (at the max pool's pace, :meth:`pool_emits`), and with an ADD the
        shortcut word too."""
        plan, obs, conv_w = self.plan, self.plan.obs, self.plan.s.conv_w
        if plan.instr.pool == Pool.MAX and need >= self.pool_rows:
            return self.pool_emits(need)
        last = self.results[need]
        columns = [min(px * self.pool_stride - self.pool_pad + self.pool_size, conv_w) - 1
                   for px in range(plan.pooled_w)]
        if self.shortcut.segments and plan.instr.pool == Pool.NONE:
            # (the chain's latency counts a table in front of the ADD; the take is behind it)
            behind = self.shortcut.table_before
            return [[self.shortcut.taken(need * plan.row_results + ob * conv_w + x) - behind
                     for x in columns] for ob in range(obs)]
        return [[last - (obs - 1 - ob) * plan.block_cycles - (conv_w - 1 - x) * plan.pixel_step
                 for x in columns] for ob in range(obs)]
