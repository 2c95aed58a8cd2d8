"""Simulation-only AXI4 slave memory with the DRAM timing of :class:`sfnpu.config.HwConfig`.

System tests run the whole accelerator against this model in HDL, so no Python runs per clock.
Its timing is deterministic and uses the same three parameters as the cycle model:
``dram_latency`` (*L*), ``dram_bytes_per_cycle`` (an exact fraction *p*/*q* bytes per cycle) and
the bus width (*B* bytes per beat).

Timing model
------------
*Bandwidth.* Read (R) and write (W) data beats share one credit counter counted in 1/*q* bytes:
it gains *p* every cycle, saturating at ``cap = B·q + p − 1``, and a beat may transfer only while
the counter holds at least one beat's worth (``B·q``), which the transfer spends. At most one
beat moves per cycle (``p/q ≤ B``). The cap is the smallest that never drops credit while beats
are back to back, so the average rate is exactly *p*/*q* bytes per cycle, and an idle memory
starts a transfer with a full cap (one beat at once, then the steady rate).

*Latency.* An R beat of a burst is offered no earlier than *L* cycles after the cycle its AR was
accepted. A write response is offered from ``max(aw + L, w_last + 1)`` (*aw*: the cycle AW was
accepted, *w_last*: the cycle of the burst's last W beat). Bursts are served in order, one at a
time per direction.

*Closed form* (consequence of the two rules; asserted by ``tests/test_hw_dma.py``): a read whose
first AR is accepted in cycle *a*, on an idle memory, with the master always ready and the next
AR accepted before its data is due, delivers beat *k* (counting over all its bursts) in cycle::

    a + L + floor(k · B · q / p)

so *N* beats take ``L + floor((N − 1)·B·q/p) + 1`` cycles from the first AR to the last beat
inclusive. Writes on an idle memory take W beat *k* in cycle ``w0 + floor(k · B · q / p)``,
*w0* being the first cycle a beat can move (AW accepted in an earlier cycle, WVALID high).

*Read/write arbitration.* An R beat spends its credit in the cycle it is first offered
(RVALID rising), so an R beat the master leaves waiting does not hold up writes. The memory
offers an R beat when one is due and the credit suffices, except when the write side has
priority (the last credit went to a read) and a W beat was waiting in the previous cycle with
its AW present: then the credit goes to W. Under a saturated read and write load the beats
alternate. RVALID depends only on state, never on the master's WVALID, so a master whose write
data comes from its read data cannot form a combinational loop through the model. (With RREADY
always high, "offered" and "transferred" are the same cycle, as in the closed form above.)

Protocol: full-width (``size = log2 B``), bus-aligned INCR bursts; anything else answers
SLVERR. Beats past the memory's ``size`` bytes answer DECERR (reads return 0, writes are
dropped); beats inside the run-time range ``[error_base, error_limit)`` answer SLVERR (fault
injection). ``hang`` stops the model from accepting or offering anything new (an offered beat
stays offered), to test that a master gives up. Up to ``queue_depth`` reads and
``queue_depth`` writes may be outstanding.

Contents and backdoor: ``init`` (bytes) becomes the memory's initial contents at elaboration,
so it is part of the generated Verilog and works in every simulator (large images make large
Verilog). In Amaranth's simulator :meth:`backdoor_read` / :meth:`backdoor_write` access the
contents at any time without bus cycles. With ``backdoor=True`` the model also has a word-wide
port (``backdoor_addr``/``backdoor_wdata``/``backdoor_we``/``backdoor_rdata``) through which a
compiled harness (:mod:`sfnpu.tb.firmware`) loads an image and reads results at one word per
cycle, and a file backdoor for testbenches that must not spend Python per word
(:mod:`sfnpu.tb.system`): the plusarg ``+sfnpu_load=FILE`` preloads the array at time 0
(``$readmemh``), and a clock edge with ``backdoor_dump`` high writes words ``[0,
+sfnpu_dump_words)`` to ``+sfnpu_dump=FILE`` (``$writememh``).
"""

