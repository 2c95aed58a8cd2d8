"""The numeric contract (sfnpu.numeric) against onnxruntime on QDQ models.

Every function is compared with onnxruntime's CPU execution (default session options unless a
test says otherwise) of small QDQ models built with onnx.helper: random data over several seeds,
random scales and zero points, uint8 and int8, plus engineered rounding ties. Where a test
states an identical share below 100 % the reason is given (onnxruntime computes that node in
float32 with an accumulation order the contract does not model).
"""

from __future__ import annotations

import itertools
import os
import tempfile
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from sfnpu import numeric as N

F32 = np.float32
DISABLE_ALL = ort.GraphOptimizationLevel.ORT_DISABLE_ALL


# -- model helpers --------------------------------------------------------------------------------

def _qt(signed):
    return TensorProto.INT8 if signed else TensorProto.UINT8


def _np(signed):
    return np.int8 if signed else np.uint8


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "t", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _session(model, level=None, dump=None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if level is not None:
        so.graph_optimization_level = level
    if dump is not None:
        so.optimized_model_filepath = dump
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(model, feeds, level=None):
    return _session(model, level).run(None, feeds)[0]


def _optypes(model, level=None):
    fd, path = tempfile.mkstemp(suffix=".onnx")
    os.close(fd)
    try:
        _session(model, level, dump=path)
        return [n.op_type for n in onnx.load(path).graph.node]
    finally:
        os.remove(path)


def _dq(src, dst, prefix, scale, zp, signed, inits, axis=None):
    inits += [_init(f"{prefix}_s", np.asarray(scale, F32)),
              _init(f"{prefix}_z", np.asarray(zp, _np(signed)))]
    kw = {} if axis is None else {"axis": axis}
    return helper.make_node("DequantizeLinear", [src, f"{prefix}_s", f"{prefix}_z"], [dst], **kw)


def _q(src, dst, prefix, scale, zp, signed, inits):
    inits += [_init(f"{prefix}_s", F32(scale)), _init(f"{prefix}_z", _np(signed)(zp))]
    return helper.make_node("QuantizeLinear", [src, f"{prefix}_s", f"{prefix}_z"], [dst])


def _unary_model(op_nodes, inits, shape, xs, xz, ys, yz, signed, y_signed=None, opset=17):
    """DQ(x) → op_nodes ("xf" → "yf") → Q."""
    y_signed = signed if y_signed is None else y_signed
    inits = list(inits)
    nodes = [_dq("x", "xf", "x", xs, xz, signed, inits), *op_nodes,
             _q("yf", "y", "y", ys, yz, y_signed, inits)]
    return _model(nodes, [helper.make_tensor_value_info("x", _qt(signed), list(shape))],
                  [helper.make_tensor_value_info("y", _qt(y_signed), None)], inits, opset)


def _binary_model(op, sha, shb, sa, za, sb, zb, sy, zy, signed):
    inits = []
    nodes = [_dq("a", "af", "a", sa, za, signed, inits), _dq("b", "bf", "b", sb, zb, signed, inits),
             helper.make_node(op, ["af", "bf"], ["yf"]), _q("yf", "y", "y", sy, zy, signed, inits)]
    return _model(nodes, [helper.make_tensor_value_info("a", _qt(signed), list(sha)),
                          helper.make_tensor_value_info("b", _qt(signed), list(shb))],
                  [helper.make_tensor_value_info("y", _qt(signed), None)], inits)


def _conv_model(xshape, w, bias, xs, xz, ws, wz, ys, yz, signed, stride, pads, group):
    inits = [_init("w", w), _init("ws", np.asarray(ws, F32)), _init("wz", np.asarray(wz, np.int8))]
    nodes = [_dq("x", "xf", "x", xs, xz, signed, inits),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0)]
    ins = ["xf", "wf"]
    if bias is not None:
        bs = (F32(xs) * np.asarray(ws, F32)).astype(F32)
        inits += [_init("b", bias), _init("bs", bs), _init("bz", np.zeros(bs.shape, np.int32))]
        nodes.append(helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"], axis=0))
        ins.append("bf")
    nodes.append(helper.make_node("Conv", ins, ["yf"], strides=list(stride), pads=list(pads),
                                  group=group, kernel_shape=list(w.shape[2:])))
    nodes.append(_q("yf", "y", "y", ys, yz, signed, inits))
    return _model(nodes, [helper.make_tensor_value_info("x", _qt(signed), list(xshape))],
                  [helper.make_tensor_value_info("y", _qt(signed), None)], inits)


def _codes(signed):
    return np.arange(256, dtype=np.uint8).view(_np(signed))


def _rand_scale(rng, lo=-6.0, hi=0.0):
    return F32(np.exp(rng.uniform(lo, hi)))


def _rand_zp(rng, signed):
    lo, hi = N.qrange(signed)
    return int(rng.integers(lo, hi + 1))


def _rand_codes(rng, shape, signed):
    lo, hi = N.qrange(signed)
    return rng.integers(lo, hi + 1, shape).astype(_np(signed))


class Tally:
    """Counts identical outputs over a test; asserts at the end."""

    def __init__(self):
        self.same = 0
        self.total = 0
        self.max_diff = 0

    def add(self, ours, ref):
        ours = np.asarray(ours, np.int64)
        ref = np.asarray(ref, np.int64)
        assert ours.shape == ref.shape, (ours.shape, ref.shape)
        self.same += int((ours == ref).sum())
        self.total += ref.size
        if ref.size:
            self.max_diff = max(self.max_diff, int(np.abs(ours - ref).max()))

    @property
    def share(self):
        return self.same / self.total

    def assert_exact(self):
        assert self.total > 0
        assert self.same == self.total, f"{self.total - self.same} of {self.total} differ " \
                                        f"(max {self.max_diff})"


# -- float32 fused multiply-add -------------------------------------------------------------------

def _round_f32_exact(fr: Fraction) -> F32:
    """Correctly rounded (half to even) float32 of a rational."""
    guess = F32(float(fr))
    cands = {guess, np.nextafter(guess, F32(np.inf)), np.nextafter(guess, F32(-np.inf))}
    best = min(cands, key=lambda v: (abs(Fraction(float(v)) - fr),
                                     int(np.asarray(v, F32).view(np.uint32)) & 1))
    return F32(best)


def test_fma_f32_is_correctly_rounded():
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.integers(-255, 256, 600).astype(F32),
                        (rng.standard_normal(600) * 2.0 ** rng.integers(-20, 20, 600)).astype(F32)])
    b = (rng.standard_normal(1200) * 2.0 ** rng.integers(-20, 5, 1200)).astype(F32)
    c = (rng.standard_normal(1200) * 2.0 ** rng.integers(-10, 25, 1200)).astype(F32)
    # halfway cases where rounding the float64 sum would be a double rounding:
    # p = (1 + 2^-23)·2^-24·(1 ∓ 2^-23) = 2^-24 ∓ 2^-70 (exact product, 72 bits)
    one_p = F32(1 + 2.0 ** -23)
    a = np.r_[a, one_p, -one_p]
    b = np.r_[b, F32(2.0 ** -24 * (1 - 2.0 ** -23)), F32(2.0 ** -24 * (1 - 2.0 ** -23))]
    c = np.r_[c, one_p, one_p]
    got = N.fma_f32(a, b, c)
    naive = (a.astype(np.float64) * b + c).astype(F32)
    for i in range(a.size):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        ref = _round_f32_exact(exact)
        assert got[i] == ref, (i, a[i], b[i], c[i], got[i], ref)
    assert got[-2] != naive[-2] and got[-1] != naive[-1]   # the crafted cases need the fix


