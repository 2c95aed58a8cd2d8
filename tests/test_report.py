"""`sfnpu report`: the files are written and their numbers are the memory functions' numbers
(ResNet-18 at 64×64 on kcu1500: one quantisation, 11 candidates, a few seconds)."""

import csv
import math

import onnx
import pytest

from sfnpu import cli, layout
from sfnpu.studies import shortcut_fusion as reports
from sfnpu.compiler.blocks import detect_blocks
from sfnpu.compiler.cutpoints import (LATENCY_TIE, conv_macs, cut_policies, evaluate,
                                      search)
from sfnpu.compiler.memory import Budget, Policy, allocate, dense_requirements, place
from sfnpu.studies.paper_reference import TABLE_IV, TABLE_VI
from sfnpu.compiler.pipeline import PipelineConfig, compile_model
from sfnpu.config import get_config
from sfnpu.isa import ConvKind, Eltwise, MemSpace, Reuse
from netbuild import Net

KCU = get_config("kcu1500")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert cli.main(["report", "resnet18", "--size", "64", "--out", str(out)]) == 0
    compiled = compile_model(out / "models" / "resnet18_64.qdq.onnx", KCU)
    return out, compiled, detect_blocks(compiled.graph, compiled.groups)


@pytest.fixture(scope="module")
def network(report):
    """ResNet-18 as written: the program runs its 7×7 stem as a 4×1 convolution over the
    rows' taps of the host's SpaceToDepth of the image, but its GOP, weights and
    everything-once total are the network's."""
    out, compiled, _ = report
    assert compiled.rewrites == ("space_to_depth", "space_to_depth_on_host", "fold_input_taps")
    plain = compile_model(out / "models" / "resnet18_64.qdq.onnx", KCU,
                          PipelineConfig(space_to_depth=False, fold_input_taps=False))
    assert len(plain.program.instructions) == len(compiled.program.instructions)
    assert plain.program.instructions[0].in_c == 3 and compiled.program.instructions[0].in_c == 48
    return plain, detect_blocks(plain.graph, plain.groups)


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_files_are_written(report):
    out, _, _ = report
    for name in ("resnet18_64.md", "resnet18_64.csv", "resnet18_64.png", "summary.md",
                 "table_ii.csv", "table_iv.csv"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "resnet18_64.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "resnet18_64.md").read_text()
    for needed in ("Table II", "## Deviations from the paper", reports.LATENCY_SOURCE,
                   "ASSUMPTION", "resnet18_64.png"):
        assert needed in md, needed


def test_sweep_csv_equals_the_memory_functions(report):
    out, compiled, blocks = report
    rows = read_csv(out / "resnet18_64.csv")
    assert tuple(rows[0]) == reports.SWEEP_FIELDS
    policies = list(cut_policies(blocks))
    assert [r["policy"] for r in rows] == [p.label for p in policies]
    budget = Budget.of(KCU)
    for row, policy in zip(rows, policies):
        e = evaluate(compiled, blocks, policy, Budget.unlimited())
        q, t = e.requirements, e.traffic
        want = {"sram_B": q.sram, "sram_hardware_B": q.hardware_sram,
                "buffer0_B": q.buffers[0], "buffer1_B": q.buffers[1],
                "buffer2_B": q.buffers[2], "row_buff_B": q.row_buff, "psum_buff_B": q.out_buff,
                "write_buff_B": q.write_buff, "weight_buff_B": q.weight_buff,
                "bram18k": q.bram18k, "sram_algorithm1_B": q.sram_algorithm1,
                "sram_dense_B": e.dense.sram, "dram_fm_B": t.fm, "dram_weights_B": t.weights,
                "dram_params_B": t.params, "dram_total_B": t.total,
                "dram_fm_dense_B": t.fm_dense, "dram_weights_dense_B": t.weights_dense,
                "eq8_fm_dense_B": t.eq8_fm_dense,
                "latency_cycles": round(e.latency),
                "fits_config": int(not budget.violations(q)),
                "frame_blocks": policy.frame_blocks}
        assert {k: int(row[k]) for k in want} == want, policy.label
        # The dense column is eqs. 1–6 on the placed program.
        alloc = allocate(compiled.graph, compiled.groups, compiled.program, blocks, policy)
        placed = place(compiled.program, compiled.groups, alloc)
        assert int(row["sram_dense_B"]) == dense_requirements(placed, KCU).sram


def test_dense_traffic_counts_c_h_w_bytes(report):
    """All row reuse: every feature map in DRAM (the pooled classifier vector may stay on
    chip), so the dense bytes are the sum of C·H·W of every DRAM input, output and shortcut —
    the image, which the host hands over as the rows' taps of its SpaceToDepth (4 × 12
    channels at half the side), counted as 48 channels."""
    out, compiled, blocks = report
    row = next(r for r in read_csv(out / "resnet18_64.csv") if "all row reuse" in r["note"])
    policy = next(p for p in cut_policies(blocks) if p.label == row["policy"])
    alloc = allocate(compiled.graph, compiled.groups, compiled.program, blocks, policy)
    dense = 0
    for i in place(compiled.program, compiled.groups, alloc):
        assert i.reuse == Reuse.ROW
        if i.input.space == MemSpace.DRAM:
            dense += i.in_c * i.in_h * i.in_w
        if i.output.space == MemSpace.DRAM:
            dense += i.out_c * i.out_h * i.out_w
        else:
            assert (i.out_h, i.out_w) == (1, 1)
        if i.eltwise == Eltwise.ADD:       # before pooling (the last block fuses its GAP)
            dense += i.out_c * math.prod(layout.conv_output_hw(i))
    assert int(row["dram_fm_dense_B"]) == dense
    first = compiled.program.instructions[0]
    assert first.in_c == 48 and first.conv == ConvKind.NORMAL
    assert int(row["dram_fm_B"]) - dense >= (64 - 48) * first.in_h * first.in_w


def fastest(candidates):
    """The latency objective: the least DRAM traffic among the candidates whose latency is
    within LATENCY_TIE of the fastest."""
    best = min(e.latency for e in candidates)
    return min((e for e in candidates if e.latency <= best * (1 + LATENCY_TIE)),
               key=lambda e: (e.traffic.total, e.latency, e.sram))


def test_layer_wise_once_counts_the_onnx_conv_layers(report, network):
    """The reconstructed everything-once total, from the network's compiled groups, equals the
    same count over the ONNX graph's Conv, Add and Gemm nodes (shape inference, dense
    bytes)."""
    out, _, _ = report
    compiled, blocks = network
    model = onnx.shape_inference.infer_shapes(onnx.load(out / "models" / "resnet18_64.qdq.onnx"))
    g = model.graph
    shape = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
             for v in (*g.value_info, *g.input, *g.output)}
    init = {i.name: tuple(i.dims) for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}

    def weight(name):
        while name not in init:                 # through DequantizeLinear to the tensor
            name = producer[name].input[0]
        return math.prod(init[name])

    conv_io = sum(math.prod(shape[n.input[0]]) + math.prod(shape[n.output[0]])
                  for n in g.node if n.op_type == "Conv")
    shortcuts = sum(math.prod(shape[n.output[0]]) for n in g.node if n.op_type == "Add")
    weights = sum(weight(n.input[1]) for n in g.node if n.op_type == "Conv")
    classifier = sum(weight(n.input[1]) for n in g.node if n.op_type == "Gemm")
    assert classifier == 512 * 1000
    assert reports.LayerWiseOnce.of(compiled, blocks) == \
        reports.LayerWiseOnce(conv_io, shortcuts, weights, classifier)


