"""Dataflow restructuring (seeds/002): liveness, explore with α, spatial split with halos, and
bit-exact equivalence of the branches with the original sub-graph on the golden model."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from sfnpu.compiler import restructure as rs
from sfnpu.compiler.importer import import_model
from sfnpu.compiler.passes import run_passes
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.studies.restructuring_check import check_on_golden
from netbuild import Net

REGRESS = os.environ.get("SFNPU_REGRESS") == "1"


def ir_graph(tmp_path, net, outputs, name):
    path = tmp_path / f"{name}.onnx"
    quantize_model(net.model(outputs), path, CalibrationSource.arrays(net.samples(8)))
    graph, _ = run_passes(import_model(path).graph)
    return graph


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Stencils of several sizes and strides, a residual add, a channel concat (with its
    requantisation tables), a 2× upsample and a global pool that ends every split."""
    n = Net((3, 20, 24), name="mixed")
    a = n.op("Relu", [n.conv("x", 3, 8, 3)])
    b = n.op("Relu", [n.conv(a, 8, 8, 3)])
    s = n.op("Add", [a, b])
    p = n.op("MaxPool", [s], kernel_shape=[2, 2], strides=[2, 2])
    c = n.op("Relu", [n.conv(p, 8, 16, 3, stride=2)])
    u = n.op("Resize", [c, "", n.const(np.array([1, 1, 2, 2]))], mode="nearest")
    d = n.op("Relu", [n.conv(p, 8, 6, 5)])
    cat = n.op("Concat", [u, d], axis=1)
    e = n.conv(cat, 22, 8, 1)
    out = n.op("GlobalAveragePool", [n.op("Relu", [e])])
    return ir_graph(tmp_path_factory.mktemp("mixed"), n, [out], "mixed")


def test_liveness_by_hand():
    # x(4) → A(10) → B(6) → C(2), and C also reads x: x lives until C.
    steps = [(("x",), ("A",)), (("A",), ("B",)), (("B", "x"), ("C",))]
    sizes = dict(x=4, A=10, B=6, C=2)
    assert rs.liveness(steps, sizes, ["x"], ["C"]) == [14, 20, 12]
    with pytest.raises(rs.RestructureError, match="reads 'y'"):
        rs.liveness([(("y",), ("A",))], dict(y=1, A=1), ["x"], ["A"])


def test_profile_of_a_graph_is_the_liveness_of_its_node_order(mixed):
    prof = rs.memory_profile(mixed)
    assert len(prof.memory) == len(mixed.nodes)
    size = {t: int(np.prod(v.shape)) for t, v in mixed.tensors.items()}
    # the first node reads the input and writes its output; nothing else is alive yet
    first = mixed.nodes[0]
    assert prof.memory[0] == size[first.inputs[0]] + size[first.output]
    assert prof.peak == max(prof.memory) and prof.memory[prof.peak_step] == prof.peak


def test_explore_grows_as_alpha_falls(mixed):
    sets = [rs.explore(mixed, a) for a in (0.9, 0.6, 0.3, 0.1)]
    assert all(s for s in sets)
    assert all(x <= y for x, y in zip(sets, sets[1:]))
    assert len(sets[-1]) > len(sets[0])
    crit = rs.memory_profile(mixed).memory
    peak = max(crit)
    assert {k for k in sets[0] if crit[k] == peak}       # seeded at the peak
    assert all(mixed.nodes[k].op != "globalavgpool" for k in sets[-1])
    with pytest.raises(rs.RestructureError, match="alpha 0"):
        rs.explore(mixed, 0)


@pytest.mark.parametrize("alpha,n_slices", [(0.9, (2, 2)), (0.5, (3, 2)), (0.3, (2, 4)),
                                            (0.1, (4, 3)), (0.1, (3, 3))])
def test_split_is_bit_exact_on_the_golden_model(mixed, alpha, n_slices):
    r = rs.restructure(mixed, alpha, n_slices, hardware=True)
    assert r is not None and len(r.blocks[0].branches) == n_slices[0] * n_slices[1]
    eq = check_on_golden(r, seed=3)
    assert eq.identical, eq.mismatches
    assert eq.values == sum(int(np.prod(mixed.tensors[t].shape)) for t in r.blocks[0].joins)