from __future__ import annotations

from fractions import Fraction

from amaranth.hdl import ClockSignal, Instance, Module, Mux, Signal
from amaranth.hdl import MemoryData
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu.config import HwConfig

from .axi import Axi4Signature, Burst, Resp

__all__ = ["AxiMemory", "SIM_DRAM_MODULE", "SIM_DRAM_VERILOG"]

#: The storage of a DRAM model with a backdoor (simulation only): byte-strobed bus writes and
#: combinational reads, plus the harness's word port.
SIM_DRAM_MODULE = "sfnpu_sim_dram"
SIM_DRAM_VERILOG = """
module sfnpu_sim_dram #(parameter WORDS = 1, parameter WIDTH = 64) (
  input clk,
  input [$clog2(WORDS)-1:0] raddr, output [WIDTH-1:0] rdata,
  input [$clog2(WORDS)-1:0] waddr, input [WIDTH-1:0] wdata, input [WIDTH/8-1:0] wstrb,
  input [$clog2(WORDS)-1:0] baddr, input [WIDTH-1:0] bwdata, input bwe,
  output [WIDTH-1:0] brdata, input bdump);
  reg [WIDTH-1:0] mem [0:WORDS-1];
  integer i;
  // +sfnpu_load=FILE preloads the array at time 0 ($readmemh, `@word` addresses): a harness
  // loads a multi-megabyte image without spending a clock cycle per word on the word port.
  string load_file;
  initial if ($value$plusargs("sfnpu_load=%s", load_file)) $readmemh(load_file, mem);
  // +sfnpu_dump=FILE +sfnpu_dump_words=N: an edge with bdump high writes the first N words.
  string dump_file;
  integer dump_words;
  always @(posedge clk)
    if (bdump && $value$plusargs("sfnpu_dump=%s", dump_file)
        && $value$plusargs("sfnpu_dump_words=%d", dump_words))
      $writememh(dump_file, mem, 0, dump_words - 1);
  assign rdata = mem[raddr];
  assign brdata = mem[baddr];
  always @(posedge clk) begin
    for (i = 0; i < WIDTH / 8; i = i + 1)
      if (wstrb[i]) mem[waddr][8 * i +: 8] <= wdata[8 * i +: 8];
    if (bwe) mem[baddr] <= bwdata;
  end
endmodule
"""


class _Port:
    def __init__(self, words: int, width: int, enables: int, name: str):
        self.addr = Signal(range(words), name=f"{name}_addr")
        self.data = Signal(width, name=f"{name}_data")
        self.en = Signal(enables, name=f"{name}_en")

_TIME_BITS = 32     # cycle stamps; a simulation never runs 2^32 cycles


