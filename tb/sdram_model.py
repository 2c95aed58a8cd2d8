"""Behavioural SDR SDRAM for Amaranth's simulator that checks the controller's protocol.

:class:`SdramModel` sits on the pin-level signals of a
:class:`~sfnpu.hw.sdram.SdramController` (its ``sdram`` port): at every clock edge it decodes
the command, checks it against the rules below, stores write data (byte masks from DQM) and
drives read data onto ``dq_i`` ``cas_latency`` edges after a READ. It takes the same
:class:`~sfnpu.hw.sdram_timing.SdramCycles` the controller was built from — a test can build
the controller from altered cycles and watch the model flag it.

Rules checked (a :class:`Violation` names the rule and the edge; edges count from the first
clock edge of the simulation):

* power-up: no command before ``power_up`` edges; then PRECHARGE ALL, ``init_refreshes`` AUTO
  REFRESH, MODE REGISTER SET, in that order, before any other command (``init order``);
  a mode register with an unsupported CAS latency or burst length (``mode register``);
* tRC, tRRD, tRCD, tRAS, tRP, tWR (``tWR``: last write data to PRECHARGE), tRFC, tMRD, the
  read burst before PRECHARGE (``read to precharge``);
* ACTIVATE of a bank with an open row (``activate open bank``), READ or WRITE of a bank
  without one (``bank not active``), AUTO REFRESH or MODE with a bank open (``bank open``);
* a READ or WRITE that cuts the previous burst short (``burst interrupted``), BURST STOP
  (``unsupported command``), CKE low (``clock enable``);
* the data bus: the controller driving DQ while the SDRAM does (``bus contention``), write
  data not driven (``write data not driven``);
* refresh: two AUTO REFRESH commands, or the last one and the present edge, more than
  ``refi`` edges apart (``tREFI``).

Memory is sparse (a dict of 16-bit words) and reads zero where nothing was written. When the
SDRAM does not drive DQ, ``dq_i`` carries a pattern that changes every cycle, so a controller
that samples at the wrong edge reads garbage rather than a stale word.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sfnpu.hw.sdram import Command
from sfnpu.hw.sdram_timing import ULX3S_SDRAM, SdramCycles, SdramGeometry

__all__ = ["Violation", "SdramModel"]


@dataclass(frozen=True)
class Violation:
    rule: str
    edge: int
    detail: str

    def __str__(self):
        return f"edge {self.edge}: {self.rule}: {self.detail}"


@dataclass
class _Bank:
    row: int | None = None
    activated: int | None = None
    precharged: int | None = None
    read: int | None = None
    write: int | None = None


@dataclass
class SdramModel:
    pins: object                  # the controller's `sdram` interface
    cycles: SdramCycles
    geometry: SdramGeometry = ULX3S_SDRAM
    violations: list[Violation] = field(default_factory=list)
    commands: list[tuple[int, Command]] = field(default_factory=list)   # (edge, command)

    def __post_init__(self):
        self.memory: dict[tuple[int, int, int], int] = {}
        self.banks = [_Bank() for _ in range(1 << self.geometry.bank_bits)]
        self.edge = -1
        self.init_step = 0            # 0: power-up, 1: PRE ALL done, then refreshes, MODE
        self.ready = False
        self.cas_latency: int | None = None
        self.burst_length: int | None = None
        self.last_activate: int | None = None
        self.last_refresh: int | None = None
        self.last_mode: int | None = None
        self.last_burst: int | None = None      # edge of the last READ/WRITE
        self.last_read: int | None = None
        self.refresh_reported = False
        self.outputs: dict[int, int | None] = {}      # edge → word the SDRAM drives
        self.write_words: dict[int, tuple] = {}       # edge → (bank, row, col) to store
        self.driven: set[int] = set()                 # edges the SDRAM drives DQ
        self.dqm_at: dict[int, int] = {}

    # -- reporting -------------------------------------------------------------------------

    def flag(self, rule: str, detail: str):
        self.violations.append(Violation(rule, self.edge, detail))

    def _gap(self, rule: str, since: int | None, need: int, what: str):
        if since is not None and self.edge - since < need:
            self.flag(rule, f"{what} {self.edge - since} cycles after, needs {need}")

    def refreshes(self) -> list[int]:
        return [e for e, cmd in self.commands if cmd == Command.REFRESH]

    # -- simulation --------------------------------------------------------------------------

    async def run(self, ctx):
        """Testbench process: follow the pins forever (add with ``add_testbench(...,
        background=True)``)."""
        p = self.pins
        signals = (p.clk_en, p.cs, p.ras, p.cas, p.we, p.ba, p.a, p.dqm, p.dq_o, p.dq_oe)
        async for _clk, _rst, cke, cs, ras, cas, we, ba, a, dqm, dq, oe in \
                ctx.tick().sample(*signals):
            self.edge += 1
            self.step(cke, cs, Command(ras << 2 | cas << 1 | we), ba, a, dqm, dq, oe)
            self.dqm_at[self.edge] = dqm
            self.dqm_at.pop(self.edge - 2, None)
            word = self.read_word(self.edge + 1)
            ctx.set(p.dq_i, word if word is not None else (self.edge * 0x9E37 + 0x5A5A) & 0xFFFF)

    def step(self, cke, cs, command, ba, a, dqm, dq, oe):
        """One clock edge: the command, then the data bus."""
        c = self.cycles
        if not cke:
            self.flag("clock enable", "CKE low")
        if self.ready and not self.refresh_reported and self.edge - self.last_refresh > c.refi:
            self.flag("tREFI", f"no AUTO REFRESH for {self.edge - self.last_refresh} cycles, "
                      f"at most {c.refi}")
            self.refresh_reported = True
        if cs and command != Command.NOP:
            self._command(command, ba, a)
        self._data_bus(dqm, dq, oe)

    def _command(self, command, ba, a):
        c = self.cycles
        self.commands.append((self.edge, command))
        if self.edge < c.power_up:
            self.flag("power-up", f"{command.name} before edge {c.power_up}")
        self._init_order(command, a)
        self._gap("tRFC", self.last_refresh, c.rfc, f"{command.name} after AUTO REFRESH:")
        self._gap("tMRD", self.last_mode, c.mrd, f"{command.name} after MODE:")
        handler = {
            Command.ACTIVATE: self._activate, Command.READ: self._read_write,
            Command.WRITE: self._read_write, Command.PRECHARGE: self._precharge,
            Command.REFRESH: self._refresh, Command.MODE: self._mode,
        }.get(command)
        if handler is None:
            self.flag("unsupported command", command.name)
        else:
            handler(command, ba, a)

    def _init_order(self, command, a):
        if self.ready:
            return
        n = self.cycles.init_refreshes
        expected = ("PRECHARGE ALL" if self.init_step == 0 else
                    "AUTO REFRESH" if self.init_step <= n else "MODE")
        got = ("PRECHARGE ALL" if command == Command.PRECHARGE and a >> 10 & 1 else
               "AUTO REFRESH" if command == Command.REFRESH else
               "MODE" if command == Command.MODE else command.name)
        if got != expected:
            self.flag("init order", f"{got} where the power-up sequence needs {expected}")
        else:
            self.init_step += 1

    def _open_banks(self) -> list[int]:
        return [b for b, bank in enumerate(self.banks) if bank.row is not None]

    def _activate(self, command, ba, a):
        c, bank = self.cycles, self.banks[ba]
        if bank.row is not None:
            self.flag("activate open bank", f"bank {ba} has row {bank.row} open")
        self._gap("tRP", bank.precharged, c.rp, f"ACTIVATE bank {ba} after PRECHARGE:")
        self._gap("tRC", bank.activated, c.rc, f"ACTIVATE bank {ba} after ACTIVATE:")
        self._gap("tRRD", self.last_activate, c.rrd, "ACTIVATE after ACTIVATE:")
        bank.row, bank.activated = a, self.edge
        self.last_activate = self.edge

    def _read_write(self, command, ba, a):
        c, bank = self.cycles, self.banks[ba]
        bl = self.burst_length or 1
        if bank.row is None:
            self.flag("bank not active", f"{command.name} bank {ba} with no open row")
            return
        self._gap("tRCD", bank.activated, c.rcd, f"{command.name} bank {ba} after ACTIVATE:")
        self._gap("burst interrupted", self.last_burst, bl, f"{command.name} after READ/WRITE:")
        if a >> 10 & 1:
            self.flag("unsupported command", f"{command.name} with auto-precharge")
        column = a & ((1 << self.geometry.col_bits) - 1)
        base = column & ~(bl - 1)
        words = [(ba, bank.row, base | (column + i) % bl) for i in range(bl)]
        self.last_burst = self.edge
        if command == Command.READ:
            bank.read = self.last_read = self.edge
            for i, key in enumerate(words):
                self.outputs[self.edge + self.cas_latency + i] = key
            # The SDRAM holds DQ until after the burst's last edge (tOH).
            self.driven.update(range(self.edge + self.cas_latency,
                                     self.edge + self.cas_latency + bl + 1))
        else:
            self._gap("READ to WRITE", self.last_read, c.read_to_write, "WRITE after READ:")
            bank.write = self.edge
            for i, key in enumerate(words):
                self.write_words[self.edge + i] = key

    def _precharge(self, command, ba, a):
        c = self.cycles
        for b in (range(len(self.banks)) if a >> 10 & 1 else (ba,)):
            bank = self.banks[b]
            if bank.row is None:
                continue                  # precharging an idle bank is a NOP
            self._gap("tRAS", bank.activated, c.ras, f"PRECHARGE bank {b} after ACTIVATE:")
            self._gap("tWR", bank.write, c.write_to_precharge, f"PRECHARGE bank {b} after WRITE:")
            self._gap("read to precharge", bank.read, c.read_to_precharge,
                      f"PRECHARGE bank {b} after READ:")
            bank.row, bank.precharged = None, self.edge
            bank.read = bank.write = None

    def _idle_banks(self, command):
        c = self.cycles
        if self._open_banks():
            self.flag("bank open", f"{command.name} with banks {self._open_banks()} open")
        for b, bank in enumerate(self.banks):
            self._gap("tRP", bank.precharged, c.rp, f"{command.name} after PRECHARGE bank {b}:")
            self._gap("tRC", bank.activated, c.rc, f"{command.name} after ACTIVATE bank {b}:")

    def _refresh(self, command, ba, a):
        self._idle_banks(command)
        self.last_refresh = self.edge
        self.refresh_reported = False

    def _mode(self, command, ba, a):
        self._idle_banks(command)
        bl = {0: 1, 1: 2, 2: 4, 3: 8}.get(a & 7)
        cl = a >> 4 & 7
        if bl is None or cl not in (2, 3) or a >> 3 & 1 or a >> 7:
            self.flag("mode register", f"unsupported value {a:#x}")
        elif cl != self.cycles.cas_latency:
            self.flag("mode register", f"CAS latency {cl}, the part needs "
                      f"{self.cycles.cas_latency} at this clock")
        self.cas_latency, self.burst_length = cl, bl
        self.last_mode = self.edge
        if self.init_step == self.cycles.init_refreshes + 2:
            self.ready = True

    def _data_bus(self, dqm, dq, oe):
        """Write data at this edge; what the SDRAM drives at the next one is set by run()."""
        if oe and self.edge in self.driven:
            self.flag("bus contention", "DQ driven by the controller and the SDRAM")
        self.driven.discard(self.edge)
        key = self.write_words.pop(self.edge, None)
        if key is None:
            return
        if not oe:
            self.flag("write data not driven", f"write word {key} with DQ not driven")
        word = self.memory.get(key, 0)
        for lane in range(self.geometry.data_bits // 8):
            if not dqm >> lane & 1:
                mask = 0xFF << 8 * lane
                word = word & ~mask | dq & mask
        self.memory[key] = word

    def read_word(self, edge: int) -> int | None:
        """The word the SDRAM drives at ``edge`` (DQM two edges earlier masks its bytes)."""
        key = self.outputs.pop(edge, None)
        if key is None:
            return None
        word = self.memory.get(key, 0)
        masked = self.dqm_at.get(edge - 2, 0)
        for lane in range(self.geometry.data_bits // 8):
            if masked >> lane & 1:
                word ^= 0xA5 << 8 * lane      # high impedance: not the stored byte
        return word
