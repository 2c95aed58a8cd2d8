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
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TimedPath", "worst_paths", "paths_markdown", "ROUTING_NS"]

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


def worst_paths(netlist: dict | str | Path, top: str, count: int = 10) -> list[TimedPath]:
    """The ``count`` slowest paths of module ``top`` of a Yosys JSON netlist, one per
    endpoint register (the bits of one register count once)."""
    if not isinstance(netlist, dict):
        netlist = json.loads(Path(netlist).read_text())
    cells = netlist["modules"][top]["cells"]
    names = _net_names(netlist["modules"][top])
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

    ends = []
    for cname, cell in cells.items():
        if cell["type"] in _COMBINATIONAL:
            continue
        for pin, bit in inputs[cname]:
            if pin not in _CLOCK_PINS and bit in arrival:
                ends.append((arrival[bit] + ROUTING_NS + SETUP_NS, bit, cname, pin))
    ends.sort(key=lambda e: -e[0])
    found, registers = [], set()
    for delay, bit, cname, pin in ends:
        register = names.get(bit, str(bit)).rsplit("_TRELLIS_FF", 1)[0]
        if register in registers:
            continue
        registers.add(register)
        nets, at = [], bit
        while at is not None:
            source, kind = came_from.get(at, (None, "input"))
            nets.append((names.get(at, str(at)), kind, round(arrival.get(at, 0.0), 2)))
            at = source
        nets.reverse()
        found.append(TimedPath(round(delay, 2), len(nets) - 1, f"{cname}.{pin}",
                               tuple(nets)))
        if len(found) == count:
            break
    return found


def paths_markdown(paths: list[TimedPath]) -> list[str]:
    """A table of the paths: estimated delay and Fmax, levels, start and end nets."""
    lines = ["| estimate | Fmax | levels | from | to |", "| ---: | ---: | ---: | --- | --- |"]
    for p in paths:
        lines.append(f"| {p.delay_ns:.1f} ns | {p.mhz:.0f} MHz | {p.levels} | "
                     f"`{p.nets[0][0][:70]}` | `{p.endpoint[:70]}` |")
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
    args = parser.parse_args(argv)
    paths = worst_paths(args.netlist, args.top, args.count)
    print("\n".join(paths_markdown(paths)))
    for p in paths[:args.trace]:
        print(f"\n{p.delay_ns:.1f} ns, {p.levels} levels, to {p.endpoint}:")
        for net, kind, at in p.nets:
            print(f"  {at:6.2f} ns  {kind:10s} {net}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