class AxiMemory(wiring.Component):
    """AXI4 slave memory of ``size`` bytes (simulation only; see the module docstring).

    Parameters
    ----------
    size : int
        Bytes, a multiple of the bus width.
    data_width : int
        Bus bits.
    latency : int
        *L*, cycles from an accepted AR to the first data beat (and AW to the response).
    bytes_per_cycle : Fraction
        Average bandwidth *p*/*q*, at most ``data_width / 8``.
    init : bytes
        Initial contents from address 0 (shorter than ``size``: the rest is zero).
    addr_width : int
        Bus address bits.
    queue_depth : int
        Outstanding bursts per direction.

    Signature
    ---------
    bus : In(Axi4Signature(addr_width, data_width))
        The slave port.
    error_base, error_limit : In(addr_width)
        Beats in ``[error_base, error_limit)`` answer SLVERR (empty when ``base >= limit``).
    hang : In(1)
        Stop accepting and offering transfers.
    """

    def __init__(self, *, size: int, data_width: int, latency: int,
                 bytes_per_cycle: Fraction, init: bytes = b"", addr_width: int = 32,
                 queue_depth: int = 16, backdoor: bool = False):
        self.bus_bytes = data_width // 8
        bytes_per_cycle = Fraction(bytes_per_cycle)
        if size <= 0 or size % self.bus_bytes:
            raise ValueError(f"size {size} must be a positive multiple of {self.bus_bytes}")
        if not 0 < bytes_per_cycle <= self.bus_bytes:
            raise ValueError(f"bytes_per_cycle {bytes_per_cycle} must be in (0, "
                             f"{self.bus_bytes}]")
        if latency < 1:
            raise ValueError(f"latency must be at least 1, not {latency}")
        if len(init) > size:
            raise ValueError(f"init has {len(init)} bytes, more than size {size}")
        self.size = size
        self.data_width = data_width
        self.latency = latency
        self.bytes_per_cycle = bytes_per_cycle
        self.addr_width = addr_width
        self.queue_depth = queue_depth
        words = size // self.bus_bytes
        B = self.bus_bytes
        # Only the initialised prefix is listed: the rest is zero, and a long list of zeros
        # would only make the generated Verilog large.
        used = -(-len(init) // B)
        padded = bytes(init) + bytes(used * B - len(init))
        #: The contents (Amaranth-simulator backdoor: ``ctx.get(memory_data[word])``).
        self.memory_data = MemoryData(
            shape=data_width, depth=words,
            init=[int.from_bytes(padded[i * B:(i + 1) * B], "little") for i in range(used)])
        self.backdoor = backdoor
        members = {
            "bus": In(Axi4Signature(addr_width, data_width)),
            "error_base": In(addr_width),
            "error_limit": In(addr_width),
            "hang": In(1),
        }
        if backdoor:
            members.update({
                "backdoor_addr": In(range(words)),
                "backdoor_wdata": In(data_width),
                "backdoor_we": In(1),
                "backdoor_rdata": Out(data_width),
                "backdoor_dump": In(1),
            })
        super().__init__(members)

    @classmethod
    def from_config(cls, config: HwConfig, *, size: int, init: bytes = b"", **kwargs):
        """The DRAM of ``config``: its bus width, latency and bandwidth."""
        return cls(size=size, data_width=config.dram_bus_bits, latency=config.dram_latency,
                   bytes_per_cycle=config.dram_bytes_per_cycle, init=init, **kwargs)

    # -- the timing model in Python, for tests and the cycle model ------------------------------

    def beat_cycle(self, k: int) -> int:
        """Cycles after the first beat of an idle-memory stream at which beat ``k`` moves:
        ``floor(k · B · q / p)``."""
        p, q = self.bytes_per_cycle.numerator, self.bytes_per_cycle.denominator
        return k * self.bus_bytes * q // p

    def read_cycles(self, beats: int) -> int:
        """Cycles from the first accepted AR to the last beat, inclusive, of an idle-memory
        read of ``beats`` beats that is never starved of addresses: ``L + floor((N − 1) · B ·
        q / p) + 1``."""
        return self.latency + self.beat_cycle(beats - 1) + 1

    # -- Amaranth-simulator backdoor -----------------------------------------------------------

    def backdoor_read(self, ctx, address: int, length: int) -> bytes:
        B = self.bus_bytes
        first, end = address // B, -(-(address + length) // B)
        blob = b"".join(ctx.get(self.memory_data[w]).to_bytes(B, "little")
                        for w in range(first, end))
        return blob[address - first * B:][:length]

    def backdoor_write(self, ctx, address: int, payload: bytes):
        B = self.bus_bytes
        for offset in range(0, len(payload)):
            word, lane = divmod(address + offset, B)
            value = ctx.get(self.memory_data[word])
            value &= ~(0xFF << (8 * lane))
            ctx.set(self.memory_data[word], value | payload[offset] << (8 * lane))

    # -- hardware ----------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        B = self.bus_bytes
        size_log2 = B.bit_length() - 1
        words = self.size // B
        word_bits = self.addr_width - size_log2
        p, q = self.bytes_per_cycle.numerator, self.bytes_per_cycle.denominator
        cost, cap = B * q, B * q + p - 1

        read_port = _Port(words, self.data_width, 1, "read")
        write_port = _Port(words, self.data_width, B, "write")
        if not self.backdoor:
            m.submodules.storage = storage = Memory(self.memory_data)
            for port, ours in ((storage.read_port(domain="comb"), read_port),
                               (storage.write_port(granularity=8), write_port)):
                m.d.comb += port.addr.eq(ours.addr)
                if ours is read_port:
                    m.d.comb += ours.data.eq(port.data)
                else:
                    m.d.comb += [port.data.eq(ours.data), port.en.eq(ours.en)]
        else:
            # A Verilog array (SIM_DRAM_VERILOG) instead of an Amaranth memory: Amaranth writes
            # every word's initial value, which makes megabytes of Verilog for a DRAM model.
            # Its word port serves a test harness: load an image and read results without
            # bus cycles (the harness drives it before the start and after the end of a run).
            m.submodules.storage = Instance(
                SIM_DRAM_MODULE, p_WORDS=words, p_WIDTH=self.data_width,
                i_clk=ClockSignal(), i_raddr=read_port.addr, o_rdata=read_port.data,
                i_waddr=write_port.addr, i_wdata=write_port.data, i_wstrb=write_port.en,
                i_baddr=self.backdoor_addr, i_bwdata=self.backdoor_wdata,
                i_bwe=self.backdoor_we, o_brdata=self.backdoor_rdata,
                i_bdump=self.backdoor_dump)

        now = Signal(_TIME_BITS)
        m.d.sync += now.eq(now + 1)

        # Bandwidth credit shared by R and W beats.
        credit = Signal(range(cap + 1), init=cap)
        beat = Signal()
        gained = credit + p - Mux(beat, cost, 0)
        m.d.sync += credit.eq(Mux(gained > cap, cap, gained))
        credit_ok = credit >= cost

        request = data.StructLayout({"word": word_bits, "beats_m1": 8, "ready_at": _TIME_BITS,
                                     "bad": 1})

        def accept_request(channel, fifo):
            """Queue an accepted AR/AW with the cycle its data (or response) may start."""
            entry = data.View(request, fifo.w_data)
            a = channel.payload
            m.d.comb += [
                entry.word.eq(a.addr[size_log2:]),
                entry.beats_m1.eq(a.len),
                entry.ready_at.eq(now + self.latency),
                entry.bad.eq((a.size != size_log2) | (a.burst != Burst.INCR)
                             | (a.addr[:size_log2] != 0)),
                fifo.w_en.eq(channel.valid & channel.ready),
            ]
            return data.View(request, fifo.r_data)

        def beat_resp(bad, word):
            address = word << size_log2
            in_error_range = (address >= self.error_base) & (address < self.error_limit)
            return Mux(bad, Resp.SLVERR, Mux(word >= words, Resp.DECERR,
                                             Mux(in_error_range, Resp.SLVERR, Resp.OKAY)))

        # Arbitration state (see the module docstring).
        r_held = Signal()           # RVALID was high and not taken: keep it
        w_waiting = Signal()        # a W beat with its AW present waited last cycle
        prefer_write = Signal()     # the last beat was a read

        # -- reads ---------------------------------------------------------------------------
        m.submodules.ar_queue = ar_queue = SyncFIFO(width=request.size, depth=self.queue_depth)
        m.d.comb += bus.ar.ready.eq(ar_queue.w_rdy & ~self.hang)
        head = accept_request(bus.ar, ar_queue)
        r_beat = Signal(8)
        r_word = Signal(word_bits)
        m.d.comb += r_word.eq(head.word + r_beat)
        r_due = ar_queue.r_rdy & (now >= head.ready_at)
        # A new R beat pays its credit when it is offered: a master that leaves it waiting
        # (RREADY low) does not block writes.
        offer_read = ~r_held & ~self.hang & r_due & credit_ok & ~(prefer_write & w_waiting)
        r_resp = beat_resp(head.bad, r_word)
        m.d.comb += [
            read_port.addr.eq(r_word),
            bus.r.valid.eq(r_held | offer_read),
            bus.r.payload.data.eq(Mux(r_resp == Resp.OKAY, read_port.data, 0)),
            bus.r.payload.resp.eq(r_resp),
            bus.r.payload.last.eq(r_beat == head.beats_m1),
        ]
        r_fire = bus.r.valid & bus.r.ready
        m.d.sync += r_held.eq(bus.r.valid & ~bus.r.ready)
        with m.If(offer_read):
            m.d.sync += prefer_write.eq(1)
        with m.If(r_fire):
            m.d.sync += r_beat.eq(r_beat + 1)
            with m.If(bus.r.payload.last):
                m.d.sync += r_beat.eq(0)
                m.d.comb += ar_queue.r_en.eq(1)

        # -- writes --------------------------------------------------------------------------
        m.submodules.aw_queue = aw_queue = SyncFIFO(width=request.size, depth=self.queue_depth)
        response = data.StructLayout({"ready_at": _TIME_BITS, "resp": Resp})
        m.submodules.b_queue = b_queue = SyncFIFO(width=response.size, depth=self.queue_depth)
        writes_outstanding = Signal(range(self.queue_depth + 1))   # AW accepted, B not yet
        m.d.comb += bus.aw.ready.eq(~self.hang & (writes_outstanding < self.queue_depth))
        w_head = accept_request(bus.aw, aw_queue)
        w_beat = Signal(8)
        w_word = Signal(word_bits)
        w_resp = Signal(Resp)       # worst response of the burst's beats so far
        m.d.comb += [
            w_word.eq(w_head.word + w_beat),
            bus.w.ready.eq(~self.hang & aw_queue.r_rdy & credit_ok & ~offer_read),
        ]
        w_fire = bus.w.valid & bus.w.ready
        m.d.sync += w_waiting.eq(bus.w.valid & ~bus.w.ready & aw_queue.r_rdy)
        last_beat = w_beat == w_head.beats_m1
        this_resp = Signal(Resp)
        m.d.comb += this_resp.eq(Mux(bus.w.payload.last != last_beat, Resp.SLVERR,
                                     beat_resp(w_head.bad, w_word)))
        burst_resp = Mux(this_resp.as_value() > w_resp.as_value(), this_resp, w_resp)
        m.d.comb += [
            write_port.addr.eq(w_word),
            write_port.data.eq(bus.w.payload.data),
        ]
        b_entry = data.View(response, b_queue.w_data)
        with m.If(w_fire):
            m.d.sync += [w_beat.eq(w_beat + 1), w_resp.eq(burst_resp), prefer_write.eq(0)]
            with m.If(this_resp == Resp.OKAY):
                m.d.comb += write_port.en.eq(bus.w.payload.strb)
            with m.If(last_beat):
                m.d.sync += [w_beat.eq(0), w_resp.eq(Resp.OKAY)]
                m.d.comb += [
                    aw_queue.r_en.eq(1),
                    b_queue.w_en.eq(1),
                    b_entry.ready_at.eq(Mux(w_head.ready_at > now + 1, w_head.ready_at,
                                            now + 1)),
                    b_entry.resp.eq(burst_resp),
                ]
        m.d.comb += beat.eq(offer_read | w_fire)

        b_head = data.View(response, b_queue.r_data)
        b_held = Signal()
        m.d.comb += [
            bus.b.valid.eq(b_held | (~self.hang & b_queue.r_rdy & (now >= b_head.ready_at))),
            bus.b.payload.resp.eq(b_head.resp),
        ]
        m.d.sync += b_held.eq(bus.b.valid & ~bus.b.ready)
        b_fire = bus.b.valid & bus.b.ready
        m.d.comb += b_queue.r_en.eq(b_fire)
        aw_fire = bus.aw.valid & bus.aw.ready
        with m.If(aw_fire & ~b_fire):
            m.d.sync += writes_outstanding.eq(writes_outstanding + 1)
        with m.Elif(b_fire & ~aw_fire):
            m.d.sync += writes_outstanding.eq(writes_outstanding - 1)
        return m
