"""The model against the RTL's group log: per-group cycles and DRAM bytes, and the tolerances."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .model import ModelRun

__all__ = ["Comparison", "compare", "GROUP_TOLERANCE", "GROUP_SLACK", "RUN_TOLERANCE"]


#: Largest relative difference between the model's and the RTL's cycles accepted in any one
#: group (or up to GROUP_SLACK cycles), and over a whole run: none. Every group measured is
#: exact (the system tests, PP-LCNet in ``make sim``, and the random networks of regress mode
#: on ``tiny`` and ``ecp5``), so a cycle's difference is a model or RTL change to explain. The
#: one behaviour not modelled, a full write buffer stalling the datapath, would show here.
#: ``Comparison.problems`` takes looser limits for exploratory use.
GROUP_TOLERANCE = 0.0
GROUP_SLACK = 0
RUN_TOLERANCE = 0.0


@dataclass(frozen=True)
class Comparison:
    """The model against measured per-group cycles and DRAM bytes (the RTL's group log)."""
    model: ModelRun
    cycles: tuple[int, ...]
    read_bytes: tuple[int, ...]
    write_bytes: tuple[int, ...]

    @property
    def errors(self) -> list[float]:
        """Relative cycle error of each group, (model − measured) / measured."""
        return [(g.cycles - c) / c for g, c in zip(self.model.groups, self.cycles)]

    @property
    def run_error(self) -> float:
        return (self.model.cycles - sum(self.cycles)) / sum(self.cycles)

    @property
    def exact(self) -> int:
        return sum(g.cycles == c for g, c in zip(self.model.groups, self.cycles))

    @property
    def max_error(self) -> float:
        return max(map(abs, self.errors), default=0.0)

    def within(self, tolerance: float) -> int:
        return sum(abs(e) <= tolerance for e in self.errors)

    @property
    def bytes_mismatches(self) -> list[int]:
        """Groups whose DRAM bytes (read or written) differ from the model's."""
        return [g.index for g, r, w in zip(self.model.groups, self.read_bytes, self.write_bytes)
                if (g.read_bytes, g.write_bytes) != (r, w)]

    def problems(self, group_tolerance: float = GROUP_TOLERANCE,
                 run_tolerance: float = RUN_TOLERANCE,
                 group_slack: int = GROUP_SLACK) -> list[str]:
        """Every disagreement beyond the tolerances, as sentences; empty when they agree."""
        out = []
        if len(self.cycles) != len(self.model.groups):
            out.append(f"{len(self.cycles)} groups measured, {len(self.model.groups)} modelled")
        for k in self.bytes_mismatches:
            g = self.model.groups[k]
            out.append(f"group {k}: DRAM bytes read/written {self.read_bytes[k]}/"
                       f"{self.write_bytes[k]}, model {g.read_bytes}/{g.write_bytes}")
        limit = f"tolerance {group_tolerance:.1%} or {group_slack} cycles" \
            if group_tolerance or group_slack else "the model is exact"
        for g, c, e in zip(self.model.groups, self.cycles, self.errors):
            if abs(e) > group_tolerance and abs(g.cycles - c) > group_slack:
                out.append(f"group {g.index}: {c} cycles, model {g.cycles} "
                           f"({g.cycles - c:+d}, {e:+.2%}; {limit})")
        if self.cycles and abs(self.run_error) > run_tolerance:
            out.append(f"run: {sum(self.cycles)} cycles, model {self.model.cycles} "
                       f"({self.run_error:+.2%}, tolerance {run_tolerance:.2%})")
        return out

    def summary(self) -> str:
        n = len(self.cycles)
        return (f"{n} groups: {self.exact} exact, {self.within(0.01)} within 1 %, "
                f"{self.within(0.05)} within 5 %, largest error {self.max_error:.1%}; run "
                f"{self.run_error:+.2%}; DRAM bytes identical in "
                f"{n - len(self.bytes_mismatches)}/{n} groups")


def compare(model: ModelRun, cycles: Sequence[int], read_bytes: Sequence[int],
            write_bytes: Sequence[int]) -> Comparison:
    return Comparison(model, tuple(cycles), tuple(read_bytes), tuple(write_bytes))
