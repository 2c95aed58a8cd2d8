"""Cut-point search over block-wise reuse policies (ShortcutFusion Sec. IV-B, eq. 10).

A cut-point is where the reuse mode switches. Following the paper's relaxation, every
sub-network whose scale only falls (or only rises) has exactly one cut-point: a classification
network has one segment (row reuse for blocks ``< L``, frame reuse after), an FPN or
encoder–decoder network two, split at the network cut of :mod:`.blocks` (block ``i`` is row
reuse if ``i < L1`` or ``i ≥ N1 + L2``), PANet three and r repeated BiFPN layers 2r + 1 (the
segments :mod:`.blocks` finds). In general, segment ``j`` is row-then-frame when ``j`` is even
and frame-then-row when odd, and the exhaustive search over all segment cuts costs
∏(nⱼ + 1) = O(Nᵏ) evaluations. Where the network has long-path tensors (:mod:`.memory`),
every cut combination is evaluated twice: with them off chip (the paper's choice for
long-lifetime data) and held on chip, which the budget may or may not afford.

Each candidate is allocated (:mod:`.memory`); it is feasible when every buffer requirement
(eqs. 1–7) fits the budget — then weights are read exactly once and every feature-map access
happens at most once (constraint 10), because those buffers are what make single access
possible. Among feasible candidates the objective picks the best: ``"latency"`` (eq. 10: the
sum of a per-instruction latency callable, by default the cycle model's), ``"sram"`` (eq. 6,
for Table II) or ``"dram"`` (eq. 9, exact bytes).

Latency is the cycle model's (:mod:`sfnpu.sim.cycle`): the cycles of each placed group on the
hardware configuration, the sum over the program (:func:`model_latency`).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import Callable, Iterator, Sequence

from sfnpu import isa, layout
from sfnpu.config import HwConfig
from sfnpu.isa import ConvKind, Instruction, Reuse

from .blocks import Blocks, detect_blocks
from .memory import (WEIGHT_BUFFER, AllocationError, Budget, Policy, Requirements, Traffic,
                     Violation, allocate, dense_requirements, instruction_needs,
                     long_path_tensors, place, requirements, store_overflows, traffic,
                     weights_read_again)

__all__ = [
    "LatencyFn", "model_latency", "conv_macs", "Evaluation", "SearchResult",
    "NoFeasiblePolicy", "cut_policies", "count_policies", "long_path_options", "HELD",
    "single_cut_policies",
    "double_cut_policies", "evaluate", "select", "search", "Progress",
]

#: Cycles of one placed instruction (its reuse mode and operand locations included), given
#: the next one (``None`` after the last: a group with ``prefetch`` loads the next group's
#: weights) and, for a tile, its operands' pitches (:meth:`~.codegen.Program.window`).
LatencyFn = Callable[[Instruction, Instruction | None, layout.Geometry | None], float]


def conv_macs(instr: Instruction) -> int:
    """Multiply-accumulates of the group's convolution (0 without one)."""
    if instr.conv == ConvKind.NONE:
        return 0
    h, w = layout.conv_output_hw(instr)
    per_output = instr.kh * instr.kw * (instr.in_c if instr.conv == ConvKind.NORMAL else 1)
    return instr.out_c * h * w * per_output


def model_latency(config: HwConfig) -> LatencyFn:
    """The cycle model's cycles of one placed instruction, memoised: candidates of a search
    share most of their instructions."""
    return _model_latency(config)


@lru_cache(maxsize=None)
def _model_latency(config: HwConfig) -> LatencyFn:
    from sfnpu.sim.cycle import CycleModel

    model = CycleModel(config)
    cycles = lru_cache(maxsize=1 << 16)(
        lambda instr, nxt, window: float(model.group(instr, next_instr=nxt,
                                                     geometry=window).cycles))
    # Only a prefetching group's cycles depend on the next instruction.
    return lambda instr, nxt, window=None: cycles(instr, nxt if instr.prefetch else None,
                                                  window)


# --------------------------------------------------------------------------------------------
# Candidate policies
# --------------------------------------------------------------------------------------------

#: Label suffix of a policy that keeps long-path tensors on chip.
HELD = " +long paths on chip"


