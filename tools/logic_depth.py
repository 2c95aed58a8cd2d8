"""The deepest register-to-register paths of a Yosys ``synth_ecp5`` netlist, in seconds.

Placing and routing the board design takes nextpnr about 40 minutes on this machine; this
estimate takes a few seconds on the JSON netlist Yosys writes (``--synth-only``), so that a
change meant to shorten a path can be checked before the long build. It is an estimate, not
timing closure: every cell has one delay per arc and every net one routing delay.

Delay model (ECP5 speed grade 6, rounded; the routing figure is calibrated on the routed board
design, whose critical path nextpnr measured as 61 logic levels in 42.7 ns):

* a LUT4 0.35 ns, a PFUMX/L6MUX21 0.25 ns;
* a CCU2C 0.45 ns from its data inputs, 0.06 ns along the carry chain (CIN → COUT, no
  routing), 0.3 ns from CIN to its sums;
* an unregistered MULT18X18D 5.5 ns input to output (nextpnr's slow, unregistered timing);
* a TRELLIS_DPR16X4 (LUT RAM) 0.45 ns from its read address;
* paths start at a flip-flop (0.35 ns clock to output), a block RAM's output (4.3 ns without
  its output register) or a LUT RAM's output, and end at a flip-flop's or block RAM's input
  (0.1 ns set-up);
* 0.65 ns of routing per net between cells.

Levels count the cells a path passes, carry cells included.

After routing, nextpnr reports one path per clock. :func:`routed_endpoints` reads the
arrival nextpnr computed at every register input (its JSON report with
``--detailed-timing-report``, which :mod:`sfnpu.tools.bitstream` passes) and lists the slowest
registers, each with the deepest path into it by the estimate above: every path that fails
the clock from one build, not only the worst.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TimedPath", "worst_paths", "routed_endpoints", "paths_markdown", "ROUTING_NS"]

ROUTING_NS = 0.65
SETUP_NS = 0.1
_LOGIC_NS = {"LUT4": 0.35, "PFUMX": 0.25, "L6MUX21": 0.25}
_COMBINATIONAL = set(_LOGIC_NS) | {"CCU2C", "MULT18X18D", "TRELLIS_DPR16X4"}
#: Clock-to-output of the cells a path can start at.
_LAUNCH_NS = {"TRELLIS_FF": 0.35, "DP16KD": 4.3, "TRELLIS_DPR16X4": 1.0}
_CLOCK_PINS = {"CLK", "CLKA", "CLKB", "WCK"}


def _arc_ns(cell_type: str, pin: str, out: str) -> float | None:
    """Delay from input ``pin`` to output ``out`` (``None``: no combinational arc)."""
    if cell_type in _LOGIC_NS:
        return _LOGIC_NS[cell_type]
    if cell_type == "CCU2C":
        if pin == "CIN":
            return 0.06 if out == "COUT" else 0.3
        return 0.45
    if cell_type == "MULT18X18D":
        return 5.5
    if cell_type == "TRELLIS_DPR16X4":
        return 0.45 if pin.startswith("RAD") else None
    return None


@dataclass(frozen=True)
class TimedPath:
    """One path: its estimated delay, the cells it passes and its endpoint (the register
    input it ends at), with each net it passes and the arrival there."""
    delay_ns: float
    levels: int
    endpoint: str
    nets: tuple[tuple[str, str, float], ...]   # (net, cell type driving it, arrival ns)

    @property
    def mhz(self) -> float:
        return 1000 / self.delay_ns


def _net_names(module: dict) -> dict[int, str]:
    """Bit → the most readable net name (a visible one, the shortest)."""
    best: dict[int, tuple] = {}
    for name, net in module["netnames"].items():
        for bit in net["bits"]:
            if isinstance(bit, int):
                key = (net["hide_name"], len(name), name)
                if bit not in best or key < best[bit]:
                    best[bit] = key
    return {bit: key[2] for bit, key in best.items()}


class _Timing:
    """Arrival of every net of module ``top`` under the delay model, and the input each
    combinational output's latest arrival came from."""

    def __init__(self, netlist: dict | str | Path, top: str):
        if not isinstance(netlist, dict):
            netlist = json.loads(Path(netlist).read_text())
        self.cells = netlist["modules"][top]["cells"]
        self.names = _net_names(netlist["modules"][top])
        self.inputs, self.arrival, self.came_from = _arrivals(self.cells)

    def path(self, delay: float, bit: int, endpoint: str) -> TimedPath:
        """The path into ``bit`` (at ``endpoint``), traced back to where it starts."""
        nets, at = [], bit
        while at is not None:
            source, kind = self.came_from.get(at, (None, "input"))
            nets.append((self.names.get(at, str(at)), kind, round(self.arrival.get(at, 0.0), 2)))
            at = source
        nets.reverse()
        return TimedPath(round(delay, 2), len(nets) - 1, endpoint, tuple(nets))


