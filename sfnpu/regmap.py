"""The control and status register map: the single definition of every register the host sees.

The CSR block (:mod:`sfnpu.hw.csr`) builds its address decoder, reset values and read
multiplexer from :data:`REGISTERS`; ``firmware/include/sfnpu_regs.h`` and ``docs/registers.md``
are rendered from it by ``make docs`` (:mod:`sfnpu.docs`). :class:`ErrorCode` and
:class:`StallCause` are shaped enums: the RTL carries them on signals, the host decodes
``ERROR_CODE`` with the same class, the C header lists the same values. No other file may restate
an offset, a bit position or a code.

Conventions:

* 32-bit registers at word-aligned byte offsets on an AXI4-Lite slave; the two low address bits
  are ignored. A read or write of an offset not listed here answers ``SLVERR``; so does a write
  to a register without writable fields, and a write to a register marked *locked while busy*
  during a run (the write is then dropped), so a firmware bug is reported, not absorbed.
* 64-bit quantities are ``*_LO``/``*_HI`` pairs. For counters (:attr:`Register.latched`),
  reading ``*_LO`` copies the upper half into a shadow register and reading ``*_HI`` returns the
  shadow: read LO first, then HI, and the two halves belong to the same cycle. There is one
  shadow for all counters, so read pairs without interleaving.
* Access per field: ``RO`` read-only, ``RW`` read/write, ``W1C`` set by hardware and cleared by
  writing 1, ``W1P`` write 1 to trigger a one-cycle pulse (reads 0). Byte write strobes apply.
"""

from __future__ import annotations

import enum as py_enum
from dataclasses import dataclass

from amaranth.hdl import Shape
from amaranth.lib import enum

from . import image

__all__ = [
    "MAGIC", "REGMAP_VERSION", "DATA_BITS", "Access", "ErrorCode", "ERROR_DOCS", "StallCause",
    "STALL_DOCS", "Field", "Register", "REGISTERS", "register", "by_offset", "wide_registers",
    "reset_value", "check", "HW_PARAMETERS", "render_markdown", "render_c_header",
]

#: ``ID`` register value: ASCII "SFNP" in little-endian byte order.
MAGIC = int.from_bytes(b"SFNP", "little")
#: Register map format version; bumped whenever an offset, field or meaning changes.
REGMAP_VERSION = 1
DATA_BITS = 32


class Access(py_enum.Enum):
    RO = "RO"
    RW = "RW"
    W1C = "W1C"
    W1P = "W1P"

    @property
    def writable(self) -> bool:
        return self is not Access.RO


class ErrorCode(enum.Enum, shape=8):
    """Why the accelerator stopped: the first error of a run ends it and is kept in
    ERROR_CODE, ERROR_GROUP and ERROR_ADDR."""
    NONE = 0
    ILLEGAL_OPCODE = 1
    ILLEGAL_FIELD = 2
    DMA_WINDOW = 3
    BUFFER_OVERFLOW = 4
    AXI_READ_ERROR = 5
    AXI_WRITE_ERROR = 6
    TIMEOUT = 7
    IMAGE_MISMATCH = 8
    UNSUPPORTED = 9
    WEIGHTS_NOT_HELD = 10


ERROR_DOCS = {
    ErrorCode.NONE: "no error",
    ErrorCode.ILLEGAL_OPCODE: "the fetched instruction's opcode is not GROUP",
    ErrorCode.ILLEGAL_FIELD: "reserved bits set, an undefined enum value, or a rule of "
                             "sfnpu.isa.validate broken",
    ErrorCode.DMA_WINDOW: "a DMA command touched a bus word outside "
                          "[DMA_WINDOW_BASE, DMA_WINDOW_LIMIT); nothing was issued",
    ErrorCode.BUFFER_OVERFLOW: "an on-chip buffer access beyond the buffer's size",
    ErrorCode.AXI_READ_ERROR: "SLVERR or DECERR on the read data channel",
    ErrorCode.AXI_WRITE_ERROR: "SLVERR or DECERR on the write response channel",
    ErrorCode.TIMEOUT: "the bus slave made no handshake for WATCHDOG cycles",
    ErrorCode.IMAGE_MISMATCH: "image magic, format version or hardware fingerprint differs "
                              "from this hardware, no INSTRUCTIONS section, or an image base "
                              "that is not a multiple of SECTION_ALIGN",
    ErrorCode.UNSUPPORTED: "a valid instruction uses a feature this hardware build does not "
                           "implement (see the controller's documentation)",
    ErrorCode.WEIGHTS_NOT_HELD: "weights_held is set, but the weight store does not hold the "
                                "group's weights whole: the last weight load was of other "
                                "weights (another offset or kind), partial (frame-reuse "
                                "chunks), or there was none in this run; or they do not fit "
                                "the store",
}


