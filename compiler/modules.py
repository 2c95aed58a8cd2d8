"""Module-level on-chip allocation (Kim et al., seeds/000–001, Algorithms 2–6) on sfnpu's three
buffers.

A *module* is a group of branches that start from one tensor, the module input (MIFM), and meet
in one merge: a concat destination or an element-wise add, the module output (MOFM). The pass
keeps a module's feature maps on chip while it runs and hands its MOFM to the next module as
that module's MIFM, so feature maps cross the DRAM bus only at the edges of a run of modules.

The steps, each a small function over the compiled group list:

* :func:`detect_modules` (Algorithm 2) — for every merge, the closest tensor all its branches
  descend from such that the groups in between read nothing else and hand nothing on but the
  merge. A merge whose branches only meet further back than ``max_groups`` groups is a long
  skip-connection (an FPN route, a U-Net bridge): no module, its data stays in DRAM. A module
  nested in a branch (Inception-C's split 1×3/3×1 pair) is a sub-module of that branch.
* :func:`reorder` (Algorithm 3) — each module's branches run one after the other (the compiler
  interleaves them), in descending order of the memory their layers need besides MIFM and MOFM.
* :func:`insert_loaders` — a module whose MIFM comes from a non-module layer (the network stem)
  gets a copy group that loads it on chip once instead of every branch head reading DRAM.
* :func:`allocate` (Algorithms 4–6) — first fit in buffers {0, 1, 2} over time: the MIFM is
  held for the whole module (Algorithm 4's shared region); the MOFM has one fixed base, and each
  branch's part of it is occupied only from the group that writes it (concat by redirection:
  the part is written at its channel offset), so earlier branches may work in the parts still
  empty (Algorithm 5's occupied MOFM); an intermediate map that finds no room is written to and
  read back from DRAM (Algorithm 6, no forwarding). Processing I keeps the MOFM on chip (and
  forwards it to the next module); processing II writes it to DRAM and gives its room to the
  branches; the cheaper of the two in DRAM bytes is chosen per module.
* :func:`check_placement` — an independent proof on the placed instructions: every on-chip read
  finds, byte for byte, the tensor it expects (written there and not overwritten since), no
  write lands on bytes a later group still reads, every range fits its buffer.
* :func:`traffic_by_group` — DRAM feature-map bytes and transfers per group, in sfnpu's layout,
  dense C·H·W, and the paper's NPU accounting (4×4 output patches: H and W rounded up to 4).

Groups that touch an on-chip feature map run with frame reuse (weights read once, the input
re-read on chip); everything else keeps the compiled program's row reuse and DRAM homes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

from sfnpu import isa, layout
from sfnpu.config import HwConfig
from sfnpu.isa import Instruction, Location, MemSpace, Reuse
from sfnpu.limits import with_held_weights

from .blocks import GroupGraph, operands
from .codegen import Program, generate
from .groups import Group
from .ir import Graph, Tensor
from .memory import AllocationError, accesses, tiled_tensors

__all__ = [
    "ModuleError", "Branch", "Module", "Modules", "detect_modules", "reorder", "insert_loaders",
    "Decision", "ModuleAllocation", "allocate", "place", "check_placement", "PlacementReport",
    "GroupFm", "traffic_by_group", "module_group_indices", "ModulePlan", "plan_modules", "MAX_MODULE_GROUPS",
    "LOADED_SUFFIX",
]

#: Largest module (in groups) the detection accepts; a merge whose branches meet further back is
#: a long skip-connection (condition 4 of the paper's module definition).
MAX_MODULE_GROUPS = 16
#: Suffix of the on-chip copy a loader group makes of a module input held in DRAM.
LOADED_SUFFIX = ".on_chip"


class ModuleError(AllocationError):
    """A module placement the checker refutes or that cannot be made; names group and tensor."""


# --------------------------------------------------------------------------------------------
# Detection (Algorithm 2)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Branch:
    groups: tuple[int, ...]      # group indices in program order
    required: int                # Algorithm 3: largest IFM + OFM of a layer, MIFM/MOFM excluded
    sub_modules: int             # merges nested inside the branch


@dataclass(frozen=True)
class Module:
    index: int
    name: str
    merge: str                   # "concat" or "add"
    entry: str                   # MIFM
    exit: str                    # MOFM (the concat destination or the add's output)
    groups: tuple[int, ...]      # every member group, ascending
    branches: tuple[Branch, ...]
    identity: bool = False       # an add whose other operand is the MIFM itself

    @property
    def paths(self) -> int:
        """Branches including an identity shortcut (a branch without layers)."""
        return len(self.branches) + self.identity

    @property
    def first(self) -> int:
        return self.groups[0]

    @property
    def last(self) -> int:
        return self.groups[-1]


@dataclass(frozen=True)
class Modules:
    modules: tuple[Module, ...]
    module_of: Mapping[int, int]          # group index → module index (members only)
    rejected: tuple[str, ...]             # merges left out, with the reason

    def __len__(self) -> int:
        return len(self.modules)

    def __iter__(self):
        return iter(self.modules)

    def __getitem__(self, i: int) -> Module:
        return self.modules[i]


def _tensor_bytes(graph: Graph, t: str, lanes: int) -> int:
    return layout.tensor_bytes(*graph.tensors[t].shape, lanes)


def _merges(groups: Sequence[Group], gg: GroupGraph) -> list[tuple[str, str, tuple[int, ...]]]:
    """(kind, merged tensor, groups writing into it) for every concat destination and add."""
    found = []
    for t, writers in gg.writers.items():
        if any(groups[w].dest == t for w in writers):
            found.append(("concat", t, writers))
    for g in groups:
        if g.shortcut is not None and any(n.op == "add" for n in g.nodes):
            found.append(("add", g.written, (g.index,)))
    return sorted(found, key=lambda m: max(m[2]))


def _depends(gg: GroupGraph, g: int, tensor: str) -> bool:
    """Whether group ``g`` reads ``tensor`` directly or through earlier groups."""
    mask = sum(1 << r for r in gg.readers.get(tensor, ()))
    return bool(((1 << g) | gg.ancestors[g]) & mask)


def _members(gg: GroupGraph, entry: str, writers: Sequence[int]) -> tuple[int, ...]:
    start = gg.producer(entry)
    last = max(writers)
    return tuple(g for g in range(start + 1, last + 1)
                 if _depends(gg, g, entry)
                 and (g in writers or any(gg.is_ancestor(g, w) for w in writers)))


def _closed(gg: GroupGraph, entry: str, merged: str, members: Sequence[int]) -> bool:
    inside = set(members)
    for m in members:
        grp = gg.groups[m]
        if any(t != entry and gg.producer(t) not in inside for t in operands(grp)):
            return False            # reads something from outside the module
        out = grp.written
        if out == merged:
            continue
        if out in gg.graph_outputs or any(r not in inside for r in gg.readers.get(out, ())):
            return False            # an inner result escapes
    return True


def _branches(gg: GroupGraph, graph: Graph, entry: str, merged: str,
              members: Sequence[int], lanes: int) -> tuple[Branch, ...]:
    """Components of the members joined by the tensors they pass each other."""
    parent = {m: m for m in members}

    def root(m):
        while parent[m] != m:
            parent[m] = parent[parent[m]]
            m = parent[m]
        return m

    for m in members:
        for t in operands(gg.groups[m]):
            if t != entry:
                parent[root(m)] = root(gg.producer(t))
    comps: dict[int, list[int]] = {}
    for m in members:
        comps.setdefault(root(m), []).append(m)
    result = []
    for comp in sorted(comps.values()):
        need = 0
        for m in comp:
            grp = gg.groups[m]
            need = max(need, sum(_tensor_bytes(graph, t, lanes) for t in operands(grp)
                                 if t != entry)
                       + (0 if grp.written == merged else
                          _tensor_bytes(graph, grp.written, lanes)))
        nested = {gg.groups[m].dest for m in comp} - {None, merged}
        result.append(Branch(tuple(comp), need, len(nested)))
    return tuple(result)


def _module_name(groups: Sequence[Group], members: Sequence[int]) -> str:
    """The dotted prefix the member groups' names share (``Mixed_5b``)."""
    names = [groups[m].name.split(".") for m in members if groups[m].nodes]
    if not names:
        return groups[members[0]].name
    common = names[0]
    for n in names[1:]:
        k = 0
        while k < min(len(common), len(n)) and common[k] == n[k]:
            k += 1
        common = common[:k]
    return ".".join(common) or ".".join(names[0])


