"""SDR SDRAM controller behind an AXI4 slave: the board's DRAM for the accelerator.

:class:`SdramController` serves the accelerator's AXI4 master (full-width INCR bursts with
byte strobes, 32-bit beats) and a word-wide host port (the same
:class:`~sfnpu.hw.block_ram.HostPortSignature` the block RAM offers a bridge) from one x16 SDR
SDRAM (:mod:`sfnpu.hw.sdram_timing` holds its geometry and timing).

Data: the SDRAM runs with burst length 2, so one 32-bit beat is one READ or WRITE command that
moves two 16-bit words (low half first); byte strobes become DQM. A beat's SDRAM address is
``row | bank | column`` from the most significant bit down, so a stream that leaves a row
continues in the next bank.

Scheduling: one command per cycle, chosen from counters that hold every timing constraint
(per bank: ACTIVATE after tRP/tRC, READ/WRITE after tRCD, PRECHARGE after tRAS, tWR and the
read burst; globally tRRD, the burst spacing and the READ-to-WRITE bus turnaround). A bank
keeps its row open until another row of that bank is needed or a refresh closes it. Refresh
requests come every ``refi − refresh_lead`` cycles and take priority over the next beat, so
the gap between two AUTO REFRESH commands stays within tREFI whatever the bus does (a master
that stalls R or W never blocks a refresh: beats wait, refreshes do not).

Power-up: NOPs for the power-up time, PRECHARGE ALL, ``init_refreshes`` AUTO REFRESH, MODE
REGISTER SET (CAS latency, burst length 2, sequential), then ``ready``.

Responses are in order per direction. Beats past the SDRAM's size answer DECERR (reads return
zero, writes are dropped); narrow, unaligned or non-INCR bursts answer SLVERR, as does a W
beat whose WLAST disagrees with AWLEN.

Pin timing: every pin output is a register of this component. Read data is captured
``cas_latency + 1 + read_delay`` cycles after the READ leaves its register, where
``read_delay`` counts the register stages a board adds on the way to and from the pins
(0 when the behavioural model is attached to the signals directly).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, enum, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from .axi import Axi4Signature, Burst, Resp
from .block_ram import HostPortSignature
from .sdram_timing import ULX3S_SDRAM, SdramCycles, SdramGeometry

__all__ = ["Command", "SdramPinsSignature", "SdramController"]


class Command(enum.Enum, shape=3):
    """SDRAM commands as (RAS, CAS, WE) asserted with CS asserted."""
    NOP = 0b000
    BURST_STOP = 0b001
    READ = 0b010
    WRITE = 0b011
    ACTIVATE = 0b100
    PRECHARGE = 0b101
    REFRESH = 0b110
    MODE = 0b111


class SdramPinsSignature(wiring.Signature):
    """The SDRAM's pins from the controller's side, active high like amaranth-boards'
    ``SDRAMResource`` (``cs``, ``ras``, ``cas``, ``we`` are inverted at the pins); the
    bidirectional ``dq`` is split into ``dq_o``, ``dq_oe`` and ``dq_i``."""

    def __init__(self, geometry: SdramGeometry):
        self.geometry = geometry
        lanes = geometry.data_bits // 8
        super().__init__({
            "clk_en": Out(1, init=1), "cs": Out(1), "ras": Out(1), "cas": Out(1), "we": Out(1),
            "ba": Out(geometry.bank_bits), "a": Out(geometry.addr_bits), "dqm": Out(lanes),
            "dq_o": Out(geometry.data_bits), "dq_oe": Out(1), "dq_i": In(geometry.data_bits),
        })


class _Countdown:
    """Cycles until a command is allowed again: ``start(n)`` (in the issuing cycle) allows it
    ``n`` cycles later, or later still if an earlier start asked for more."""

    def __init__(self, m: Module, longest: int, name: str):
        self.m = m
        self.count = Signal(range(max(longest, 1) + 1), name=name)
        self._next = Mux(self.count == 0, 0, self.count - 1)
        m.d.sync += self.count.eq(self._next)
        self.ready = self.count == 0

    def start(self, n: int):
        self.m.d.sync += self.count.eq(Mux(self._next > n - 1, self._next, n - 1))


class _CommandRegisters:
    """The pin registers: every cycle one command, NOP unless something issues."""

    def __init__(self, m: Module, geometry: SdramGeometry, pins):
        command = Signal(Command)
        cmd_ba = Signal(geometry.bank_bits)
        cmd_a = Signal(geometry.addr_bits)
        dq_o = Signal(geometry.data_bits)
        dqm = Signal(len(pins.dqm))
        dq_oe = Signal()
        m.d.sync += [
            pins.clk_en.eq(1), pins.cs.eq(1),
            Cat(pins.we, pins.cas, pins.ras).eq(command),
            pins.ba.eq(cmd_ba), pins.a.eq(cmd_a),
            pins.dq_o.eq(dq_o), pins.dqm.eq(dqm), pins.dq_oe.eq(dq_oe),
        ]
        self.command, self.cmd_ba, self.cmd_a = command, cmd_ba, cmd_a
        self.dq_o, self.dqm, self.dq_oe = dq_o, dqm, dq_oe


class _BankTimers:
    """The timing counters (per bank and global) and each bank's open row."""

    def __init__(self, m: Module, c: SdramCycles, geometry: SdramGeometry):
        banks = 1 << geometry.bank_bits
        longest = max(c.rc, c.rfc, c.rcd, c.rp, c.rrd, c.mrd, c.ras, c.write_to_precharge,
                      c.read_to_write, c.burst_length)
        self.act_wait = [_Countdown(m, longest, f"act_wait{b}") for b in range(banks)]
        self.rw_wait = [_Countdown(m, longest, f"rw_wait{b}") for b in range(banks)]
        self.pre_wait = [_Countdown(m, longest, f"pre_wait{b}") for b in range(banks)]
        self.rrd_wait = _Countdown(m, longest, "rrd_wait")        # any ACTIVATE
        self.burst_wait = _Countdown(m, longest, "burst_wait")    # READ/WRITE spacing
        self.write_wait = _Countdown(m, longest, "write_wait")    # READ → WRITE turnaround
        self.is_open = Signal(banks)
        self.open_row = Array(Signal(geometry.row_bits, name=f"open_row{b}")
                              for b in range(banks))