class StallCause(enum.Enum, shape=2):
    """Stall counters: the controller asserts one bit per cause in every cycle of a run in
    which the MAC array does no useful work for that reason (several may be set at once)."""
    DRAM_READ = 0
    DRAM_WRITE = 1
    WEIGHTS = 2
    CONTROL = 3


STALL_DOCS = {
    StallCause.DRAM_READ: "waiting for read data (input rows, shortcut, parameters)",
    StallCause.DRAM_WRITE: "output blocked by the DRAM write path",
    StallCause.WEIGHTS: "waiting for the next weight block",
    StallCause.CONTROL: "instruction fetch, decode and group switch",
}


#: Reset values that depend on the hardware instance (resolved by :func:`reset_value`).
HW_PARAMETERS = {
    "fingerprint_lo": "low 32 bits of HwConfig.fingerprint",
    "fingerprint_hi": "high 32 bits of HwConfig.fingerprint",
    "group_log_depth": "entries in the per-group cycle log (an elaboration parameter)",
}


@dataclass(frozen=True)
class Field:
    name: str
    lsb: int
    width: int
    access: Access
    doc: str
    reset: int | str = 0            # an int, or a key of HW_PARAMETERS
    enum: type | None = None        # shaped enum the field holds

    @property
    def msb(self) -> int:
        return self.lsb + self.width - 1

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.lsb


@dataclass(frozen=True)
class Register:
    name: str
    offset: int
    fields: tuple[Field, ...]
    doc: str
    latched: bool = False           # half of a 64-bit counter read through the shadow register
    locked_while_busy: bool = False  # writes during a run are dropped and answer SLVERR
    read_side_effect: str = ""      # what a read changes, if anything

    @property
    def writable(self) -> bool:
        return any(f.access.writable for f in self.fields)

    @property
    def access(self) -> str:
        kinds = []
        for f in self.fields:
            if f.access.value not in kinds:
                kinds.append(f.access.value)
        return "/".join(kinds)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"register {self.name} has no field {name!r}")


def _word(name, offset, access, doc, *, reset=0, field_doc=None, **kw) -> Register:
    """A register holding one 32-bit field named like the register (lower case)."""
    return Register(name, offset, (Field(name.lower(), 0, 32, access, field_doc or doc, reset),),
                    doc, **kw)


def _pair(name, offset, access, doc, *, latched=False, **kw) -> tuple[Register, Register]:
    """A 64-bit quantity as ``*_LO`` at ``offset`` and ``*_HI`` at ``offset + 4``."""
    return (_word(f"{name}_LO", offset, access, f"{doc} (bits 31:0)", latched=latched, **kw),
            _word(f"{name}_HI", offset + 4, access, f"{doc} (bits 63:32)", latched=latched, **kw))


_STALL_BASE = 0x088
_RO, _RW, _W1C, _W1P = Access.RO, Access.RW, Access.W1C, Access.W1P