def _arrivals(cells: dict):
    """Per cell its input (pin, bit)s; per bit its arrival and (source bit, driving cell
    type), combinational cells in topological order."""
    inputs: dict[str, list[tuple[str, int]]] = defaultdict(list)
    sinks: dict[int, list[str]] = defaultdict(list)
    driven: set[int] = set()
    for cname, cell in cells.items():
        for pin, bits in cell["connections"].items():
            for bit in bits:
                if not isinstance(bit, int):
                    continue
                if cell["port_directions"].get(pin) == "output":
                    driven.add(bit)
                else:
                    inputs[cname].append((pin, bit))
                    sinks[bit].append(cname)

    arrival: dict[int, float] = {}
    came_from: dict[int, tuple[int | None, str]] = {}
    for cname, cell in cells.items():
        launch = _LAUNCH_NS.get(cell["type"])
        if launch is None and cell["type"] in _COMBINATIONAL:
            continue
        for pin, bits in cell["connections"].items():
            if cell["port_directions"].get(pin) == "output":
                for bit in bits:
                    if isinstance(bit, int):
                        arrival[bit] = max(arrival.get(bit, 0.0), launch or 0.0)
                        came_from.setdefault(bit, (None, cell["type"]))

    # Combinational cells in topological order (Kahn): a cell is timed once all its inputs are.
    waiting = {c: sum(1 for _, b in inputs[c] if b in driven and b not in arrival)
               for c, cell in cells.items() if cell["type"] in _COMBINATIONAL}
    ready = [c for c, n in waiting.items() if n == 0]
    while ready:
        cname = ready.pop()
        cell = cells[cname]
        for out, bits in cell["connections"].items():
            if cell["port_directions"].get(out) != "output":
                continue
            for bit in bits:
                if not isinstance(bit, int):
                    continue
                best, source = arrival.get(bit, 0.0), None
                for pin, src in inputs[cname]:
                    arc = _arc_ns(cell["type"], pin, out)
                    if arc is None:
                        continue
                    t = arrival.get(src, 0.0) + (0.0 if pin == "CIN" else ROUTING_NS) + arc
                    if t > best:
                        best, source = t, src
                arrival[bit] = best
                came_from[bit] = (source, cell["type"])
                for sink in sinks.get(bit, ()):
                    if sink in waiting:
                        waiting[sink] -= 1
                        if waiting[sink] == 0:
                            ready.append(sink)

    return inputs, arrival, came_from


def worst_paths(netlist: dict | str | Path, top: str, count: int = 10) -> list[TimedPath]:
    """The ``count`` slowest paths of module ``top`` of a Yosys JSON netlist, one per
    endpoint register (the bits of one register count once)."""
    timing = _Timing(netlist, top)
    ends = []
    for cname, cell in timing.cells.items():
        if cell["type"] in _COMBINATIONAL:
            continue
        for pin, bit in timing.inputs[cname]:
            if pin not in _CLOCK_PINS and bit in timing.arrival:
                ends.append((timing.arrival[bit] + ROUTING_NS + SETUP_NS, bit, cname, pin))
    ends.sort(key=lambda e: -e[0])
    found, registers = [], set()
    for delay, bit, cname, pin in ends:
        register = timing.names.get(bit, str(bit)).rsplit("_TRELLIS_FF", 1)[0]
        if register in registers:
            continue
        registers.add(register)
        found.append(timing.path(delay, bit, f"{cname}.{pin}"))
        if len(found) == count:
            break
    return found