def test_summary_tables_equal_the_searches(report, network):
    out, compiled, blocks = report
    plain, plain_blocks = network
    (ii,) = read_csv(out / "table_ii.csv")
    sweep = search(compiled, Budget.unlimited(), objective="sram", blocks=blocks)
    assert (ii["network"], int(ii["sram_B"]), ii["policy"]) == \
        ("resnet18_64", sweep.best.sram, sweep.best.policy.label)
    assert int(ii["sram_dense_B"]) == min(e.dense.sram for e in sweep.feasible)
    iv = {(r["budget"], r["objective"]): r for r in read_csv(out / "table_iv.csv")}
    assert set(iv) == {(b, o) for b in ("config", "bram") for o in ("latency", "dram")}
    budgeted = search(compiled, Budget.of(KCU), blocks=blocks)
    least = min(budgeted.feasible, key=lambda e: (e.traffic.total, e.latency, e.sram))
    # The search's objective (eq. 10): the least traffic among the fastest, up to LATENCY_TIE.
    assert budgeted.best == fastest(budgeted.feasible)
    # Everything once: the network's all-row policy's maps and parameters, every weight
    # tensor once — which is all it reads: the unlimited sweep sizes the weight store by eq. 2,
    # so no layer (layer4's 2.4 MB, past kcu1500's 1.5 MiB store) streams its weights.
    all_row = evaluate(plain, plain_blocks, Policy.uniform(plain_blocks, Reuse.ROW),
                       Budget.unlimited())
    weights = {i.weights.offset: layout.weight_bytes(i, KCU)
               for i in plain.program.instructions if i.conv != ConvKind.NONE}
    assert max(weights.values()) > KCU.buffer_bytes[1]
    once = all_row.traffic.fm + all_row.traffic.params + sum(weights.values())
    assert all_row.traffic.total == once
    # The program's own all-row run moves fewer bytes than the network's: the host hands over
    # the image as the rows' taps of its SpaceToDepth, 48 of the 64 lanes at a quarter of the
    # pixels, where the network's 3-channel image takes a 64-lane word per pixel.
    program_row = next(e for e in sweep.evaluations if set(e.policy.modes) == {Reuse.ROW})
    assert program_row.traffic.fm < all_row.traffic.fm
    macs = sum(conv_macs(i) for i in plain.program.instructions)
    for objective, chosen in (("latency", budgeted.best), ("dram", least)):
        row = iv[("config", objective)]
        assert (row["policy"], int(row["fm_B"]), int(row["offchip_total_B"]),
                int(row["total_once_B"])) == (chosen.policy.label, chosen.traffic.fm,
                                              chosen.traffic.total, once)
        assert float(row["reduction"]) == round(1 - chosen.traffic.total / once, 4)
        # Latency, GOPS and MAC efficiency: the cycle model's, for that policy's program.
        seconds = chosen.latency / (KCU.clock_mhz * 1e6)
        assert float(row["latency"]) == round(seconds * 1e3, 3)
        assert float(row["gops"]) == round(2 * macs / 1e9 / seconds, 1)
        assert float(row["mac_efficiency"]) == round(macs / (chosen.latency * KCU.macs), 4)
        assert 0 < float(row["mac_efficiency"]) <= 1
    # Per-network buffers: the sweep's candidates within the BRAM18K limit of eq. 10 (no
    # Table IV entry for this network: the whole device).
    bram = [e for e in sweep.feasible if e.requirements.bram18k <= Budget.of(KCU).bram18k]
    assert iv[("bram", "latency")]["policy"] == fastest(bram).policy.label
    assert iv[("bram", "dram")]["policy"] == \
        min(bram, key=lambda e: (e.traffic.total, e.latency, e.sram)).policy.label