class _RefreshTimer:
    """Refresh requests every ``period`` cycles."""

    def __init__(self, m: Module, period: int):
        # Counted from the last AUTO REFRESH, the power-up sequence's included.
        self.period = period
        refresh_timer = Signal(range(period + 1))
        refresh_pending = Signal()
        m.d.sync += refresh_timer.eq(refresh_timer - 1)
        with m.If(refresh_timer == 0):
            m.d.sync += [refresh_timer.eq(period - 1), refresh_pending.eq(1)]
        self.timer, self.pending = refresh_timer, refresh_pending

    def restart(self, m: Module):
        """An AUTO REFRESH goes out: the request is served and the count starts over."""
        m.d.sync += [self.timer.eq(self.period - 1), self.pending.eq(0)]


class _Burst:
    """The burst (or host access) being served and its current beat's SDRAM address."""

    def __init__(self, controller: SdramController):
        g = controller.geometry
        offset_bits = controller.bus_bytes.bit_length() - 1
        bus_word_bits = controller.addr_width - offset_bits
        active = Signal()           # a burst (or host access) has beats left
        is_write = Signal()
        is_host = Signal()
        beat_word = Signal(bus_word_bits)
        beats_left = Signal(9)
        burst_bad = Signal()        # unsupported burst: SLVERR
        write_resp = Signal(Resp)   # worst W beat response so far
        b_pending = Signal()
        host_busy = Signal()        # host access accepted, not yet done
        read_next = Signal()        # round robin between AR and AW
        self.active, self.is_write, self.is_host = active, is_write, is_host
        self.beat_word, self.beats_left, self.burst_bad = beat_word, beats_left, burst_bad
        self.write_resp, self.b_pending = write_resp, b_pending
        self.host_busy, self.read_next = host_busy, read_next

        col_bits = g.col_bits - 1   # a beat covers two columns
        self.column = Cat(Const(0, 1), beat_word[:col_bits])
        self.bank = beat_word[col_bits:col_bits + g.bank_bits]
        self.row = beat_word[col_bits + g.bank_bits:col_bits + g.bank_bits + g.row_bits]
        beyond = beat_word[controller.word_bits:].any()       # the size is a power of two
        self.resp = Mux(burst_bad, Resp.SLVERR, Mux(beyond, Resp.DECERR, Resp.OKAY))
        self.last_beat = beats_left == 1

    def beat_done(self, m: Module):
        """The current beat has been issued (or answered without a command)."""
        m.d.sync += [self.beat_word.eq(self.beat_word + 1),
                     self.beats_left.eq(self.beats_left - 1)]
        with m.If(self.last_beat):
            m.d.sync += self.active.eq(0)