REGISTERS: tuple[Register, ...] = (
    # -- identity ----------------------------------------------------------------------------
    _word("ID", 0x000, _RO, 'magic number, ASCII "SFNP" (little-endian)', reset=MAGIC),
    Register("VERSION", 0x004, (
        Field("regmap", 0, 16, _RO, "register map version (REGMAP_VERSION)", REGMAP_VERSION),
        Field("image_format", 16, 16, _RO, "DRAM image format version the hardware executes",
              image.FORMAT_VERSION),
    ), "format versions"),
    _word("FINGERPRINT_LO", 0x008, _RO, "hardware fingerprint (bits 31:0), as in the image "
          "header", reset="fingerprint_lo"),
    _word("FINGERPRINT_HI", 0x00C, _RO, "hardware fingerprint (bits 63:32)",
          reset="fingerprint_hi"),
    _word("GROUP_LOG_DEPTH", 0x010, _RO, "entries in the per-group cycle log",
          reset="group_log_depth"),
    # -- control and status ------------------------------------------------------------------
    Register("CONTROL", 0x020, (
        Field("start", 0, 1, _W1P, "start a run at IMAGE_BASE (ignored while busy); clears "
              "STATUS.done/error, the error registers, the counters and the group log"),
        Field("soft_reset", 1, 1, _W1P, "abort: return to idle and clear status, error "
              "registers, counters and the group log"),
        Field("irq_enable", 2, 1, _RW, "drive the interrupt while STATUS.done or STATUS.error "
              "is set"),
    ), "run control"),
    Register("STATUS", 0x024, (
        Field("busy", 0, 1, _RO, "a run is in progress, or the core is still completing bus "
              "transactions (after an error or a soft reset)"),
        Field("done", 1, 1, _W1C, "the run ended (successfully or with an error)"),
        Field("error", 2, 1, _W1C, "the run ended with an error; see ERROR_CODE"),
    ), "run status"),
    Register("ERROR_CODE", 0x028, (
        Field("code", 0, 8, _RO, "first error of the run", enum=ErrorCode),
    ), "why the run stopped"),
    _word("ERROR_GROUP", 0x02C, _RO, "index of the group that was running at the first error"),
    *_pair("ERROR_ADDR", 0x030, _RO, "bus address of the first error: DMA command start "
           "(DMA_WINDOW) or burst start (AXI_*_ERROR)"),
    _word("WATCHDOG", 0x038, _RW, "cycles the bus slave may stall the DMA without any "
          "handshake before the run stops with TIMEOUT; 0 disables", reset=1 << 20),
    *_pair("IMAGE_BASE", 0x040, _RW, "bus address of the DRAM image (instruction and tensor "
           "offsets are relative to it)", locked_while_busy=True),
    *_pair("DMA_WINDOW_BASE", 0x048, _RW, "first byte the DMA may access",
           locked_while_busy=True),
    *_pair("DMA_WINDOW_LIMIT", 0x050, _RW, "first byte after the window (exclusive; reset "
           "0: empty window, no access allowed)", locked_while_busy=True),
    # -- performance counters: reset by start, counting while busy -------------------------------
    *_pair("CYCLES", 0x080, _RO, "cycles of the run", latched=True),
    *[reg for cause in StallCause for reg in _pair(
        f"STALL_{cause.name}", _STALL_BASE + 8 * cause.value, _RO,
        f"stall cycles, cause {cause.name}", latched=True)],
    *_pair("DRAM_READ_BYTES", 0x0A8, _RO, "bytes of every read data beat on the bus",
           latched=True),
    *_pair("DRAM_WRITE_BYTES", 0x0B0, _RO, "bytes written to DRAM (write strobes set)",
           latched=True),
    # -- per-group cycle log -----------------------------------------------------------------
    _word("GROUP_COUNT", 0x0C0, _RO, "groups completed in this run (log entries written; "
          "entry k is stored at k mod GROUP_LOG_DEPTH)"),
    Register("GROUP_LOG_INDEX", 0x0C4, (
        Field("index", 0, 16, _RW, "log entry read by GROUP_LOG_DATA (taken modulo "
              "GROUP_LOG_DEPTH)"),
    ), "group log read pointer"),
    _word("GROUP_LOG_DATA", 0x0C8, _RO, "cycles of group GROUP_LOG_INDEX: from the cycle after "
          "the previous group ended (or the first cycle of the run) to its last cycle, "
          "inclusive; saturates at 2^32-1",
          read_side_effect="GROUP_LOG_INDEX.index increments"),
    _word("GROUP_LOG_READ_BYTES", 0x0CC, _RO, "DRAM bytes read by group GROUP_LOG_INDEX "
          "(as DRAM_READ_BYTES counts them); read it before GROUP_LOG_DATA, whose read "
          "advances the index; saturates at 2^32-1"),
    _word("GROUP_LOG_WRITE_BYTES", 0x0D0, _RO, "DRAM bytes written by group GROUP_LOG_INDEX "
          "(as DRAM_WRITE_BYTES counts them); saturates at 2^32-1"),
)

_BY_NAME = {r.name: r for r in REGISTERS}
_BY_OFFSET = {r.offset: r for r in REGISTERS}


def register(name: str) -> Register:
    return _BY_NAME[name]


def by_offset(offset: int) -> Register | None:
    return _BY_OFFSET.get(offset)


def offsets_and_masks() -> dict:
    """The map as plain data — ``{"magic", "offsets": {register: offset}, "masks":
    {"REGISTER.field": mask}}`` — for processes that drive the bus but should not load
    Amaranth (the cocotb testbench: :mod:`sfnpu.tb.cocotb_system`)."""
    return {"magic": MAGIC,
            "offsets": {r.name: r.offset for r in REGISTERS},
            "masks": {f"{r.name}.{f.name}": f.mask for r in REGISTERS for f in r.fields}}


