"""DMA engine: moves bus words between DRAM (an AXI4 master port) and the datapath's streams.

A command ``{address, length, direction}`` names a byte range. The engine transfers every bus
word that range touches, as full-width INCR bursts of at most ``HwConfig.dram_max_burst`` beats
that never cross a 4 KiB boundary:

* READ: the words appear on ``read_data`` in address order, ``last`` on the command's final
  word. A range that does not start or end on a word boundary brings the whole first and last
  word; the consumer, which knows the address, drops the extra bytes.
* WRITE: the engine takes one ``write_data`` word per bus word of the range (word-aligned, as
  the read side delivers them) and writes only the range's bytes (write strobes).

Reads and writes run concurrently; each direction works through its commands in order, and a
new command of one direction is accepted once the previous one has issued all its bursts, so
up to ``read_outstanding`` read bursts overlap the DRAM latency. There is no ordering between
directions: a read of data still being written must wait for ``write_busy`` to fall.

The DMA window: a command is executed only if every bus word it touches lies in
``[window_base, window_limit)`` (checked on whole words, so no bus address outside the window
is ever issued, whatever the window's alignment). Otherwise nothing is issued and the engine
stops with ``DMA_WINDOW``.

Errors (``ErrorCode`` of :mod:`sfnpu.regmap`): DMA_WINDOW, AXI_READ_ERROR / AXI_WRITE_ERROR
(an R beat or B response other than OKAY) and TIMEOUT (the slave made no handshake for
``watchdog`` cycles while the engine was waiting on it). The first error sets ``error``,
``error_code`` and ``error_addr`` (command start for DMA_WINDOW, burst start for AXI errors) and
puts the engine in a failed state that cannot hang the bus or the datapath: no new burst is
issued, remaining bursts are dropped, commands are accepted and discarded, read beats still in
flight are accepted but not passed on, and W beats owed for bursts already issued are sent with
no byte strobe set. ``clear`` leaves the failed state once nothing is outstanding (``idle``).

Counters for the CSR block: ``read_bytes`` is the bus width in every cycle an R beat is accepted
(bus traffic, including beats drained after an error); ``write_bytes`` counts the bytes a W beat
writes (its strobes).
"""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from sfnpu.config import HwConfig
from sfnpu.regmap import ErrorCode

from .axi import BOUNDARY_BYTES, Axi4Signature, Burst, Resp

__all__ = ["Direction", "command_layout", "DmaEngine"]


class Direction(enum.Enum, shape=1):
    READ = 0
    WRITE = 1


def command_layout(addr_width: int, length_bits: int) -> data.StructLayout:
    """One DMA command: byte ``address``, ``length`` in bytes (0: nothing), ``direction``."""
    return data.StructLayout({"address": addr_width, "length": length_bits,
                              "direction": Direction})


