"""The outputs of a sweep (:mod:`.dse`): ``points.csv``, the Pareto fronts as PNG plots and
``summary.md``.

A point is on a front when no other feasible point of the same network is at least as good
on both axes and better on one (:func:`pareto`); every axis is minimised: latency against
SRAM, against DRAM bytes and against multipliers. The paper's design point (the ``kcu1500``
configuration: Ti = To = 64, 3 × 1.5 MiB buffers, 200 MHz) is marked where the sweep holds it.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from sfnpu.config import CONFIGS

__all__ = ["FRONTS", "pareto", "paper_point", "write"]

#: The fronts drawn and listed: (y metric, its label), each against latency.
FRONTS = (("sram_B", "SRAM (bytes)"), ("dram_B", "DRAM bytes per inference"),
          ("multipliers", "multipliers"))

#: The configuration whose figures the paper's tables give.
PAPER_CONFIG = "kcu1500"


def pareto(rows: Sequence[dict], x: str, y: str) -> list[dict]:
    """The points of ``rows`` no other point dominates on (``x``, ``y``), both minimised,
    sorted by ``x``; of points equal on both, the first."""
    front, best_y = [], None
    for r in sorted(rows, key=lambda r: (r[x], r[y])):
        if best_y is None or r[y] < best_y:
            front.append(r)
            best_y = r[y]
    return front


def paper_point(row: dict) -> bool:
    """Whether the row's configuration is the paper's design (its name aside)."""
    ref = CONFIGS[PAPER_CONFIG].to_dict()
    for name, value in ref.items():
        if name == "name":
            continue
        if name == "buffer_bytes":
            if [row[f"buffer{i}_B"] for i in range(3)] != list(value):
                return False
        elif name == "device":
            if (row["device"] or None) != value:
                return False
        elif row[name] != value:
            return False
    return True


def _feasible(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r.get("feasible") == 1]


def _by_network(rows: Sequence[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["network"], []).append(r)
    return out


def _write_csv(rows: Sequence[dict], path: Path) -> None:
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def _plot(network: str, rows: Sequence[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    feasible = _feasible(rows)
    fig, axes = plt.subplots(1, len(FRONTS), figsize=(5 * len(FRONTS), 4.2))
    for ax, (metric, label) in zip(axes, FRONTS):
        ax.scatter([r[metric] for r in feasible], [r["latency_ms"] for r in feasible], s=12,
                   color="0.65", label="feasible points")
        ran = [r for r in rows if r.get("feasible") == 0 and r.get("latency_ms") not in
               (None, "")]
        if ran:
            ax.scatter([r[metric] for r in ran], [r["latency_ms"] for r in ran], s=12,
                       marker="x", color="tab:red", alpha=0.5, label="does not fit its part")
        front = pareto(feasible, metric, "latency_ms")
        ax.step([r[metric] for r in front], [r["latency_ms"] for r in front], where="post",
                color="tab:blue", label="Pareto front")
        ax.scatter([r[metric] for r in front], [r["latency_ms"] for r in front], s=18,
                   color="tab:blue")
        for r in rows:
            if paper_point(r) and r.get("latency_ms") not in (None, ""):
                ax.scatter([r[metric]], [r["latency_ms"]], marker="*", s=160,
                           color="tab:orange", zorder=5, label="the paper's design (kcu1500)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("latency (ms, cycle model)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{network}: latency against SRAM, DRAM traffic and multipliers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _describe(r: dict) -> str:
    kib = [r[f"buffer{i}_B"] // 1024 for i in range(3)]
    bufs = f"{kib[0]} KiB" if len(set(kib)) == 1 else "/".join(map(str, kib)) + " KiB"
    return (f"Ti={r['ti']} To={r['to']}, buffers 3×{bufs}, row {r['row_buffer_bytes'] // 1024} "
            f"KiB, psum {r['psum_buffer_bytes'] // 1024} KiB, {r['dram_bus_bits']}-bit "
            f"{r['dram_bandwidth_gbps']:g} GB/s, {r['clock_mhz']:g} MHz"
            + (", packed" if r["dsp_packing"] else ""))


def _md_table(header: Sequence[str], lines: Sequence[Sequence]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return out


def _summary(result, fronts: dict[str, dict[str, list[dict]]]) -> str:
    rows = result.rows
    feasible = _feasible(rows)
    lines = [f"# Design-space sweep `{result.spec.name}`", "",
             f"{len(rows)} points ({len({r['config'] for r in rows})} configurations × "
             f"{len({r['network'] for r in rows})} networks): {len(feasible)} feasible, "
             f"{len(rows) - len(feasible)} not. This run computed {result.computed} on "
             f"{result.runner} in {result.seconds:.1f} s; the rest came from the cache.", "",
             "Latency is the cycle model's for the best reuse policy of the cut-point search "
             "on the configuration's buffers (tiling included). SRAM counts the three "
             "buffers, the row, partial-sum and write buffers and the weight store. "
             "Multipliers, DP16KD-equivalent block RAMs and LUTs are `sfnpu.resources`' "
             "estimate; a point whose estimate exceeds its part is infeasible.", ""]
    lines += ["## Best configuration per device and network (least latency)", ""]
    table = []
    for device in sorted({r["device"] for r in rows}):
        for network, group in _by_network(r for r in feasible if r["device"] == device).items():
            best = min(group, key=lambda r: (r["latency_cycles"], r["sram_B"]))
            table.append((device or "(no part)", network, best["config"], _describe(best),
                          f"{best['latency_ms']:.3f}", f"{best['mac_efficiency']:.1%}",
                          f"{best['dram_B'] / 1e6:.2f}", f"{best['sram_B'] / 1024:.0f}",
                          best["multipliers"]))
    lines += _md_table(("device", "network", "config", "configuration", "latency ms",
                        "MAC efficiency", "DRAM MB", "SRAM KiB", "multipliers"), table)
    lines.append("")
    for network, by_metric in fronts.items():
        lines += [f"## {network}", "", f"![{network}]({_png_name(network)})", ""]
        for metric, label in FRONTS:
            front = by_metric[metric]
            lines.append(f"Pareto front, latency against {label}: "
                         + (", ".join(f"{r['config']} ({r['latency_ms']:.3f} ms, "
                                      f"{r[metric]:,})" for r in front) or "none feasible"))
            lines.append("")
        paper = [r for r in rows if r["network"] == network and paper_point(r)]
        if paper:
            p = paper[0]
            if p.get("latency_ms") in (None, ""):
                verdict = f"not run ({p['reason']})."
            elif p.get("feasible") != 1:
                verdict = f"{p['latency_ms']:.3f} ms, but infeasible: {p['reason']}."
            else:
                on = any(p is r for f in by_metric.values() for r in f)
                verdict = f"{p['latency_ms']:.3f} ms, {'on' if on else 'off'} a front."
            lines.append(f"The paper's design point ({p['config']}): {verdict}")
        else:
            lines.append("The paper's design point is not in this sweep.")
        lines.append("")
    errors = [r for r in rows if r.get("feasible") == 0 and r.get("reason")]
    if errors:
        lines += ["## Infeasible points", ""]
        reasons: dict[str, list[str]] = {}
        for r in errors:
            reasons.setdefault(r["reason"], []).append(r["point"])
        for reason, points in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(points[:6]) + (f" and {len(points) - 6} more" if len(points) > 6
                                             else "")
            lines.append(f"- {len(points)} point(s), e.g. {shown}: {reason}")
        lines.append("")
    return "\n".join(lines)


def _png_name(network: str) -> str:
    return "pareto_" + network.replace("@", "_").replace("/", "_") + ".png"


def write(result, out: Path) -> list[Path]:
    """``points.csv``, one ``pareto_<network>.png`` per network and ``summary.md``."""
    out = Path(out)
    files = [out / "points.csv"]
    _write_csv(result.rows, files[0])
    fronts = {}
    for network, rows in _by_network(result.rows).items():
        feasible = _feasible(rows)
        fronts[network] = {m: pareto(feasible, m, "latency_ms") for m, _ in FRONTS}
        files.append(out / _png_name(network))
        _plot(network, rows, files[-1])
    files.append(out / "summary.md")
    files[-1].write_text(_summary(result, fronts))
    return files
