"""Control and status registers: an AXI4-Lite slave implementing :mod:`sfnpu.regmap`.

Offsets, field positions, access kinds and reset values all come from the register map; this
block decides only where each field's value lives and what the hardware does with it. The rest of
the accelerator sees the registers through :class:`ControlSignature`: run control and the DMA
window out, events and per-cycle counter increments in.

Run protocol (from the CSR's side):

* ``start`` pulses for one cycle, the cycle after the host writes CONTROL.start, when not
  busy. It clears STATUS.done/error, the error registers, every counter and the group log;
  ``running`` is 1 from the next cycle until the core reports ``done`` or ``error``.
* While running, CYCLES counts every cycle, each STALL_* counter the cycles its ``stall`` bit is
  set, the byte counters add ``read_bytes``/``write_bytes``. A ``group_done`` pulse appends the
  group's cycle count to the log. ``done`` ends the run; ``error`` ends it with a code (and
  sets STATUS.done as well).
* ``soft_reset`` pulses the cycle after a write of CONTROL.soft_reset: the CSR returns to idle
  at once and the core must abort. STATUS.busy also covers a core that is not yet ``idle``
  (still completing bus transactions after an error or an abort): a start is ignored until it
  is.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu import regmap
from sfnpu.config import HwConfig
from sfnpu.regmap import Access, ErrorCode, StallCause

from .axi import AxiLiteSignature, Resp

__all__ = ["ControlSignature", "CsrBlock"]

_STALL_CAUSES = len(StallCause)
_LOG_ENTRY_MAX = (1 << 32) - 1


class ControlSignature(wiring.Signature):
    """CSR ↔ accelerator core, from the CSR's side (``Out`` = driven by the CSR block).

    Members
    -------
    start, soft_reset : Out(1)
        One-cycle pulses (see the module docstring).
    running : Out(1)
        A run is in progress (counters count).
    image_base, window_base, window_limit : Out(64)
        IMAGE_BASE, DMA_WINDOW_BASE, DMA_WINDOW_LIMIT (constant during a run: locked).
    watchdog : Out(32)
        WATCHDOG: allowed slave stall cycles, 0 = no limit.
    idle : In(1)
        The core has no bus transaction outstanding.
    done, error : In(1)
        One-cycle events ending the run; with ``error``, ``error_code``, ``error_group`` and
        ``error_addr`` are sampled.
    stall : In(len(StallCause))
        Bit ``StallCause.X.value`` set in every stalled cycle of cause X.
    read_bytes, write_bytes : In(range(bus_bytes + 1))
        DRAM bytes read / written in this cycle (the DMA's counter outputs).
    group_done : In(1)
        Pulse in the last cycle of each group.
    """

    def __init__(self, bus_bytes: int):
        self.bus_bytes = bus_bytes
        super().__init__({
            "start": Out(1),
            "soft_reset": Out(1),
            "running": Out(1),
            "image_base": Out(64),
            "window_base": Out(64),
            "window_limit": Out(64),
            "watchdog": Out(32),
            "idle": In(1),
            "done": In(1),
            "error": In(1),
            "error_code": In(ErrorCode),
            "error_group": In(32),
            "error_addr": In(64),
            "stall": In(_STALL_CAUSES),
            "read_bytes": In(range(bus_bytes + 1)),
            "write_bytes": In(range(bus_bytes + 1)),
            "group_done": In(1),
        })

    def __eq__(self, other):
        return type(other) is type(self) and other.bus_bytes == self.bus_bytes


class _Fields:
    """Where every field lives: register storage, pulses and the group's accumulators."""

    def __init__(self, ctl, counters: dict):
        reg = regmap.register
        self.irq_enable = Signal(init=reg("CONTROL").field("irq_enable").reset)
        self.running = Signal()
        self.done = Signal()
        self.error = Signal()
        self.error_code = Signal(ErrorCode)
        self.error_group = Signal(32)
        self.error_addr = Signal(64)
        self.watchdog = Signal(32, init=reg("WATCHDOG").field("watchdog").reset)
        self.wide_rw = {name: Signal(64, name=name.lower())
                        for name in ("IMAGE_BASE", "DMA_WINDOW_BASE", "DMA_WINDOW_LIMIT")}
        self.counters = counters
        self.group_count = Signal(32)
        self.log_index = Signal(reg("GROUP_LOG_INDEX").field("index").width)
        self.group_cycles = Signal(32)     # cycles of the current group so far, saturating
        self.high_shadow = Signal(32)      # upper counter half latched by a *_LO read
        self.start = Signal()
        self.soft_reset = Signal()
        self.busy = self.running | ~ctl.idle
        # The current group's DRAM bytes read and written (for its log entry).
        self.group_read = Signal(32)
        self.group_written = Signal(32)


class CsrBlock(wiring.Component):
    """The register map of :mod:`sfnpu.regmap` on an AXI4-Lite slave port.

    Parameters
    ----------
    config : HwConfig
        Supplies the fingerprint (FINGERPRINT_LO/HI) and the DRAM bus width (byte counters).
    addr_width : int
        AXI4-Lite address bits (default 12: a 4 KiB page).
    group_log_depth : int
        Entries of the per-group cycle log (a power of two; one 32-bit memory).

    Signature
    ---------
    bus : In(AxiLiteSignature(addr_width))
        Register access. A write is accepted when address and data are both valid; one
        transaction per direction is in flight at a time. Answers OKAY, or SLVERR for unmapped
        offsets, writes to read-only registers and writes to locked registers while busy.
        Read latency: the read data is valid the cycle after the address is accepted.
    control : Out(ControlSignature(config.dram_bus_bytes))
        To and from the accelerator core.
    irq : Out(1)
        Level interrupt: CONTROL.irq_enable and (STATUS.done or STATUS.error).
    """

    def __init__(self, config: HwConfig, *, addr_width: int = 12, group_log_depth: int = 256):
        if group_log_depth < 1 or group_log_depth & (group_log_depth - 1):
            raise ValueError(f"group_log_depth must be a power of two, not {group_log_depth}")
        index_bits = regmap.register("GROUP_LOG_INDEX").field("index").width
        if group_log_depth > 1 << index_bits:
            raise ValueError(f"group_log_depth exceeds the {index_bits}-bit log index")
        top = max(r.offset for r in regmap.REGISTERS)
        if top >= 1 << addr_width:
            raise ValueError(f"addr_width {addr_width} cannot reach offset {top:#x}")
        self.config = config
        self.addr_width = addr_width
        self.group_log_depth = group_log_depth
        self.parameters = {
            "fingerprint_lo": config.fingerprint & 0xFFFF_FFFF,
            "fingerprint_hi": config.fingerprint >> 32,
            "group_log_depth": group_log_depth,
        }
        #: The 64-bit performance counters by register base name (a simulation backdoor).
        self.counters = {name: Signal(64, name=name.lower())
                         for name in ("CYCLES", *(f"STALL_{c.name}" for c in StallCause),
                                      "DRAM_READ_BYTES", "DRAM_WRITE_BYTES")}
        super().__init__({
            "bus": In(AxiLiteSignature(addr_width)),
            "control": Out(ControlSignature(config.dram_bus_bytes)),
            "irq": Out(1),
        })

    @staticmethod
    def _high_half(counter, shadow):
        """What a counter's *_HI read returns: the half latched by the *_LO read before it."""
        return shadow

    @staticmethod
    def _word_index_bits():
        return (max(r.offset for r in regmap.REGISTERS) >> 2).bit_length()

    def elaborate(self, platform):
        m = Module()
        ctl = self.control
        f = _Fields(ctl, self.counters)
        log_write, log_read, log_bits = self._group_log(m, f)
        read_value = self._read_values(f, log_read)
        self._bus_write(m, f)
        self._bus_read(m, f, read_value)

        # -- run state, counters and the group log (after the bus writes: hardware wins) -------
        start_run = f.start & ~f.busy
        with m.If(f.running):
            self._count(m, f, log_write, log_bits)

        # A start or a soft reset clears the run state (one condition: it maps onto the
        # flip-flops' synchronous reset).
        clear = Signal()
        m.d.comb += clear.eq(f.soft_reset | start_run)
        with m.If(clear):
            m.d.sync += [f.done.eq(0), f.error.eq(0), f.error_code.eq(ErrorCode.NONE),
                         f.error_group.eq(0), f.error_addr.eq(0), f.group_count.eq(0),
                         f.group_cycles.eq(0), f.group_read.eq(0), f.group_written.eq(0),
                         f.running.eq(~f.soft_reset)]
            m.d.sync += [counter.eq(0) for counter in f.counters.values()]

        m.d.comb += [
            ctl.start.eq(start_run & ~f.soft_reset),
            ctl.soft_reset.eq(f.soft_reset),
            ctl.running.eq(f.running),
            ctl.image_base.eq(f.wide_rw["IMAGE_BASE"]),
            ctl.window_base.eq(f.wide_rw["DMA_WINDOW_BASE"]),
            ctl.window_limit.eq(f.wide_rw["DMA_WINDOW_LIMIT"]),
            ctl.watchdog.eq(f.watchdog),
            self.irq.eq(f.irq_enable & (f.done | f.error)),
        ]
        return m

    def _group_log(self, m, f):
        """The group log: one entry per group (cycles, DRAM bytes read, bytes written)."""
        m.submodules.group_log = log = Memory(shape=96, depth=self.group_log_depth, init=[])
        log_write = log.write_port()
        log_read = log.read_port()
        log_bits = (self.group_log_depth - 1).bit_length()
        m.d.comb += log_read.addr.eq(f.log_index[:log_bits])
        return log_write, log_read, log_bits

    def _read_values(self, f, log_read):
        """The read value of every register, as a function of the register."""
        reg = regmap.register
        constants = {name: Const(regmap.reset_value(reg(name), self.parameters), 32)
                     for name in ("ID", "VERSION", "FINGERPRINT_LO", "FINGERPRINT_HI",
                                  "GROUP_LOG_DEPTH")}
        fields = {
            "CONTROL": {"start": Const(0), "soft_reset": Const(0), "irq_enable": f.irq_enable},
            "STATUS": {"busy": f.busy, "done": f.done, "error": f.error},
            "ERROR_CODE": {"code": f.error_code},
            "ERROR_GROUP": {"error_group": f.error_group},
            "ERROR_ADDR_LO": {"error_addr_lo": f.error_addr[:32]},
            "ERROR_ADDR_HI": {"error_addr_hi": f.error_addr[32:]},
            "WATCHDOG": {"watchdog": f.watchdog},
            "GROUP_COUNT": {"group_count": f.group_count},
            "GROUP_LOG_INDEX": {"index": f.log_index},
            "GROUP_LOG_DATA": {"group_log_data": log_read.data[:32]},
            "GROUP_LOG_READ_BYTES": {"group_log_read_bytes": log_read.data[32:64]},
            "GROUP_LOG_WRITE_BYTES": {"group_log_write_bytes": log_read.data[64:]},
        }
        for name, value in [*f.wide_rw.items(), *f.counters.items()]:
            lo, hi = regmap.wide_registers()[name]
            fields[lo.name] = {lo.fields[0].name: value[:32]}
            fields[hi.name] = {hi.fields[0].name: self._high_half(value, f.high_shadow)
                               if hi.latched else value[32:]}

        def read_value(r: regmap.Register):
            if r.name in constants:
                return constants[r.name]
            parts, pos = [], 0
            for field in sorted(r.fields, key=lambda field: field.lsb):
                parts += [Const(0, field.lsb - pos), fields[r.name][field.name]]
                pos = field.lsb + field.width
            return Cat(*parts, Const(0, 32 - pos))

        missing = [r.name for r in regmap.REGISTERS
                   if r.name not in constants and r.name not in fields]
        assert not missing, f"registers without an implementation: {missing}"
        return read_value

    def _bus_write(self, m, f):
        """AXI4-Lite write: address and data together, one response outstanding."""
        bus = self.bus
        b_valid = Signal()
        b_resp = Signal(Resp)
        write_fire = bus.aw.valid & bus.w.valid & ~b_valid
        write_offset = Cat(Const(0, 2), bus.aw.payload.addr[2:])
        strobe_mask = Cat(*(bit.replicate(8) for bit in bus.w.payload.strb))
        wdata = bus.w.payload.data
        m.d.comb += [
            bus.aw.ready.eq(write_fire),
            bus.w.ready.eq(write_fire),
            bus.b.valid.eq(b_valid),
            bus.b.payload.resp.eq(b_resp),
        ]
        with m.If(bus.b.valid & bus.b.ready):
            m.d.sync += b_valid.eq(0)

        rw_storage = {
            ("CONTROL", "irq_enable"): f.irq_enable,
            ("WATCHDOG", "watchdog"): f.watchdog,
            ("GROUP_LOG_INDEX", "index"): f.log_index,
        }
        for name, value in f.wide_rw.items():
            lo, hi = regmap.wide_registers()[name]
            rw_storage[(lo.name, lo.fields[0].name)] = value[:32]
            rw_storage[(hi.name, hi.fields[0].name)] = value[32:]
        w1c_storage = {("STATUS", "done"): f.done, ("STATUS", "error"): f.error}
        w1p_pulses = {("CONTROL", "start"): f.start, ("CONTROL", "soft_reset"): f.soft_reset}
        # Pulses leave a flip-flop, one cycle after the write: the host's bus logic does not
        # reach into the run state and the sequencer in the same cycle.
        m.d.sync += [pulse.eq(0) for pulse in w1p_pulses.values()]

        with m.If(write_fire):
            m.d.sync += [b_valid.eq(1), b_resp.eq(Resp.SLVERR)]
            with m.Switch(write_offset):
                for r in regmap.REGISTERS:
                    if not r.writable:
                        continue
                    with m.Case(r.offset):
                        allowed = ~f.busy if r.locked_while_busy else Const(1)
                        with m.If(allowed):
                            m.d.sync += b_resp.eq(Resp.OKAY)
                            for field in r.fields:
                                key = (r.name, field.name)
                                bits = slice(field.lsb, field.lsb + field.width)
                                ones = (wdata & strobe_mask)[bits]
                                if field.access is Access.RW:
                                    target = rw_storage[key]
                                    keep = target & ~strobe_mask[bits]
                                    m.d.sync += target.eq(keep | ones)
                                elif field.access is Access.W1C:
                                    with m.If(ones.any()):
                                        m.d.sync += w1c_storage[key].eq(0)
                                elif field.access is Access.W1P:
                                    m.d.sync += w1p_pulses[key].eq(ones.any())

    def _bus_read(self, m, f, read_value):
        """AXI4-Lite read: data registered, valid the cycle after the address."""
        bus = self.bus
        r_valid = Signal()
        r_data = Signal(32)
        r_resp = Signal(Resp)
        read_fire = bus.ar.valid & ~r_valid
        read_offset = Cat(Const(0, 2), bus.ar.payload.addr[2:])
        m.d.comb += [
            bus.ar.ready.eq(read_fire),
            bus.r.valid.eq(r_valid),
            bus.r.payload.data.eq(r_data),
            bus.r.payload.resp.eq(r_resp),
        ]
        with m.If(bus.r.valid & bus.r.ready):
            m.d.sync += r_valid.eq(0)
        # Read data: a binary mux tree over the word index (holes and words past the map read
        # 0); the response and the read side effects decode the full offset.
        read_words = self._word_index_bits()
        words = [Const(0, 32)] * (1 << read_words)
        for r in regmap.REGISTERS:
            words[r.offset >> 2] = read_value(r)
        word_index = bus.ar.payload.addr[2:2 + read_words]
        selected = words
        for bit in word_index:
            selected = [Mux(bit, hi, lo) for lo, hi in zip(selected[::2], selected[1::2])]
        in_range = bus.ar.payload.addr[2 + read_words:] == 0
        with m.If(read_fire):
            m.d.sync += [r_valid.eq(1), r_data.eq(Mux(in_range, selected[0], 0)),
                         r_resp.eq(Resp.SLVERR)]
            with m.Switch(read_offset):
                for r in regmap.REGISTERS:
                    with m.Case(r.offset):
                        m.d.sync += r_resp.eq(Resp.OKAY)
                        if r.latched and r.name.endswith("_LO"):
                            # The upper half of the same cycle's value, for the *_HI read.
                            m.d.sync += f.high_shadow.eq(f.counters[r.name[:-3]][32:])
                        if r.name == "GROUP_LOG_DATA":
                            m.d.sync += f.log_index.eq(f.log_index + 1)

    def _count(self, m, f, log_write, log_bits):
        """While running: the counters, the group's log entry, and the end of the run."""
        ctl, counters = self.control, f.counters
        m.d.sync += counters["CYCLES"].eq(counters["CYCLES"] + 1)
        for cause in StallCause:
            counter = counters[f"STALL_{cause.name}"]
            m.d.sync += counter.eq(counter + ctl.stall[cause.value])
        m.d.sync += [
            counters["DRAM_READ_BYTES"].eq(counters["DRAM_READ_BYTES"] + ctl.read_bytes),
            counters["DRAM_WRITE_BYTES"].eq(counters["DRAM_WRITE_BYTES"] + ctl.write_bytes),
        ]

        def saturating(total, step):
            wide = total + step
            return Mux(wide > _LOG_ENTRY_MAX, _LOG_ENTRY_MAX, wide)[:32]

        this_group = saturating(f.group_cycles, 1)
        this_read = saturating(f.group_read, ctl.read_bytes)
        this_written = saturating(f.group_written, ctl.write_bytes)
        m.d.sync += [f.group_cycles.eq(this_group), f.group_read.eq(this_read),
                     f.group_written.eq(this_written)]
        with m.If(ctl.group_done):
            m.d.comb += [
                log_write.addr.eq(f.group_count[:log_bits]),
                log_write.data.eq(Cat(this_group, this_read, this_written)),
                log_write.en.eq(1),
            ]
            m.d.sync += [f.group_count.eq(f.group_count + 1), f.group_cycles.eq(0),
                         f.group_read.eq(0), f.group_written.eq(0)]
        with m.If(ctl.done | ctl.error):
            m.d.sync += [f.running.eq(0), f.done.eq(1)]
        with m.If(ctl.error):
            m.d.sync += [
                f.error.eq(1),
                f.error_code.eq(ctl.error_code),
                f.error_group.eq(ctl.error_group),
                f.error_addr.eq(ctl.error_addr),
            ]