def cut_policies(blocks: Blocks, segments: Sequence[int] | None = None,
                 long_paths: Sequence[bool] = (False,)) -> Iterator[Policy]:
    """Every policy with one cut-point per segment (O(Nᵏ) for k segments).

    ``segments``: block counts, summing to the number of blocks (default: the network cut's
    segments). Segment ``j`` runs row reuse before its cut when ``j`` is even (scale falling),
    frame reuse before its cut when ``j`` is odd (scale rising); cut ``L_j`` ranges over
    ``0..n_j`` (both ends included: the segment entirely in one mode). ``long_paths``: the
    values of :attr:`Policy.hold_long_paths` to enumerate, each over all cuts.
    """
    segments = tuple(blocks.segments if segments is None else segments)
    if sum(segments) != len(blocks) or any(n < 0 for n in segments):
        raise ValueError(f"segments {segments} do not partition {len(blocks)} blocks")
    for hold in long_paths:
        for cuts in itertools.product(*(range(n + 1) for n in segments)):
            modes: list[Reuse] = []
            for j, (n, cut) in enumerate(zip(segments, cuts)):
                first, second = (Reuse.ROW, Reuse.FRAME) if j % 2 == 0 else \
                    (Reuse.FRAME, Reuse.ROW)
                modes += [first] * cut + [second] * (n - cut)
            label = (f"L={cuts[0]}" if len(cuts) == 1 else f"L={cuts}") + (HELD if hold else "")
            yield Policy(tuple(modes), label, tuple(cuts), hold)


def count_policies(blocks: Blocks, segments: Sequence[int] | None = None,
                   long_paths: Sequence[bool] = (False,)) -> int:
    """How many policies :func:`cut_policies` yields: ∏(nⱼ + 1) per long-path option."""
    return len(long_paths) * prod(
        n + 1 for n in (blocks.segments if segments is None else segments))


def long_path_options(compiled, blocks: Blocks) -> tuple[bool, ...]:
    """Both long-path treatments when the network has long paths, else only the default."""
    return (False, True) if long_path_tensors(compiled.graph, compiled.groups, blocks) \
        else (False,)


def single_cut_policies(blocks: Blocks) -> Iterator[Policy]:
    """Fig. 11 left: block ``i`` row reuse if ``i < L``, frame reuse otherwise."""
    return cut_policies(blocks, (len(blocks),))


def double_cut_policies(blocks: Blocks, cut: int | None = None) -> Iterator[Policy]:
    """Fig. 15: row reuse if ``i < L1`` or ``i ≥ N1 + L2``; ``N1`` is the network cut."""
    n1 = blocks.cut if cut is None else cut
    if n1 is None:
        raise ValueError("the network has no network cut; give one or use single_cut_policies")
    return cut_policies(blocks, (n1, len(blocks) - n1))


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Evaluation:
    policy: Policy
    latency: float | None
    requirements: Requirements | None
    traffic: Traffic | None
    violations: tuple[Violation, ...]
    error: str | None = None          # the allocation itself failed
    dense: Requirements | None = None  # eqs. 1–6 as the paper writes them (dense bytes)

    @property
    def feasible(self) -> bool:
        return self.error is None and not self.violations

    @property
    def sram(self) -> int | None:
        return None if self.requirements is None else self.requirements.sram


def evaluation_config(program, blocks: Blocks, policy: Policy, budget: Budget) -> HwConfig:
    """The hardware a candidate is measured on. With the budget's buffers: the configuration.
    With unlimited buffers (Table II's sweep, per-network buffers), eq. 2 sizes buffer 1 —
    the weight store — to at least the largest row-mode layer's weights, so the store is
    made that large where the configuration's is smaller: row reuse then holds its weights
    instead of streaming them per output row (the weights the SRAM figure already counts)."""
    config = program.config
    if budget.buffers is not None:
        return config
    row_weights = [layout.weight_bytes(i, config)
                   for i, mode in zip(program.instructions, policy.group_modes(blocks))
                   if mode == Reuse.ROW and i.conv == ConvKind.NORMAL]
    store = max(row_weights, default=0)
    if store <= config.buffer_bytes[WEIGHT_BUFFER]:
        return config
    b0, _, b2 = config.buffer_bytes
    return config.replace(buffer_bytes=(b0, store, b2), device=None)


