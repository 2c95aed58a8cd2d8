"""The training-step memory-sweep model of BN fission-n-fusion (seeds/004).

A tiny Conv → BN → ReLU → Conv graph is counted by hand; DenseNet-121's totals are recomputed
from its layer list with closed-form per-layer sweep counts, independently of the pass lists.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sfnpu.studies import bn_fission as bf


def _model(nodes, inits, out_shape, in_shape=(1, 2, 4, 4), name="tiny"):
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(in_shape))],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def tiny_composite() -> onnx.ModelProto:
    """X 2x4x4 (32 values) → conv_a 1x1 → A 4x4x4 (64) → bn → B (64) → relu → R (64)
    → conv_b 3x3 pad 1 → Z 2x4x4 (32)."""
    f = np.float32
    inits = {"wa": np.zeros((4, 2, 1, 1), f), "wb": np.zeros((2, 4, 3, 3), f),
             "g": np.ones(4, f), "b": np.zeros(4, f), "m": np.zeros(4, f), "v": np.ones(4, f)}
    nodes = [
        helper.make_node("Conv", ["X", "wa"], ["A"], name="conv_a", kernel_shape=[1, 1]),
        helper.make_node("BatchNormalization", ["A", "g", "b", "m", "v"], ["B"], name="bn"),
        helper.make_node("Relu", ["B"], ["R"], name="relu"),
        helper.make_node("Conv", ["R", "wb"], ["Z"], name="conv_b", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
    ]
    return _model(nodes, inits, (1, 2, 4, 4))


N, BPE = 2, 4           # batch 2, fp32: one value per image costs 8 bytes per sweep


def test_tiny_composite_by_hand():
    net = bf.net_from_onnx(tiny_composite())
    assert [(l.name, l.op) for l in net.layers] == [
        ("conv_a", "conv"), ("bn", "bn"), ("relu", "relu"), ("conv_b", "conv")]
    assert dict(net.elements) == {"X": 32, "A": 64, "B": 64, "R": 64, "Z": 32}
    assert net.layer("conv_b").macs == 32 * 4 * 9
    steps = bf.run_steps(bf.lower_training_step(net))
    got = [bf.traffic(s, N, BPE) for s in steps]
    # Values per image summed over all sweeps (reads + writes):
    # baseline forward  conv_a R X W A 32+64 | bn mean R A 64, var R A 64, norm R A W B 128
    #                   relu R B W R 128 | conv_b R R W Z 64+32                = 576, 10 sweeps
    # baseline backward loss R Z W dZ 64 | conv_b data R dZ W dR 96, weight R R,dZ 96
    #                   relu R dR,B W dB 192 | bn param R dB,A 128, data R dB,A W dA 192
    #                   conv_a weight R X,dA 96 (no data gradient for the image) = 864, 16 sweeps
    # RCF: relu passes go (-128 fwd, -192 bwd); conv_b reads B instead of R (same size);
    #      conv_b data gradient also reads B for the mask and writes dB (+64)  → 448 + 736
    # MVF: the variance read goes (-64)                                       → 384 + 736
    # BNFF: stats into conv_a (-64); normalisation into conv_b, which reads A instead of B and
    #       also writes B (-128 +64) → 256; backward bn param (-128) and data (-192) passes go,
    #       conv_a's weight gradient reads dB and B instead of dA (+64)       → 256 + 480
    #       backward sweeps: loss 2, conv_b data 3 (dZ, B → dB), weight 2, conv_a weight 3 = 10
    # ICF: nothing more to fuse (the only BN is already fused)                → 256 + 480
    expect = [(576, 864, 10, 16), (448, 736, 8, 14), (384, 736, 7, 14), (256, 480, 5, 10),
              (256, 480, 5, 10)]
    assert [(t.bytes_fwd // (N * BPE), t.bytes_bwd // (N * BPE), t.sweeps_fwd, t.sweeps_bwd)
            for t in got] == expect
    assert got[0].bytes == 1440 * N * BPE == 11520
    assert [len(s.fused_bn) for s in steps] == [0, 0, 0, 1, 1]
    # Paper Fig. 5a: 8 forward sweeps around a BN become 3 (O1', I2', O2').
    ab = [bf.segment_sweeps(s, ("A", "B", "R")) for s in steps]
    assert ab[0][0] == 8 and ab[3][0] == 3
    # backward: 11 → 5 here (conv_a has no data gradient, unlike a DenseNet conv1: 12 → 7)
    assert (ab[0][1], ab[3][1]) == (11, 5)


def test_fused_kernels_read_what_they_need():
    steps = bf.run_steps(bf.lower_training_step(bf.net_from_onnx(tiny_composite())))
    bnff = {p.name: p for p in steps[3].passes}
    assert bnff["conv_a:conv.fwd"].writes == ("A",) and "bn.stats" in bnff[
        "conv_a:conv.fwd"].absorbed
    assert bnff["conv_b:conv.fwd"].reads == ("A",) and bnff["conv_b:conv.fwd"].writes == (
        "Z", "B")
    assert set(bnff["conv_b:conv.bwd_data"].reads) == {"d(Z)", "B"}
    assert bnff["conv_b:conv.bwd_data"].writes == ("d(B)",)
    assert set(bnff["conv_a:conv.bwd_weight"].reads) == {"X", "d(B)", "B"}
    assert not any(p.layer in ("bn", "relu") for p in steps[3].passes)


@pytest.fixture(scope="module")
def study():
    return bf.densenet121_study()


def test_steps_never_increase_traffic(study):
    t = study.traffic()
    for a, b in zip(t, t[1:]):
        assert b.bytes <= a.bytes and b.bytes_fwd <= a.bytes_fwd and b.bytes_bwd <= a.bytes_bwd
        assert b.sweeps <= a.sweeps and b.kernels <= a.kernels
    assert [len(s.fused_bn) for s in study.schedules] == [0, 0, 0, 58, 119]


def _closed_form(net: bf.Net) -> list[int]:
    """Values per image summed over sweeps, per step, from the layer list alone."""
    e = net.elements
    base = 2 * e[net.output]                                      # loss
    for l in net.layers:
        x, y = l.inputs[0], l.output
        ins = sum(e[i] for i in l.inputs)
        if l.op in ("conv", "gemm"):
            base += (e[x] + e[y]) * (3 if x != net.input else 2)  # fwd, data, weight
        elif l.op == "bn":
            base += 4 * e[x] + 5 * e[x]
        elif l.op == "relu":
            base += 2 * e[x] + 3 * e[x]
        elif l.op == "concat":
            base += 2 * (ins + e[y])
        elif l.op == "maxpool":
            base += (e[x] + e[y]) + (e[y] + 2 * e[x])
        else:                                                     # avgpool, gap
            base += 2 * (e[x] + e[y])
        k = len(net.consumers(y))
        if k > 1:
            base += (k + 1) * e[y]                                # Split backward
    relu_conv = [l for l in net.layers if l.op == "relu"
                 and [c.op for c in net.consumers(l.output)] == ["conv"]]
    rcf = base - sum(4 * e[l.inputs[0]] for l in relu_conv)
    bns = [l for l in net.layers if l.op == "bn"]
    mvf = rcf - sum(e[b.inputs[0]] for b in bns)
    fused_relu_inputs = {l.inputs[0] for l in relu_conv}
    bnff = icf = mvf
    for b in bns:
        if b.output not in fused_relu_inputs:
            continue
        prod = net.producer(b.inputs[0])
        if prod.op == "conv":        # fwd −2; bwd −5 + one re-read per ∂x reader
            readers = 2 if prod.inputs[0] != net.input else 1
            bnff -= (2 + 5 - readers) * e[b.inputs[0]]
        else:                        # concat / pool: one ∂x reader (Split or its backward)
            icf -= (2 + 5 - 1) * e[b.inputs[0]]
    icf += bnff - mvf
    return [base, rcf, mvf, bnff, icf]


def test_densenet121_totals_match_closed_form(study):
    expect = _closed_form(study.net)
    unit = study.batch * bf.BYTES_PER_ELEMENT
    assert [t.bytes for t in study.traffic()] == [v * unit for v in expect]
    assert study.reductions() == [1 - v / expect[0] for v in expect]
    # The figures of the report (batch 120, 224², fp32): baseline 171.19 GB, RCF −16.6 %,
    # RCF+MVF −21.0 %, BNFF −27.1 % (paper −19.1 %), BNFF+ICF −44.7 %.
    assert round(study.traffic()[0].bytes / 1e9, 2) == 171.19
    assert [round(r * 100, 1) for r in study.reductions()] == [0.0, 16.6, 21.0, 27.1, 44.7]


def test_densenet121_layers_from_builder(study):
    ops = [l.op for l in study.net.layers]
    assert (ops.count("conv"), ops.count("bn"), ops.count("relu"), ops.count("concat")) == (
        120, 121, 121, 58)
    # Paper Fig. 5: around an intra-composite-layer BN, forward 8 → 3 sweeps, backward −5.
    s0, s3 = study.schedules[0], study.schedules[3]
    seg = ("features.denseblock1.denselayer1.conv1", "features.denseblock1.denselayer1.norm2",
           "features.denseblock1.denselayer1.relu2")
    (f0, b0), (f3, b3) = bf.segment_sweeps(s0, seg), bf.segment_sweeps(s3, seg)
    assert (f0, f3, b0 - b3) == (8, 3, 5)


def test_concat_forms_have_equal_forward_bytes():
    from sfnpu.models import builders

    built = bf.net_from_onnx(builders.densenet121(64))
    inc, changed = bf.incremental_concat(built)
    assert changed and bf.incremental_concat(inc) == (inc, False)
    a, b = (bf.traffic(bf.lower_training_step(n), 1) for n in (built, inc))
    assert a.bytes_fwd == b.bytes_fwd


def test_unsupported_node_is_named():
    f = np.float32
    nodes = [helper.make_node("Conv", ["X", "w"], ["A"], name="conv", kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["A"], ["Z"], name="gate_sigmoid")]
    model = _model(nodes, {"w": np.zeros((2, 2, 1, 1), f)}, (1, 2, 4, 4))
    with pytest.raises(bf.BnffError, match="gate_sigmoid.*Sigmoid"):
        bf.net_from_onnx(model)


def test_bnff_requires_mean_variance_fusion():
    base = bf.lower_training_step(bf.net_from_onnx(tiny_composite()))
    with pytest.raises(bf.BnffError, match="'bn'.*mean/variance"):
        bf.bn_fission_fusion(bf.relu_conv_fusion(base)[0])


def test_checker_catches_a_broken_schedule():
    base = bf.lower_training_step(bf.net_from_onnx(tiny_composite()))
    broken = base.passes[:1] + base.passes[2:]             # drop bn.mean: fine
    bf.check_schedule(bf.Schedule(base.net, broken, base.sizes))
    no_norm = tuple(p for p in base.passes if p.kind != "bn.norm")
    with pytest.raises(bf.BnffError, match="reads 'B' before it is written"):
        bf.check_schedule(bf.Schedule(base.net, no_norm, base.sizes))


def test_cli_writes_the_report(tmp_path):
    from sfnpu.cli import main

    assert main(["bnff", "--batch", "4", "--size", "64", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "bnff.md").read_text()
    assert "-19.1 %" in md and "BNFF+ICF" in md and "roofline estimate" in md
    rows = (tmp_path / "bnff.csv").read_text().splitlines()
    assert rows[0].startswith("step,") and len(rows) == 1 + len(bf.STEPS)
