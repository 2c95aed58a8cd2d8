"""`sfnpu modules`: module-level on-chip allocation (:mod:`.modules`) beside Kim et al.'s Table 1.

For one network (a builder name or an ONNX file) the report compares, module by module, the
feature-map DRAM traffic of the compiled program (every layer reads and writes DRAM: the paper's
*Naive*) with the module allocation at the given on-chip budget (the paper's *Proposed*), and
the number of feature-map transfers. The on-chip budget is the three feature-map buffers
{0, 1, 2} together, split equally (the controller's buffers are of one size); the hardware is
``kcu1500``'s memories and bus with Ti = To = 32 (1024 MACs, the paper NPU's MAC count; 32-channel
blocks, so every Inception-V3 concat part starts on a block boundary). Because a tensor cannot
span two buffers, the report also gives the smallest equal split at which the allocation stops
improving, and a sweep of the budget.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from sfnpu import layout
from sfnpu.compiler.modules import (GroupFm, ModulePlan, module_group_indices, plan_modules,
                                    traffic_by_group)
from sfnpu.compiler.pipeline import Compiled, compile_model, ensure_qdq
from sfnpu.config import ROW_BUFFER_ROWS, HwConfig, get_config
from sfnpu.models import builders

from .networks import study_model
from .paper_reference import KIM_CITATION, KIM_SRAM_KB, KIM_TABLE_1, KIM_TOTAL, KimModule

__all__ = ["ModuleReportError", "npu_config", "Fm", "ModuleRow", "ModuleStudy", "study", "write_report",
           "SWEEP_KIB", "PAPER_NPU_PARALLELISM"]

KiB = 1024
#: Ti = To of the analysis configuration: 32 × 32 = 1024 MACs, as the paper's NPU.
PAPER_NPU_PARALLELISM = 32
#: On-chip budgets of the sweep (KiB, the three buffers together).
SWEEP_KIB = (512, 640, 768, 896, 1024, 1152, 1280, 1536, 2048)


class ModuleReportError(ValueError):
    """A report request that cannot be met (unknown model, bad budget or size)."""


def npu_config(total_bytes: int, base: str = "kcu1500") -> HwConfig:
    """``base``'s memories and bus, 1024 MACs, buffers {0, 1, 2} splitting ``total_bytes``
    equally (each rounded down to whole pixels of a channel block); model only."""
    p = PAPER_NPU_PARALLELISM
    each = total_bytes // 3 // p * p
    if each <= 0:
        raise ModuleReportError(f"on-chip budget of {total_bytes} B is too small for three buffers")
    return get_config(base).replace(name=f"{base}-{p}x{p}-{total_bytes // KiB}k", ti=p, to=p,
                                    buffer_bytes=(each,) * 3, device=None)


@dataclass(frozen=True)
class Fm:
    """Feature-map DRAM traffic of a set of groups."""
    layout: int          # bytes in sfnpu's layout
    dense: int           # C·H·W bytes
    patch: int           # the paper's NPU accounting (H, W rounded up to 4)
    reads: int
    writes: int

    @staticmethod
    def of(per_group: Sequence[GroupFm], indices: Sequence[int]) -> "Fm":
        gs = [per_group[i] for i in indices]
        return Fm(sum(g.total for g in gs), sum(g.read_dense + g.written_dense for g in gs),
                  sum(g.read_patch + g.written_patch for g in gs),
                  sum(g.reads for g in gs), sum(g.writes for g in gs))


@dataclass(frozen=True)
class ModuleRow:
    name: str
    branches: int
    groups: int
    weights: int                 # dense bytes, read once
    naive: Fm
    proposed: Fm                 # at the requested budget
    processing: str
    spilled: int                 # intermediate maps sent to DRAM
    best: Fm                     # at the smallest budget holding every module map
    best_processing: str
    paper: KimModule | None


@dataclass(frozen=True)
class ModuleStudy:
    title: str
    config: HwConfig             # at the requested budget
    budget: int                  # bytes, buffers {0, 1, 2} together
    best_budget: int             # smallest equal split reaching the unlimited-budget traffic
    rows: tuple[ModuleRow, ...]
    sweep: tuple[tuple[int, Fm], ...]      # (budget bytes, module feature-map traffic)
    network_naive: Fm
    network_proposed: Fm
    plan: ModulePlan
    rejected: tuple[str, ...]


def _module_fm(plan: ModulePlan) -> Fm:
    per = traffic_by_group(plan.program.instructions, plan.program.config)
    idx = [i for m in plan.modules for i in module_group_indices(plan.groups, m)]
    return Fm.of(per, idx)


def _plan(compiled: Compiled, config: HwConfig, each: int) -> ModulePlan:
    return plan_modules(compiled.graph, compiled.groups, config, capacity=(each,) * 3)


def _smallest_budget(compiled: Compiled, config: HwConfig) -> int:
    """The smallest equal buffer size (bytes each) whose module traffic equals that with
    unlimited buffers (bisection; the result is re-checked)."""
    lanes = config.lanes
    big = sum(layout.tensor_bytes(*t.shape, lanes) for t in compiled.graph.tensors.values())
    floor = _module_fm(_plan(compiled, config, big)).layout
    lo, hi = 0, big // lanes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _module_fm(_plan(compiled, config, mid * lanes)).layout == floor:
            hi = mid
        else:
            lo = mid
    return hi * lanes


def _paper_row(network: str, size: int | None, name: str) -> KimModule | None:
    if (network, size) != ("inception_v3", 299):
        return None
    return next((r for r in KIM_TABLE_1 if r.module == name), None)


def _compiled(model: str, size: int | None, config: HwConfig, cache: Path
              ) -> tuple[Compiled, str, int | None]:
    cache.mkdir(parents=True, exist_ok=True)
    if model in builders.BUILDERS:
        size = size or builders.DEFAULT_INPUT_SIZE[model]
        path = study_model(SimpleNamespace(network=model, input_size=size, conv_only=False),
                           cache)
        return compile_model(path, config), f"{model} at {size}×{size}", size
    if size is not None:
        raise ModuleReportError(f"--size applies to builders ({', '.join(builders.BUILDERS)}), not "
                          f"to the ONNX file {model!r}")
    if not Path(model).exists():
        raise ModuleReportError(f"{model!r} is neither a builder ({', '.join(builders.BUILDERS)}) "
                          "nor an ONNX file")
    path, _ = ensure_qdq(model, cache)
    return compile_model(path, config), Path(model).name, None


def study(model: str, sram_kib: float = KIM_SRAM_KB, size: int | None = None,
          cache: Path = Path("build/modules/cache")) -> ModuleStudy:
    """Module allocation of ``model`` with ``sram_kib`` KiB in buffers {0, 1, 2}."""
    if not sram_kib > 0:
        raise ModuleReportError(f"--sram-kb {sram_kib}: must be positive")
    budget = int(sram_kib * KiB)
    config = npu_config(budget)
    compiled, title, size = _compiled(model, size, config, cache)
    each = config.buffer_bytes[0]
    plan = _plan(compiled, config, each)
    best_each = _smallest_budget(compiled, config)
    best = _plan(compiled, config, best_each)
    naive_fm = traffic_by_group(compiled.program.instructions, config)
    fm = traffic_by_group(plan.program.instructions, config)
    best_fm = traffic_by_group(best.program.instructions, config)
    rows = []
    for m, nm, bm, d, bd in zip(plan.modules, plan.naive_modules, best.modules,
                                plan.allocation.decisions, best.allocation.decisions):
        rows.append(ModuleRow(
            m.name, m.paths, len(nm.groups),
            sum(naive_fm[i].weights_dense for i in nm.groups),
            Fm.of(naive_fm, nm.groups), Fm.of(fm, module_group_indices(plan.groups, m)),
            d.processing, len(d.spilled),
            Fm.of(best_fm, module_group_indices(best.groups, bm)), bd.processing,
            _paper_row(model, size, m.name)))
    sweep = []
    for kib in sorted({*SWEEP_KIB, sram_kib, 3 * best_each / KiB}):
        e = int(kib * KiB) // 3 // config.lanes * config.lanes
        sweep.append((3 * e, _module_fm(_plan(compiled, config, e))))
    everything = range(len(compiled.groups))
    return ModuleStudy(title, config, 3 * each, 3 * best_each, tuple(rows), tuple(sweep),
                       Fm.of(naive_fm, everything),
                       Fm.of(fm, range(len(plan.groups))), plan,
                       plan.modules.rejected)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------

def _kb(n: float) -> str:
    return f"{n / KiB:,.1f}"


def _pkb(n: float | None) -> str:
    return "–" if n is None else f"{n:,.1f}"


def _total(rows: Sequence[ModuleRow], attr: str) -> Fm:
    fms = [getattr(r, attr) for r in rows]
    return Fm(*(sum(getattr(f, k) for f in fms) for k in Fm.__dataclass_fields__))


def report_markdown(st: ModuleStudy, command: str, png: str, csv_name: str) -> str:
    cfg = st.config
    paper = any(r.paper for r in st.rows)
    best_kib = st.best_budget / KiB
    lines = [
        f"# Module-level on-chip allocation: {st.title}",
        "",
        f"Command: `{command}`. Data: [{csv_name}]({csv_name}); figure: [{png}]({png}).",
        "",
        f"Hardware: {cfg.summary()}. Model only (no RTL run at this size). The budget "
        f"`--sram-kb` is buffers {{0, 1, 2}} together, split equally: {_kb(st.budget)} KiB "
        f"= 3 × {_kb(cfg.buffer_bytes[0])} KiB. KB = 1024 bytes (the paper's per-layer figures "
        "are multiples of 1024 B).",
        "",
        f"Modules: {len(st.rows)} detected (Algorithm 2), "
        f"{sum(r.branches for r in st.rows)} branches; "
        + (f"left out: {'; '.join(st.rejected)}." if st.rejected else "no merge left out."),
        "",
        "*Naive* is the compiled program: every group reads its operands from and writes its "
        "result to DRAM. *Ours* is the module allocation (`sfnpu.compiler.modules`): branches "
        "re-ordered, MIFM held, MOFM parts occupied from their writer on, MOFM forwarded as the "
        "next MIFM; the placement is proven by `check_placement`. Feature-map bytes are given in "
        "sfnpu's layout (channel blocks of 32) and, to compare with the paper, in its NPU's "
        "accounting: C·H·W with H and W rounded up to multiples of 4 (its 4×4 output patches; "
        "this reproduces its Naive column exactly for the modules whose layers match ours). "
        "Weights are dense O·I·kh·kw bytes, read once.",
        "",
        "Execution: `tests/test_modules.py` runs an Inception-style network placed by this pass "
        "on the golden model (outputs identical to the all-DRAM program and to onnxruntime) and "
        "on the RTL (`tiny`, whole DRAM identical to the golden model's), also with buffers so "
        "small that modules spill and write their output to DRAM; `sfnpu run --modules` runs "
        "any model this way.",
        "",
    ]
    head = ("| module | branches | groups | W KB (ours / paper) | naive FM KB, 4×4 acc. "
            "(ours / paper) | naive FM KB, our layout | ours FM KB @ "
            f"{_kb(st.budget)} KiB (layout / 4×4) | processing | ours FM KB @ {best_kib:,.1f} "
            "KiB (layout / 4×4) | paper proposed FM KB | transfers naive R/W (ours / paper) | "
            f"transfers R/W @ {_kb(st.budget)} / @ {best_kib:,.1f} KiB / paper |")
    lines.append(head)
    lines.append("|" + " --- |" * (head.count("|") - 1))
    for r in st.rows:
        p = r.paper
        lines.append(
            f"| {r.name}{f' ({p.label})' if p else ''} | {r.branches} | {r.groups} | "
            f"{_kb(r.weights)} / {_pkb(p and p.weights_kb)} | "
            f"{_kb(r.naive.patch)} / {_pkb(p and p.naive_fm_kb)} | {_kb(r.naive.layout)} | "
            f"{_kb(r.proposed.layout)} / {_kb(r.proposed.patch)} | {r.processing}"
            f"{f', {r.spilled} spilled' if r.spilled else ''} | "
            f"{_kb(r.best.layout)} / {_kb(r.best.patch)} | {_pkb(p and p.proposed_fm_kb)} | "
            f"{r.naive.reads}/{r.naive.writes} / "
            f"{f'{p.naive_reads}/{p.naive_writes}' if p else '–'} | "
            f"{r.proposed.reads}/{r.proposed.writes} / {r.best.reads}/{r.best.writes} / "
            f"{f'{p.proposed_reads}/{p.proposed_writes}' if p else '–'} |")
    n, o, b = (_total(st.rows, a) for a in ("naive", "proposed", "best"))
    w = sum(r.weights for r in st.rows)
    t = KIM_TOTAL if paper else None
    lines.append(
        f"| **total** | {sum(r.branches for r in st.rows)} | {sum(r.groups for r in st.rows)} | "
        f"{_kb(w)} / {_pkb(t and t.weights_kb)} | {_kb(n.patch)} / {_pkb(t and t.naive_fm_kb)} | "
        f"{_kb(n.layout)} | {_kb(o.layout)} / {_kb(o.patch)} | | {_kb(b.layout)} / "
        f"{_kb(b.patch)} | {_pkb(t and t.proposed_fm_kb)} | {n.reads}/{n.writes} / "
        f"{f'{t.naive_reads}/{t.naive_writes}' if t else '–'} | {o.reads}/{o.writes} / "
        f"{b.reads}/{b.writes} / {f'{t.proposed_reads}/{t.proposed_writes}' if t else '–'} |")
    lines += ["", "## Totals", "",
              "| | naive FM KB | proposed FM KB | FM reduction | total (W + FM) naive KB | "
              "total proposed KB | total proposed / naive | FM transfers naive → proposed |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def totals(label, nfm, pfm, transfers):
        return (f"| {label} | {nfm / KiB:,.1f} | {pfm / KiB:,.1f} | "
                f"{100 * (1 - pfm / nfm):.2f} % | {(w + nfm) / KiB:,.1f} | "
                f"{(w + pfm) / KiB:,.1f} | {100 * (w + pfm) / (w + nfm):.2f} % | "
                f"{transfers} |")

    lines.append(totals(f"ours @ {_kb(st.budget)} KiB, layout bytes", n.layout, o.layout,
                        f"{n.reads + n.writes} → {o.reads + o.writes}"))
    lines.append(totals(f"ours @ {_kb(st.budget)} KiB, 4×4 accounting", n.patch, o.patch,
                        f"{n.reads + n.writes} → {o.reads + o.writes}"))
    lines.append(totals(f"ours @ {best_kib:,.1f} KiB, layout bytes", n.layout, b.layout,
                        f"{n.reads + n.writes} → {b.reads + b.writes}"))
    lines.append(totals(f"ours @ {best_kib:,.1f} KiB, 4×4 accounting", n.patch, b.patch,
                        f"{n.reads + n.writes} → {b.reads + b.writes}"))
    if t:
        lines.append(f"| paper (Table 1) @ {KIM_SRAM_KB} KB | {t.naive_fm_kb:,.1f} | "
                     f"{t.proposed_fm_kb:,.1f} | "
                     f"{100 * (1 - t.proposed_fm_kb / t.naive_fm_kb):.2f} % | "
                     f"{t.naive_total_kb:,.1f} | {t.proposed_total_kb:,.1f} | "
                     f"{100 * t.proposed_total_kb / t.naive_total_kb:.2f} % | "
                     f"{t.naive_reads + t.naive_writes} → "
                     f"{t.proposed_reads + t.proposed_writes} |")
    lines += ["", f"Whole network (stem and classifier too, our layout): naive "
              f"{_kb(st.network_naive.layout)} KB, with module allocation @ {_kb(st.budget)} KiB "
              f"{_kb(st.network_proposed.layout)} KB of feature-map traffic.", "",
              "## Budget sweep", "",
              "| buffers {0,1,2} KiB | module FM KB (layout) | module FM KB (4×4) | transfers |",
              "| --- | --- | --- | --- |"]
    for budget, f in st.sweep:
        lines.append(f"| {_kb(budget)} | {_kb(f.layout)} | {_kb(f.patch)} | "
                     f"{f.reads + f.writes} |")
    lines += ["", "## Why the numbers differ from the paper's", ""]
    lines += _explanations(st)
    if paper:
        lines += ["", f"Paper data quoted from {KIM_CITATION}."]
    return "\n".join(lines) + "\n"


def _explanations(st: ModuleStudy) -> list[str]:
    out = []
    each = st.config.buffer_bytes[0]
    best_each = st.best_budget // 3
    if st.best_budget > st.budget:
        out.append(
            f"* **One tensor, one buffer.** The paper's NPU has one 1024 KB memory; sfnpu has "
            f"three buffers and a tensor lives in one of them. At {_kb(st.budget)} KiB each "
            f"buffer holds {_kb(each)} KiB, less than the largest module map that must stay "
            f"whole ({_kb(best_each)} KiB), so modules spill or write their MOFM to DRAM. "
            f"From {st.best_budget / KiB:,.1f} KiB (3 × {_kb(best_each)} KiB, "
            f"{100 * (st.best_budget / st.budget - 1):.2f} % more) every module map stays on "
            "chip.")
    if any(r.best.reads for r in st.rows[:1]):
        out.append(
            "* **Stem → first module.** The stem runs with row reuse, whose results go to DRAM, "
            "so the first module's MIFM is loaded once by a copy group (one read). The paper's "
            "first module shows no transfer: its stem's last layer wrote the MIFM on chip.")
    extra = [r for r in st.rows if r.paper and r.groups != r.paper.naive_reads]
    if extra:
        out.append(
            "* **Extra groups.** " + ", ".join(f"{r.name} has {r.groups} groups vs "
                                                f"{r.paper.naive_reads} layers" for r in extra)
            + ": a max-pool part or a nested concat quantised differently from the concat is "
            "copied by a requantising table group (onnxruntime's QDQ graph has a "
            "DequantizeLinear/QuantizeLinear pair there), and a nested concat whose parts "
            "cannot be redirected twice is copied; their naive traffic is larger than the "
            "paper's for the same reason.")
    rows, psum, weights = _working_memory(st)
    out.append(
        "* **What the budget holds.** The paper's 1024 KB also holds weights and working "
        "memories. sfnpu keeps those in memories beside buffers {0, 1, 2}; what the module "
        f"groups need there in frame reuse: {_kb(rows)} KiB of row buffer (6 input rows), "
        f"{_kb(psum)} KiB of partial sums (one output row of To channels) and a weight store "
        f"for the largest layer's {_kb(weights)} KiB (the controller's store is the size of "
        "buffer 1; a larger layer is taken in chunks of output-channel blocks). Our budget "
        "therefore covers feature maps only.")
    out.append(
        "* **Layout.** sfnpu stores maps in blocks of 32 channels (a 48-channel map takes 64); "
        "the paper rounds H and W up to 4. The two accountings are shown side by side.")
    return out


def _working_memory(st: ModuleStudy) -> tuple[int, int, int]:
    """Largest row-buffer, partial-sum and weight needs of the module groups (bytes)."""
    cfg = st.config
    instrs = st.plan.program.instructions
    idx = [i for m in st.plan.modules for i in module_group_indices(st.plan.groups, m)]
    rows = max(ROW_BUFFER_ROWS * instrs[i].in_w * layout.channel_blocks(instrs[i].in_c,
                                                                           cfg.lanes)
               * cfg.lanes for i in idx)
    psum = max(layout.conv_output_hw(instrs[i])[1] * cfg.to * 4 for i in idx)
    weights = max(layout.weight_bytes(instrs[i], cfg) for i in idx)
    return rows, psum, weights


def _write_csv(st: ModuleStudy, path: Path) -> None:
    fields = ["module", "paper_label", "branches", "groups", "weights_b", "paper_weights_kb",
              "naive_fm_layout_b", "naive_fm_patch_b", "paper_naive_fm_kb",
              "proposed_fm_layout_b", "proposed_fm_patch_b", "processing", "spilled",
              "best_fm_layout_b", "best_fm_patch_b", "best_processing", "paper_proposed_fm_kb",
              "naive_reads", "naive_writes", "proposed_reads", "proposed_writes", "best_reads",
              "best_writes", "paper_proposed_reads", "paper_proposed_writes", "budget_b",
              "best_budget_b"]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(fields)
        for r in st.rows:
            p = r.paper
            out.writerow([r.name, p.label if p else "", r.branches, r.groups, r.weights,
                          p.weights_kb if p else "", r.naive.layout, r.naive.patch,
                          p.naive_fm_kb if p else "", r.proposed.layout, r.proposed.patch,
                          r.processing, r.spilled, r.best.layout, r.best.patch,
                          r.best_processing, p.proposed_fm_kb if p else "", r.naive.reads,
                          r.naive.writes, r.proposed.reads, r.proposed.writes, r.best.reads,
                          r.best.writes, p.proposed_reads if p else "",
                          p.proposed_writes if p else "", st.budget, st.best_budget])


def _write_png(st: ModuleStudy, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = [r.paper.label if r.paper else r.name for r in st.rows]
    x = range(len(names))
    series = [("naive (ours, 4×4 acc.)", [r.naive.patch / KiB for r in st.rows]),
              (f"ours @ {_kb(st.budget)} KiB", [r.proposed.patch / KiB for r in st.rows]),
              (f"ours @ {st.best_budget / KiB:,.1f} KiB", [r.best.patch / KiB for r in st.rows])]
    if any(r.paper for r in st.rows):
        series.insert(1, ("naive (paper)", [r.paper.naive_fm_kb if r.paper else 0
                                            for r in st.rows]))
        series.append(("proposed (paper)", [r.paper.proposed_fm_kb if r.paper else 0
                                            for r in st.rows]))
    width = 0.8 / len(series)
    for k, (label, ys) in enumerate(series):
        a.bar([i + k * width for i in x], ys, width, label=label)
    a.set_xticks([i + 0.4 - width / 2 for i in x], names, rotation=45, ha="right")
    a.set_ylabel("feature-map DRAM traffic (KB)")
    a.set_title("per module")
    a.legend(fontsize=8)
    budgets = [s / KiB for s, _ in st.sweep]
    b.plot(budgets, [f.patch / KiB for _, f in st.sweep], "o-", label="ours (4×4 accounting)")
    b.plot(budgets, [f.layout / KiB for _, f in st.sweep], "s--", label="ours (sfnpu layout)")
    if any(r.paper for r in st.rows):
        b.plot([KIM_SRAM_KB], [KIM_TOTAL.proposed_fm_kb], "r*", markersize=14,
               label="paper (1024 KB)")
    b.set_xlabel("buffers {0, 1, 2} (KiB)")
    b.set_ylabel("module feature-map DRAM traffic (KB)")
    b.set_yscale("symlog", linthresh=100)
    b.set_title("budget sweep")
    b.legend(fontsize=8)
    fig.suptitle(f"Module-level allocation: {st.title}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(model: str, out: Path, sram_kib: float = KIM_SRAM_KB, size: int | None = None,
                 command: str = "") -> list[Path]:
    st = study(model, sram_kib, size, out / "cache")
    out.mkdir(parents=True, exist_ok=True)
    stem = Path(model).stem.replace(".qdq", "") if model not in builders.BUILDERS else \
        f"{model}_{st.title.split(' at ')[-1].split('×')[0]}"
    md, csv_path, png = (out / f"{stem}.{ext}" for ext in ("md", "csv", "png"))
    _write_csv(st, csv_path)
    written = [csv_path]
    if _write_png(st, png):
        written.append(png)
    md.write_text(report_markdown(st, command or f"sfnpu modules {model}", png.name,
                                  csv_path.name))
    return [md, *written]
