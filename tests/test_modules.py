"""Module-level on-chip allocation (Kim et al.): detection, branch re-ordering, the placement
checker against deliberately broken placements, golden-model and RTL runs of an Inception-style
network placed by the pass, and the Inception-V3 figures beside the paper's Table 1."""

import dataclasses
import re
from types import SimpleNamespace

import numpy as np
import pytest

from netbuild import Net
from sfnpu import isa
from sfnpu.cli import main
from sfnpu.compiler.modules import (LOADED_SUFFIX, ModuleError, check_placement,
                                    detect_modules, module_group_indices, plan_modules,
                                    traffic_by_group)
from sfnpu.compiler.pipeline import PipelineConfig, compile_model
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.config import get_config
from sfnpu.isa import MemSpace, Reuse
from sfnpu.sim.golden import GoldenModel

TINY = get_config("tiny")


def inception_net():
    """A stem conv, an Inception-A-style module (1×1; 1×1 → 3×3; 1×1 → 3×3 → 3×3; 3×3 average
    pool → 1×1; concat at channel offsets 0, 16, 32, 56), a reduction module (3×3 stride 2;
    max pool stride 2) and a 1×1 head. Every concat part starts on an 8-channel block."""
    net = Net((8, 12, 12), seed=21, name="inception_style")

    def cr(x, cin, cout, k, stride=1):
        return net.op("Relu", [net.conv(x, cin, cout, k, stride=stride,
                                        pads=[k // 2] * 4 if stride == 1 else [0] * 4)])

    s = cr("x", 8, 32, 3)
    b1 = cr(s, 32, 16, 1)
    b2 = cr(cr(s, 32, 8, 1), 8, 16, 3)
    b3 = cr(cr(cr(s, 32, 16, 1), 16, 24, 3), 24, 24, 3)
    p = net.op("AveragePool", [s], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
               count_include_pad=1)
    b4 = cr(p, 32, 8, 1)
    a = net.op("Concat", [b1, b2, b3, b4], axis=1)                     # 64 channels
    r1 = cr(a, 64, 32, 3, stride=2)
    r2 = net.op("MaxPool", [a], kernel_shape=[3, 3], strides=[2, 2])
    r = net.op("Concat", [r1, r2], axis=1)                              # 96 channels, 5×5
    return net, [net.conv(r, 96, 16, 1, pads=[0, 0, 0, 0])]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    net, outputs = inception_net()
    path = tmp_path_factory.mktemp("modules") / "inception_style.qdq.onnx"
    quantize_model(net.model(outputs, opset=14), path, CalibrationSource.synthetic(4, seed=1))
    return net, path, compile_model(path, TINY)


@pytest.fixture(scope="module")
def plan(compiled):
    _, _, c = compiled
    return plan_modules(c.graph, c.groups, TINY)


def golden_outputs(program, compiled_model, net, config):
    blob = program.pack(compiled_model.quantise_inputs({"x": net.samples(1, seed=5)}))
    return GoldenModel(config).outputs(blob), blob


# --------------------------------------------------------------------------------------------
# Detection and re-ordering
# --------------------------------------------------------------------------------------------

def test_detects_both_modules(compiled):
    _, _, c = compiled
    mods = detect_modules(c.graph, c.groups, TINY.lanes)
    assert len(mods) == 2 and not mods.rejected
    a, r = mods
    assert [len(b.groups) for b in a.branches] == [1, 2, 3, 2]     # in compiled order
    assert len(r.branches) == 2 and a.exit == r.entry
    assert c.graph.tensors[a.exit].shape == (64, 12, 12)
    # The stem's result is the first module's input; the head reads the second's output.
    stem = c.groups[0]
    assert a.entry == stem.output and stem.index not in mods.module_of


def test_long_skip_is_not_a_module(tmp_path):
    """A concat joining a map from far back (a long skip-connection) forms no module when the
    branches meet more than max_groups groups back; the short module inside is still found."""
    net = Net((8, 8, 8), seed=3, name="long_skip")
    x = net.op("Relu", [net.conv("x", 8, 8, 3)])
    y = x
    for _ in range(5):
        y = net.op("Relu", [net.conv(y, 8, 8, 3)])
    out = net.conv(net.op("Concat", [x, y], axis=1), 16, 8, 1, pads=[0] * 4)
    path = tmp_path / "skip.qdq.onnx"
    quantize_model(net.model([out], opset=14), path, CalibrationSource.synthetic(2))
    c = compile_model(path, TINY)
    mods = detect_modules(c.graph, c.groups, TINY.lanes, max_groups=3)
    assert len(mods) == 0 and "long skip-connection" in mods.rejected[0]
    assert len(detect_modules(c.graph, c.groups, TINY.lanes)) == 1


def test_branches_run_one_after_another_largest_first(plan):
    for m in plan.modules:
        assert m.groups == tuple(range(m.first, m.last + 1))       # contiguous
        order = [b for b in sorted(m.branches, key=lambda b: b.groups[0])]
        assert [b.required for b in order] == sorted((b.required for b in order), reverse=True)
        for b in order:                                          # one branch at a time
            assert b.groups == tuple(range(b.groups[0], b.groups[-1] + 1))
    # The first module's input comes from the stem (DRAM): one loader copies it on chip.
    first = plan.modules[0]
    assert first.entry.endswith(LOADED_SUFFIX)
    loader = plan.groups[first.first - 1]
    assert loader.nodes == () and loader.output == first.entry


# --------------------------------------------------------------------------------------------
# Placement, golden model
# --------------------------------------------------------------------------------------------

def test_placement_runs_like_the_all_dram_program(compiled, plan):
    net, _, c = compiled
    assert [d.processing for d in plan.allocation.decisions] == ["I", "I"]
    a, r = plan.modules
    loc = plan.program.locations
    assert loc[a.exit].space != MemSpace.DRAM and loc[a.entry].space != MemSpace.DRAM
    assert loc[r.exit].space != MemSpace.DRAM           # forwarded to the head, on chip
    want, _ = golden_outputs(c.program, c, net, TINY)
    got, _ = golden_outputs(plan.program, c, net, TINY)
    assert len(want) == len(got) and all(np.array_equal(w, g) for w, g in zip(want, got))
    # Inside the modules only the loader touches DRAM: one read of the stem's 32×12×12 map.
    per = traffic_by_group(plan.program.instructions, TINY)
    inside = [i for m in plan.modules for i in module_group_indices(plan.groups, m)]
    assert sum(per[i].total for i in inside) == 32 * 12 * 12
    assert sum(per[i].reads + per[i].writes for i in inside) == 1
    naive = traffic_by_group(c.program.instructions, TINY)
    assert sum(naive[i].reads for m in plan.naive_modules for i in m.groups) == \
        sum(len(m.groups) for m in plan.naive_modules)
    assert all(plan.program.instructions[i].reuse == Reuse.FRAME for i in inside)


@pytest.mark.parametrize("buffer_kib", [None, 4])
def test_pipeline_switch_places_the_modules(compiled, buffer_kib):
    """The pipeline's ``modules`` step: compiling with the switch on gives the pass's
    placement (also with smaller buffers), and the program computes what the all-DRAM one
    computes, bit for bit."""
    net, path, c = compiled
    capacity = None if buffer_kib is None else (buffer_kib * 1024,) * 3
    switched = compile_model(path, TINY, PipelineConfig(modules=True, module_capacity=capacity))
    steps = ("import", "passes", "split_shared_wide_convs", "fold_input_taps", "space_to_depth",
             "space_to_depth_on_host", "fold_row_taps", "lane_blocks", "fuse", "generate")
    assert c.pipeline.steps == steps
    assert switched.pipeline.steps == steps + ("modules",)
    assert [record.name for record in switched.steps] == list(steps + ("modules",))
    assert [record.changed for record in switched.steps][-3:] == [True, True, True]
    p = plan_modules(c.graph, c.groups, TINY, capacity)
    assert switched.program.instructions == p.program.instructions
    assert [g.name for g in switched.groups] == [g.name for g in p.groups]
    assert switched.program.instructions != c.program.instructions
    assert any(loc.space != MemSpace.DRAM for loc in switched.program.locations.values())
    want, _ = golden_outputs(c.program, c, net, TINY)
    got, _ = golden_outputs(switched.program, switched, net, TINY)
    assert len(want) == len(got) and all(np.array_equal(w, g) for w, g in zip(want, got))


@pytest.mark.parametrize("buffer_kib", [4, 7])
def test_small_buffers_spill_and_still_match(compiled, buffer_kib):
    """Buffers too small for everything: processing II and spilled intermediates (the paper's
    reduction-a case) — the program still computes the same outputs."""
    net, _, c = compiled
    config = TINY.replace(name=f"tiny-{buffer_kib}k", buffer_bytes=(buffer_kib * 1024,) * 3)
    p = plan_modules(c.graph, c.groups, config)
    ds = p.allocation.decisions
    assert any(d.processing == "II" or d.spilled for d in ds) or not all(d.mifm_on_chip
                                                                          for d in ds)
    want, _ = golden_outputs(c.program, c, net, TINY)
    got, _ = golden_outputs(p.program, c, net, config)
    assert all(np.array_equal(w, g) for w, g in zip(want, got))
    per = traffic_by_group(p.program.instructions, config)
    inside = [i for m in p.modules for i in module_group_indices(p.groups, m)]
    assert sum(per[i].total for i in inside) > 32 * 12 * 12


# --------------------------------------------------------------------------------------------
# The checker refutes broken placements
# --------------------------------------------------------------------------------------------

def _moved(instrs, group, role, loc):
    out = list(instrs)
    out[group] = out[group].replace(**{role: loc})
    return out


def _intermediate(plan):
    """A member group writing an on-chip map that is not the module output, and its readers."""
    m = plan.modules[0]
    for i in m.groups:
        t = plan.groups[i].written
        if t != m.exit and plan.program.locations[t].space != MemSpace.DRAM:
            readers = [g.index for g in plan.groups if t in (g.input, g.shortcut)]
            return m, i, t, readers
    raise AssertionError("no on-chip intermediate")


def test_checker_accepts_the_plan(plan):
    report = check_placement(plan.graph, plan.groups, plan.program.instructions, TINY)
    assert report.on_chip_tensors >= 8 and report.on_chip_reads >= 10


def test_checker_refutes_overwriting_a_live_map(plan):
    m, i, t, readers = _intermediate(plan)
    mifm = plan.program.locations[m.entry]                   # live for the whole module
    instrs = _moved(plan.program.instructions, i, "output", mifm)
    for r in readers:
        instrs = _moved(instrs, r, "input", mifm)
    with pytest.raises(ModuleError, match=f"overwrites '{m.entry}'"):
        check_placement(plan.graph, plan.groups, instrs, TINY)


def test_checker_refutes_reading_from_the_wrong_place(plan):
    _, i, t, readers = _intermediate(plan)
    loc = plan.program.locations[t]
    wrong = isa.Location(offset=loc.offset + TINY.lanes, space=loc.space)
    instrs = _moved(plan.program.instructions, readers[0], "input", wrong)
    with pytest.raises(ModuleError, match="was written to"):
        check_placement(plan.graph, plan.groups, instrs, TINY)


def test_checker_refutes_reading_a_concat_before_all_parts(plan):
    """The module output's first reader moved in front of the last part's writer: the part's
    bytes still hold a branch's working map (or nothing)."""
    m = plan.modules[0]
    reader = next(g.index for g in plan.groups if g.input == m.exit)
    last_part = m.last
    groups = list(plan.groups)
    instrs = list(plan.program.instructions)
    for seq in (groups, instrs):
        seq.insert(last_part, seq.pop(reader))
    groups = [dataclasses.replace(g, index=k) for k, g in enumerate(groups)]
    with pytest.raises(ModuleError, match=f"reads '{m.exit}' .* but the bytes from"):
        check_placement(plan.graph, groups, instrs, TINY)


def test_checker_refutes_overflow_and_outputs_on_chip(plan):
    _, i, t, readers = _intermediate(plan)
    loc = plan.program.locations[t]
    near_end = isa.Location(offset=TINY.buffer_bytes[0] - TINY.lanes, space=loc.space)
    instrs = _moved(plan.program.instructions, i, "output", near_end)
    with pytest.raises(ModuleError, match="exceeds buffer"):
        check_placement(plan.graph, plan.groups, instrs, TINY)
    last = len(plan.groups) - 1
    instrs = _moved(plan.program.instructions, last, "output", isa.buffer(2, 0))
    with pytest.raises(ModuleError, match="network output"):
        check_placement(plan.graph, plan.groups, instrs, TINY)


def test_checker_refutes_row_reuse_on_chip(plan):
    _, i, _, _ = _intermediate(plan)
    instrs = list(plan.program.instructions)
    instrs[i] = instrs[i].replace(reuse=Reuse.ROW)
    with pytest.raises(ModuleError, match="row reuse streams"):
        check_placement(plan.graph, plan.groups, instrs, TINY)


# --------------------------------------------------------------------------------------------
# Inception-V3 at 299 beside the paper's Table 1
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def inception_v3():
    from sfnpu.studies.networks import study_model
    from sfnpu.studies.module_allocation import npu_config
    from sfnpu.tb.verilator import REPO_ROOT

    config = npu_config(1024 * 1024)
    cache = REPO_ROOT / "build" / "modules" / "cache"       # shared with `sfnpu modules`
    cache.mkdir(parents=True, exist_ok=True)
    path = study_model(SimpleNamespace(network="inception_v3", input_size=299, conv_only=False),
                       cache)
    return config, compile_model(path, config)


def test_inception_v3_against_table_1(inception_v3):
    from sfnpu.studies.paper_reference import KIM_TABLE_1, KIM_TOTAL

    config, c = inception_v3
    naive = traffic_by_group(c.program.instructions, config)
    mods = detect_modules(c.graph, c.groups, config.lanes)
    assert len(mods) == 11 and [len(m.branches) for m in mods] == [4, 4, 4, 3, 4, 4, 4, 4, 3,
                                                                    4, 4]
    for m, row in zip(mods, KIM_TABLE_1):
        assert m.name == row.module
        # Weights read once: exactly the paper's column.
        assert sum(naive[i].weights_dense for i in m.groups) == row.weights_kb * 1024
        # Naive feature maps in the paper's NPU accounting: exactly its column where our
        # groups are its layers (the others add requantising copies).
        if len(m.groups) == row.naive_reads:
            assert sum(naive[i].read_patch + naive[i].written_patch for i in m.groups) == \
                row.naive_fm_kb * 1024
    fm = {}
    for kib in (1024, 3 * 352800 / 1024):
        each = int(kib * 1024) // 3 // config.lanes * config.lanes
        p = plan_modules(c.graph, c.groups, config, capacity=(each,) * 3)
        per = traffic_by_group(p.program.instructions, config)
        idx = [i for m in p.modules for i in module_group_indices(p.groups, m)]
        fm[kib] = (sum(per[i].read_patch + per[i].written_patch for i in idx),
                   sum(per[i].reads + per[i].writes for i in idx))
    # Three buffers of 344.5 KiB hold every module map: only the stem's output is loaded
    # once (192×36×36 in the paper's accounting), below the paper's 600 KB and 4 transfers.
    assert fm[3 * 352800 / 1024] == (192 * 36 * 36, 1)
    assert fm[3 * 352800 / 1024][0] <= KIM_TOTAL.proposed_fm_kb * 1024
    # With exactly 1024 KiB the 288-channel 35×35 maps (344.5 KiB) exceed a 341.3 KiB buffer.
    assert fm[1024][0] > KIM_TOTAL.proposed_fm_kb * 1024


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def test_cli_writes_the_report(compiled, tmp_path, capsys):
    _, path, _ = compiled
    assert main(["modules", str(path), "--sram-kb", "192", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "inception_style.md").read_text()
    assert "| **total** |" in md and "Budget sweep" in md
    assert (tmp_path / "inception_style.csv").read_text().count("\n") == 3
    assert main(["modules", str(path), "--sram-kb", "0", "--out", str(tmp_path)]) == 2
    assert "--sram-kb 0.0: must be positive" in capsys.readouterr().out
    assert main(["modules", "no_such_net", "--out", str(tmp_path)]) == 2
    assert "neither a builder" in capsys.readouterr().out


def test_cli_run_with_modules_matches_onnxruntime(compiled, tmp_path):
    """`sfnpu run --modules` (the pipeline's switch): the placed program's outputs are
    onnxruntime's; `sfnpu compile --modules` reports the step."""
    net, path, _ = compiled
    assert main(["compile", str(path), "--modules", "-o", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    steps = re.search(r"pipeline steps: (.*)", report).group(1)
    assert re.findall(r"(\w+) \(\d+\.\d\d s", steps) == list(PipelineConfig(modules=True).steps)
    assert any(f"| BUF{k}+" in report for k in range(3))     # a module map on chip
    np.save(tmp_path / "x.npy", net.samples(1, seed=9))
    for backend, extra in (("onnxruntime", []), ("golden", ["--modules"])):
        assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--backend",
                     backend, *extra, "-o", str(tmp_path / f"{backend}.npy")]) == 0
    assert np.array_equal(np.load(tmp_path / "onnxruntime.npy"),
                          np.load(tmp_path / "golden.npy"))


# --------------------------------------------------------------------------------------------
# RTL
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_system():
    from sfnpu.tb.system import SYSTEM_BUILDS, SystemHarness

    return SystemHarness(TINY, SYSTEM_BUILDS / "tiny")


@pytest.mark.parametrize("buffer_kib", [None, 4])
def test_module_placement_on_the_rtl(compiled, tiny_system, buffer_kib):
    """The placed Inception-style network on the Verilated accelerator (tiny, 64 KiB buffers):
    the whole DRAM is identical to the golden model's after the same image. With the allocation
    limited to 4 KiB per buffer the modules spill and write their outputs to DRAM (processing
    II), which the RTL runs the same way."""
    net, _, c = compiled
    capacity = None if buffer_kib is None else (buffer_kib * 1024,) * 3
    p = plan_modules(c.graph, c.groups, TINY, capacity)
    if buffer_kib is not None:
        assert any(d.processing == "II" or d.spilled for d in p.allocation.decisions)
    _, blob = golden_outputs(p.program, c, net, TINY)
    result = tiny_system.run(blob, max_cycles=2_000_000)
    assert not result.timeout and result.done and not result.error, result.error_code
    golden = bytes(GoldenModel(TINY).run(blob).dram)
    differ = np.flatnonzero(np.frombuffer(result.dram[:len(golden)], np.uint8)
                            != np.frombuffer(golden, np.uint8))
    assert differ.size == 0, f"{differ.size} DRAM bytes differ, first at {differ[:8]}"
    # The hardware writes exactly the feature maps the placement leaves in DRAM.
    per = traffic_by_group(p.program.instructions, TINY)
    assert result.counters["DRAM_WRITE_BYTES"] == sum(g.written for g in per)
    naive = traffic_by_group(c.program.instructions, TINY)
    assert sum(g.written for g in per) < sum(g.written for g in naive)