def routed_endpoints(netlist: dict | str | Path, top: str, report: dict | str | Path,
                     count: int = 20) -> list[TimedPath]:
    """The ``count`` slowest endpoints of the placed and routed design, one per register:
    each with nextpnr's delay (its arrival at the endpoint pin, from the report's
    ``detailed_net_timings``; ``--detailed-timing-report``; without the endpoint's set-up
    time, which nextpnr's critical path adds: 0 for a flip-flop, 0.2 ns for a DP16KD) and the netlist
    estimate's deepest path into it (which cells it passes, not nextpnr's own path).
    Only paths within one clock edge count."""
    if not isinstance(report, dict):
        report = json.loads(Path(report).read_text())
    if "detailed_net_timings" not in report:
        raise ValueError("the nextpnr report has no endpoint timing: run nextpnr with "
                         "--detailed-timing-report")
    timing = _Timing(netlist, top)
    ends = sorted(((end["delay"][-1] if isinstance(end["delay"], list) else end["delay"],
                    end["cell"], end["port"])
                   for net in report["detailed_net_timings"] for end in net["endpoints"]
                   if end["event"] == net["event"] and "async" not in net["event"]),
                  reverse=True)
    found, registers = [], set()
    for delay, cname, pin in ends:
        register = re.sub(r"_TRELLIS_FF_Q(_\d+)?$", "", cname)
        if register in registers:
            continue
        registers.add(register)
        pins = dict(timing.inputs.get(cname, ()))
        # nextpnr feeds a flip-flop's data from outside its slice through the M input
        bit = pins.get(pin, pins.get("DI") if pin == "M" else None)
        path = timing.path(delay, bit, f"{cname}.{pin}") if bit is not None else \
            TimedPath(round(delay, 2), 0, f"{cname}.{pin}", ())
        found.append(path)
        if len(found) == count:
            break
    return found


def paths_markdown(paths: list[TimedPath], delay: str = "estimate") -> list[str]:
    """A table of the paths: delay (``delay`` names its source) and Fmax, levels, start and
    end nets."""
    lines = [f"| {delay} | Fmax | levels | from | to |", "| ---: | ---: | ---: | --- | --- |"]
    for p in paths:
        lines.append(f"| {p.delay_ns:.1f} ns | {p.mhz:.0f} MHz | {p.levels} | "
                     f"`{p.nets[0][0][:70] if p.nets else '?'}` | `{p.endpoint[:70]}` |")
    return lines


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m sfnpu.tools.logic_depth",
        description="Estimated deepest paths of a Yosys synth_ecp5 JSON netlist.")
    parser.add_argument("netlist")
    parser.add_argument("--top", default="sfnpu_ulx3s")
    parser.add_argument("--count", type=int, default=15)
    parser.add_argument("--trace", type=int, default=1, help="paths printed net by net")
    parser.add_argument("--routed", metavar="REPORT",
                        help="nextpnr's JSON report (--detailed-timing-report): the routed "
                             "design's slowest endpoints, each with its deepest estimated path")
    args = parser.parse_args(argv)
    if args.routed:
        paths = routed_endpoints(args.netlist, args.top, args.routed, args.count)
        print("\n".join(paths_markdown(paths, "nextpnr")))
    else:
        paths = worst_paths(args.netlist, args.top, args.count)
        print("\n".join(paths_markdown(paths)))
    for p in paths[:args.trace]:
        print(f"\n{p.delay_ns:.1f} ns, {p.levels} levels, to {p.endpoint}:")
        for net, kind, at in p.nets:
            print(f"  {at:6.2f} ns  {kind:10s} {net}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