def wide_registers() -> dict[str, tuple[Register, Register]]:
    """64-bit quantities: base name → (LO, HI)."""
    return {r.name[:-3]: (r, _BY_NAME[r.name[:-3] + "_HI"])
            for r in REGISTERS if r.name.endswith("_LO")}


def reset_value(reg: Register, params: dict[str, int] | None = None) -> int:
    """The register's value after reset; ``params`` resolves HW_PARAMETERS names."""
    value = 0
    for f in reg.fields:
        reset = f.reset
        if isinstance(reset, str):
            if params is None or reset not in params:
                raise KeyError(f"{reg.name}.{f.name}: reset value needs parameter {reset!r}")
            reset = params[reset]
        if f.access is Access.W1P:
            reset = 0
        value |= (reset & ((1 << f.width) - 1)) << f.lsb
    return value


def check(registers=REGISTERS):
    """Raise ValueError unless offsets are unique and aligned, fields fit and do not overlap,
    reset values fit, and enum fields have their enum's width."""
    seen = set()
    for reg in registers:
        if reg.offset % 4 or reg.offset in seen:
            raise ValueError(f"{reg.name}: offset {reg.offset:#x} unaligned or reused")
        seen.add(reg.offset)
        used = 0
        for f in reg.fields:
            if f.lsb < 0 or f.width < 1 or f.msb >= DATA_BITS or used & f.mask:
                raise ValueError(f"{reg.name}.{f.name}: bits {f.msb}:{f.lsb} invalid")
            used |= f.mask
            if isinstance(f.reset, str) and f.reset not in HW_PARAMETERS:
                raise ValueError(f"{reg.name}.{f.name}: unknown parameter {f.reset!r}")
            if isinstance(f.reset, int) and not 0 <= f.reset < 1 << f.width:
                raise ValueError(f"{reg.name}.{f.name}: reset {f.reset} does not fit")
            if f.enum is not None and Shape.cast(f.enum).width != f.width:
                raise ValueError(f"{reg.name}.{f.name}: width differs from {f.enum}")
    for enum_type, docs in ((ErrorCode, ERROR_DOCS), (StallCause, STALL_DOCS)):
        if set(docs) != set(enum_type):
            raise ValueError(f"{enum_type.__name__}: every member needs a description")


check()


# --------------------------------------------------------------------------------------------
# Rendering (called by sfnpu.docs; `make docs` writes the files)
# --------------------------------------------------------------------------------------------

_ACCESS_DOCS = {
    Access.RO: "read-only",
    Access.RW: "read/write",
    Access.W1C: "set by hardware, cleared by writing 1",
    Access.W1P: "writing 1 triggers a one-cycle pulse; reads 0",
}


def _single_word(reg: Register) -> bool:
    """A register whose only field is the whole word named like it: no field macros."""
    return len(reg.fields) == 1 and reg.fields[0].width == 32 \
        and reg.fields[0].name == reg.name.lower()


def _reset_text(f: Field) -> str:
    if isinstance(f.reset, str):
        return f"`{f.reset}`"
    return f"{0 if f.access is Access.W1P else f.reset:#x}"