class SdramController(wiring.Component):
    """AXI4 slave and host port in front of an x16 SDR SDRAM (see the module docstring).

    Parameters
    ----------
    cycles : SdramCycles
        The SDRAM's timing at this component's clock (``SdramTiming.cycles(clock_mhz)``).
    geometry : SdramGeometry
    data_width, addr_width : int
        The AXI4 bus; ``data_width`` is two SDRAM words.
    read_delay : int
        Register stages between this component and the pins, outputs and inputs together.

    Signature
    ---------
    bus : In(Axi4Signature(addr_width, data_width))
    host : In(HostPortSignature(word_bits, data_width))
        Word access for a bridge (all bytes written); served between bursts, before the bus.
    sdram : Out(SdramPinsSignature(geometry))
    ready : Out(1)
        The power-up sequence has finished.
    """

    def __init__(self, cycles: SdramCycles, *, geometry: SdramGeometry = ULX3S_SDRAM,
                 data_width: int = 32, addr_width: int = 32, read_delay: int = 0):
        if data_width != 2 * geometry.data_bits or cycles.burst_length != 2:
            raise ValueError(f"a {data_width}-bit bus needs a {data_width // 2}-bit SDRAM with "
                             f"burst length 2 (have {geometry.data_bits} bits, burst length "
                             f"{cycles.burst_length})")
        self.cycles = cycles
        self.geometry = geometry
        self.data_width = data_width
        self.addr_width = addr_width
        self.read_delay = read_delay
        self.bus_bytes = data_width // 8
        self.size = geometry.size_bytes
        self.words = self.size // self.bus_bytes
        self.word_bits = (self.words - 1).bit_length()
        super().__init__({
            "bus": In(Axi4Signature(addr_width, data_width)),
            "host": In(HostPortSignature(self.word_bits, data_width)),
            "sdram": Out(SdramPinsSignature(geometry)),
            "ready": Out(1),
        })

    @property
    def refresh_period(self) -> int:
        """Cycles between refresh requests: tREFI less the longest wait a request can meet
        (a row just opened must stay open tRAS, a write needs tWR, then tRP/tRC before
        AUTO REFRESH), with a few cycles for the request's own registers."""
        c = self.cycles
        lead = max(c.ras, c.write_to_precharge + 1, c.read_to_precharge + 1) \
            + max(c.rp, c.rc) + 4
        if c.refi <= lead:
            raise ValueError(f"tREFI of {c.refi} cycles leaves no room for traffic")
        return c.refi - lead

    def elaborate(self, platform):
        m = Module()
        c = self.cycles
        cmd = _CommandRegisters(m, self.geometry, self.sdram)
        timers = _BankTimers(m, c, self.geometry)
        refresh = _RefreshTimer(m, self.refresh_period)
        burst = _Burst(self)
        issue_tag, read_room, host_write_done = self._read_return(m, burst)
        second, w_data, w_strb, w_available = self._write_data(m, cmd, burst)
        self._write_response(m, burst)

        # -- command scheduling ---------------------------------------------------------------
        # The first command reaches the pins `power_up` edges after reset (one in its register).
        init_timer = Signal(range(max(c.power_up, c.rp, c.rfc, c.mrd) + 1),
                            init=c.power_up - 1)
        init_refreshes = Signal(range(c.init_refreshes + 1))
        with m.If(init_timer != 0):
            m.d.sync += init_timer.eq(init_timer - 1)
        # READ/WRITE leave the next command slot free: a WRITE's second data word goes out then
        slot_free = Signal()
        m.d.sync += slot_free.eq(1)

        with m.FSM(name="sdram"):
            self._power_up(m, cmd, timers, refresh, init_timer, init_refreshes)
            with m.State("RUN"):
                with m.If(refresh.pending):
                    with m.If(timers.is_open.any()):
                        with m.If(slot_free & Cat(t.ready for t in timers.pre_wait).all()):
                            self._precharge_all(m, cmd, timers)
                    with m.Elif(Cat(t.ready for t in timers.act_wait).all()):
                        self._auto_refresh(m, cmd, timers, refresh)
                with m.Elif(burst.active & burst.is_write & w_available
                            & (burst.resp != Resp.OKAY)):
                    # dropped: no SDRAM command
                    self._take_write_beat(m, burst, host_write_done, burst.resp)
                with m.Elif(burst.active & ~burst.is_write & (burst.is_host | read_room)
                            & (burst.resp != Resp.OKAY)):
                    m.d.comb += [issue_tag.valid.eq(1), issue_tag.host.eq(burst.is_host),
                                 issue_tag.last.eq(burst.last_beat),
                                 issue_tag.resp.eq(burst.resp)]
                    burst.beat_done(m)
                with m.Elif(burst.active & (burst.is_write & w_available
                                            | ~burst.is_write & (burst.is_host | read_room))
                            & slot_free):
                    self._serve_beat(m, cmd, timers, burst, slot_free, issue_tag, second,
                                     w_data, w_strb, host_write_done)
                with m.If(~burst.active & ~burst.b_pending):
                    self._accept_burst(m, burst)
        return m

    def _precharge_all(self, m, cmd, timers):
        """PRECHARGE ALL: closes every bank."""
        m.d.comb += [cmd.command.eq(Command.PRECHARGE), cmd.cmd_a.eq(1 << 10)]
        m.d.sync += timers.is_open.eq(0)
        for t in timers.act_wait:
            t.start(self.cycles.rp)

    def _auto_refresh(self, m, cmd, timers, refresh):
        """AUTO REFRESH: serves the pending refresh request."""
        m.d.comb += cmd.command.eq(Command.REFRESH)
        for t in timers.act_wait:
            t.start(self.cycles.rfc)
        refresh.restart(m)

    def _read_return(self, m, burst):
        """Read return path: tags travel with the command to the captured data."""
        c, g, bus, host = self.cycles, self.geometry, self.bus, self.host
        capture_stage = c.cas_latency + 2 + self.read_delay  # high half captured in dq_in
        tag = data.StructLayout({"valid": 1, "host": 1, "last": 1, "resp": Resp})
        pipe = [Signal(tag, name=f"read_tag{k}") for k in range(capture_stage + 1)]
        issue_tag = Signal(tag)
        m.d.sync += pipe[0].eq(issue_tag)
        m.d.sync += [pipe[k].eq(pipe[k - 1]) for k in range(1, len(pipe))]
        dq_in = Signal(g.data_bits)
        dq_prev = Signal(g.data_bits)
        m.d.sync += [dq_in.eq(self.sdram.dq_i), dq_prev.eq(dq_in)]
        out = pipe[capture_stage]
        word = Mux(out.resp == Resp.OKAY, Cat(dq_prev, dq_in), 0)

        r_depth = 8
        beat = data.StructLayout({"data": self.data_width, "resp": Resp, "last": 1})
        m.submodules.r_fifo = r_fifo = SyncFIFO(width=beat.size, depth=r_depth)
        in_flight = sum(p.valid & ~p.host for p in pipe)
        read_room = r_fifo.level + in_flight < r_depth
        fifo_in = data.View(beat, r_fifo.w_data)
        m.d.comb += [
            fifo_in.data.eq(word), fifo_in.resp.eq(out.resp), fifo_in.last.eq(out.last),
            r_fifo.w_en.eq(out.valid & ~out.host),
        ]
        head = data.View(beat, r_fifo.r_data)
        m.d.comb += [
            bus.r.valid.eq(r_fifo.r_rdy),
            bus.r.payload.data.eq(head.data), bus.r.payload.resp.eq(head.resp),
            bus.r.payload.last.eq(head.last),
            r_fifo.r_en.eq(bus.r.ready),
        ]
        host_read_done = out.valid & out.host
        host_rdata = Signal(self.data_width)
        with m.If(host_read_done):
            m.d.sync += host_rdata.eq(word)
        host_write_done = Signal()
        m.d.comb += [host.rdata.eq(Mux(host_read_done, word, host_rdata)),
                     host.done.eq(host_read_done | host_write_done)]
        with m.If(host.done):
            m.d.sync += burst.host_busy.eq(0)
        return issue_tag, read_room, host_write_done

    def _write_data(self, m, cmd, burst):
        """Write data: DQ and DQM of the pending beat; its high half follows the WRITE."""
        g, bus, host = self.geometry, self.bus, self.host
        is_host = burst.is_host
        second = Signal(data.StructLayout({"valid": 1, "data": g.data_bits,
                                           "dqm": len(cmd.dqm)}))
        w_data = Mux(is_host, host.wdata, bus.w.payload.data)
        w_strb = Mux(is_host, Const(-1, self.bus_bytes), bus.w.payload.strb)
        w_available = is_host | bus.w.valid
        lanes = len(cmd.dqm)
        # DQ and DQM follow the pending write beat whether or not its WRITE goes out, so only
        # the output enable waits for the scheduling decision (timing). DQ is not driven then;
        # DQM masks read data two cycles after the SDRAM samples it, and the last read burst's
        # data has left by the time a write burst, accepted after it, can set DQM.
        m.d.sync += second.valid.eq(0)
        with m.If(second.valid):
            m.d.comb += [cmd.dq_o.eq(second.data), cmd.dqm.eq(second.dqm), cmd.dq_oe.eq(1)]
        with m.Else():
            m.d.comb += cmd.dq_o.eq(w_data[:g.data_bits])
            with m.If(burst.active & burst.is_write):
                m.d.comb += cmd.dqm.eq(~w_strb[:lanes])
        return second, w_data, w_strb, w_available

    def _take_write_beat(self, m, burst, host_write_done, resp):
        """Takes the current W beat (or host word) with response ``resp``."""
        bus, is_host = self.bus, burst.is_host
        write_resp, last_beat = burst.write_resp, burst.last_beat
        m.d.comb += bus.w.ready.eq(~is_host)
        this = Value.cast(Mux(~is_host & (bus.w.payload.last != last_beat),
                              Resp.SLVERR, resp))
        worst = Mux(this > write_resp.as_value(), this, write_resp)
        m.d.sync += write_resp.eq(worst)
        with m.If(last_beat):
            m.d.sync += [burst.b_pending.eq(~is_host), write_resp.eq(worst)]
            m.d.comb += host_write_done.eq(is_host)
        burst.beat_done(m)

    def _write_response(self, m, burst):
        """The B channel: one response per write burst, its worst beat's."""
        bus = self.bus
        m.d.comb += [bus.b.valid.eq(burst.b_pending), bus.b.payload.resp.eq(burst.write_resp)]
        with m.If(bus.b.valid & bus.b.ready):
            m.d.sync += [burst.b_pending.eq(0), burst.write_resp.eq(Resp.OKAY)]

    def _power_up(self, m, cmd, timers, refresh, init_timer, init_refreshes):
        """The power-up states: wait, PRECHARGE ALL, AUTO REFRESHes, MODE REGISTER SET."""
        c = self.cycles
        with m.State("POWER_UP"):
            with m.If(init_timer == 0):
                self._precharge_all(m, cmd, timers)
                m.d.sync += init_timer.eq(c.rp - 1)
                m.next = "INIT_REFRESH"
        with m.State("INIT_REFRESH"):
            with m.If(init_timer == 0):
                with m.If(init_refreshes == c.init_refreshes):
                    m.d.comb += [cmd.command.eq(Command.MODE), cmd.cmd_a.eq(c.mode_register)]
                    m.d.sync += init_timer.eq(c.mrd - 1)
                    m.next = "INIT_MODE"
                with m.Else():
                    self._auto_refresh(m, cmd, timers, refresh)
                    m.d.sync += [init_timer.eq(c.rfc - 1),
                                 init_refreshes.eq(init_refreshes + 1)]
        with m.State("INIT_MODE"):
            with m.If(init_timer == 0):
                m.d.sync += self.ready.eq(1)
                m.next = "RUN"

    def _serve_beat(self, m, cmd, timers, burst, slot_free, issue_tag, second, w_data, w_strb,
                    host_write_done):
        """One command for the current beat: READ/WRITE, PRECHARGE or ACTIVATE."""
        c, g = self.cycles, self.geometry
        banks, lanes = 1 << g.bank_bits, len(cmd.dqm)
        bank, row, is_write = burst.bank, burst.row, burst.is_write

        def bank_ready(timers):
            return Array(t.ready for t in timers)[bank]

        m.d.comb += cmd.cmd_ba.eq(bank)
        with m.If(timers.is_open.bit_select(bank, 1) & (timers.open_row[bank] == row)):
            with m.If(bank_ready(timers.rw_wait) & timers.burst_wait.ready
                      & (~is_write | timers.write_wait.ready)):
                m.d.comb += cmd.cmd_a.eq(burst.column)
                m.d.sync += slot_free.eq(0)
                timers.burst_wait.start(c.burst_length)
                with m.If(is_write):
                    m.d.comb += [cmd.command.eq(Command.WRITE), cmd.dq_oe.eq(1)]
                    m.d.sync += [second.valid.eq(1),
                                 second.data.eq(w_data[g.data_bits:]),
                                 second.dqm.eq(~w_strb[lanes:])]
                    for b in range(banks):
                        with m.If(bank == b):
                            timers.pre_wait[b].start(c.write_to_precharge)
                    self._take_write_beat(m, burst, host_write_done, Resp.OKAY)
                with m.Else():
                    m.d.comb += [cmd.command.eq(Command.READ),
                                 issue_tag.valid.eq(1), issue_tag.host.eq(burst.is_host),
                                 issue_tag.last.eq(burst.last_beat),
                                 issue_tag.resp.eq(Resp.OKAY)]
                    timers.write_wait.start(c.read_to_write)
                    for b in range(banks):
                        with m.If(bank == b):
                            timers.pre_wait[b].start(c.read_to_precharge)
                    burst.beat_done(m)
        with m.Elif(timers.is_open.bit_select(bank, 1)):
            with m.If(bank_ready(timers.pre_wait)):
                m.d.comb += cmd.command.eq(Command.PRECHARGE)
                for b in range(banks):
                    with m.If(bank == b):
                        m.d.sync += timers.is_open[b].eq(0)
                        timers.act_wait[b].start(c.rp)
        with m.Elif(bank_ready(timers.act_wait) & timers.rrd_wait.ready):
            m.d.comb += [cmd.command.eq(Command.ACTIVATE), cmd.cmd_a.eq(row)]
            m.d.sync += timers.open_row[bank].eq(row)
            timers.rrd_wait.start(c.rrd)
            for b in range(banks):
                with m.If(bank == b):
                    m.d.sync += timers.is_open[b].eq(1)
                    timers.act_wait[b].start(c.rc)
                    timers.rw_wait[b].start(c.rcd)
                    timers.pre_wait[b].start(c.ras)

    def _accept_burst(self, m, burst):
        """Accepts the next burst: host first, then AR and AW in turn."""
        bus, host = self.bus, self.host
        offset_bits = self.bus_bytes.bit_length() - 1
        with m.If(host.re | host.we):
            with m.If(~burst.host_busy):
                m.d.sync += [burst.active.eq(1), burst.is_host.eq(1), burst.is_write.eq(host.we),
                             burst.host_busy.eq(1), burst.beat_word.eq(host.addr),
                             burst.write_resp.eq(Resp.OKAY),
                             burst.beats_left.eq(1), burst.burst_bad.eq(0)]
        with m.Else():
            take_read = bus.ar.valid & (burst.read_next | ~bus.aw.valid)
            m.d.comb += [bus.ar.ready.eq(take_read),
                         bus.aw.ready.eq(~take_read)]
            for channel, writes in ((bus.ar, 0), (bus.aw, 1)):
                a = channel.payload
                with m.If(channel.valid & channel.ready):
                    m.d.sync += [
                        burst.active.eq(1), burst.is_host.eq(0), burst.is_write.eq(writes),
                        burst.read_next.eq(writes), burst.write_resp.eq(Resp.OKAY),
                        burst.beat_word.eq(a.addr[offset_bits:]),
                        burst.beats_left.eq(a.len + 1),
                        burst.burst_bad.eq((a.size != offset_bits)
                                           | (a.burst != Burst.INCR)
                                           | (a.addr[:offset_bits] != 0)),
                    ]