def detect_modules(graph: Graph, groups: Sequence[Group], lanes: int,
                   max_groups: int = MAX_MODULE_GROUPS) -> Modules:
    """Modules of a compiled group list (Algorithm 2); ``lanes`` sizes the tensors for the
    branches' required memory."""
    gg = GroupGraph.build(graph, groups)
    found: list[tuple[str, str, str, tuple[int, ...]]] = []
    rejected: list[str] = []
    for kind, merged, writers in _merges(groups, gg):
        # The add's operands (or the concat's parts) must all descend from the entry.
        heads = writers
        candidates = sorted(((gg.producer(t), t) for t in gg.writers), reverse=True)
        candidates += [(-1, t) for t in sorted(gg.graph_inputs)]
        module = None
        for p, entry in candidates:
            if p >= min(heads) or entry == merged:
                continue
            if not all(_depends(gg, w, entry) for w in heads):
                continue
            if kind == "add":
                grp = groups[writers[0]]
                if not all(t == entry or _depends(gg, gg.producer(t), entry)
                           for t in operands(grp) if gg.producer(t) >= 0):
                    continue
            members = _members(gg, entry, writers)
            if len(members) > max_groups:
                rejected.append(f"{merged}: branches meet only {len(members)} groups back "
                                f"(more than {max_groups}): long skip-connection")
                break
            if _closed(gg, entry, merged, members):
                module = (kind, merged, entry, members)
                break
        if module is not None:
            found.append(module)
    # A module inside another one's branch is a sub-module of that branch.
    outer = [m for m in found
             if not any(set(m[3]) < set(o[3]) for o in found)]
    modules, module_of = [], {}
    for kind, merged, entry, members in outer:
        branches = _branches(gg, graph, entry, merged, members, lanes)
        if kind == "concat" and len(branches) < 2:
            rejected.append(f"{merged}: a single branch")
            continue
        idx = len(modules)
        identity = kind == "add" and entry in operands(groups[members[-1]])
        modules.append(Module(idx, _module_name(groups, members), kind, entry, merged,
                              tuple(members), branches, identity))
        for m in members:
            module_of[m] = idx
    return Modules(tuple(modules), module_of, tuple(rejected))


