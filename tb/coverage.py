"""Functional coverage of the instruction set: which field values a regression exercises.

Every field of :class:`sfnpu.isa.InstructionLayout` (reserved bits excepted) gets bins: each
member of an enum, both values of a flag, and for numeric fields the classes the hardware
treats differently — kernel sides 1/3/5/7 and the even ones, strides, padding 0/1/more,
sizes of one pixel, of a few and of many, channel counts below, at, and above the lane count
(multiple of it or not), zero and non-zero zero points and offsets, clamps that narrow the
range. Field names come from :func:`sfnpu.isa.field_table`, so a field added to the ISA has
no bins until this module learns it, and :func:`field_bins` refuses it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable

from sfnpu import isa
from sfnpu.config import HwConfig
from sfnpu.isa import Instruction, Pool

__all__ = ["Coverage", "field_bins", "measure"]

Binner = Callable[[int, Instruction, HwConfig], str | None]


def _kernel(v, i, c):
    return str(v) if v in (1, 3, 5, 7) else "even"


def _pad(v, i, c):
    return "0" if v == 0 else ("1" if v == 1 else "2+")


def _size(v, i, c):
    return "1" if v == 1 else ("2..16" if v <= 16 else ">16")


def _channels(v, i, c):
    lanes = c.lanes
    if v < lanes:
        return "<L"
    if v == lanes:
        return "=L"
    return ">L, multiple" if v % lanes == 0 else ">L, not a multiple"


def _nonzero(v, i, c):
    return "0" if v == 0 else "non-zero"


def _pool_window(name, values):
    def bin_(v, i, c):
        if i.pool not in (Pool.MAX, Pool.AVG):
            return None                                  # unused without a window pool
        return str(v) if v in values else "other"
    bin_.bins = [str(v) for v in values]
    return bin_


def _clamp(end):
    def bin_(v, i, c):
        if i.act != isa.Activation.CLAMP:
            return None
        extreme = (-128 if i.out_signed else 0) if end == "lo" else (127 if i.out_signed else 255)
        return "type limit" if v == extreme else "narrowed"
    bin_.bins = ["type limit", "narrowed"]
    return bin_


def _flag(v, i, c):
    return str(v)


_kernel.bins = ["1", "3", "5", "7", "even"]
_pad.bins = ["0", "1", "2+"]
_size.bins = ["1", "2..16", ">16"]
_channels.bins = ["<L", "=L", ">L, multiple", ">L, not a multiple"]
_nonzero.bins = ["0", "non-zero"]
_flag.bins = ["0", "1"]

#: Numeric fields and how their values are binned.
_NUMERIC: dict[str, Binner] = {
    "kh": _kernel, "kw": _kernel,
    "pad_top": _pad, "pad_left": _pad, "pad_bottom": _pad, "pad_right": _pad,
    "pool_size": _pool_window("pool_size", (2, 3)),
    "pool_stride": _pool_window("pool_stride", (1, 2)),
    "pool_pad": _pool_window("pool_pad", (0, 1)),
    "in_h": _size, "in_w": _size, "out_h": _size, "out_w": _size,
    "in_zp": _nonzero, "out_zp": _nonzero, "sc_zp": _nonzero,
    "in_c": _channels, "out_c": _channels,
    "out_c_offset": _nonzero,
    "clamp_lo": _clamp("lo"), "clamp_hi": _clamp("hi"),
}
_STRIDE_BINS = ["1", "2"]
_CONSTANT_DATA = ("weights.offset", "weights.space", "params.offset", "params.space")


def field_bins() -> dict[str, tuple[Binner, list[str]]]:
    """(binner, every bin) of each non-reserved ISA field, by dotted name."""
    out = {}
    for f in isa.field_table():
        if f.kind == "reserved":
            continue
        leaf = f.name.split(".")[-1]
        enum = next((e for e in isa.enum_types() if e.__name__ == f.kind), None)
        if f.name in _CONSTANT_DATA:
            # Weights and parameters live in the image's DRAM sections (after its header); a
            # buffer there stops the run with UNSUPPORTED (tests/test_system.py's error tests).
            bins = ["DRAM"] if leaf == "space" else ["non-zero"]
            out[f.name] = (_nonzero if leaf == "offset" else (lambda v, i, c: v.name), bins)
        elif enum is not None:
            out[f.name] = ((lambda v, i, c: v.name), [m.name for m in enum])
        elif leaf in ("sh", "sw"):
            out[f.name] = ((lambda v, i, c: str(v)), list(_STRIDE_BINS))
        elif leaf == "offset":
            out[f.name] = (_nonzero, list(_nonzero.bins))
        elif f.width == 1:
            out[f.name] = (_flag, list(_flag.bins))
        elif leaf in _NUMERIC:
            out[f.name] = (_NUMERIC[leaf], list(_NUMERIC[leaf].bins))
        else:
            raise KeyError(f"ISA field {f.name!r} has no coverage bins; add them to "
                           "sfnpu.tb.coverage")
    return out


def _value(instr: Instruction, name: str):
    value = instr
    for part in name.split("."):
        value = getattr(value, part)
    return value


@dataclass
class Coverage:
    """Hits per field and bin over the measured programs."""
    bins: dict[str, list[str]]
    hits: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    instructions: int = 0

    def missing(self) -> dict[str, list[str]]:
        return {name: [b for b in bins if not self.hits[name].get(b)]
                for name, bins in self.bins.items()
                if any(not self.hits[name].get(b) for b in bins)}

    @property
    def reached(self) -> int:
        return sum(bool(self.hits[n].get(b)) for n, bins in self.bins.items() for b in bins)

    @property
    def total(self) -> int:
        return sum(len(b) for b in self.bins.values())

    def markdown(self, title: str = "ISA functional coverage") -> str:
        lines = [f"# {title}", "",
                 f"{self.instructions} instructions; {self.reached} of {self.total} bins "
                 f"reached ({self.reached / self.total:.1%}).", "",
                 "| field | bins (hits) | missing |", "| --- | --- | --- |"]
        for name, bins in self.bins.items():
            hit = ", ".join(f"{b} ({self.hits[name].get(b, 0)})" for b in bins)
            miss = ", ".join(b for b in bins if not self.hits[name].get(b)) or "—"
            lines.append(f"| `{name}` | {hit} | {miss} |")
        return "\n".join(lines) + "\n"


def measure(programs: Iterable[Iterable[Instruction]], config: HwConfig) -> Coverage:
    """The coverage of ``programs`` (each a sequence of instructions) on ``config``."""
    table = field_bins()
    cov = Coverage({name: bins for name, (_, bins) in table.items()})
    for program in programs:
        for instr in program:
            cov.instructions += 1
            for name, (binner, _) in table.items():
                b = binner(_value(instr, name), instr, config)
                if b is not None:
                    cov.hits[name][b] = cov.hits[name].get(b, 0) + 1
    return cov
