"""The input reader (``hw.controller`` in_*) and the row buffer's intake.

Input rows: row *r* enters the FIFO once row *r* − 1 has left it for the row buffer, and the
row buffer (``6 · places`` rows) takes row *r* once the reader's first row is above
*r* − capacity. A segment (one row of one channel block) is commanded once the input FIFO has
room for it counting the words in flight; an on-chip input comes through the local reader.
"""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING

from sfnpu.isa import InputTransform, MemSpace, Pool

from .dram import CommandArbiter
from .shape import ChunkPlan

if TYPE_CHECKING:
    from .model import CycleModel

__all__ = ["InputReader"]


class InputReader:
    """When each input row is in the row buffer, the reader's DRAM commands (or the local
    reader's reads) that bring it, and the row buffer's room for it."""

    def __init__(self, model: CycleModel, plan: ChunkPlan, dram: CommandArbiter):
        from sfnpu.hw.act_table import ActivationTable

        instr, s, L = plan.instr, plan.s, model.L
        self.instr, self.plan, self.dram, self.L = instr, plan, dram, L
        self.row_words_max = model.row_words_max
        self.in_dram = instr.input.space == MemSpace.DRAM
        self.plane = plan.geo.in_plane                      # one channel block to the next
        self.pitch = plan.geo.in_row                        # one row to the next
        self.address = plan.base + instr.input.offset
        self.row_bytes = s.row_words * L                    # one input row, every block
        # The input transform's per-channel table sits between the FIFO and the row buffer.
        self.transform = ActivationTable.LATENCY \
            if instr.in_transform == InputTransform.CHANNEL_TABLE else 0
        # The reader's last read of a row is its last window's last column (hw/row_buffer.py
        # advance_rows, on issue): with f1 ≥ 2 columns a window, fetched faster than its p
        # steps, that window's first column waits in stage 1 until the window before it moves
        # into the hold register (transfer, at the last step of the window two before), and
        # its others follow a cycle apart — 2·p − f1 + 2 cycles before the row's end.
        p, f1 = s.steps, plan.f1
        self.move_lead = 2 * p - f1 + 2 \
            if 2 <= f1 <= p and s.conv_w >= 3 and instr.pool != Pool.AVG else 0
        self.row_in = [0] * instr.in_h          # cycle row r is in the row buffer
        self.in_fifo = [0] * instr.in_h         # cycle (or DRAM read) row r is in the FIFO
        self.reader_moved = []                  # cycle the reader moved to output row oy
        self.next_row = 0                       # the next row to command
        self.next_in = 0                        # the next row to move into the row buffer
        self.local_free = 0                     # the on-chip input reader

    def room(self, r: int) -> int | None:
        """First cycle the row buffer may take row r (the reader has moved past); None while
        not known."""
        capacity, instr = self.plan.capacity, self.instr
        if r < capacity:
            return 0
        oy = 0
        while max(oy * instr.sh - instr.pad_top, 0) + capacity <= r:
            oy += 1
        return self.reader_moved[oy] if oy < len(self.reader_moved) else None

    def _requests(self, r: int) -> list[int] | None:
        """The request cycle of each segment of row ``r``, None while one is not known. A
        segment is commanded when the input FIFO (a row-buffer bank's words) has room for it
        counting the words in flight (in_credit_ok): segment j once (j + 1)·in_w −
        row_words_max words have left the FIFO, the row buffer taking a row's words one per
        cycle from the cycle it may take the row."""
        in_blocks, in_w = self.plan.s.in_blocks, self.instr.in_w
        requests = []
        gates = {}
        for j in range(r * in_blocks, (r + 1) * in_blocks):
            taken = (j + 1) * in_w - self.row_words_max
            if taken <= 0:
                requests.append(0)
                continue
            row_taken, word = divmod(taken - 1, self.plan.s.row_words)
            if row_taken not in gates:
                gates[row_taken] = self.room(row_taken)
            if gates[row_taken] is None:
                return None
            # the FIFO level and in_outstanding are registers: room shows a cycle later
            requests.append(gates[row_taken] + word + 1)
        return requests

    def _command(self, r: int, requests: list[int]):
        """Command row ``r``'s segments (consecutive ones requested together in one DMA
        command, ``plane`` apart)."""
        in_w = self.instr.in_w
        cb = 0
        for request, together in groupby(requests):
            segments = len(list(together))
            if self.in_dram:
                # segments cb … of row r: plane apart
                address = self.address + cb * self.plane + r * self.pitch
                self.in_fifo[r] = self.dram.read(request, address, segments * in_w * self.L,
                                                 segments, self.plane)
                cb += segments
                continue
            # The local reader streams a granted segment a word per cycle, one cycle after
            # the grant, and is granted the next one when it is idle.
            for _ in range(segments):
                self.local_free = max(request, self.local_free) + in_w + 1
            self.in_fifo[r] = self.local_free + 1

    def fetch(self, until: int, move: bool = True):
        """Read rows into the FIFO and (``move``) move them into the row buffer as far as
        the reader's position allows, up to row ``until``."""
        while self.next_row <= until:
            requests = self._requests(self.next_row)
            if requests is None:
                break
            self._command(self.next_row, requests)
            self.next_row += 1
        while move and self.next_in < self.next_row and self.next_in <= until:
            r = self.next_in
            gate = self.room(r)
            if gate is None:
                break
            arrived = self.dram.finish(self.in_fifo[r]) if self.in_dram else self.in_fifo[r]
            self.row_in[r] = max(arrived, self.row_in[r - 1] if r else 0,
                                 gate + self.plan.s.row_words) + 1 + self.transform
            self.next_in += 1

    def row_start(self, oy: int, end: int) -> int:
        """The first cycle conv row ``oy`` may start, the row before it having ended at
        ``end``: once its last input row is in the row buffer. The reader moves on after its
        last read of the previous row, and rows behind the new first row become free then;
        rows that fit behind this one are commanded meanwhile."""
        instr = self.instr
        y_end = min(oy * instr.sh - instr.pad_top + instr.kh, instr.in_h)
        self.reader_moved.append(end - self.move_lead if oy else end)
        self.fetch(y_end - 1)
        start = max(end, self.row_in[y_end - 1] + self.plan.first_fetch + 1)
        self.fetch(min(instr.in_h - 1, max(oy * instr.sh - instr.pad_top, 0)
                       + self.plan.capacity), move=False)
        return start

    def finish(self, end: int) -> int:
        """Input rows below the last window (a stride that steps over them) are read too, and
        the row buffer is busy until it has taken them: the cycle it holds the last, the
        array having ended at ``end``."""
        self.reader_moved.append(end)
        self.fetch(self.instr.in_h - 1)
        return self.row_in[-1]

    @property
    def read_bytes(self) -> int:
        return self.instr.in_h * self.row_bytes if self.in_dram else 0