# -- convolution ----------------------------------------------------------------------------------

def _conv_case(rng, signed, c, o, hw, k, stride, pad, depthwise, *, tie=False, wz_random=False,
               per_channel=True, bias=True):
    if depthwise:
        o = c
    w = rng.integers(-128, 128, (o, 1 if depthwise else c, k, k)).astype(np.int8)
    xs, xz = _rand_scale(rng, -5, -1), _rand_zp(rng, signed)
    ws = np.exp(rng.uniform(-8, -4, o)).astype(F32) if per_channel else \
        np.full(o, _rand_scale(rng, -8, -4), F32)
    ys, yz = _rand_scale(rng, -3, 0), _rand_zp(rng, signed)
    if tie:  # multiplier exactly 1/2: every odd accumulator is a rounding tie
        xs, ws, ys = F32(2.0 ** -6), np.full(o, 2.0 ** -7, F32), F32(2.0 ** -12)
    wz = rng.integers(-8, 8, o).astype(np.int8) if wz_random else np.zeros(o, np.int8)
    if wz_random and not per_channel:
        wz = np.full(o, wz[0], np.int8)
    b = rng.integers(-20000, 20000, o).astype(np.int32) if bias else None
    x = _rand_codes(rng, (1, c) + tuple(hw), signed)
    pads = (pad,) * 4
    model = _conv_model(x.shape, w, b, xs, xz, ws if per_channel else ws[:1],
                        wz if per_channel else wz[:1], ys, yz, signed, (stride, stride), pads,
                        c if depthwise else 1)
    return model, x, w, b, xs, xz, ws, wz, ys, yz, pads


def test_conv_uint8_matches_qlinearconv():
    """uint8 activations: QLinearConv (U8S8), exact including the AVX2 pair saturation."""
    sat = N.ort_u8s8_saturates()
    rng = np.random.default_rng(1)
    tally = Tally()
    fused = set()
    configs = list(itertools.product([1, 2], [False, True], [1, 3, 5, 7], [1, 2], [0, 1]))
    for rep, depthwise, k, stride, padmode in configs:
        pad = k // 2 if padmode else 0
        for tie in (False, True):
            model, x, w, b, xs, xz, ws, wz, ys, yz, pads = _conv_case(
                rng, False, 16 if depthwise else 3 + 3 * rep, 8, (9, 11), k, stride, pad,
                depthwise, tie=tie, wz_random=padmode == 1 and not tie, per_channel=rep == 1)
            fused.update(_optypes(model))
            y = _run(model, {"x": x})[0]
            acc = N.conv_accumulate(x[0], xz, w, wz, b, (stride, stride), pads, depthwise,
                                    u8s8_pair_saturation=sat)
            tally.add(N.requantize(acc, N.requant_multiplier(xs, ws, ys), yz, 0, 255), y)
    assert "QLinearConv" in fused
    tally.assert_exact()


@pytest.mark.parametrize("c,o,k,hw,stride", [(64, 32, 3, 14, 1), (3, 32, 7, 32, 2),
                                             (256, 64, 1, 14, 1), (5, 16, 3, 12, 2)])