def test_a_wrong_halo_fails_the_check(mixed):
    critical = rs.explore(mixed, 0.1, hardware=True)
    good = rs.split(mixed, critical, (2, 2))
    bad = rs.split(mixed, critical, (2, 2), halo_error=1)
    assert check_on_golden(good).identical
    eq = check_on_golden(bad)
    assert not eq.identical and sum(eq.mismatches.values()) > 0


def test_halos_cost_operations_and_one_slice_costs_none(mixed):
    critical = rs.explore(mixed, 0.1)
    one = rs.split(mixed, critical, (1, 1))
    assert one.ops_after == one.ops_before == rs.graph_ops(mixed)
    assert one.peak_after == one.peak_before      # one branch is the original schedule
    many = rs.split(mixed, critical, (4, 4))
    assert many.ops_after > many.ops_before
    # every copy of a 3×3 stride-1 convolution reads one halo row/column beyond its region
    conv = next(sn for b in many.blocks[0].branches for sn in b
                if sn.node.op == "conv" and sn.node.consts["weight"].shape[2] == 3
                and sn.node.attrs["stride"] == (1, 1) and sn.region.r0 > 0)
    assert conv.inputs[0].r0 == conv.region.r0 - 1
    assert conv.pads[0] == 0


def test_splitting_lowers_the_peak(mixed):
    r = rs.restructure(mixed, 0.3, (2, 2))
    assert r.peak_after < r.peak_before and 0 < r.saving < 1
    # the peak step's forks and joins stay whole: a lone add saves nothing
    add = rs.split(mixed, [k for k, n in enumerate(mixed.nodes) if n.op == "add"], (2, 2))
    assert add.peak_after == add.peak_before
    assert len(r.after) >= len(mixed.nodes)


def test_bad_requests_name_the_problem(mixed):
    gap = next(k for k, n in enumerate(mixed.nodes) if n.op == "globalavgpool")
    with pytest.raises(rs.RestructureError, match="cannot be split"):
        rs.split(mixed, {gap}, (2, 2))
    with pytest.raises(rs.RestructureError, match="n_slices"):
        rs.split(mixed, rs.explore(mixed, 0.5), (0, 2))
    with pytest.raises(rs.RestructureError, match="empty critical set"):
        rs.split(mixed, set(), (2, 2))


def _builder_graph(name, size, tmp_path):
    from sfnpu.studies.networks import study_model
    path = study_model(SimpleNamespace(network=name, input_size=size, conv_only=False),
                       tmp_path)
    graph, _ = run_passes(import_model(path).graph)
    return graph


NETWORKS = [("squeezenet1_1", 64), ("mobilenet_v2", 64)] + (
    [("inception_v3", 107), ("vgg16", 32), ("resnet18", 64)] if REGRESS else [])


@pytest.mark.parametrize("name,size", NETWORKS)
def test_paper_networks_are_bit_exact_on_the_golden_model(name, size, tmp_path):
    graph = _builder_graph(name, size, tmp_path)
    done = 0
    for alpha, n in [(0.5, (2, 2)), (0.2, (3, 4))]:
        r = rs.restructure(graph, alpha, n, hardware=True)
        if r is None:
            continue
        eq = check_on_golden(r)
        assert eq.identical, (name, alpha, n, eq.mismatches)
        done += 1
    assert done