def test_onnx_file_on_a_config_nothing_fits(tmp_path):
    """A model file works too; a budget no policy fits is reported, not raised."""
    n = Net((8, 32, 32), name="plain")
    # The middle layer fits neither mode on tiny (64 KiB buffers): 73,728 B of weights in row
    # reuse, a 128×32×32 output (128 KiB) in frame reuse.
    y = n.op("Relu", [n.conv(n.op("Relu", [n.conv("x", 8, 64, 3)]), 64, 128, 3)])
    onnx.save(n.model([n.conv(y, 128, 16, 1)]), str(tmp_path / "plain.onnx"))
    (result,) = reports.run_report(reports.resolve_studies([str(tmp_path / "plain.onnx")]),
                                   "tiny", tmp_path / "out")
    assert result.budgeted is None and "fits the budget of 'tiny'" in result.budget_error
    md = (tmp_path / "out" / "plain.md").read_text()
    assert "no policy fits" in md and "fits in neither mode" in md
    rows = read_csv(tmp_path / "out" / "plain.csv")
    assert len(rows) == len(result.sweep.evaluations) == 4
    assert {r["fits_config"] for r in rows} == {"0"}


def test_unknown_model_is_a_user_error(tmp_path, capsys):
    assert cli.main(["report", "no_such_net", "--out", str(tmp_path)]) == 2
    assert "not a file, a builder" in capsys.readouterr().out


def test_studies_resolve_to_the_paper_networks():
    assert reports.resolve_studies([]) == list(reports.PAPER_STUDIES)
    assert [s.key for s in reports.resolve_studies(["resnet50"])] == \
        ["resnet50_224", "resnet50_256"]
    vgg = reports.resolve_studies(["vgg16_conv"])
    assert [s.key for s in vgg] == ["vgg16_conv_224"] and vgg[0].table_ii.min_buffer_mb == 0.712
    (b1,) = reports.resolve_studies(["efficientnet_b1"], size=768)
    assert b1.table_vi.offchip_fm_mb == 344 and b1.table_iv is None
    assert reports.resolve_studies(["mobilenet_v2"])[0].input_size == 224


def test_paper_rows_flag_their_own_inconsistencies():
    """Table IV/VI's reduction implies the weights once the feature maps are paid: ≈ the model
    size for ResNet-50, negative or zero for YOLOv3, RetinaNet and EfficientNet-B1 at 768."""
    implied = {(p.network, p.input_size, p.source): p.implied_weights_mb
               for p in (*TABLE_IV, *TABLE_VI)}
    assert implied[("resnet50", 256, "Table IV")] == pytest.approx(23.08, abs=0.01)
    assert implied[("yolov3", 416, "Table IV")] < 0
    assert abs(implied[("retinanet", 512, "Table IV")]) < 0.5
    assert abs(implied[("efficientnet_b1", 768, "Table VI")]) < 0.5