def test_conv_uint8_realistic_layers(c, o, k, hw, stride):
    """Realistic weight statistics (per-channel max 127): here the pair saturation matters."""
    sat = N.ort_u8s8_saturates()
    rng = np.random.default_rng(c * 100 + k)
    wf = rng.standard_normal((o, c, k, k))
    w = np.round(wf / np.abs(wf).reshape(o, -1).max(1).reshape(o, 1, 1, 1) * 127).astype(np.int8)
    xs, xz = F32(0.02), int(rng.integers(0, 100))
    ws = np.exp(rng.uniform(-8, -5, o)).astype(F32)
    wz = np.zeros(o, np.int8)
    x = np.clip(np.round(rng.normal(xz + 60, 60, (1, c, hw, hw))), 0, 255).astype(np.uint8)
    b = rng.integers(-3000, 3000, o).astype(np.int32)
    pads = (k // 2,) * 4
    exact = N.conv_accumulate(x[0], xz, w, wz, b, (stride, stride), pads)
    spread = float(np.std(exact * N.requant_multiplier(xs, ws, F32(1))[:, None, None]))
    ys, yz = F32(spread / 40), 128
    model = _conv_model(x.shape, w, b, xs, xz, ws, wz, ys, yz, False, (stride, stride), pads, 1)
    y = _run(model, {"x": x})[0]
    acc = N.conv_accumulate(x[0], xz, w, wz, b, (stride, stride), pads,
                            u8s8_pair_saturation=sat)
    mult = N.requant_multiplier(xs, ws, ys)
    tally = Tally()
    tally.add(N.requantize(acc, mult, yz, 0, 255), y)
    tally.assert_exact()
    if sat:  # without the emulation the contract would be wrong on this machine
        assert (acc != exact).any()


def test_conv_int8_runs_in_float():
    """int8 activations: onnxruntime on x86 does not fuse QDQ Conv (QDQIsInt8Allowed() is false)
    and computes DQ → float Conv → Q. The integer contract then matches all but a few outputs
    near a rounding boundary (float32 accumulation error), by at most 1."""
    rng = np.random.default_rng(2)
    tally = Tally()
    kinds = set()
    for c, o, k, hw, depthwise in [(64, 64, 3, 28, False), (256, 64, 1, 28, False),
                                   (96, 96, 3, 28, True), (3, 32, 3, 48, False),
                                   (8, 12, 5, 9, False), (16, 16, 7, 9, True),
                                   (128, 128, 3, 14, False)]:
        if depthwise:
            o = c
        wf = rng.standard_normal((o, 1 if depthwise else c, k, k))
        w = np.round(wf / np.abs(wf).reshape(o, -1).max(1).reshape(o, 1, 1, 1) * 127)
        w = w.astype(np.int8)
        xs, xz = _rand_scale(rng, -5, -2), int(rng.integers(-128, 0))
        ws = np.exp(rng.uniform(-8, -5, o)).astype(F32)
        x = np.clip(np.round(rng.normal(xz + 30, 40, (1, c, hw, hw))), -128, 127).astype(np.int8)
        b = rng.integers(-3000, 3000, o).astype(np.int32)
        pads = (k // 2,) * 4
        acc = N.conv_accumulate(x[0], xz, w, 0, b, (1, 1), pads, depthwise)
        spread = float(np.std(acc * N.requant_multiplier(xs, ws, F32(1))[:, None, None]))
        ys, yz = F32(spread / 40), int(rng.integers(-20, 20))
        model = _conv_model(x.shape, w, b, xs, xz, ws, np.zeros(o, np.int8), ys, yz, True, (1, 1),
                            pads, c if depthwise else 1)
        kinds.update(_optypes(model))
        y = _run(model, {"x": x})[0]
        tally.add(N.requantize(acc, N.requant_multiplier(xs, ws, ys), yz, -128, 127), y)
    assert "Conv" in kinds and "QLinearConv" not in kinds
    assert tally.total > 270_000
    assert tally.share >= 0.9999, (tally.share, tally.total - tally.same)
    assert tally.max_diff <= 1


# -- Gemm / MatMul --------------------------------------------------------------------------------

def _gemm_model(m, k, n, xs, xz, ws, wz, ys, yz, signed, rng, *, op, bias, trans_b):
    w = rng.integers(-128, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    inits = [_init("w", w), _init("ws", np.asarray(ws, F32)), _init("wz", np.asarray(wz, np.int8))]
    nodes = [_dq("x", "xf", "x", xs, xz, signed, inits),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"],
                              axis=0 if trans_b else 1)]
    ins = ["xf", "wf"]
    b = None
    if bias:
        b = rng.integers(-5000, 5000, n).astype(np.int32)
        bs = (F32(xs) * np.asarray(ws, F32)).astype(F32)
        inits += [_init("b", b), _init("bs", bs), _init("bz", np.zeros(bs.shape, np.int32))]
        nodes.append(helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"], axis=0))
        ins.append("bf")
    if op == "Gemm":
        nodes.append(helper.make_node("Gemm", ins, ["yf"], transB=int(trans_b)))
    else:
        nodes.append(helper.make_node("MatMul", ins[:2], ["mf" if bias else "yf"]))
        if bias:
            nodes.append(helper.make_node("Add", ["mf", "bf"], ["yf"]))
    nodes.append(_q("yf", "y", "y", ys, yz, signed, inits))
    model = _model(nodes, [helper.make_tensor_value_info("x", _qt(signed), [m, k])],
                   [helper.make_tensor_value_info("y", _qt(signed), None)], inits)
    return model, (w if trans_b else w.T), b


def test_gemm_matches_qgemm_and_qlinearmatmul():
    """QGemm (Gemm, MatMul + bias) for uint8 and int8, QLinearMatMul (uint8 MatMul): the conv
    arithmetic over a 1×1 'image' of M pixels, U8S8 pair saturation included."""
    sat = N.ort_u8s8_saturates()
    rng = np.random.default_rng(3)
    tally = Tally()
    kinds = set()
    for signed, (op, trans_b), per_channel, bias, tie in itertools.product(
            [False, True], [("Gemm", True), ("Gemm", False), ("MatMul", False)],
            [False, True], [False, True], [False, True]):
        if signed and op == "MatMul" and not bias:
            continue  # not fused for int8: see test_matmul_int8_without_bias_runs_in_float
        m, k, n = 64, 77, 20
        lo, hi = N.qrange(signed)
        ws = np.exp(rng.uniform(-8, -4, n)).astype(F32) if per_channel else _rand_scale(rng, -8, -4)
        xs, xz = _rand_scale(rng, -5, -2), _rand_zp(rng, signed)
        ys, yz = _rand_scale(rng, -2, 0), _rand_zp(rng, signed)
        if tie:
            xs, ys = F32(2.0 ** -6), F32(2.0 ** -12)
            ws = np.full(n, 2.0 ** -7, F32) if per_channel else F32(2.0 ** -7)
        wz = np.zeros(n, np.int8) if per_channel else np.int8(0)
        model, w, b = _gemm_model(m, k, n, xs, xz, ws, wz, ys, yz, signed, rng, op=op, bias=bias,
                                  trans_b=trans_b)
        kinds.update(_optypes(model))
        x = _rand_codes(rng, (m, k), signed)
        y = _run(model, {"x": x})
        acc = N.gemm_accumulate(x, xz, w, wz, b, u8s8_pair_saturation=sat and not signed)
        mult = N.requant_multiplier(xs, np.broadcast_to(np.asarray(ws, F32), (n,)), ys)
        tally.add(N.requantize(acc, mult, yz, lo, hi, channel_axis=1), y)
    assert {"QGemm", "QLinearMatMul"} <= kinds
    tally.assert_exact()


def test_matmul_int8_without_bias_runs_in_float():
    """int8 MatMul without a bias Add stays DQ → float MatMul → Q on x86 (not fused)."""
    rng = np.random.default_rng(4)
    tally = Tally()
    for k in (64, 512, 2048):
        m, n = 64, 64
        xs, xz = _rand_scale(rng, -5, -2), _rand_zp(rng, True)
        ws = np.exp(rng.uniform(-8, -5, n)).astype(F32)
        model, w, _ = _gemm_model(m, k, n, xs, xz, ws, np.zeros(n, np.int8), F32(1), 0, True,
                                  rng, op="MatMul", bias=False, trans_b=False)
        assert "QLinearMatMul" not in _optypes(model) and "QGemm" not in _optypes(model)
        x = _rand_codes(rng, (m, k), True)
        acc = N.gemm_accumulate(x, xz, w, 0, None)
        mult0 = N.requant_multiplier(xs, ws, F32(1))
        ys = F32(np.std(acc * mult0) / 40)
        model, w2, _ = _gemm_model(m, k, n, xs, xz, ws, np.zeros(n, np.int8), ys, 3, True,
                                   np.random.default_rng(rng.integers(1 << 30)), op="MatMul",
                                   bias=False, trans_b=False)
        acc = N.gemm_accumulate(x, xz, w2, 0, None)
        y = _run(model, {"x": x})
        tally.add(N.requantize(acc, N.requant_multiplier(xs, ws, ys), 3, -128, 127,
                               channel_axis=1), y)
    assert tally.share >= 0.999, tally.share
    assert tally.max_diff <= 1


def test_requantize_at_rounding_boundaries():
    """Accumulators engineered next to every rounding boundary (QGemm with K = 1, w = 1, so
    acc = x − x_zp + bias): float32(acc)·M must be formed exactly as the contract says (the
    multiplier float32(float32(x_s·w_s)/y_s), one float32 product, half to even)."""
    rng = np.random.default_rng(20)
    tally = Tally()
    variants_wrong = 0
    for it in range(8):
        signed = bool(it % 2)
        lo, hi = N.qrange(signed)
        n = 64
        xs, xz = _rand_scale(rng, -3, 0), _rand_zp(rng, signed)
        ws = np.exp(rng.uniform(-12, -8, n)).astype(F32)
        ys, yz = _rand_scale(rng, -2, 0), 0
        mult = N.requant_multiplier(xs, ws, ys)
        # bias so that acc·M sweeps the boundaries k + 1/2 near the top of the output range
        k = rng.integers(10, 100, n)
        centre = np.floor((k + 0.5) / mult.astype(np.float64)).astype(np.int64)
        bias = (centre - 128).astype(np.int32)
        inits = [_init("w", np.ones((1, n), np.int8)), _init("ws", ws),
                 _init("wz", np.zeros(n, np.int8)),
                 _init("b", bias), _init("bs", (F32(xs) * ws).astype(F32)),
                 _init("bz", np.zeros(n, np.int32))]
        nodes = [_dq("x", "xf", "x", xs, xz, signed, inits),
                 helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=1),
                 helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"], axis=0),
                 helper.make_node("Gemm", ["xf", "wf", "bf"], ["yf"]),
                 _q("yf", "y", "y", ys, yz, signed, inits)]
        model = _model(nodes, [helper.make_tensor_value_info("x", _qt(signed), [256, 1])],
                       [helper.make_tensor_value_info("y", _qt(signed), None)], inits)
        assert _optypes(model) == ["QGemm"]
        x = _codes(signed).reshape(256, 1)
        acc = N.gemm_accumulate(x, xz, np.ones((n, 1), np.int8), 0, bias)
        y = _run(model, {"x": x})
        tally.add(N.requantize(acc, mult, yz, lo, hi, channel_axis=1), y)
        for m2 in ((F32(xs) * (ws / F32(ys)).astype(F32)).astype(F32),
                   ((F32(xs) / F32(ys)) * ws).astype(F32)):
            variants_wrong += int((N.requantize(acc, m2, yz, lo, hi, channel_axis=1) != y).sum())
        exact = np.rint(acc.astype(np.float64) * (np.float64(xs) * ws.astype(np.float64) /
                                                  np.float64(ys))) + yz
        variants_wrong += int((np.clip(exact, lo, hi) != y).sum())
    tally.assert_exact()
    assert variants_wrong > 0   # the boundaries do discriminate the evaluation order


# -- QLinearAdd -----------------------------------------------------------------------------------

def _grid(signed):
    codes = np.arange(*(np.array(N.qrange(signed)) + [0, 1]))
    a, b = np.meshgrid(codes, codes, indexing="ij")
    return a.astype(_np(signed)), b.astype(_np(signed))


def _add_params(rng, signed, mode):
    sa, sb, sy = (_rand_scale(rng) for _ in range(3))
    za, zb, zy = (_rand_zp(rng, signed) for _ in range(3))
    if mode == "tie":   # r_a = 1/2, r_b = 1/4: many exact .5 results
        sy = _rand_scale(rng)
        sa, sb = F32(sy * 0.5), F32(sy * 0.25)
    return sa, za, sb, zb, sy, zy


def test_qlinear_add_full_grid():
    """All 256×256 code pairs, random and tie-producing scales, both types: QLinearAdd."""
    rng = np.random.default_rng(5)
    tally = Tally()
    naive = Tally()
    kinds = set()
    for it in range(24):
        signed = bool(it % 2)
        sa, za, sb, zb, sy, zy = _add_params(rng, signed, "tie" if it % 3 == 0 else "rand")
        a, b = _grid(signed)
        shape = [1, 1, 256, 256]
        model = _binary_model("Add", shape, shape, sa, za, sb, zb, sy, zy, signed)
        kinds.update(_optypes(model))
        y = _run(model, {"a": a.reshape(shape), "b": b.reshape(shape)}).reshape(256, 256)
        tally.add(N.qlinear_add(a, sa, za, b, sb, zb, sy, zy, signed), y)
        lo, hi = N.qrange(signed)
        exact = (np.float64(sa) * (a.astype(np.int64) - za) + np.float64(sb) *
                 (b.astype(np.int64) - zb)) / np.float64(sy)
        naive.add(np.clip(np.rint(exact) + zy, lo, hi), y)
    assert kinds == {"QLinearAdd"}
    tally.assert_exact()
    assert naive.same < naive.total   # the float32 FMA chain is not the exact real formula


def test_qlinear_add_discriminating_scales_and_broadcast():
    """Scale sets chosen so that alternative float32 evaluation orders (no FMA, the other
    zero-point contraction, no operand swap) disagree with the contract somewhere on the grid;
    broadcast in both directions (residual add of a (C,1,1) tensor)."""
    rng = np.random.default_rng(6)
    tally = Tally()
    found = 0
    for it in range(4000):
        if found >= 12:
            break
        signed = bool(it % 2)
        lo, hi = N.qrange(signed)
        sa, za, sb, zb, sy, zy = _add_params(rng, signed, "rand")
        codes = np.arange(lo, hi + 1)
        a = np.broadcast_to(codes.reshape(1, 1, 1, 256), (1, 256, 1, 256))
        b = codes.reshape(1, 256, 1, 1)
        first_bcast = it % 4 >= 2
        if first_bcast:
            a, b = b, a
        ours = N.qlinear_add(a, sa, za, b, sb, zb, sy, zy, signed)
        ra, rb, fixed = N.qlinear_add_params(sa, za, sb, zb, sy, zy)
        af, bf = np.asarray(a, F32), np.asarray(b, F32)
        alternatives = [
            N.fma_f32(af, ra, N.fma_f32(bf, rb, fixed)),                       # no swap
            ((fixed + af * ra).astype(F32) + bf * rb).astype(F32),             # SSE, no FMA
        ]
        if not any((np.clip(np.rint(t), lo, hi) != ours).any() for t in alternatives):
            continue
        found += 1
        model = _binary_model("Add", a.shape, b.shape, sa, za, sb, zb, sy, zy, signed)
        y = _run(model, {"a": np.ascontiguousarray(a).astype(_np(signed)),
                         "b": np.ascontiguousarray(b).astype(_np(signed))})
        tally.add(ours, y)
    assert found >= 12
    tally.assert_exact()


def test_qlinear_add_random_tensors():
    rng = np.random.default_rng(7)
    tally = Tally()
    shapes = [((1, 8, 13, 11), (1, 8, 13, 11)), ((1, 8, 13, 11), (1, 8, 1, 1)),
              ((1, 8, 1, 1), (1, 8, 13, 11)), ((1, 1, 1, 11), (1, 8, 13, 1)),
              ((1, 3, 7, 5), (1, 1, 7, 5)), ((5,), (1,)),
              ((1, 32, 48, 48), (1, 32, 1, 1)), ((1, 32, 48, 48), (1, 32, 48, 48))]  # table path
    for seed_shift, (sha, shb) in itertools.product(range(4), shapes):
        signed = bool(seed_shift % 2)
        sa, za, sb, zb, sy, zy = _add_params(rng, signed, "tie" if seed_shift == 3 else "rand")
        a, b = _rand_codes(rng, sha, signed), _rand_codes(rng, shb, signed)
        y = _run(_binary_model("Add", sha, shb, sa, za, sb, zb, sy, zy, signed), {"a": a, "b": b})
        tally.add(N.qlinear_add(a, sa, za, b, sb, zb, sy, zy, signed), y)
    tally.assert_exact()


# -- QLinearMul -----------------------------------------------------------------------------------

def test_qlinear_mul_se_scale():
    """Squeeze-and-excitation channel scale x (C,H,W) · s (C,1,1), full code grid (channel c of
    x holds every code, s[c] is code c), random and tie scales; random tensors."""
    rng = np.random.default_rng(8)
    tally = Tally()
    kinds = set()
    for it in range(20):
        signed = bool(it % 2)
        lo, hi = N.qrange(signed)
        sa, sb = _rand_scale(rng, -5, 0), _rand_scale(rng, -5, 0)
        sy = _rand_scale(rng, -6, -1)
        if it % 4 == 3:   # multiplier 2^-k: products land on .5
            sa, sb, sy = F32(2.0 ** -4), F32(2.0 ** -5), F32(2.0 ** -8)
        za, zb, zy = (_rand_zp(rng, signed) for _ in range(3))
        codes = np.arange(lo, hi + 1)
        x = np.broadcast_to(codes.reshape(1, 1, 1, 256), (1, 256, 1, 256)).astype(_np(signed))
        s = codes.reshape(1, 256, 1, 1).astype(_np(signed))
        model = _binary_model("Mul", x.shape, s.shape, sa, za, sb, zb, sy, zy, signed)
        kinds.update(_optypes(model))
        tally.add(N.qlinear_mul(x, sa, za, s, sb, zb, sy, zy, signed),
                  _run(model, {"a": np.ascontiguousarray(x), "b": s}))
        xr, sr = _rand_codes(rng, (1, 24, 7, 9), signed), _rand_codes(rng, (1, 24, 1, 1), signed)
        model = _binary_model("Mul", xr.shape, sr.shape, sa, za, sb, zb, sy, zy, signed)
        tally.add(N.qlinear_mul(xr, sa, za, sr, sb, zb, sy, zy, signed),
                  _run(model, {"a": xr, "b": sr}))
    # scale sets where other float32 evaluations disagree with the contract on the grid
    found = 0
    for it in range(3000):
        if found >= 10:
            break
        signed = bool(it % 2)
        lo, hi = N.qrange(signed)
        sa, sb, sy = _rand_scale(rng, -5, 0), _rand_scale(rng, -5, 0), _rand_scale(rng, -6, -1)
        za, zb, zy = (_rand_zp(rng, signed) for _ in range(3))
        a, b = _grid(signed)
        ours = N.qlinear_mul(a, sa, za, b, sb, zb, sy, zy, signed)
        p = (a.astype(np.int32) - za) * (b.astype(np.int32) - zb)
        m = N.qlinear_mul_multiplier(sa, sb, sy)
        alternatives = [N.fma_f32(p.astype(F32), m, F32(zy)),                        # FMA
                        np.rint((p.astype(F32) * m).astype(F32)) + zy,               # zp after
                        (p.astype(F32) * (F32(sa) * (F32(sb) / F32(sy))).astype(F32)
                         ).astype(F32) + F32(zy)]                                    # other M
        if not any((np.clip(np.rint(t), lo, hi) != ours).any() for t in alternatives):
            continue
        found += 1
        shape = [1, 1, 256, 256]
        model = _binary_model("Mul", shape, shape, sa, za, sb, zb, sy, zy, signed)
        y = _run(model, {"a": a.reshape(shape), "b": b.reshape(shape)}).reshape(256, 256)
        tally.add(ours, y)
    assert found >= 10
    assert kinds == {"QLinearMul"}
    tally.assert_exact()


# -- pooling --------------------------------------------------------------------------------------

def test_qlinear_global_avg_pool():
    rng = np.random.default_rng(9)
    tally = Tally()
    kinds = set()
    for it in range(24):
        signed = bool(it % 2)
        h, w = [(7, 7), (1, 1), (3, 5), (14, 14), (4, 4), (2, 2)][it % 6]
        xs, xz = _rand_scale(rng, -5, -1), _rand_zp(rng, signed)
        ys = F32(xs * np.exp(rng.uniform(-1.5, 0.5)))
        if it % 3 == 0:   # mean of integers in steps of 1/N, y_s = 2·x_s: .5 ties
            ys = F32(2 * xs)
        yz = _rand_zp(rng, signed)
        x = _rand_codes(rng, (1, 512, h, w), signed)
        model = _unary_model([helper.make_node("GlobalAveragePool", ["xf"], ["yf"])], [],
                             x.shape, xs, xz, ys, yz, signed)
        kinds.update(_optypes(model))
        tally.add(N.qlinear_global_avg_pool(x[0], xs, xz, ys, yz, signed), _run(model, {"x": x})[0])
    assert kinds == {"QLinearGlobalAveragePool"}
    tally.assert_exact()


def test_qlinear_avg_pool():
    """kernel 2/3, stride 1/2, pads 0/1, count_include_pad 0/1, ceil_mode 0/1, both types;
    one set of random scales and one with x and y quantisation equal (quarter steps: ties)."""
    rng = np.random.default_rng(10)
    tally = Tally()
    kinds = set()
    for signed, k, s, p, cip, ceil in itertools.product([False, True], [2, 3], [1, 2], [0, 1],
                                                        [0, 1], [0, 1]):
        for rep in range(2):
            h, w = [(7, 7), (8, 9)][rep]
            xs, xz = _rand_scale(rng, -5, -1), _rand_zp(rng, signed)
            ys, yz = (F32(xs * np.exp(rng.uniform(-1, 0.5))), _rand_zp(rng, signed)) if rep == 0 \
                else (xs, xz)
            x = _rand_codes(rng, (1, 6, h, w), signed)
            node = helper.make_node("AveragePool", ["xf"], ["yf"], kernel_shape=[k, k],
                                    strides=[s, s], pads=[p] * 4, count_include_pad=cip,
                                    ceil_mode=ceil)
            model = _unary_model([node], [], x.shape, xs, xz, ys, yz, signed, opset=19)
            kinds.update(_optypes(model))
            tally.add(N.qlinear_avg_pool(x[0], xs, xz, ys, yz, signed, k, s, p, bool(cip),
                                         bool(ceil)), _run(model, {"x": x})[0])
    # a kernel covering the whole input falls back to the integer global average pool
    for signed in (False, True):
        xs, xz, ys, yz = F32(0.05), _rand_zp(rng, signed), F32(0.1), _rand_zp(rng, signed)
        x = _rand_codes(rng, (1, 32, 4, 4), signed)
        node = helper.make_node("AveragePool", ["xf"], ["yf"], kernel_shape=[4, 4])
        model = _unary_model([node], [], x.shape, xs, xz, ys, yz, signed)
        tally.add(N.qlinear_avg_pool(x[0], xs, xz, ys, yz, signed, 4, 1), _run(model, {"x": x})[0])
    assert kinds == {"QLinearAveragePool"}
    tally.assert_exact()


def test_max_pool():
    """Same quantisation in and out: Q/DQ dropped, MaxPool on 8-bit codes. Different: the float
    path, equal to the 8-bit max followed by a requantisation table."""
    rng = np.random.default_rng(11)
    tally = Tally()
    kinds = set()
    for signed, k, s, p, ceil, diff in itertools.product([False, True], [2, 3], [1, 2], [0, 1],
                                                         [0, 1], [0, 1]):
        xs, xz = _rand_scale(rng, -5, -1), _rand_zp(rng, signed)
        ys, yz = (F32(xs * np.exp(rng.uniform(-1, 1))), _rand_zp(rng, signed)) if diff else (xs, xz)
        x = _rand_codes(rng, (1, 5, 9, 8), signed)
        node = helper.make_node("MaxPool", ["xf"], ["yf"], kernel_shape=[k, k], strides=[s, s],
                                pads=[p] * 4, ceil_mode=ceil)
        model = _unary_model([node], [], x.shape, xs, xz, ys, yz, signed)
        kinds.add(tuple(_optypes(model)))
        ours = N.max_pool(x[0], k, s, p, ceil_mode=bool(ceil))
        if diff:
            ours = N.apply_table(ours, N.requant_table(xs, xz, ys, yz, signed), signed)
        tally.add(ours, _run(model, {"x": x})[0])
    assert ("MaxPool",) in kinds
    tally.assert_exact()


# -- upsample, concat -----------------------------------------------------------------------------

@pytest.mark.parametrize("ctm,nearest", [("half_pixel", "round_prefer_floor"),
                                         ("half_pixel", "round_prefer_ceil"),
                                         ("pytorch_half_pixel", "round_prefer_floor"),
                                         ("asymmetric", "floor"),
                                         ("asymmetric", "round_prefer_floor"),
                                         ("align_corners", "round_prefer_floor")])
def test_upsample_nearest2x(ctm, nearest):
    rng = np.random.default_rng(12)
    tally = Tally()
    for signed, diff in itertools.product([False, True], [False, True]):
        xs, xz = _rand_scale(rng, -5, -1), _rand_zp(rng, signed)
        ys, yz = (F32(xs * np.exp(rng.uniform(-1, 1))), _rand_zp(rng, signed)) if diff else (xs, xz)
        x = _rand_codes(rng, (1, 3, 5, 7), signed)
        node = helper.make_node("Resize", ["xf", "", "sc"], ["yf"], mode="nearest",
                                coordinate_transformation_mode=ctm, nearest_mode=nearest)
        model = _unary_model([node], [_init("sc", np.array([1, 1, 2, 2], F32))], x.shape,
                             xs, xz, ys, yz, signed)
        ours = N.upsample_nearest2x(x[0])
        if diff:
            ours = N.apply_table(ours, N.requant_table(xs, xz, ys, yz, signed), signed)
        tally.add(ours, _run(model, {"x": x})[0])
    tally.assert_exact()


def test_qlinear_concat():
    """Every input code through QLinearConcat, with scales equal to and different from the
    output's; one input at exactly twice the output scale (ties of the requantisation)."""
    rng = np.random.default_rng(13)
    tally = Tally()
    kinds = set()
    for it in range(16):
        signed = bool(it % 2)
        n = 2 + it % 3
        scales = [_rand_scale(rng, -5, -1) for _ in range(n)]
        zps = [_rand_zp(rng, signed) for _ in range(n)]
        ys, yz = _rand_scale(rng, -5, -1), _rand_zp(rng, signed)
        if it % 4 == 0:
            ys, yz = scales[0], zps[0]
        scales[-1] = F32(ys / 2)
        inits, nodes, inputs = [], [], []
        for i in range(n):
            nodes.append(_dq(f"x{i}", f"f{i}", f"x{i}", scales[i], zps[i], signed, inits))
            inputs.append(helper.make_tensor_value_info(f"x{i}", _qt(signed), [1, 2, 8, 32]))
        nodes += [helper.make_node("Concat", [f"f{i}" for i in range(n)], ["yf"], axis=1),
                  _q("yf", "y", "y", ys, yz, signed, inits)]
        model = _model(nodes, inputs, [helper.make_tensor_value_info("y", _qt(signed), None)],
                       inits)
        kinds.update(_optypes(model))
        xs = [np.broadcast_to(_codes(signed).reshape(1, 1, 8, 32), (1, 2, 8, 32)).copy()
              for _ in range(n)]
        y = _run(model, {f"x{i}": xs[i] for i in range(n)})[0]
        tally.add(N.qlinear_concat([(xs[i][0], scales[i], zps[i]) for i in range(n)], ys, yz,
                                   signed), y)
    assert kinds == {"QLinearConcat"}
    tally.assert_exact()


# -- activation tables ----------------------------------------------------------------------------

_ACTIVATIONS = {
    "Relu": N.onnx_op("Relu"),
    "Relu6": N.onnx_op("Clip", 0.0, 6.0),
    "LeakyRelu": N.onnx_op("LeakyRelu", alpha=0.1),
    "HardSigmoid": N.onnx_op("HardSigmoid"),
    "HardSwish": N.onnx_op("HardSwish"),
    "Sigmoid": N.onnx_op("Sigmoid"),
    "Tanh": N.onnx_op("Tanh"),
}


def _builder_model(builder, shape, xs, xz, xsg, ys, yz, ysg):
    nodes, inits = builder("xf", "yf")
    return _unary_model(nodes, inits, shape, xs, xz, ys, yz, xsg, ysg)


@pytest.mark.parametrize("name", sorted(_ACTIVATIONS))
def test_activation_table(name):
    """The table built from 256 codes reproduces onnxruntime on odd-sized tensors (tail and
    vector paths, thread split), same and mixed signedness."""
    builder = _ACTIVATIONS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    tally = Tally()
    for it in range(5):
        xsg = bool(it % 2)
        ysg = xsg if it < 4 else not xsg
        xs, xz = _rand_scale(rng, -5, -2), _rand_zp(rng, xsg)
        ys, yz = _rand_scale(rng, -6, -2), _rand_zp(rng, ysg)
        table = N.activation_table(builder, xs, xz, xsg, ys, yz, ysg)
        assert table.shape == (256,)
        for shape in ([1, 3, 7, 9], [2, 5, 11, 3], [1, 7, 37, 41]):
            x = _rand_codes(rng, shape, xsg)
            y = _run(_builder_model(builder, shape, xs, xz, xsg, ys, yz, ysg), {"x": x})
            tally.add(N.apply_table(x, table, xsg), y)
    tally.assert_exact()


def test_prelu_per_channel_tables():
    """PRelu with a quantised per-channel slope: one table per channel (as many distinct tables
    as distinct slopes at most; they agree on every code ≥ x_zp)."""
    rng = np.random.default_rng(14)
    tally = Tally()
    c = 6
    for signed in (False, True):
        slope_q = rng.integers(-127, 128, (c, 1, 1)).astype(np.int8)
        slope_q[1] = slope_q[0]

        def prelu(inp, out, slope_q=slope_q):
            return ([helper.make_node("DequantizeLinear", ["sq", "ss"], ["slope"]),
                     helper.make_node("PRelu", [inp, "slope"], [out])],
                    [_init("sq", slope_q), _init("ss", F32(0.004))])

        xs, xz, ys, yz = F32(0.05), _rand_zp(rng, signed), F32(0.03), _rand_zp(rng, signed)
        tables = N.activation_table(prelu, xs, xz, signed, ys, yz, signed, channels=c)
        assert tables.shape == (c, 256)
        assert len({t.tobytes() for t in tables}) <= c - 1        # channels 0 and 1 share
        codes = _codes(signed).astype(np.int32)
        assert (tables[:, codes >= xz] == tables[0, codes >= xz]).all()
        x = _rand_codes(rng, (1, c, 13, 11), signed)
        y = _run(_builder_model(prelu, x.shape, xs, xz, signed, ys, yz, signed), {"x": x})
        tally.add(N.apply_table(x[0], tables, signed), y[0])
    tally.assert_exact()


def test_silu_composite():
    """SiLU exported as x · Sigmoid(x), QDQ around both ops (one DQ of x feeding Sigmoid and
    Mul, as the quantizer emits it). uint8: QLinearSigmoid then QLinearMul; int8 on x86: both
    left in float (the Sigmoid's Q→DQ pair is converted to uint8). Either way one 256-entry
    table, which activation_table also builds directly from the composite."""
    rng = np.random.default_rng(15)
    tally = Tally()
    for it in range(16):
        signed = bool(it % 2)
        lo, _ = N.qrange(signed)
        xs, xz = _rand_scale(rng, -5, -2), _rand_zp(rng, signed)
        ss, sz = (F32(1 / 256), lo) if it % 3 else (_rand_scale(rng, -6, -3), _rand_zp(rng, signed))
        ys, yz = _rand_scale(rng, -5, -2), _rand_zp(rng, signed)

        def silu(inp, out, ss=ss, sz=sz, signed=signed):
            inits = []
            nodes = [helper.make_node("Sigmoid", [inp], ["sf"]),
                     _q("sf", "sq", "s", ss, sz, signed, inits),
                     _dq("sq", "sd", "sd", ss, sz, signed, inits),
                     helper.make_node("Mul", [inp, "sd"], [out])]
            return nodes, inits

        shape = [1, 5, 9, 13]
        model = _builder_model(silu, shape, xs, xz, signed, ys, yz, signed)
        kinds = _optypes(model)
        assert ("QLinearMul" in kinds) == (not signed)
        sig = N.activation_table("Sigmoid", xs, xz, signed, ss, sz, signed)
        table = N.qlinear_silu_table(xs, xz, sig, ss, sz, ys, yz, signed,
                                     mul="float" if signed else "qlinear")
        assert (table == N.activation_table(silu, xs, xz, signed, ys, yz, signed)).all()
        x = np.concatenate([_codes(signed), _rand_codes(rng, shape, signed).ravel()])
        x = x[:np.prod(shape)].reshape(shape)
        tally.add(N.apply_table(x, table, signed), _run(model, {"x": x}))
    tally.assert_exact()


# -- float paths and optimisation levels ----------------------------------------------------------

def test_float_paths_match_unfused_onnxruntime():
    """DQ → float op → Q, as onnxruntime runs node units it leaves unfused (forced here with
    ORT_DISABLE_ALL): dq_add_q, dq_mul_q and dq_global_avg_pool_q are exact. The scale sets are
    chosen where the fused kernels (QLinearAdd, QLinearMul, QLinearGlobalAveragePool, taken at
    the default level) round differently: the optimisation level changes results."""
    rng = np.random.default_rng(16)
    ours = {"Add": Tally(), "Mul": Tally()}
    fused = {"Add": Tally(), "Mul": Tally()}
    level_diff = {"Add": 0, "Mul": 0}
    found = {"Add": 0, "Mul": 0}
    a_s, b_s = _grid(False), _grid(True)
    for it in range(3000):
        if min(found.values()) >= 4:
            break
        signed = bool(it % 2)
        sa, za, sb, zb, sy, zy = _add_params(rng, signed, "rand")
        a, b = b_s if signed else a_s
        for op, f_float, f_fused in (("Add", N.dq_add_q, N.qlinear_add),
                                     ("Mul", N.dq_mul_q, N.qlinear_mul)):
            if found[op] >= 4:
                continue
            y_float = f_float(a, sa, za, b, sb, zb, sy, zy, signed)
            y_fused = f_fused(a, sa, za, b, sb, zb, sy, zy, signed)
            if (y_float == y_fused).all():
                continue
            found[op] += 1
            shape = [1, 1, 256, 256]
            feeds = {"a": a.reshape(shape), "b": b.reshape(shape)}
            model = _binary_model(op, shape, shape, sa, za, sb, zb, sy, zy, signed)
            ref_float = _run(model, feeds, DISABLE_ALL).reshape(256, 256)
            ref_fused = _run(model, feeds).reshape(256, 256)
            ours[op].add(y_float, ref_float)
            fused[op].add(y_fused, ref_fused)
            level_diff[op] += int((ref_float != ref_fused).sum())
    for op in ("Add", "Mul"):
        assert found[op] >= 4
        ours[op].assert_exact()
        fused[op].assert_exact()
        assert level_diff[op] > 0
    gap, gap_fused = Tally(), Tally()
    gap_diff = 0
    for it in range(10):
        signed = bool(it % 2)
        h, w = [(4, 4), (3, 4), (7, 7), (5, 3), (14, 14)][it % 5]
        xs, xz = _rand_scale(rng, -5, -1), _rand_zp(rng, signed)
        ys, yz = F32(2 * xs), _rand_zp(rng, signed)     # .5 ties of the exact mean
        x = _rand_codes(rng, (1, 2048, h, w), signed)
        model = _unary_model([helper.make_node("GlobalAveragePool", ["xf"], ["yf"])], [], x.shape,
                             xs, xz, ys, yz, signed)
        ref_float = _run(model, {"x": x}, DISABLE_ALL)[0]
        ref_fused = _run(model, {"x": x})[0]
        gap.add(N.dq_global_avg_pool_q(x[0], xs, xz, ys, yz, signed), ref_float)
        gap_fused.add(N.qlinear_global_avg_pool(x[0], xs, xz, ys, yz, signed), ref_fused)
        gap_diff += int((ref_float != ref_fused).sum())
    gap.assert_exact()
    gap_fused.assert_exact()
    assert gap_diff > 0


def test_int8_chain_left_unfused_by_s8_to_u8_conversion():
    """int8 QDQ graphs on x86: onnxruntime converts single-consumer int8 Q→DQ pairs to uint8
    (QDQS8ToU8Transformer); a node unit whose DQ inputs and Q output then differ in type is not
    fused and runs in float. Two chained Adds show it: both stay float Add, reproduced exactly
    by dq_add_q (with the unchanged int8 parameters, the conversion being exact)."""
    rng = np.random.default_rng(17)
    tally = Tally()
    for _ in range(4):
        x, yq = _rand_codes(rng, (1, 4, 16, 16), True), _rand_codes(rng, (1, 4, 16, 16), True)
        s1, s2, s3, s4 = (_rand_scale(rng, -4, -1) for _ in range(4))
        z1, z2, z3, z4 = (_rand_zp(rng, True) for _ in range(4))
        inits = []
        nodes = [_dq("x", "xf", "x", s1, z1, True, inits),
                 _dq("yq", "yf", "yq", s2, z2, True, inits),
                 helper.make_node("Add", ["xf", "yf"], ["a1"]),
                 _q("a1", "a1q", "a1q", s3, z3, True, inits),
                 _dq("a1q", "a1d", "a1d", s3, z3, True, inits),
                 helper.make_node("Add", ["a1d", "yf"], ["a2"]),
                 _q("a2", "out", "out", s4, z4, True, inits)]
        t = TensorProto.INT8
        model = _model(nodes, [helper.make_tensor_value_info("x", t, [1, 4, 16, 16]),
                               helper.make_tensor_value_info("yq", t, [1, 4, 16, 16])],
                       [helper.make_tensor_value_info("out", t, None)], inits)
        assert "QLinearAdd" not in _optypes(model)
        mid = N.dq_add_q(x, s1, z1, yq, s2, z2, s3, z3, True)
        ours = N.dq_add_q(mid, s3, z3, yq, s2, z2, s4, z4, True)
        tally.add(ours, _run(model, {"x": x, "yq": yq}))
    tally.assert_exact()


def test_int8_graph_fused_node_runs_in_uint8():
    """After the S8→U8 conversion a node unit whose inputs and output all went through
    converted pairs is fused — in uint8: QLinearAdd then computes on codes + 128 with zero points
    + 128, which rounds differently from the int8 kernel. Graph: x, z pass unchanged through two
    float Adds (adding a zero tensor, same quantisation), the middle Add is fused, a last float
    Add of zero returns its codes."""
    rng = np.random.default_rng(18)
    a, b = _grid(True)
    tally, as_int8 = Tally(), Tally()
    found = 0
    for _ in range(5000):
        if found >= 6:
            break
        s5, s6, s7 = (_rand_scale(rng, -4, -1) for _ in range(3))
        z5, z6, z7 = (_rand_zp(rng, True) for _ in range(3))
        y_s8 = N.qlinear_add(a, s5, z5, b, s6, z6, s7, z7, True)
        y_u8 = N.qlinear_add(a.astype(np.int32) + 128, s5, z5 + 128, b.astype(np.int32) + 128, s6,
                             z6 + 128, s7, z7 + 128, False) - 128
        if (y_s8 == y_u8).all():
            continue
        found += 1
        inits = []
        nodes = [_dq("x", "xf", "x", s5, z5, True, inits), _dq("z", "zf", "z", s6, z6, True, inits),
                 _dq("zero", "0f", "zero", 1.0, 0, True, inits),
                 helper.make_node("Add", ["xf", "0f"], ["a1"]),
                 _q("a1", "a1q", "a1q", s5, z5, True, inits),
                 _dq("a1q", "a1d", "a1d", s5, z5, True, inits),
                 helper.make_node("Add", ["zf", "0f"], ["b1"]),
                 _q("b1", "b1q", "b1q", s6, z6, True, inits),
                 _dq("b1q", "b1d", "b1d", s6, z6, True, inits),
                 helper.make_node("Add", ["a1d", "b1d"], ["a2"]),
                 _q("a2", "a2q", "a2q", s7, z7, True, inits),
                 _dq("a2q", "a2d", "a2d", s7, z7, True, inits),
                 helper.make_node("Add", ["a2d", "0f"], ["a3"]),
                 _q("a3", "out", "out", s7, z7, True, inits)]
        shape = [1, 1, 256, 256]
        t = TensorProto.INT8
        inputs = [helper.make_tensor_value_info(n, t, shape) for n in ("x", "z", "zero")]
        model = _model(nodes, inputs,
                       [helper.make_tensor_value_info("out", t, None)], inits)
        assert _optypes(model).count("QLinearAdd") == 1
        y = _run(model, {"x": a.reshape(shape), "z": b.reshape(shape),
                         "zero": np.zeros(shape, np.int8)}).reshape(256, 256)
        tally.add(y_u8, y)
        as_int8.add(y_s8, y)
    assert found >= 6
    tally.assert_exact()
    assert as_int8.same < as_int8.total


def test_requant_table_and_apply_table_conventions():
    t = N.requant_table(F32(0.1), 3, F32(0.1), 3, True)
    assert (t == _codes(True).astype(np.int32)).all()            # identity, indexed by raw byte
    x = np.array([[-128, -1, 0, 127]], np.int8)
    assert (N.apply_table(x, t, True) == x).all()
    per_channel = np.stack([np.arange(256), 255 - np.arange(256)])
    xc = np.array([[0, 255], [0, 255]], np.uint8)
    assert (N.apply_table(xc, per_channel, False) == [[0, 255], [255, 0]]).all()


@pytest.mark.parametrize("a_signed, b_signed, out_signed",
                         [(s, t, u) for s in (0, 1) for t in (0, 1) for u in (0, 1)])
def test_qlinear_add_large_tensors_keep_operand_types(a_signed, b_signed, out_signed):
    """Above 2^16 elements qlinear_add_codes uses a 256×256 table; each operand's rows must
    follow that operand's type, not the output's (int8 −1 and uint8 255 share a byte)."""
    rng = np.random.default_rng(a_signed * 4 + b_signed * 2 + out_signed)
    a = rng.integers(*np.array(N.qrange(bool(a_signed))) + [0, 1], 70_000)
    b = rng.integers(*np.array(N.qrange(bool(b_signed))) + [0, 1], 70_000)
    ra, rb, fixed = N.qlinear_add_params(0.05, 3, 0.07, 5, 0.1, 1)
    whole = N.qlinear_add_codes(a, b, ra, rb, fixed, bool(out_signed))
    pieces = [N.qlinear_add_codes(a[k:k + 50_000], b[k:k + 50_000], ra, rb, fixed,
                                        bool(out_signed)) for k in (0, 50_000)]
    np.testing.assert_array_equal(whole, np.concatenate(pieces))