def test_report_command_writes_the_tables(tmp_path):
    from sfnpu.cli import main
    assert main(["restructure", "squeezenet1_1", "--size", "64", "--no-sram",
                 "--out", str(tmp_path)]) == 0
    md = (tmp_path / "restructure.md").read_text()
    assert "## Table II" in md and "## Table III" in md and "48.4 / 3.1" in md
    assert "squeezenet1_1, `accelerator`" in md and "bit-exact" in md and "MISMATCH" not in md
    rows = (tmp_path / "restructure.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * 81
    assert main(["restructure", "no_such_net", "--out", str(tmp_path)]) == 2


# --------------------------------------------------------------------------------------------
# Spatial splitting for the memory optimizer (pieces)
# --------------------------------------------------------------------------------------------

def _random_inputs(graph, seed=5):
    rng = np.random.default_rng(seed)
    out = {}
    for t in graph.inputs:
        lo, hi = graph.tensors[t].qtype.range
        out[t] = rng.integers(lo, hi + 1, graph.tensors[t].shape).astype(
            graph.tensors[t].qtype.dtype)
    return out


@pytest.mark.parametrize("upto_from_end,n_slices", [(1, (2, 2)), (3, (3, 2)), (2, (1, 1))])
def test_pieces_run_the_network_bit_exact(mixed, upto_from_end, n_slices):
    from sfnpu.studies.restructuring_check import run_pieces, run_program
    from sfnpu.studies.restructuring_sram import _front_ends, front_split, piece_graphs
    ends = _front_ends(mixed)
    r = front_split(mixed, ends[-upto_from_end], n_slices)
    pieces = piece_graphs(r)
    tiles = [p for p in pieces if p.name.startswith("tile")]
    assert len({p.name.rstrip("'") for p in tiles}) == n_slices[0] * n_slices[1]
    x = _random_inputs(mixed)
    want = run_program(mixed, x)
    got = run_pieces(mixed, pieces, x)
    assert all((want[t] == got[t]).all() for t in mixed.outputs)
    if n_slices != (1, 1):     # and a wrong halo shows in the network's output
        bad = piece_graphs(rs.split(mixed, range(ends[-upto_from_end] + 1), n_slices,
                                    halo_error=1))
        got = run_pieces(mixed, bad, x)
        assert not all((want[t] == got[t]).all() for t in mixed.outputs)


def test_a_residual_read_cuts_the_tile_into_two_pieces(mixed):
    from sfnpu.studies.restructuring_sram import front_split, piece_graphs
    add = next(k for k, n in enumerate(mixed.nodes) if n.op == "add")
    pieces = piece_graphs(front_split(mixed, add, (2, 2)))
    # the add reads its identity input without the halo the second conv needed: a window of a
    # map the tile computed larger, so the tile continues in a second piece
    assert [p.name for p in pieces][:2] == ["tile 0", "tile 0'"]
    assert pieces[-1].name == "network"


def test_front_split_sram_uses_the_optimizer(mixed):
    from sfnpu.studies.restructuring_sram import Piece, evaluate_pieces, front_split, \
        piece_graphs
    from sfnpu.config import get_config
    cfg = get_config("kcu1500")
    whole = evaluate_pieces([Piece("network", mixed, {}, {})], cfg)
    split = evaluate_pieces(piece_graphs(front_split(mixed, 3, (2, 2))), cfg)
    assert whole.sram > 0 and split.sram > 0 and len(split.per_piece) >= 5
    assert split.sram == max(row[1] for row in split.per_piece)
    with pytest.raises(rs.RestructureError, match="cannot be split on the accelerator"):
        front_split(mixed, len(mixed.nodes) - 1, (2, 2))


def test_sram_table_of_a_front_sweep(mixed):
    from sfnpu.studies.restructuring import sram_markdown
    from sfnpu.studies.restructuring_sram import sweep_front_graph
    f = sweep_front_graph(mixed, "mixed", 20, slices=((1, 1), (2, 2)))
    assert {n for _, n, _ in f.points} == {(1, 1), (2, 2)}
    assert all(r.sram > 0 and r.traffic > 0 for _, _, r in f.points)
    text = "\n".join(sram_markdown([f]))
    assert "| mixed@20 | — |" in text and "2h×2w" in text


def test_paper_mode_pools_with_one_sided_padding_are_still_exact(tmp_path):
    """A padded max-pool split in 2-D needs padding on some sides only (no instruction encodes
    it); the check computes those copies with sfnpu.numeric and stays bit-exact."""
    from sfnpu.studies.restructuring_check import encodable
    n = Net((3, 16, 20), name="padpool")
    c = n.op("Relu", [n.conv("x", 3, 8, 3)])
    p = n.op("MaxPool", [c], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    a = n.op("AveragePool", [p], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
             count_include_pad=1)
    y = n.conv(a, 8, 4, 3)
    graph = ir_graph(tmp_path, n, [y], "padpool")
    r = rs.split(graph, range(len(graph.nodes)), (2, 2))
    assert not encodable(r)
    assert check_on_golden(r).identical
    assert not check_on_golden(rs.split(graph, range(len(graph.nodes)), (2, 2),
                                        halo_error=1)).identical


# One program: windows read and tiles written in place
# --------------------------------------------------------------------------------------------

def _one_program_outputs(r, config, x, policy=None):
    from sfnpu.sim.golden import GoldenModel
    from sfnpu.studies.restructuring_sram import one_program
    compiled = one_program(r, config)
    program = compiled.program if policy is None else _with_policy(compiled, policy)
    blob = program.pack([x[t] for t in program.inputs])
    return compiled, blob, dict(zip(program.outputs, GoldenModel(config).outputs(blob)))


def _with_policy(compiled, reuse):
    from sfnpu.compiler.blocks import detect_blocks
    from sfnpu.compiler.memory import Policy, apply_policy
    blocks = detect_blocks(compiled.graph, compiled.groups)
    return apply_policy(compiled, Policy.uniform(blocks, reuse), blocks)


@pytest.mark.parametrize("upto_from_end,n_slices", [(1, (2, 2)), (2, (3, 2)), (3, (2, 2)),
                                                    (4, (1, 3)), (5, (2, 2))])
def test_one_program_runs_the_network_bit_exact(mixed, upto_from_end, n_slices):
    """The split front as one program: every copy a group of its own, every window of a fork
    read in place and every tile written into its join (windowed instructions) — the network's
    output equals the unsplit program's; a wrong halo changes it."""
    from sfnpu.config import get_config
    from sfnpu.studies.restructuring_check import run_program
    from sfnpu.studies.restructuring_sram import _front_ends, front_split
    cfg = get_config("tiny")
    upto = _front_ends(mixed)[-upto_from_end]
    r = front_split(mixed, upto, n_slices)
    x = _random_inputs(mixed)
    want = run_program(mixed, x)
    compiled, _, got = _one_program_outputs(r, cfg, x)
    assert all((want[t] == got[t]).all() for t in mixed.outputs)
    ops = [n.op for n in compiled.graph.nodes]
    assert ops.count("stitch") == len(r.blocks[0].joins)
    branches = n_slices[0] * n_slices[1]
    assert sum(n.op == "conv" and n.name.endswith("@0") for n in compiled.graph.nodes) == \
        sum(mixed.nodes[k].op == "conv" for k in range(upto + 1))
    windowed = [g for g, i in zip(compiled.groups, compiled.program.instructions) if i.windowed]
    assert len(windowed) >= branches and all(g.part for g in windowed)
    bad = rs.split(mixed, range(upto + 1), n_slices, halo_error=1)
    if branches > 1 and any(mixed.nodes[k].op == "conv" for k in range(upto + 1)):
        _, _, got = _one_program_outputs(bad, cfg, x)
        assert not all((want[t] == got[t]).all() for t in mixed.outputs)


def test_one_program_graph_names_its_views(mixed):
    from sfnpu.compiler.ir import spatial_views
    from sfnpu.studies.restructuring_sram import front_split
    add = next(k for k, n in enumerate(mixed.nodes) if n.op == "add")
    g = rs.one_graph(front_split(mixed, add, (2, 2)))
    views = spatial_views(g)
    # each branch reads its window of the input, and its add the identity map's window of
    # the first copy's larger map
    assert sum(source == mixed.inputs[0] for source, _, _ in views.values()) == 4
    assert sum(source.endswith("@1") for source, _, _ in views.values()) == 1
    stitch = next(n for n in g.nodes if n.op == "stitch")
    assert sorted(stitch.attrs["origins"]) == [(0, 0), (0, 12), (10, 0), (10, 12)]


@pytest.fixture(scope="module")
def harness_tiny():
    from test_system import system_harness
    return system_harness("tiny")


@pytest.mark.parametrize("reuse", ["ROW", "FRAME"])
def test_one_program_on_the_rtl(mixed, harness_tiny, reuse):
    """The split front of ``mixed`` (residual, pool, upsample, concat in every branch) on the
    tiny RTL: DRAM identical to the golden model's, every group's cycles the cycle model's —
    with every map in DRAM, and with the copies' own maps on chip where frame reuse puts
    them."""
    from sfnpu.isa import Reuse
    from sfnpu.studies.restructuring_check import run_program
    from sfnpu.studies.restructuring_sram import _front_ends, front_split
    from sfnpu.tb.system import Scoreboard
    r = front_split(mixed, _front_ends(mixed)[-2], (2, 2))
    x = _random_inputs(mixed)
    _, blob, got = _one_program_outputs(r, harness_tiny.config, x, Reuse[reuse])
    want = run_program(mixed, x)
    assert all((want[t] == got[t]).all() for t in mixed.outputs)
    problems = Scoreboard(harness_tiny.config).problems(blob, harness_tiny.run(blob))
    assert not problems, problems


def _paper_front(tmp_path, network, size, last):
    """The builder network's first layers, up to the tensor ``last``, as IR."""
    import onnx
    from sfnpu.models import builders
    model = onnx.shape_inference.infer_shapes(builders.build(network, size))
    model = onnx.utils.Extractor(model).extract_model(["input"], [last])
    path = tmp_path / f"{network}_{size}.qdq.onnx"
    quantize_model(model, path, CalibrationSource.synthetic(1))
    graph, _ = run_passes(import_model(path).graph)
    return graph


@pytest.mark.parametrize("network,size,last", [("vgg16", 32, "features.9"),
                                               ("yolov2", 64, "layer7.maxpool")])
def test_paper_front_as_one_program_on_the_rtl(tmp_path, harness_tiny, network, size, last):
    """VGG-16's and YOLOv2's first blocks split into 2×2 tiles up to the last layer before
    the pool, as one program on the tiny RTL: bit-exact with the unsplit network and with the
    golden model, cycle-exact with the cycle model."""
    from sfnpu.studies.restructuring_check import run_program
    from sfnpu.studies.restructuring_sram import _front_ends, front_split
    from sfnpu.tb.system import Scoreboard
    graph = _paper_front(tmp_path, network, size, last)
    r = front_split(graph, _front_ends(graph)[-2], (2, 2))
    x = _random_inputs(graph)
    compiled, blob, got = _one_program_outputs(r, harness_tiny.config, x)
    want = run_program(graph, x)
    assert all((want[t] == got[t]).all() for t in graph.outputs)
    assert sum(i.windowed for i in compiled.program.instructions) >= 8
    problems = Scoreboard(harness_tiny.config).problems(
        blob, harness_tiny.run(blob, max_cycles=5_000_000))
    assert not problems, problems


@pytest.mark.skipif(not REGRESS, reason="paper-size fronts run in `make regress`")
@pytest.mark.parametrize("network,size,conv_only,configs", [
    ("vgg16", 224, True, ("ecp5", "kcu1500")),
    # YOLOv2's 3×3 convolutions over 1024 channels need input-channel splits on ecp5
    ("yolov2", 416, False, ("kcu1500",))])
def test_paper_size_fronts_compile_and_run_as_one_program(tmp_path, network, size, conv_only,
                                                          configs):
    """Table II's networks at the paper's sizes, the front split 2×2 (tiled further where a
    tile still exceeds a store): one program for tiny and ``configs``, identical on the golden
    model to the unsplit network."""
    from sfnpu.config import get_config
    from sfnpu.studies.networks import study_model
    from sfnpu.studies.restructuring_check import run_program
    from sfnpu.studies.restructuring_sram import _front_ends, front_split, one_program
    path = study_model(SimpleNamespace(network=network, input_size=size, conv_only=conv_only),
                       tmp_path)
    graph, _ = run_passes(import_model(path).graph)
    ends = _front_ends(graph)
    r = front_split(graph, ends[len(ends) // 2], (2, 2))
    for name in configs:
        assert one_program(r, get_config(name)).program.instructions
    x = _random_inputs(graph)
    cfg = get_config("tiny")
    _, _, got = _one_program_outputs(r, cfg, x)
    want = run_program(graph, x, cfg)
    assert all((want[t] == got[t]).all() for t in graph.outputs)