def test_stem_taps_note_counts_the_image_instead(report):
    """The summary's note on the stem's taps: ResNet-18 reads the rows' taps of its image's
    SpaceToDepth (48 channels at 32×32), and its reduction with the image counted instead
    is the reduction of the same policy on the program compiled without the taps."""
    out, _, _ = report
    result = reports.run_study(reports.resolve_studies(["resnet18"], 64)[0], KCU,
                               out / "models")
    e = result.policy("config", "latency")
    note = reports._input_taps_note(result, e)
    assert "stem's taps (48×32×32" in note
    unfolded = compile_model(out / "models" / "resnet18_64.qdq.onnx", KCU,
                             PipelineConfig(fold_input_taps=False))
    same = evaluate(unfolded, detect_blocks(unfolded.graph, unfolded.groups), e.policy,
                    Budget.of(KCU))
    assert same.traffic.fm_dense < e.traffic.fm_dense
    reduction = 1 - (same.traffic.fm_dense + same.traffic.weights_dense) / result.once[1]
    assert f"the reduction would be {reduction:.2%}" in note


def test_reduction_ceiling_is_reached_with_every_map_on_chip(report):
    """The ceiling counts the network's input and outputs off chip, every weight once, and
    nothing else: on ResNet-18 as written, the unlimited sweep's all-frame policy moves exactly
    those feature-map bytes and reaches it, and no policy exceeds it."""
    out, _, _ = report
    result = reports.run_study(reports.resolve_studies(["resnet18"], 64)[0], KCU,
                               out / "models")
    base = result.network
    assert base.unavoidable_fm_dense == 3 * 64 * 64 + 1000
    weights = result.weights_once[1]
    ceiling = reports.reduction_ceiling(result, weights / reports.MB)
    sweep = search(base.compiled, Budget.unlimited(), objective="dram", blocks=base.blocks)
    reductions = {e.policy.label: 1 - (e.traffic.fm_dense + e.traffic.weights_dense)
                  / result.once[1] for e in sweep.feasible}
    assert max(reductions.values()) == pytest.approx(ceiling, abs=1e-12)
    best = min(sweep.feasible, key=lambda e: e.traffic.fm_dense)
    assert best.traffic.fm_dense == base.unavoidable_fm_dense
    assert best.traffic.weights_dense == weights
    assert best.policy.label == "L=0" and len(reductions) > 2


def test_summary_sets_the_rtl_beside_the_papers_resources(report):
    """The hardware section's figures are ``sfnpu.resources``'s estimate of the kcu1500 RTL,
    its part's budget and the paper's builds (ResNet-18 is not in the paper's tables: all of
    them are listed)."""
    from sfnpu import resources
    from sfnpu.config import DEVICES

    out, _, _ = report
    md = (out / "summary.md").read_text()
    section = md.split("## Hardware: the RTL of this configuration beside the paper's design")[1]
    need = resources.estimate(KCU)
    assert (f"| sfnpu `kcu1500` RTL, 4096 MACs (estimate) | {need.multipliers:,} | "
            f"{need.bram18k:,} | {need.luts:,} LUT6 | — |") in section
    part = DEVICES["XCKU115"]
    assert f"| the part, XCKU115 | {part.multipliers:,} | {part.bram18k:,} | {part.luts:,} |" \
        in section
    assert "an extrapolation for 4096" in section
    for p in TABLE_IV + TABLE_VI:
        assert f"| paper, {p.label} @ {p.input_size} ({p.source}) | {p.dsps:,} | " \
               f"{p.bram18k:,} | {p.luts_k * 1000:,.0f} | {p.ffs_k} |" in section
    for short in resources.shortfalls(need, part):
        assert short in section
    for name, count in resources.memories(KCU).items():
        assert f"| {name} | {count:,} |" in section


def test_hardware_section_of_a_configuration_without_a_part():
    """``tiny`` names no part, and its LUT4s are not set against the paper's LUT6s."""
    from types import SimpleNamespace

    tiny = SimpleNamespace(config=get_config("tiny"),
                           study=SimpleNamespace(network="resnet50", input_size=256))
    text = "\n".join(reports._hardware_lines([tiny]))
    assert "The configuration names no part." in text and "not comparable" in text
    assert "| the part," not in text and "× the LUTs" not in text
    assert "| paper, ResNet50 @ 256 (Table IV) |" in text and "ResNet152" not in text