def evaluate(compiled, blocks: Blocks, policy: Policy, budget: Budget,
             latency: LatencyFn | None = None) -> Evaluation:
    """Allocate, place and measure one policy against a budget, on
    :func:`evaluation_config`."""
    program = compiled.program
    config = evaluation_config(program, blocks, policy, budget)
    if config != program.config:
        program = dataclasses.replace(program, config=config)
    if latency is None:
        latency = model_latency(config)
    try:
        alloc = allocate(compiled.graph, compiled.groups, program, blocks, policy,
                         budget.buffers)
    except AllocationError as e:
        return Evaluation(policy, None, None, None, (), str(e))
    instructions = place(program, compiled.groups, alloc)
    # The stores the budget does not size (the weight store's frame blocks, rows, tables):
    # a candidate the controller would stop is not one (nor one the cycle model can time).
    if stores := store_overflows(instructions, compiled.groups, config, buffers=False):
        return Evaluation(policy, None, None, None, (), "; ".join(stores))
    req = requirements(instructions, config, alloc.extents)
    dram = traffic(instructions, config, compiled.groups, compiled.graph)
    cycles = sum(latency(i, n, program.window(i))
                 for i, n in zip(instructions, instructions[1:] + [None]))
    # Constraint 10 whatever the budget: row reuse past the weight store rereads weights.
    violations = budget.violations(req) + weights_read_again(instructions, config)
    return Evaluation(policy, cycles, req, dram, tuple(violations),
                      dense=dense_requirements(instructions, config))


#: Sort keys; ties go to the other two. Equal latencies (a compute-bound network often has
#: several) go to the least DRAM traffic, which costs energy, not to the least SRAM: the
#: budget has already fixed the buffers.
_OBJECTIVES = {
    "latency": lambda e: (e.latency, e.traffic.total, e.sram),   # see LATENCY_TIE
    "sram": lambda e: (e.sram, e.traffic.total, e.latency),
    "dram": lambda e: (e.traffic.total, e.latency, e.sram),
}

#: Latencies within this fraction of the fastest candidate's count as equal for the latency
#: objective. It is below the cycle model's accuracy against the RTL (whole programs within
#: 0.6 %), so a policy that moves megabytes more DRAM traffic to save a few cycles in
#: millions (YOLOv2: 9 cycles of 6.16 M for 9.7 MB) does not win on the model's noise.
LATENCY_TIE = 1e-3


def select(evaluations: Sequence[Evaluation], objective: str = "latency",
           budget: Budget | None = None) -> Evaluation | None:
    """The best feasible candidate by ``objective`` (ties: the other two objectives), or None.
    For ``"latency"``, latencies within :data:`LATENCY_TIE` of the fastest are ties.

    ``budget``: also require the requirements to fit it — exact for limits that do not steer
    the allocation (BRAM18K, the fixed-size buffers), as the candidates keep the placement
    they were evaluated with.
    """
    if objective not in _OBJECTIVES:
        raise ValueError(f"objective {objective!r}: choose one of {', '.join(_OBJECTIVES)}")
    fits = [e for e in evaluations
            if e.feasible and (budget is None or not budget.violations(e.requirements))]
    if objective == "latency" and fits:
        fastest = min(e.latency for e in fits)
        fits = [e for e in fits if e.latency <= fastest * (1 + LATENCY_TIE)]
        return min(fits, key=_OBJECTIVES["dram"])
    return min(fits, key=_OBJECTIVES[objective], default=None)


@dataclass(frozen=True)
class SearchResult:
    best: Evaluation
    evaluations: tuple[Evaluation, ...]     # every candidate, in enumeration order
    objective: str
    blocks: Blocks

    @property
    def feasible(self) -> tuple[Evaluation, ...]:
        return tuple(e for e in self.evaluations if e.feasible)


class NoFeasiblePolicy(ValueError):
    """No candidate policy fits the budget; the message names the blocks and amounts."""


#: Called after every evaluated candidate with (done, total).
Progress = Callable[[int, int], None]


def search(compiled, budget: Budget | None = None, latency: LatencyFn | None = None,
           objective: str = "latency", blocks: Blocks | None = None,
           segments: Sequence[int] | None = None,
           progress: Progress | None = None,
           long_paths: Sequence[bool] | None = None) -> SearchResult:
    """Exhaustive cut-point search over one cut per segment — single cut, double cut at the
    network cut, three for PANet, 2r + 1 for BiFPN (the segments of :mod:`.blocks`), or the
    given ``segments`` — each with long-path tensors off and on chip (``long_paths``, default
    :func:`long_path_options`); raises :class:`NoFeasiblePolicy` naming what does not fit."""
    if objective not in _OBJECTIVES:
        raise ValueError(f"objective {objective!r}: choose one of {', '.join(_OBJECTIVES)}")
    config = compiled.program.config
    budget = Budget.of(config) if budget is None else budget
    blocks = detect_blocks(compiled.graph, compiled.groups) if blocks is None else blocks
    if long_paths is None:
        long_paths = long_path_options(compiled, blocks)
    total = count_policies(blocks, segments, long_paths)
    evaluations = []
    for p in cut_policies(blocks, segments, long_paths):
        evaluations.append(evaluate(compiled, blocks, p, budget, latency))
        if progress is not None:
            progress(len(evaluations), total)
    evaluations = tuple(evaluations)
    best = select(evaluations, objective)
    if best is None:
        raise NoFeasiblePolicy(_diagnose(compiled, blocks, budget, evaluations))
    return SearchResult(best, evaluations, objective, blocks)