class DmaEngine(wiring.Component):
    """AXI4 master DMA (see the module docstring).

    Parameters
    ----------
    config : HwConfig
        ``dram_bus_bits`` (data width) and ``dram_max_burst`` (beats per burst); latency and
        bandwidth size the default ``read_outstanding``.
    addr_width : int
        Bus address bits.
    length_bits : int
        Width of a command's byte count.
    read_outstanding, write_outstanding : int
        Bursts in flight per direction. The defaults (:meth:`outstanding_to_stream`) keep a
        long transfer at the DRAM's full bandwidth.

    Signature
    ---------
    cmd : In(stream.Signature(command_layout(addr_width, length_bits)))
    read_data : Out(stream.Signature(StructLayout({"data": bus bits, "last": 1})))
    write_data : In(stream.Signature(bus bits))
    bus : Out(Axi4Signature(addr_width, bus bits))
    window_base, window_limit : In(64)
        The DMA window (CSR DMA_WINDOW_BASE / DMA_WINDOW_LIMIT), limit exclusive.
    watchdog : In(32)
        Slave stall cycles before TIMEOUT (CSR WATCHDOG), 0 = never.
    clear : In(1)
        Leave the failed state (effective while ``idle``).
    error : Out(1)
        The engine is in the failed state.
    error_code : Out(ErrorCode)
    error_addr : Out(addr_width)
    takes_read, takes_write : Out(1)
        ``cmd.ready`` for a command of that direction: a requester that knows its direction
        takes its ready from these, without the command's multiplexer in front.
    read_busy, write_busy : Out(1)
        A command of that direction has bursts left or outstanding (``write_busy`` falls after
        the last write response: the data is in DRAM).
    idle : Out(1)
        Neither busy: no bus transaction outstanding.
    read_bytes, write_bytes : Out(range(bus bytes + 1))
        DRAM bytes moved in this cycle (see the module docstring).

    Timing: a command accepted in cycle *c* issues its first burst address in cycle *c* + 4
    (:attr:`ISSUE_LATENCY`: a cycle pending, a cycle decoded, a cycle with its engine);
    further bursts follow one per cycle while fewer than ``*_outstanding`` are in flight.
    Read beats pass from R to ``read_data`` combinationally.
    """

    #: Cycles from an accepted command to its first AR/AW valid.
    ISSUE_LATENCY = 4
    #: Cycles from the last beat of a burst to the next AR/AW valid when the outstanding
    #: limit held it back.
    REISSUE_LATENCY = 2

    def __init__(self, config: HwConfig, *, addr_width: int = 32, length_bits: int = 24,
                 read_outstanding: int | None = None, write_outstanding: int | None = None):
        self.config = config
        self.bus_bytes = config.dram_bus_bytes
        self.data_width = config.dram_bus_bits
        self.max_burst = config.dram_max_burst
        self.addr_width = addr_width
        self.length_bits = length_bits
        self.read_outstanding = read_outstanding or self.outstanding_to_stream(config)
        self.write_outstanding = write_outstanding or self.outstanding_to_stream(config)
        if not self.bus_bytes.bit_length() - 1 < addr_width <= 64:
            raise ValueError(f"addr_width {addr_width} must be above log2 of the bus bytes "
                             "and at most 64")
        if not 1 <= length_bits <= addr_width:
            raise ValueError(f"length_bits must be 1..addr_width, not {length_bits}")
        if self.read_outstanding < 1 or self.write_outstanding < 1:
            raise ValueError("outstanding limits must be at least 1")
        super().__init__({
            "cmd": In(stream.Signature(command_layout(addr_width, length_bits))),
            "read_data": Out(stream.Signature(data.StructLayout(
                {"data": self.data_width, "last": 1}))),
            "write_data": In(stream.Signature(self.data_width)),
            "bus": Out(Axi4Signature(addr_width, self.data_width)),
            "window_base": In(64),
            "window_limit": In(64),
            "watchdog": In(32),
            "clear": In(1),
            "error": Out(1),
            "error_code": Out(ErrorCode),
            "error_addr": Out(addr_width),
            "takes_read": Out(1),
            "takes_write": Out(1),
            "read_busy": Out(1),
            "write_busy": Out(1),
            "idle": Out(1),
            "read_bytes": Out(range(self.bus_bytes + 1)),
            "write_bytes": Out(range(self.bus_bytes + 1)),
        })

    @classmethod
    def outstanding_to_stream(cls, config: HwConfig) -> int:
        """Fewest bursts in flight that hide the latency of a long transfer of full bursts.

        Burst *j* + *O* is issued ``REISSUE_LATENCY`` cycles after the last beat of burst *j*
        and its data is due *L* cycles later; meanwhile the memory streams the (*O* − 1)·n
        beats in between, one every B/bpc cycles: no gap when
        ``floor(((O − 1)·n + 1) · B/bpc) ≥ L + REISSUE_LATENCY``.
        """
        beat_cycles = Fraction(config.dram_bus_bytes) / config.dram_bytes_per_cycle
        n = min(config.dram_max_burst, BOUNDARY_BYTES // config.dram_bus_bytes)
        need = config.dram_latency + cls.REISSUE_LATENCY
        outstanding = 1
        while int(((outstanding - 1) * n + 1) * beat_cycles) < need:
            outstanding += 1
        return outstanding

    def _burst_words(self, m, next_word, words_left):
        """Beats of the next burst: the words left, at most ``max_burst``, and never past the
        next 4 KiB boundary."""
        page_words = BOUNDARY_BYTES // self.bus_bytes
        to_boundary = Signal(range(page_words + 1))
        m.d.comb += to_boundary.eq(page_words - next_word[:page_words.bit_length() - 1])
        by_length = Mux(words_left < self.max_burst, words_left, self.max_burst)
        return Mux(to_boundary < by_length, to_boundary, by_length)

    def elaborate(self, platform):
        m = Module()
        failed = Signal()
        raise_error = []                              # (condition, code, address), by priority
        # An accepted command waits a cycle in ``pending`` (the producer's address arithmetic
        # and the decode do not share a cycle) and a cycle in ``decoded`` (the decode's adders
        # and window compares do not share one with the engine's burst issue).
        pending, decoded = self._command_stage(), self._command_stage()
        rd = self._read_channel(m, failed, raise_error)
        wr = self._write_channel(m, failed, raise_error)
        self._accept(m, pending, decoded, failed, raise_error, rd, wr)
        self._watchdog(m, raise_error, rd, wr)

        # -- error state: the first error wins; the listed order breaks ties ------------------
        for condition, code, address in reversed(raise_error):
            with m.If(condition & ~failed):
                m.d.sync += [failed.eq(1), self.error_code.eq(code),
                             self.error_addr.eq(address)]
        drop = [rd.left.eq(0), wr.left.eq(0), rd.left_zero.eq(1), wr.left_zero.eq(1)]
        with m.If(failed):                            # drop the bursts not yet issued
            m.d.sync += drop
        for condition, _, _ in raise_error:
            with m.If(condition):
                m.d.sync += drop

        read_busy = ~rd.left_zero | (rd.outstanding != 0) | pending.read | decoded.read
        write_busy = ~wr.left_zero | (wr.outstanding != 0) | pending.write | decoded.write
        m.d.comb += [
            self.read_busy.eq(read_busy),
            self.write_busy.eq(write_busy),
            self.idle.eq(~read_busy & ~write_busy),
            self.error.eq(failed),
        ]
        with m.If(self.clear & ~read_busy & ~write_busy):
            m.d.sync += [failed.eq(0), self.error_code.eq(ErrorCode.NONE),
                         self.error_addr.eq(0)]
        return m

    def _command_stage(self):
        """A register stage of accepted commands: ``valid``, ``payload`` and their direction."""
        stage = SimpleNamespace(valid=Signal(), payload=Signal(self.cmd.payload.shape()))
        stage.read = stage.valid & (stage.payload.direction == Direction.READ)
        stage.write = stage.valid & (stage.payload.direction == Direction.WRITE)
        return stage

    def _decode(self, m, cmd, decoded):
        """Command decode into registers beside ``decoded``: the word range of ``cmd`` and
        the window check."""
        B = self.bus_bytes
        size_log2 = B.bit_length() - 1
        word_bits = self.addr_width - size_log2
        end = Signal(self.addr_width + 1)
        end_word = Signal(word_bits + 2)              # first word after the range
        m.d.comb += [
            end.eq(cmd.address + cmd.length),
            end_word.eq((end + (B - 1))[size_log2:]),
        ]
        first_word = cmd.address[size_log2:]
        # A range running past the top of the address space would wrap: never in the window.
        in_window = (((first_word << size_log2) >= self.window_base)
                     & ((end_word << size_log2) <= self.window_limit)
                     & ((end_word << size_log2) <= 1 << self.addr_width))
        decoded.end = Signal(self.addr_width + 1)
        decoded.first_word = Signal(word_bits)
        decoded.end_word = Signal(word_bits + 2)
        decoded.in_window = Signal()
        m.d.sync += [decoded.end.eq(end), decoded.first_word.eq(first_word),
                     decoded.end_word.eq(end_word), decoded.in_window.eq(in_window)]

    def _burst_issuer(self, m, channel, outstanding_limit, completed, failed):
        """Split the current command of one direction into bursts on ``channel``."""
        size_log2 = self.bus_bytes.bit_length() - 1
        word_bits = self.addr_width - size_log2
        page_words = BOUNDARY_BYTES // self.bus_bytes
        count_bits = self.length_bits + 1            # words of one command, with margin
        next_word = Signal(word_bits)
        words_left = Signal(count_bits)
        # words_left == 0, a register set beside it: the command port's ready tests it.
        left_zero = Signal(init=1)
        outstanding = Signal(range(outstanding_limit + 1))
        burst = Signal(range(max(self.max_burst, page_words) + 1))
        m.d.comb += burst.eq(self._burst_words(m, next_word, words_left))
        can_load = ~channel.valid | channel.ready
        issue = Signal()
        m.d.comb += issue.eq(can_load & ~left_zero & ~failed
                             & (outstanding < outstanding_limit))
        with m.If(can_load):
            m.d.sync += channel.valid.eq(issue)
        with m.If(issue):
            m.d.sync += [
                channel.payload.addr.eq(next_word << size_log2),
                channel.payload.len.eq(burst - 1),
                channel.payload.size.eq(size_log2),
                channel.payload.burst.eq(Burst.INCR),
                next_word.eq(next_word + burst),
                words_left.eq(words_left - burst),
                left_zero.eq(words_left == burst),
            ]
        with m.If(issue & ~completed):
            m.d.sync += outstanding.eq(outstanding + 1)
        with m.Elif(completed & ~issue):
            m.d.sync += outstanding.eq(outstanding - 1)
        return next_word, words_left, left_zero, outstanding, burst, issue

    def _read_channel(self, m, failed, raise_error):
        """Read channel: AR bursts, and R beats to ``read_data`` with the command's last."""
        bus, B = self.bus, self.bus_bytes
        size_log2 = B.bit_length() - 1
        read_info = data.StructLayout({"last": 1, "addr": self.addr_width})
        m.submodules.read_info = read_fifo = SyncFIFO(width=read_info.size,
                                                      depth=self.read_outstanding)
        r_fire = bus.r.valid & bus.r.ready
        r_done = r_fire & bus.r.payload.last
        rd_word, rd_left, rd_left_zero, rd_outstanding, rd_burst, rd_issue = self._burst_issuer(
            m, bus.ar, self.read_outstanding, r_done, failed)
        pushed = data.View(read_info, read_fifo.w_data)
        m.d.comb += [
            read_fifo.w_en.eq(rd_issue),
            pushed.last.eq(rd_left == rd_burst),
            pushed.addr.eq(rd_word << size_log2),
        ]
        burst_info = data.View(read_info, read_fifo.r_data)
        r_ok = bus.r.payload.resp == Resp.OKAY
        m.d.comb += [
            self.read_data.valid.eq(bus.r.valid & r_ok & ~failed),
            self.read_data.payload.data.eq(bus.r.payload.data),
            self.read_data.payload.last.eq(bus.r.payload.last & burst_info.last),
            bus.r.ready.eq(self.read_data.ready | failed | ~r_ok),
            read_fifo.r_en.eq(r_done),
            self.read_bytes.eq(Mux(r_fire, B, 0)),
        ]
        raise_error.append((r_fire & ~r_ok, ErrorCode.AXI_READ_ERROR, burst_info.addr))
        return SimpleNamespace(word=rd_word, left=rd_left, left_zero=rd_left_zero,
                               outstanding=rd_outstanding,
                               fire=r_fire)

    def _write_channel(self, m, failed, raise_error):
        """Write channel: AW bursts, W beats with their strobes, and the B responses."""
        bus, B = self.bus, self.bus_bytes
        size_log2 = B.bit_length() - 1
        beats = data.StructLayout({"beats_m1": 8, "first": 1, "head": size_log2 or 1,
                                   "last": 1, "tail": size_log2 or 1})
        m.submodules.write_beats = w_fifo = SyncFIFO(width=beats.size,
                                                     depth=self.write_outstanding)
        m.submodules.write_addrs = b_fifo = SyncFIFO(width=self.addr_width,
                                                     depth=self.write_outstanding)
        b_fire = bus.b.valid & bus.b.ready
        wr_word, wr_left, wr_left_zero, wr_outstanding, wr_burst, wr_issue = self._burst_issuer(
            m, bus.aw, self.write_outstanding, b_fire, failed)
        head = Signal(size_log2 or 1)                 # first byte lane of the command
        tail = Signal(size_log2 or 1)                 # lanes in its last word (0: all)
        first_burst = Signal()
        pushed = data.View(beats, w_fifo.w_data)
        m.d.comb += [
            w_fifo.w_en.eq(wr_issue),
            pushed.beats_m1.eq(wr_burst - 1),
            pushed.first.eq(first_burst),
            pushed.head.eq(head),
            pushed.last.eq(wr_left == wr_burst),
            pushed.tail.eq(tail),
            b_fifo.w_en.eq(wr_issue),
            b_fifo.w_data.eq(wr_word << size_log2),
        ]
        with m.If(wr_issue):
            m.d.sync += first_burst.eq(0)

        burst = data.View(beats, w_fifo.r_data)
        w_beat = Signal(8)
        strobes, written = self._write_strobes(burst, w_beat)
        w_fire = bus.w.valid & bus.w.ready
        m.d.comb += [
            bus.w.valid.eq(w_fifo.r_rdy & (self.write_data.valid | failed)),
            bus.w.payload.data.eq(self.write_data.payload),
            bus.w.payload.strb.eq(Mux(failed, 0, strobes)),
            bus.w.payload.last.eq(w_beat == burst.beats_m1),
            self.write_data.ready.eq(w_fifo.r_rdy & bus.w.ready & ~failed),
            self.write_bytes.eq(Mux(w_fire & ~failed, written, 0)),
            bus.b.ready.eq(1),
            b_fifo.r_en.eq(b_fire),
        ]
        with m.If(w_fire):
            m.d.sync += w_beat.eq(w_beat + 1)
            with m.If(bus.w.payload.last):
                m.d.sync += w_beat.eq(0)
                m.d.comb += w_fifo.r_en.eq(1)
        raise_error.append((b_fire & (bus.b.payload.resp != Resp.OKAY),
                            ErrorCode.AXI_WRITE_ERROR, b_fifo.r_data))
        return SimpleNamespace(word=wr_word, left=wr_left, left_zero=wr_left_zero,
                               outstanding=wr_outstanding,
                               head=head, tail=tail, first_burst=first_burst, fire=w_fire,
                               b_fire=b_fire, beats_ready=w_fifo.r_rdy)

    def _write_strobes(self, burst, w_beat):
        """Byte strobes of a W beat (head and tail lanes masked) and the bytes it writes."""
        B = self.bus_bytes
        size_log2 = B.bit_length() - 1
        all_strobes = (1 << B) - 1
        first_beat = burst.first & (w_beat == 0)
        last_beat = burst.last & (w_beat == burst.beats_m1)
        lanes_all = Const(all_strobes, B)
        head_mask = (lanes_all << burst.head)[:B] if size_log2 else lanes_all
        tail_mask = Mux(burst.tail == 0, lanes_all,
                        ((Const(1, B + 1) << burst.tail) - 1)[:B]) if size_log2 else lanes_all
        strobes = lanes_all & Mux(first_beat, head_mask, lanes_all) \
            & Mux(last_beat, tail_mask, lanes_all)
        written = (Mux(last_beat & (burst.tail != 0), burst.tail, B)
                   - Mux(first_beat, burst.head, 0)) if size_log2 else B
        return strobes, written

    def _accept(self, m, pending, decoded, failed, raise_error, rd, wr):
        """Accepting commands: the idle engine of their direction, or a window error. An
        accepted command waits a cycle in ``pending`` and a cycle in ``decoded``, then its
        engine takes it."""
        size_log2 = self.bus_bytes.bit_length() - 1
        incoming_write = self.cmd.payload.direction == Direction.WRITE
        m.d.comb += [
            self.takes_read.eq(rd.left_zero & ~pending.read & ~decoded.read | failed),
            self.takes_write.eq(wr.left_zero & ~pending.write & ~decoded.write | failed),
            self.cmd.ready.eq(Mux(incoming_write, self.takes_write, self.takes_read)),
        ]
        m.d.sync += [pending.valid.eq(self.cmd.valid & self.cmd.ready & ~failed),
                     pending.payload.eq(self.cmd.payload),
                     decoded.valid.eq(pending.valid & ~failed),
                     decoded.payload.eq(pending.payload)]
        self._decode(m, pending.payload, decoded)
        cmd = decoded.payload
        first_word, end_word = decoded.first_word, decoded.end_word
        is_write = cmd.direction == Direction.WRITE
        accept = decoded.valid & ~failed & (cmd.length != 0)
        with m.If(accept & decoded.in_window):
            with m.If(is_write):
                m.d.sync += [
                    wr.word.eq(first_word),
                    wr.left.eq(end_word - first_word),
                    wr.left_zero.eq(end_word == first_word),
                    wr.head.eq(cmd.address[:size_log2] if size_log2 else 0),
                    wr.tail.eq(decoded.end[:size_log2] if size_log2 else 0),
                    wr.first_burst.eq(1),
                ]
            with m.Else():
                m.d.sync += [rd.word.eq(first_word), rd.left.eq(end_word - first_word),
                             rd.left_zero.eq(end_word == first_word)]
        raise_error.insert(0, (accept & ~decoded.in_window, ErrorCode.DMA_WINDOW, cmd.address))

    def _watchdog(self, m, raise_error, rd, wr):
        """Watchdog: cycles the slave keeps the engine waiting without any handshake."""
        bus = self.bus
        handshake = ((bus.ar.valid & bus.ar.ready) | (bus.aw.valid & bus.aw.ready)
                     | wr.fire | rd.fire | wr.b_fire)
        waiting = ((bus.ar.valid & ~bus.ar.ready) | (bus.aw.valid & ~bus.aw.ready)
                   | (bus.w.valid & ~bus.w.ready)
                   | ((rd.outstanding != 0) & ~bus.r.valid)
                   | ((wr.outstanding != 0) & ~wr.beats_ready & ~bus.b.valid))
        stalled = Signal(32)
        m.d.sync += stalled.eq(Mux(waiting & ~handshake, stalled + 1, 0))
        raise_error.append(((self.watchdog != 0) & (stalled >= self.watchdog),
                            ErrorCode.TIMEOUT, 0))