# --------------------------------------------------------------------------------------------
# Branch re-ordering (Algorithm 3) and loaders
# --------------------------------------------------------------------------------------------

def _renumber(groups: Sequence[Group]) -> list[Group]:
    return [dataclasses.replace(g, index=i) for i, g in enumerate(groups)]


def reorder(groups: Sequence[Group], modules: Modules) -> list[Group]:
    """Each module's branches one after the other, the one needing most memory first (stable);
    a module's groups move to the position of its last group, where all they read exists."""
    order: list[Group] = []
    for g in groups:
        m = modules.module_of.get(g.index)
        if m is None:
            order.append(g)
        elif g.index == modules[m].last:
            ranked = sorted(modules[m].branches, key=lambda b: -b.required)
            order += [groups[i] for b in ranked for i in b.groups]
    return _renumber(order)


def insert_loaders(graph: Graph, groups: Sequence[Group], modules: Modules
                   ) -> tuple[Graph, list[Group]]:
    """A copy group in front of every module whose MIFM no module writes and that at least two
    member groups read: it loads the MIFM from DRAM once; the members read the copy."""
    exits = {m.exit for m in modules}
    tensors = dict(graph.tensors)
    loads: dict[int, Group] = {}
    renamed: dict[int, tuple[str, str]] = {}
    for m in modules:
        heads = [i for i in m.groups if m.entry in operands(groups[i])]
        if m.entry in exits or len(heads) < 2:
            continue
        t = graph.tensors[m.entry]
        copy = m.entry + LOADED_SUFFIX
        tensors[copy] = Tensor(copy, t.shape, t.qtype)
        loads[m.first] = Group(-1, (), m.entry, copy)
        for i in m.groups:
            renamed[i] = (m.entry, copy)
    out: list[Group] = []
    for g in groups:
        if g.index in loads:
            out.append(loads[g.index])
        if g.index in renamed:
            old, new = renamed[g.index]
            g = dataclasses.replace(
                g, input=new if g.input == old else g.input,
                shortcut=new if g.shortcut == old else g.shortcut)
        out.append(g)
    return graph.replace(tensors=tensors), _renumber(out)


