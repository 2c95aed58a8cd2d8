"""Streamed weights: the weight stream (``hw.controller`` ws_*) into the weight buffer."""

from __future__ import annotations

from math import ceil

from sfnpu.config import MAX_KERNEL

from .dram import WEIGHT_READER, CommandArbiter, DmaTiming

__all__ = ["WeightStream"]


class WeightStream:
    """Weights streamed from DRAM (a normal convolution whose weights exceed the store), as
    the controller streams them (``hw.controller``, ws_*): for every output row, each pass's
    set (P steps of Ti·To bytes, contiguous in the layout) in one command, at the top read
    priority, requested once the weight FIFO has room for it counting the steps in flight
    (ws_req: level + outstanding + P ≤ 2·MAX_KERNEL²; the level is a register). The weight
    buffer (``hw.weight_buffer``) takes a set's steps from the FIFO a step per cycle, into a
    bank free from the cycle after the set two before it was released, and replays it from two
    cycles after its last step, ``uses`` times (once per output pixel).

    A set is released as its last word's last replay moves into the buffer's output register,
    the cycle the array takes the word before it: in a pass that runs without a break, the
    cycle before the array takes the pass's last word. A set of one word (one step, one use)
    moves there once it is in its bank and the array has taken the last set's word, however
    long the array then waits for its input: the group's first set as soon as it is in its
    bank, so a third set is taken, and one more set commanded, before any input has arrived."""

    def __init__(self, dma: DmaTiming, dram: CommandArbiter, address: int, blocks: int, ib: int,
                 rows: int, steps: int, uses: int, pass_cycles: int, array=None):
        self.set_bytes = steps * dma.config.ti * dma.config.to
        self.dram, self.address, self.per_row = dram, address, blocks * ib
        self.blocks, self.ib, self.pass_cycles = blocks, ib, pass_cycles
        # the passes' timing when the datapath may hold (ShortcutReader.run_pass)
        self.array = array
        self.total, self.steps = self.per_row * rows, steps
        self.one_word = steps == 1 and uses == 1
        self.word_taken = -1                    # the cycle the array took the last set's word
        self.passed = 0                         # sets whose pass is scheduled
        self.room = 2 * MAX_KERNEL * MAX_KERNEL
        # bus cycles between two steps' last beats within a set's burst
        self.step_cycles = ceil((dma.config.ti * dma.config.to // dma.B) * dma.beat)
        self.handles, self.requests = [], []
        self.taken = []                         # per set: the cycle each step left the FIFO
        self.released = []                      # per set: its last step's last read
        self._request()
        # Both banks are free at the start: the first two sets leave the FIFO as they come,
        # making room for more before any input has arrived.
        for k in range(min(2, self.total)):
            self._take(k)
        self.advance()

    def _request(self):
        """Command every set whose FIFO room is known by now."""
        while len(self.handles) < self.total:
            k = len(self.handles)
            request = self.requests[-1] if self.requests else 0
            need = (k + 1) * self.steps - self.room     # steps that must have left the FIFO
            if need > 0:
                set_, step = divmod(need - 1, self.steps)
                if set_ >= len(self.taken):
                    return
                # The step leaves the FIFO in cycle t, its level register drops in t + 1 and
                # the arbiter grants the set then: t + 2 in the DMA model's cycles, which
                # count a command from the cycle after its grant.
                request = max(request, self.taken[set_][step] + 2)
            self.requests.append(request)
            self.handles.append(self.dram.read(
                request, self.address + (k % self.per_row) * self.set_bytes, self.set_bytes,
                reader=WEIGHT_READER))

    def _take(self, k: int):
        """Set ``k`` into its bank: a step per cycle once it has arrived and the bank is free."""
        self._request()
        done = self.dram.finish(self.handles[k])
        free = self.released[k - 2] + 1 if k >= 2 else 0
        taken, last = [], free - 1
        for i in range(self.steps):
            # step i's last beat (the set's beats move back to back)
            last = max(last + 1, done - 1 - (self.steps - 1 - i) * self.step_cycles)
            taken.append(last)
        self.taken.append(taken)
        self._request()

    def ready(self, k: int) -> int:
        """The first cycle set ``k`` (in pass order) can be replayed."""
        while len(self.taken) <= k:
            self._take(len(self.taken))
        return self.taken[k][-1] + 2

    def advance(self):
        """Take every set whose bank is known to be free (the weight buffer loads the next
        row's first sets while the row's last passes run, whatever the input does)."""
        while True:
            if self.one_word and len(self.released) == self.passed < self.total:
                self.released.append(max(self.ready(self.passed) - 1, self.word_taken))
            elif len(self.taken) < min(len(self.released) + 2, self.total):
                self._take(len(self.taken))
            else:
                return

    def release(self, k: int, pass_end: int):
        """The array takes set ``k``'s last word in ``pass_end``; the set's bank is free
        from the cycle after its release."""
        if not self.one_word:
            self.released.append(pass_end - 1)
            return
        if k == len(self.released):
            self.released.append(max(self.ready(k) - 1, self.word_taken))
        self.word_taken, self.passed = pass_end, k + 1

    def passes(self, oy: int, start: int):
        """The end of each output block's last pass in output row ``oy`` (which may start at
        ``start``): each pass runs once its set can be replayed (behind an ADD, and while
        the datapath does not hold: ``array``). A generator, so that what a block's end sets
        off (its writes) is submitted before the next sets are waited for."""
        block_end = start
        for ob in range(self.blocks):
            first = (oy * self.blocks + ob) * self.ib
            for k in range(first, first + self.ib):
                begin = max(block_end, self.ready(k) - 1)
                if self.array is None:
                    block_end = begin + self.pass_cycles
                    self.release(k, block_end)
                else:
                    block_end, before_last = self.array.run_pass(
                        begin, k == first + self.ib - 1, self.advance)
                    # a pass held before its last step releases its set before the hold
                    self.release(k, block_end if self.one_word else before_last + 1)
            yield block_end

    @property
    def read_bytes(self) -> int:
        """Every set, once per output row."""
        return self.total * self.set_bytes