def render_markdown(banner: str) -> str:
    out = [
        "# Control and status registers",
        "",
        banner,
        "",
        f"Register map version {REGMAP_VERSION}. An AXI4-Lite slave of {DATA_BITS}-bit "
        "registers at the byte offsets below (the two low address bits are ignored). Reads and "
        "writes of offsets not listed answer `SLVERR`, as do writes to registers without "
        "writable fields and writes to registers *locked while busy* during a run (the write "
        "is dropped). Byte write strobes apply.",
        "",
        "64-bit quantities are `*_LO`/`*_HI` pairs. Reading the `*_LO` half of a counter "
        "(marked *latched*) copies its upper half into a shadow register that the next "
        "`*_HI` read returns: read LO, then HI, and both halves are from the same cycle. "
        "There is one shadow register for all counters. Counters are cleared by a start and "
        "count while a run is in progress; after it they hold their final values.",
        "",
        "Run: write the image base, the DMA window (reset: empty) and, if wanted, "
        "`CONTROL.irq_enable`; write `CONTROL.start`; wait for `STATUS.done` (polling or "
        "the interrupt); check `STATUS.error` and `ERROR_CODE`; clear `STATUS` by writing "
        "1s. A start is ignored while `STATUS.busy`, which also covers a core still "
        "completing bus transactions after an error or a soft reset.",
        "",
        "## Registers",
        "",
        "| offset | register | access | reset | description |",
        "| ---: | --- | --- | ---: | --- |",
    ]
    for reg in REGISTERS:
        notes = []
        if reg.latched:
            notes.append("latched")
        if reg.locked_while_busy:
            notes.append("locked while busy")
        if reg.read_side_effect:
            notes.append(f"reading: {reg.read_side_effect}")
        reset = (_reset_text(reg.fields[0]) if _single_word(reg)
                 else f"{reset_value(reg, {k: 0 for k in HW_PARAMETERS}):#x}")
        note = f" ({'; '.join(notes)})" if notes else ""
        out.append(f"| `{reg.offset:#05x}` | `{reg.name}` | {reg.access} | {reset} | "
                   f"{reg.doc}{note} |")
    out += [
        "",
        "## Fields",
        "",
        "| register | bits | field | access | reset | meaning |",
        "| --- | ---: | --- | --- | ---: | --- |",
    ]
    for reg in REGISTERS:
        if _single_word(reg):
            continue
        for f in reg.fields:
            bits = f"{f.msb}:{f.lsb}" if f.width > 1 else f"{f.lsb}"
            kind = f" (`{f.enum.__name__}`)" if f.enum is not None else ""
            out.append(f"| `{reg.name}` | {bits} | `{f.name}` | {f.access.value} | "
                       f"{_reset_text(f)} | {f.doc}{kind} |")
    out += ["", "Access kinds: " + "; ".join(f"`{a.value}` {d}" for a, d in
                                            _ACCESS_DOCS.items()) + ".", ""]
    out += ["Reset values named in backticks depend on the hardware instance:", ""]
    out += [f"- `{name}`: {doc}" for name, doc in HW_PARAMETERS.items()]
    for enum_type, docs in ((ErrorCode, ERROR_DOCS), (StallCause, STALL_DOCS)):
        out += ["", f"## {enum_type.__name__}", "",
                " ".join(enum_type.__doc__.split()), "",
                "| value | name | meaning |", "| ---: | --- | --- |"]
        out += [f"| {m.value} | `{m.name}` | {docs[m]} |" for m in enum_type]
    out.append("")
    return "\n".join(out)


def render_c_header(banner: str) -> str:
    out = [
        f"/* {banner} */",
        "#ifndef SFNPU_REGS_H",
        "#define SFNPU_REGS_H",
        "",
        "#include <stdint.h>",
        "",
        f"#define SFNPU_ID_MAGIC 0x{MAGIC:08x}u",
        f"#define SFNPU_REGMAP_VERSION {REGMAP_VERSION}u",
        "",
        "/* Register byte offsets from the CSR base. */",
    ]
    out += [f"#define SFNPU_REG_{reg.name:<22} 0x{reg.offset:03x}u" for reg in REGISTERS]
    out += ["", "/* Fields: _SHIFT (lowest bit), _MASK (in place), _RESET (after reset). */"]
    for reg in REGISTERS:
        if _single_word(reg):
            continue
        for f in reg.fields:
            stem = f"SFNPU_{reg.name}_{f.name.upper()}"
            out += [f"#define {stem}_SHIFT {f.lsb}u", f"#define {stem}_MASK 0x{f.mask:08x}u"]
            if isinstance(f.reset, int):
                reset = 0 if f.access is Access.W1P else f.reset
                out.append(f"#define {stem}_RESET {reset}u")
    out += ["", "/* Non-zero reset values of whole-word registers. */"]
    for reg in REGISTERS:
        if _single_word(reg) and isinstance(reg.fields[0].reset, int) \
                and reg.fields[0].reset:
            out.append(f"#define SFNPU_{reg.name}_RESET 0x{reg.fields[0].reset:08x}u")
    for enum_type, docs, prefix, name in (
            (ErrorCode, ERROR_DOCS, "SFNPU_ERROR_", "sfnpu_error_t"),
            (StallCause, STALL_DOCS, "SFNPU_STALL_", "sfnpu_stall_cause_t")):
        out += ["", f"/* {' '.join(enum_type.__doc__.split())} */", "typedef enum {"]
        out += [f"    {prefix + m.name:<28} = {m.value}, /* {docs[m]} */" for m in enum_type]
        out += [f"}} {name};"]
    out += [
        "",
        "/* A 64-bit register pair: LO first (for a counter this latches HI), then HI. */",
        "static inline uint64_t sfnpu_read64(volatile const uint32_t *csr, uint32_t lo_offset)",
        "{",
        "    uint32_t lo = csr[lo_offset / 4u];",
        "    uint32_t hi = csr[lo_offset / 4u + 1u];",
        "    return ((uint64_t)hi << 32) | lo;",
        "}",
        "",
        "#endif /* SFNPU_REGS_H */",
        "",
    ]
    return "\n".join(out)