# --------------------------------------------------------------------------------------------
# Allocation (Algorithms 4–6)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Busy:
    buf: int
    lo: int
    hi: int
    t0: int
    t1: int
    tensor: str


@dataclass(frozen=True)
class _Piece:
    lo: int          # bytes from the tensor's base
    hi: int
    t0: int          # the group writing it
    t1: int          # the last group reading the tensor


@dataclass(frozen=True)
class Decision:
    """What the allocator chose for one module."""
    module: str
    processing: str                  # "I" (MOFM on chip) or "II" (MOFM to DRAM)
    mifm_on_chip: bool
    spilled: tuple[str, ...]         # intermediate maps sent to DRAM (no forwarding)
    dram_bytes: int                  # the choice's feature-map DRAM bytes (our layout)
    alternative_bytes: int | None    # the other processing's, None if it cannot be placed


@dataclass(frozen=True)
class ModuleAllocation:
    locations: Mapping[str, Location]      # every tensor a group reads or writes
    decisions: tuple[Decision, ...]
    extents: tuple[int, int, int]


class _State:
    """Busy byte ranges of the three buffers over group time."""

    def __init__(self, capacity: Sequence[int], align: int):
        self.capacity, self.align = tuple(capacity), align
        self.busy: list[_Busy] = []
        self.base: dict[str, tuple[int, int]] = {}

    def copy(self) -> "_State":
        s = _State(self.capacity, self.align)
        s.busy, s.base = list(self.busy), dict(self.base)
        return s

    def free(self, buf: int, base: int, pieces: Sequence[_Piece]) -> bool:
        if base + max(p.hi for p in pieces) > self.capacity[buf]:
            return False
        return not any(b.buf == buf and b.lo < base + p.hi and base + p.lo < b.hi
                       and b.t0 <= p.t1 and p.t0 <= b.t1
                       for p in pieces for b in self.busy)

    def place(self, tensor: str, pieces: Sequence[_Piece], forbidden: set[int]) -> bool:
        """First fit over every buffer, the lowest end address winning."""
        best = None
        a = self.align
        for buf in range(3):
            if buf in forbidden:
                continue
            bases = {0} | {-(-(b.hi - p.lo) // a) * a for b in self.busy if b.buf == buf
                           for p in pieces if b.hi >= p.lo}
            for base in sorted(bases):
                if self.free(buf, base, pieces):
                    key = (base + max(p.hi for p in pieces), buf)
                    if best is None or key < best[0]:
                        best = (key, buf, base)
                    break
        if best is None:
            return False
        _, buf, base = best
        self.base[tensor] = (buf, base)
        self.busy += [_Busy(buf, base + p.lo, base + p.hi, p.t0, p.t1, tensor) for p in pieces]
        return True


class _Allocator:
    def __init__(self, graph: Graph, groups: Sequence[Group], program: Program,
                 modules: Modules, capacity: Sequence[int]):
        self.graph, self.groups, self.program, self.modules = graph, groups, program, modules
        self.gg = GroupGraph.build(graph, groups)
        self.config = program.config
        self.capacity = tuple(capacity)
        self.tiled = tiled_tensors(groups)

    def pieces(self, t: str) -> list[_Piece]:
        """Byte ranges of ``t`` each writer fills (a concat part: its channel blocks), busy
        from that writer to the last reader of ``t``."""
        last = max(self.gg.readers[t])
        result = []
        for w in self.gg.writers[t]:
            instr = self.program.instructions[w]
            acc = next(a for a in accesses(instr, self.config) if a.operand == "output")
            base = instr.output.offset
            result.append(_Piece(acc.start - base, acc.end - base, w, last))
        return result

    def size(self, t: str) -> int:
        return _tensor_bytes(self.graph, t, self.config.lanes)

    def dram_cost(self, t: str) -> int:
        """DRAM bytes of a map that is written once and read by each reader."""
        return self.size(t) * (1 + len(self.gg.readers.get(t, ())))

    def forbidden(self, state: _State, t: str) -> set[int]:
        """Buffers holding the other operand of a group reading ``t`` (one read port each)."""
        found = set()
        for r in self.gg.readers.get(t, ()):
            for other in operands(self.groups[r]):
                if other != t and other in state.base:
                    found.add(state.base[other][0])
        return found

    def put(self, state: _State, t: str) -> bool:
        if t in state.base:
            return True
        if not self.gg.readers.get(t) or t in self.tiled:
            return False        # never read on chip (a network output), or a tile's window
        return state.place(t, self.pieces(t), self.forbidden(state, t))

    def module(self, state: _State, m: Module, processing: str) -> tuple[_State, int, list[str]]:
        state = state.copy()
        cost, spilled = 0, []
        if m.entry.endswith(LOADED_SUFFIX):
            self.put(state, m.entry)      # a loader's copy; a forwarded MOFM is placed already
        if processing == "I":
            if not self.put(state, m.exit):
                raise _NoRoom
        else:
            cost += self.dram_cost(m.exit)
        for i in m.groups:
            t = self.groups[i].written
            if t == m.exit:
                continue
            if not self.put(state, t):
                spilled.append(t)
                cost += self.dram_cost(t)
        return state, cost, spilled

    def run(self) -> ModuleAllocation:
        state = _State(self.capacity, self.config.lanes)
        decisions = []
        for m in self.modules:
            tried = {}
            for processing in ("I", "II"):
                try:
                    tried[processing] = self.module(state, m, processing)
                except _NoRoom:
                    pass
            choice = min(tried, key=lambda p: tried[p][1])
            other = next((tried[p][1] for p in tried if p != choice), None)
            state, cost, spilled = tried[choice]
            decisions.append(Decision(m.name, choice, m.entry in state.base, tuple(spilled),
                                      cost, other))
        locations = dict(self.program.locations)
        extents = [0, 0, 0]
        for t, (buf, base) in state.base.items():
            locations[t] = isa.buffer(buf, base)
        for b in state.busy:
            extents[b.buf] = max(extents[b.buf], b.hi)
        return ModuleAllocation(locations, tuple(decisions), tuple(extents))


class _NoRoom(Exception):
    """The MOFM finds no room (processing I impossible)."""


def allocate(graph: Graph, groups: Sequence[Group], program: Program, modules: Modules,
             capacity: Sequence[int] | None = None) -> ModuleAllocation:
    """Place every module's feature maps (``capacity``: bytes per buffer, default the
    configuration's)."""
    cap = program.config.buffer_bytes if capacity is None else capacity
    return _Allocator(graph, groups, program, modules, cap).run()


def place(program: Program, groups: Sequence[Group], locations: Mapping[str, Location]
          ) -> list[Instruction]:
    """The program's instructions at these locations; a group touching an on-chip feature map
    runs with frame reuse."""
    out = []
    for grp, instr in zip(groups, program.instructions):
        changes = grp.locate(locations)
        if any(loc.space != MemSpace.DRAM for loc in changes.values()):
            changes["reuse"] = Reuse.FRAME
        out.append(instr.replace(**changes))
    return with_held_weights(out, program.config)


# --------------------------------------------------------------------------------------------
# Checker
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlacementReport:
    extents: tuple[int, int, int]
    on_chip_tensors: int
    on_chip_reads: int


def _fm_ranges(instr: Instruction, config: HwConfig) -> dict[str, tuple[Location, int, int]]:
    """operand → (location, start, end) of the group's feature-map accesses."""
    return {a.operand: (getattr(instr, a.operand), a.start, a.end)
            for a in accesses(instr, config) if a.operand in ("input", "shortcut", "output")}


def check_placement(graph: Graph, groups: Sequence[Group], instructions: Sequence[Instruction],
                    config: HwConfig, capacity: Sequence[int] | None = None) -> PlacementReport:
    """Prove a placed program keeps every feature map intact; raise :class:`ModuleError`.

    Tracks which tensor owns every on-chip byte. A read must find every byte of its range owned
    by the tensor it reads (so a concat is read only after all its parts are written); a write
    may only replace bytes whose tensor no group from this one on reads; ranges stay inside
    the buffers; a tensor keeps one home; DRAM reads find the tensor where it was written;
    input and shortcut use different buffers; network outputs end in DRAM; row-reuse groups
    keep feature maps (not channel vectors) in DRAM.
    """
    cap = tuple(config.buffer_bytes if capacity is None else capacity)
    if len(instructions) != len(groups):
        raise ModuleError(f"{len(instructions)} instructions for {len(groups)} groups")
    last_read: dict[str, int] = {}
    for g in groups:
        for t in operands(g):
            last_read[t] = g.index
    owner: list[list[tuple[int, int, str]]] = [[], [], []]   # (lo, hi, tensor), disjoint
    home: dict[str, tuple[MemSpace, int]] = {}
    on_chip, reads = set(), 0

    def fail(i: int, msg: str):
        raise ModuleError(f"group {i} ({groups[i].name}): {msg}")

    for i, (grp, instr) in enumerate(zip(groups, instructions)):
        ranges = _fm_ranges(instr, config)
        roles = [("input", grp.input)] + ([("shortcut", grp.shortcut)] if grp.shortcut else [])
        for role, t in roles:
            loc, lo, hi = ranges[role]
            if t not in home:
                if t not in graph.inputs:
                    fail(i, f"{role} {t!r} is read before any group writes it")
                if loc.space != MemSpace.DRAM:
                    fail(i, f"{role} {t!r} is a network input and lives in DRAM, not "
                            f"{loc.space.name}")
                continue
            if home[t] != (loc.space, loc.offset):
                fail(i, f"{role} {t!r} is read from {loc.space.name}+{loc.offset:#x} but was "
                        f"written to {home[t][0].name}+{home[t][1]:#x}")
            if loc.space == MemSpace.DRAM:
                continue
            b = loc.space.value - MemSpace.BUF0.value
            covered = lo
            for s_lo, s_hi, s_t in sorted(owner[b]):
                if s_hi <= lo or s_lo >= hi:
                    continue
                if s_t != t or s_lo > covered:
                    what = f"hold {s_t!r}" if s_t != t and s_lo <= covered else "were never written"
                    at = max(covered, lo) if s_lo > covered else s_lo
                    fail(i, f"reads {t!r} from buffer {b} [{lo:#x}, {hi:#x}), but the bytes "
                            f"from {at:#x} {what}")
                covered = max(covered, s_hi)
            if covered < hi:
                fail(i, f"reads {t!r} from buffer {b} [{lo:#x}, {hi:#x}), but the bytes from "
                        f"{covered:#x} were never written")
            reads += 1
        try:        # the ISA's rules, one read port per buffer among them
            isa.validate(instr)
        except isa.InstructionError as error:
            fail(i, str(error))
        if instr.reuse == Reuse.ROW:
            for role in ("input", "shortcut", "output"):
                if role in ranges and ranges[role][0].space != MemSpace.DRAM:
                    t = grp.input if role == "input" else grp.shortcut if role == "shortcut" \
                        else grp.written
                    if graph.tensors[t].shape[1:] != (1, 1):
                        fail(i, f"row-reuse {role} {t!r} is a feature map on chip; row reuse "
                                "streams feature maps from DRAM")
        t = grp.written
        loc, lo, hi = ranges["output"]
        where = (loc.space, loc.offset)
        if t in home and home[t] != where:
            fail(i, f"writes {t!r} to {where[0].name}+{where[1]:#x}, but it already lives at "
                    f"{home[t][0].name}+{home[t][1]:#x}")
        home[t] = where
        if loc.space == MemSpace.DRAM:
            continue
        if t in graph.outputs:
            fail(i, f"network output {t!r} must be written to DRAM")
        b = loc.space.value - MemSpace.BUF0.value
        if hi > cap[b]:
            fail(i, f"output {t!r} [{lo:#x}, {hi:#x}) exceeds buffer {b} ({cap[b]:#x} B)")
        kept = []
        for s_lo, s_hi, s_t in owner[b]:
            if s_hi <= lo or s_lo >= hi:
                kept.append((s_lo, s_hi, s_t))
                continue
            if s_t != t and last_read.get(s_t, -1) >= i:
                fail(i, f"output {t!r} [{lo:#x}, {hi:#x}) in buffer {b} overwrites {s_t!r} "
                        f"[{s_lo:#x}, {s_hi:#x}), which group {last_read[s_t]} still reads")
            if s_lo < lo:
                kept.append((s_lo, lo, s_t))
            if s_hi > hi:
                kept.append((hi, s_hi, s_t))
        owner[b] = kept + [(lo, hi, t)]
        on_chip.add(t)
    extents = tuple(max((hi for _, hi, _ in owner[b]), default=0) for b in range(3))
    return PlacementReport(extents, len(on_chip), reads)


# --------------------------------------------------------------------------------------------
# Traffic
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupFm:
    """DRAM feature-map traffic of one group (each access once)."""
    read: int            # our layout (channel blocks of ``lanes``)
    written: int
    reads: int           # transfers (DRAM feature-map operands read)
    writes: int
    read_dense: int      # C·H·W
    written_dense: int
    read_patch: int      # the paper's NPU: C·⌈H/4⌉·4·⌈W/4⌉·4
    written_patch: int
    weights_dense: int   # O·I·kh·kw, read once

    @property
    def total(self) -> int:
        return self.read + self.written


def _patch(c: int, h: int, w: int) -> int:
    return c * -(-h // 4) * 4 * -(-w // 4) * 4


def traffic_by_group(instructions: Sequence[Instruction], config: HwConfig) -> list[GroupFm]:
    result = []
    for instr in instructions:
        got = dict(read=0, written=0, reads=0, writes=0, read_dense=0, written_dense=0,
                   read_patch=0, written_patch=0)
        for a in accesses(instr, config):
            if a.space != MemSpace.DRAM or a.operand not in ("input", "shortcut", "output"):
                continue
            if a.operand == "input":
                shape = (instr.in_c, instr.in_h, instr.in_w)
            elif a.operand == "output":
                shape = (instr.out_c, instr.out_h, instr.out_w)
            else:
                hw = (1, 1) if instr.eltwise == isa.Eltwise.CHANNEL_SCALE else \
                    layout.conv_output_hw(instr)
                shape = (instr.out_c, *hw)
            kind = "written" if a.write else "read"
            got[kind] += a.end - a.start
            got["writes" if a.write else "reads"] += 1
            got[f"{kind}_dense"] += shape[0] * shape[1] * shape[2]
            got[f"{kind}_patch"] += _patch(*shape)
        w = layout.weight_shape(instr)
        result.append(GroupFm(**got, weights_dense=w[0] * w[1] * w[2] * w[3] if w else 0))
    return result


def module_group_indices(groups: Sequence[Group], module: Module) -> tuple[int, ...]:
    """The module's groups plus the loader in front of it, if any."""
    before = module.first - 1
    if before >= 0 and not groups[before].nodes and groups[before].output == module.entry:
        return (before, *module.groups)
    return module.groups


# --------------------------------------------------------------------------------------------
# The whole pass
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModulePlan:
    """A compiled program rewritten for module-level allocation."""
    graph: Graph
    groups: tuple[Group, ...]
    program: Program                     # placed instructions, proven by check_placement
    modules: Modules                     # detected on ``groups`` (re-ordered, loaders added)
    allocation: ModuleAllocation
    check: PlacementReport
    naive_groups: tuple[Group, ...]      # the compiled groups (all feature maps in DRAM)
    naive_modules: Modules               # the same modules in the compiled numbering


def plan_modules(graph: Graph, groups: Sequence[Group], config: HwConfig,
                 capacity: Sequence[int] | None = None,
                 max_groups: int = MAX_MODULE_GROUPS) -> ModulePlan:
    """Detect, re-order, load, allocate, place and prove (``capacity``: bytes per buffer,
    default the configuration's)."""
    naive = detect_modules(graph, groups, config.lanes, max_groups)
    ordered = reorder(groups, naive)
    graph2, loaded = insert_loaders(graph, ordered, detect_modules(graph, ordered, config.lanes,
                                                                    max_groups))
    modules = detect_modules(graph2, loaded, config.lanes, max_groups)
    base = generate(graph2, loaded, config)
    loaded = base.groups        # tiles of groups too large for the stores are groups too
    alloc = allocate(graph2, loaded, base, modules, capacity)
    instructions = place(base, loaded, alloc.locations)
    for n, instr in enumerate(instructions):
        try:
            isa.validate(instr)
        except isa.InstructionError as e:
            raise ModuleError(f"instruction {n}: {e}") from None
    report = check_placement(graph2, loaded, instructions, config, capacity)
    program = dataclasses.replace(base, instructions=instructions,
                                  locations=dict(alloc.locations))
    return ModulePlan(graph2, tuple(loaded), program, modules, alloc, report, tuple(groups),
                      naive)
