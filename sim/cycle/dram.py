"""The DRAM side of the schedule: the DMA engine's command timing and the command arbiter.

:class:`DmaTiming` holds the closed forms of one configuration's DMA engine
(:mod:`sfnpu.hw.dma`) on the DRAM model's bus (:mod:`sfnpu.hw.axi_mem`): a command's beats and
bursts, and a control-FSM read. A read of *N* beats takes ``ISSUE_LATENCY + latency +
floor((N − 1) · B/bpc) + 1`` cycles from its command state to its last beat, inclusive (the
next state starts in the cycle after), unless short bursts at a 4 KiB boundary let the
outstanding limit delay a burst's address past the stream (then burst by burst,
:meth:`DmaTiming.control_read`).

:class:`CommandArbiter` times the compute phase's commands: the readers' (streamed weights,
shortcut, input) and the output writer's, through the DMA's two directions and the bus's one
bandwidth credit, simulated in time order.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction
from math import ceil, floor

from sfnpu.config import HwConfig
from sfnpu.hw.axi import BOUNDARY_BYTES

__all__ = ["DmaTiming", "CommandArbiter", "WEIGHT_READER", "SHORTCUT_READER", "INPUT_READER"]

#: The compute phase's DRAM readers in the controller's command-arbiter priority (after the
#: output writes): streamed weights, shortcut, input.
WEIGHT_READER, SHORTCUT_READER, INPUT_READER = range(3)


class DmaTiming:
    """The DMA engine's timing on one configuration's DRAM bus (:mod:`sfnpu.hw.dma`,
    :mod:`sfnpu.hw.axi_mem`), from their own constants."""

    def __init__(self, config: HwConfig):
        from sfnpu.hw.dma import DmaEngine

        self.config = config
        self.B = config.dram_bus_bytes
        self.beat = Fraction(self.B) / config.dram_bytes_per_cycle   # cycles per beat
        self.latency = config.dram_latency
        #: DMA: command accepted → first burst address, and a burst's completion → the
        #: address of the burst ``outstanding`` after it.
        self.issue = DmaEngine.ISSUE_LATENCY
        self.reissue = DmaEngine.REISSUE_LATENCY
        self.outstanding = DmaEngine.outstanding_to_stream(config)
        self.max_burst = config.dram_max_burst
        self.page_words = BOUNDARY_BYTES // self.B          # bus words of a 4 KiB page

    def beats(self, address: int, length: int) -> int:
        """Bus beats of a command: every bus word the byte range touches."""
        if length <= 0:
            return 0
        return (address + length - 1) // self.B - address // self.B + 1

    def bursts(self, address: int, n_beats: int) -> list[int]:
        """Beats of each burst the DMA splits a command of ``n_beats`` beats from byte
        ``address`` into (:meth:`sfnpu.hw.dma.DmaEngine._burst_words`): at most
        ``dram_max_burst`` beats, never past a 4 KiB boundary."""
        mb, page = self.max_burst, self.page_words
        word = (address // self.B) % page
        if word + n_beats <= page or (word % mb == 0 and page % mb == 0):
            # no boundary inside, or every boundary falls between max_burst bursts
            full, rest = divmod(n_beats, mb)
            return [mb] * full + ([rest] if rest else [])
        lengths = []
        while n_beats:
            n = min(n_beats, mb, page - word)
            lengths.append(n)
            word = (word + n) % page
            n_beats -= n
        return lengths

    def _stream(self, n_beats: int) -> int:
        """Cycles from the first to the last beat of a back-to-back read, inclusive."""
        return floor((n_beats - 1) * self.beat) + 1 if n_beats else 0

    def read_transfer(self, n_beats: int) -> int:
        """Cycles of a control-FSM read: from the command state (the command is accepted
        there; its address follows ``issue`` cycles later) to the last beat, inclusive — the
        next state starts in the cycle after it."""
        return self.issue + self.latency + self._stream(n_beats)

    def control_read(self, address: int, length: int) -> tuple[int, int]:
        """(cycles, beats) of a control-FSM read of ``length`` bytes from byte ``address``
        (:meth:`read_transfer`). The DMA issues its bursts one per cycle, burst *j* + *O* no
        earlier than ``REISSUE_LATENCY`` cycles after burst *j*'s last beat was taken, and a
        burst's data is due ``latency`` cycles after its address: when a 4 KiB boundary leaves
        a short burst among full ones, the next address can come too late for the beats to
        stream on, and the read takes that much longer."""
        n = self.beats(address, length)
        cycles = self.read_transfer(n)
        lengths = self.bursts(address, n)
        if len(lengths) <= self.outstanding or all(k == self.max_burst for k in lengths[:-1]):
            return cycles, n                         # the closed form's bursts: no gap
        # Beat times in units of 1/q cycle (beat = p/q cycles): integers, exact and fast.
        p, q, O = self.beat.numerator, self.beat.denominator, self.outstanding
        issued, done = self.issue - 1, []            # last address; bursts' last beats taken
        free = 0                                     # the credit's next beat
        taken = 0
        for j, k in enumerate(lengths):
            aw = issued + 1
            if j >= O:
                aw = max(aw, -(-done[j - O] // q) + self.reissue)
            issued = aw
            taken = max((aw + self.latency) * q, free) + (k - 1) * p
            free = taken + p
            done.append(taken)
        return taken // q + 1, n


class CommandArbiter:
    """The compute phase's command arbiter (``hw.controller``), the DMA engine's two directions
    (:mod:`sfnpu.hw.dma`) and the DRAM model's one data bus (:mod:`sfnpu.hw.axi_mem`),
    simulated burst by burst in time order.

    Each direction accepts a command once the previous one has issued its last burst; a
    command accepted in cycle *c* issues its bursts' addresses from *c* + ``ISSUE_LATENCY``,
    one per cycle, at most ``outstanding`` in flight: burst *j* + *O* is issued
    ``REISSUE_LATENCY`` cycles after burst *j* completes (its last read beat; its write
    response). A read burst's beats are due ``latency`` cycles after its address, a write
    burst's from the cycle after its address; its response comes at ``max(aw + latency,
    last W + 1)``.

    Both directions' beats share one bandwidth credit: a beat moves at most every
    ``B / bytes_per_cycle`` cycles, whichever direction it belongs to. When beats of both are
    due, the memory's arbitration decides: a read beat goes first, except when the last beat
    was a read and a write beat was already waiting in the previous cycle; under a saturated
    load of both the beats alternate. Beats of one direction move in bulk while the other has
    none due; they are placed one at a time only while both compete.

    Read commands come from the readers (streamed weights, shortcut, input), each in its own
    order. When the read side can accept a command (the previous one has issued its last
    burst, no write command is requested), the command arbiter grants the highest-priority
    reader whose next command is requested by then, or else the first to request.

    Commands are submitted as the compute schedule meets them (:meth:`read`, :meth:`write`:
    a handle) and the bus is simulated only as far as an answer needs (:meth:`finish`), so
    the writes of earlier rows compete with the reads of later ones. A reader's command must
    be submitted before the simulation reaches its request (the compute schedule knows it by
    then: it follows from earlier data)."""

    def __init__(self, dma: DmaTiming):
        self.m = dma
        # cycles per beat: an int when whole (the arithmetic below is then on ints, fast)
        self.beat = int(dma.beat) if dma.beat.denominator == 1 else dma.beat
        self.lead = (dma.latency, 1)              # address → first beat due, per direction
        self.pending = (deque(), deque())           # bursts not issued: [n, request, handle]
        # read commands not yet accepted, per reader: [request, burst lengths, handle]
        self.readers = (deque(), deque(), deque())  # WEIGHT_, SHORTCUT_, INPUT_READER
        self.inflight = (deque(), deque())          # issued: [due, beats left, aw, handle]
        self.completed = ([], [])                   # completion cycles, the last O
        self.accept = [0, 0]                        # cycle the current command was accepted
        self.write_commands = deque()               # [request, accepted or None, gate]
        self.write_beats = []                       # cycle of every write beat, in order
        self.issued = [-1, -1]                      # last address cycle
        self.free = 0                               # first cycle the credit allows a beat
        self.prefer_write = True                    # the last beat was a read
        self.done = {}                              # handle → cycle after its last beat
        self.waiting = {}                           # handle → what its end sets off
        self.beat_cycles = {}                       # tracked read → its beats' cycles
        self.left = {}                              # handle → bursts not yet complete
        self.handles = 0
        self.beats_moved = 0                        # bus beats of both directions
        self.last_response = 0                      # the last write response

    @property
    def busy(self) -> Fraction:
        """Bus cycles of both directions' beats."""
        return self.beats_moved * self.m.beat

    # -- submitting and answering -----------------------------------------------------------

    def _submit(self, request: int, address: int, nbytes: int, commands: int, stride: int,
                write: bool, reader: int = INPUT_READER, gate: int | None = None) -> int:
        m = self.m
        handle = self.handles
        self.handles += 1
        if nbytes <= 0:
            self.done[handle] = ceil(request)
            return handle
        per = nbytes // commands
        pending = self.pending[write]
        bursts = beats = 0
        for k in range(commands):
            # the DMA splits each command at max_burst beats and at 4 KiB boundaries
            n_cmd = m.beats(address + k * stride, per)
            lengths = m.bursts(address + k * stride, n_cmd)
            beats += n_cmd
            bursts += len(lengths)
            if not write:
                self.readers[reader].append([ceil(request), lengths, handle])
                continue
            command = [ceil(request), None, gate]
            self.write_commands.append(command)
            for j, n in enumerate(lengths):
                # a command's first burst carries it; the others follow its address
                pending.append([n, command if j == 0 else None, handle])
        self.left[handle] = bursts
        self.beats_moved += beats
        return handle

    def read(self, request: int, address: int, nbytes: int, commands: int = 1, stride: int = 0,
             reader: int = INPUT_READER, beats: bool = False) -> int:
        """Submit ``commands`` equal reads of ``reader`` (``nbytes`` in all, command *k* from
        byte ``address + k·stride``), requested from ``request`` on; :meth:`finish` of the
        handle is the cycle after the last beat (the data is in its FIFO from then on).
        ``beats``: record every beat's cycle (:meth:`beat_cycle`)."""
        handle = self._submit(request, address, nbytes, commands, stride, False, reader)
        if beats:
            self.beat_cycles[handle] = []
        return handle

    def beat_cycle(self, handle: int, k: int) -> int:
        """The cycle of beat ``k`` of a read submitted with ``beats`` (run to its end)."""
        self.finish(handle)
        return ceil(self.beat_cycles[handle][k])

    def write(self, request: int, address: int, nbytes: int, gate: int | None = None) -> int:
        """Submit a write of ``nbytes`` to byte ``address``, its data in the write buffer from
        ``request`` on; :attr:`last_response` is the last write response once :meth:`drain`
        has run. ``gate``: the write beat (counted over the phase) whose word leaving the
        full write buffer makes room for this command's last word. That word enters in the
        cycle after the beat and the writer commands the write a cycle later (the FIFO's
        level is a register), so no earlier than the beat's cycle + 2."""
        return self._submit(request, address, nbytes, 1, 0, True, gate=gate)

    def finish(self, handle: int) -> int:
        """The cycle after the last beat of a submitted transfer."""
        while handle not in self.done:
            if not self._step():
                raise RuntimeError("DMA transfer that never completes")
        return self.done[handle]

    def when_done(self, handle: int, then):
        """Call ``then()`` once the transfer has moved its last beat (at once if it has): what
        depends on its end is submitted as the simulation reaches it, not by running the
        simulation ahead to it (past requests not yet known)."""
        if handle in self.done:
            then()
        else:
            self.waiting.setdefault(handle, []).append(then)

    def drain(self) -> int:
        """Run every submitted transfer to its end; the last write response."""
        while self._step():
            pass
        return self.last_response

    # -- the simulation ---------------------------------------------------------------------

    def _issue(self, write: bool):
        """Issue the addresses of the direction's pending bursts the outstanding limit allows."""
        pending, inflight = self.pending[write], self.inflight[write]
        m = self.m
        O = m.outstanding
        completed = self.completed[write]
        while len(inflight) < O:
            if not pending and (write or not self._accept_read()):
                return
            if write and pending[0][1] is not None and not self._resolved(pending[0][1]):
                return                              # its words are not all in the buffer yet
            n, command, handle = pending.popleft()
            issued = self.issued[write]
            if command is not None:                 # a new write command: accepted after the
                command[1] = self._accepted(command)    # last one's last address
                self.accept[write] = command[1]
            aw = max(self.accept[write] + m.issue, issued + 1)
            back = O - len(inflight)                # burst j − O has completed
            if len(completed) >= back and completed[-back] + m.reissue > aw:
                aw = completed[-back] + m.reissue
            self.issued[write] = aw
            inflight.append([aw + self.lead[write], n, aw, handle])
        # The outstanding limit holds the next write command's bursts, not its acceptance
        # (the previous command has issued its last burst): the reads it holds back need it.
        if write and pending and pending[0][1] is not None and self._resolved(pending[0][1]):
            pending[0][1][1] = self._accepted(pending[0][1])

    def _resolved(self, command) -> bool:
        """Whether a write command's request is known: the write beat that makes room in
        the full write buffer for its last word has moved (then the request follows it)."""
        gate = command[2]
        if gate is None:
            return True
        if gate >= len(self.write_beats):
            return False
        command[0] = max(command[0], ceil(self.write_beats[gate]) + 2)
        command[2] = None
        return True

    def _earliest(self, command) -> int:
        """A lower bound of an unresolved write command's request: its gate beat moves no
        earlier than the bus allows the beats before it."""
        ahead = command[2] - len(self.write_beats)
        return max(command[0], ceil(self.free + ahead * self.beat) + 2)

    def _accepted(self, command) -> int:
        """The cycle a write command whose predecessors have issued every burst is accepted."""
        return max(command[0], self.issued[True], 0)

    def _accept_read(self) -> bool:
        """Accept the next read command (the arbiter's choice, see the class docstring) and
        queue its bursts; False when none can be accepted yet."""
        if not any(self.readers):
            return False
        first = min(queue[0][0] for queue in self.readers if queue)
        # the previous command has issued its last burst; the writes have their turn first
        accept = self._past_writes(max(first, self.issued[False], 0))
        if accept is None:
            return False
        queue = next(q for q in self.readers if q and q[0][0] <= accept)
        _, lengths, handle = queue.popleft()
        self.accept[False] = accept
        self.pending[False].extend([n, None, handle] for n in lengths)
        return True

    def _past_writes(self, accept: int):
        """The first cycle from ``accept`` on at which the command arbiter presents a read:
        a write command takes priority from its request to the cycle it is accepted. None
        while a write command requested by then is not yet accepted (not yet known)."""
        commands = self.write_commands
        while commands and commands[0][1] is not None and commands[0][1] < accept:
            commands.popleft()
        moved = True
        while moved:
            moved = False
            for command in commands:
                if not self._resolved(command):
                    if self._earliest(command) > accept:
                        continue
                    return None
                request, accepted, _ = command
                if request > accept:
                    continue
                if accepted is None:
                    return None
                if accepted >= accept:
                    accept, moved = accepted + 1, True
        return accept

    def _complete(self, write: bool, last):
        """The head burst of a direction has moved its last beat in cycle ``last``."""
        due, n, aw, handle = self.inflight[write].popleft()
        done = max(aw + self.m.latency, ceil(last) + 1) if write else ceil(last)
        completed = self.completed[write]
        completed.append(done)
        if len(completed) > self.m.outstanding:
            del completed[0]
        if write:
            self.last_response = max(self.last_response, done)
        self.left[handle] -= 1
        if not self.left[handle]:
            self.done[handle] = ceil(last) + 1
            for then in self.waiting.pop(handle, ()):
                then()

    def _step(self) -> bool:
        """Move the next beats on the bus; False when nothing is left to move."""
        self._issue(True)
        self._issue(False)
        rd, wr = self.inflight
        if not rd and not wr:
            return False
        beat, free = self.beat, self.free
        r_due = max(rd[0][0], free) if rd else None
        w_due = max(wr[0][0], free) if wr else None
        if r_due is not None and w_due is not None and r_due == w_due:
            # Both due in the same cycle: the write goes if the last beat was a read and the
            # write beat was already waiting in the previous cycle; then they alternate until
            # one of the two bursts is done.
            t = r_due
            write = bool(self.prefer_write and wr[0][0] <= t - 1)
            first, second = (wr, rd) if write else (rd, wr)
            n = min(first[0][1], second[0][1])
            last = t + 2 * (n - 1) * beat
            self.free = last + 2 * beat
            self.prefer_write = write
            w0 = t if write else t + beat               # the write beats' first cycle
            self.write_beats.extend(w0 + 2 * i * beat for i in range(n))
            if rd[0][3] in self.beat_cycles:
                r0 = t + beat if write else t
                self.beat_cycles[rd[0][3]].extend(r0 + 2 * i * beat for i in range(n))
            first[0][1] -= n
            second[0][1] -= n
            if not first[0][1]:
                self._complete(write, last)
            if not second[0][1]:
                self._complete(not write, last + beat)
            return True
        write = r_due is None or (w_due is not None and w_due < r_due)
        t, other = (w_due, r_due) if write else (r_due, w_due)
        n = self.inflight[write][0][1]
        if other is not None:
            # alone until the other direction's next beat is due
            n = min(n, ceil((other - t) / beat))
        head = self.inflight[write][0]
        last = t + (n - 1) * beat
        self.free = last + beat
        head[1] -= n
        if write:
            self.write_beats.extend(t + i * beat for i in range(n))
        elif head[3] in self.beat_cycles:
            self.beat_cycles[head[3]].extend(t + i * beat for i in range(n))
        self.prefer_write = not write
        if not head[1]:
            self._complete(write, last)
        return True