# --------------------------------------------------------------------------------------------
# Diagnosis of infeasible budgets
# --------------------------------------------------------------------------------------------

def _needs(instr: Instruction, mode: Reuse, output_dram: bool,
           config: HwConfig) -> dict[str, int]:
    """Lower bounds one group puts on the buffers in one mode, whatever the other blocks do:
    eqs. 1 and 3–5, and in frame mode the largest of its on-chip tensors in some buffer."""
    lanes = config.lanes
    out = isa.dram(0) if mode == Reuse.ROW or output_dram else isa.buffer(0)
    # In frame mode the input may be on chip (then nothing is staged or held whole).
    inp = isa.buffer(1) if mode == Reuse.FRAME else instr.input
    need = instruction_needs(instr.replace(reuse=mode, output=out, input=inp), config)
    if "weight_buff" in need:
        need[f"buffer {WEIGHT_BUFFER}"] = need.pop("weight_buff")
    if mode == Reuse.FRAME:
        need["largest buffer"] = max(
            layout.tensor_bytes(instr.in_c, instr.in_h, instr.in_w, lanes),
            0 if output_dram else layout.tensor_bytes(instr.out_c, instr.out_h, instr.out_w,
                                                      lanes))
    return need


def _limit(budget: Budget, resource: str) -> int | None:
    if resource.startswith("buffer "):
        return None if budget.buffers is None else budget.buffers[int(resource[-1])]
    if resource == "largest buffer":
        return None if budget.buffers is None else max(budget.buffers)
    return getattr(budget, resource)


def _block_excess(compiled, blocks: Blocks, budget: Budget, block: int,
                  mode: Reuse) -> list[str]:
    """The largest over-budget need per resource of one block in one mode."""
    config = compiled.program.config
    dests = {g.dest for g in compiled.groups if g.dest}
    worst: dict[str, tuple[int, int]] = {}
    for g in blocks[block].groups:
        instr = compiled.program.instructions[g]
        grp = compiled.groups[g]
        out_dram = grp.written in compiled.graph.outputs or grp.written in dests
        for res, need in _needs(instr, mode, out_dram, config).items():
            have = _limit(budget, res)
            if have is not None and need > have and need > worst.get(res, (0, -1))[0]:
                worst[res] = (need, g)
    return [f"{res} {need} B > {_limit(budget, res)} B (group {g} "
            f"{compiled.groups[g].name})" for res, (need, g) in worst.items()]


#: Blocks listed by name in a NoFeasiblePolicy message before the rest are counted.
_LISTED = 6


def _diagnose(compiled, blocks: Blocks, budget: Budget,
              evaluations: Sequence[Evaluation]) -> str:
    lines = []
    stuck = 0
    for b in blocks:
        row = _block_excess(compiled, blocks, budget, b.index, Reuse.ROW)
        frame = _block_excess(compiled, blocks, budget, b.index, Reuse.FRAME)
        if row and frame:
            stuck += 1
            if stuck <= _LISTED:
                lines.append(f"block {b.index} ({b.name}) fits in neither mode: row reuse "
                             f"needs {'; '.join(row)}; frame reuse needs {'; '.join(frame)}")
    if stuck > _LISTED:
        lines.append(f"... and {stuck - _LISTED} more blocks that fit in neither mode")
    if not lines:
        def excess(e: Evaluation):
            if e.error:
                return (1, float("inf"))
            return (0, sum(v.need / v.have for v in e.violations))
        closest = min(evaluations, key=excess)
        if closest.error:
            lines.append(f"closest policy {closest.policy.label}: {closest.error}")
        for v in closest.violations:
            where = ""
            if v.group >= 0:
                blk = blocks[blocks.block_of[v.group]]
                where = f" — block {blk.index} ({blk.name})"
            lines.append(f"closest policy {closest.policy.label}: {v}{where}")
    return (f"no reuse policy out of {len(evaluations)} fits the budget of "
            f"{compiled.program.config.name!r}:\n  " + "\n  ".join(lines))
