"""The numeric contract: the integer and float32 arithmetic every executor reproduces.

The reference is onnxruntime's CPU execution (default ``SessionOptions``: ORT_ENABLE_ALL, CPU
execution provider, x86-64 with AVX2) of an int8 QDQ model. The golden model calls these
functions; the RTL blocks are tested against them. Nothing else may re-implement them. Every
function states the exact float32 steps and the onnxruntime kernel it reproduces;
``tests/test_numeric.py`` compares each with onnxruntime 1.31.

What onnxruntime runs for each QDQ node unit after graph optimisation (the QDQ fusions belong
to level ORT_ENABLE_EXTENDED; at ORT_ENABLE_BASIC/DISABLE_ALL every node runs in float, see the
``dq_*`` functions — the optimisation level changes results)::

    QDQ pattern                         kernel                               here
    Conv, uint8 activations             QLinearConv (NHWC), MLAS U8S8        conv_accumulate
    Conv, int8 activations              not fused on x86: DQ→float Conv→Q    ≈ conv_accumulate
    Gemm, MatMul + bias Add             QGemm (uint8 and int8)               gemm_accumulate
    MatMul, no bias                     QLinearMatMul (uint8); int8: float   gemm_accumulate
    Add / Mul                           QLinearAdd / QLinearMul              qlinear_add / _mul
    GlobalAveragePool                   QLinearGlobalAveragePool             qlinear_global_avg_pool
    AveragePool                         QLinearAveragePool (float inside)    qlinear_avg_pool
    MaxPool, Resize (same quant)        Q/DQ dropped: op on 8-bit codes      max_pool, upsample_…
    MaxPool, Resize (other quant)       DQ → float op → Q                    … + requant_table
    Concat                              QLinearConcat (a table per input)    qlinear_concat
    Sigmoid, LeakyRelu                  QLinearSigmoid / QLinearLeakyRelu    activation_table
    other unary ops                     DQ → float op → Q                    activation_table

int8 QDQ graphs on x86 are a patchwork. ``QDQIsInt8Allowed()`` is false, so int8 Conv and
bias-less MatMul are never fused; and ``QDQS8ToU8Transformer`` rewrites every internal int8
Q→DQ pair with a single consumer into uint8 (zero point + 128). A node unit whose DQ inputs and
Q output then disagree in type is not fused and runs in float (``dq_add_q``, ``dq_mul_q``,
``dq_global_avg_pool_q``, tables); one whose inputs and output were all converted is fused *in
uint8* — the fused kernels must then be called with codes + 128 and zero points + 128
(QLinearAdd rounds differently on shifted codes; QLinearConv becomes U8S8 and saturates). Which
case applies depends on the graph topology, so the importer has to take it from onnxruntime's
optimised graph (``SessionOptions.optimized_model_filepath``), not from the QDQ model.

Convolution / Gemm (QLinearConv, QGemm, QLinearMatMul)::

    acc = Σ (x − x_zp)(w − w_zp) + bias                      exact int32
    y   = clamp(rint(float32(acc) · float32(float32(x_s·w_s) / y_s)) + y_zp, lo, hi)

with ``rint`` rounding half to even, and ``lo``/``hi`` the output type's range narrowed by an
absorbed Relu/Clip. Two deviations from "exact int32" are properties of onnxruntime on this
CPU class, not of the model:

* uint8 activations × int8 weights (MLAS U8S8 GEMM on AVX2 without VNNI, ``vpmaddubsw``): the
  raw products are summed in pairs along K with int16 saturation,
  ``sat16(x[2i]·w[2i] + x[2i+1]·w[2i+1])`` (K ordered kernel row, kernel column, channel, i.e.
  NHWC im2col; padding holds ``x_zp``), before the exact zero-point corrections. Reproduced by
  ``u8s8_pair_saturation=True`` (:func:`ort_u8s8_saturates` tells whether the local
  onnxruntime does it). Depthwise convolutions with equal weight zero points and int8×int8
  kernels are exact. With realistic weights 0.2–10 % of a layer's outputs change.
* int8 activations: Conv (and MatMul without bias) run as float32 convolutions of dequantised
  tensors. The integer formula matches about 99.999 % of outputs and differs by at most 1
  (float32 accumulation error next to a rounding boundary); exactness would need MLAS's float
  summation order (NCHWc kernels, FMA), which the contract does not model.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

__all__ = [
    "qrange", "requant_multiplier", "requantize", "conv_accumulate", "ort_u8s8_saturates",
    "gemm_accumulate",
    "fma_f32", "qlinear_add_params", "qlinear_add", "qlinear_add_codes",
    "qlinear_mul_multiplier", "qlinear_mul", "qlinear_mul_codes",
    "dq_add_q", "dq_mul_q", "dq_global_avg_pool_q",
    "global_avg_pool_multiplier", "qlinear_global_avg_pool", "global_avg_pool_codes",
    "qlinear_avg_pool",
    "pool_output_size", "max_pool", "upsample_nearest2x", "requant_table", "qlinear_concat",
    "onnx_op", "activation_table", "apply_table", "qlinear_silu_table",
]

_INT_MIN = -2**31


def qrange(signed: bool) -> tuple[int, int]:
    """Value range of an 8-bit tensor."""
    return (-128, 127) if signed else (0, 255)


def requant_multiplier(x_scale, w_scale, y_scale) -> np.ndarray:
    """float32(float32(x_s · w_s) / y_s), per output channel, computed as onnxruntime does
    (QLinearConv, QGemm, QLinearMatMul): the product, then the quotient, each rounded to
    float32."""
    x_scale = np.float32(x_scale)
    w_scale = np.asarray(w_scale, dtype=np.float32)
    return (x_scale * w_scale / np.float32(y_scale)).astype(np.float32)


def requantize(acc: np.ndarray, multiplier, zero_point: int, lo: int, hi: int,
               channel_axis: int = 0) -> np.ndarray:
    """int32 accumulators → 8-bit outputs (as int32 values in ``[lo, hi]``).

    ``multiplier`` is a float32 scalar or one value per channel along ``channel_axis``.
    float32(acc) rounds to nearest even; the product is a single float32 multiply; the
    result rounds half to even before the zero point is added (MLAS ``MlasRequantizeOutput``:
    ``cvtepi32_ps``, ``mul_ps``, clamp to ``[lo − zp, hi − zp]``, ``cvtps_epi32``, ``+ zp``).
    """
    acc = np.asarray(acc, dtype=np.int32)
    m = np.asarray(multiplier, dtype=np.float32)
    if m.ndim == 1:
        shape = [1] * acc.ndim
        shape[channel_axis] = m.size
        m = m.reshape(shape)
    scaled = acc.astype(np.float32) * m
    # Clamp in float first, as MLAS does: huge products saturate instead of overflowing int64.
    scaled = np.clip(scaled, np.float32(lo - int(zero_point)), np.float32(hi - int(zero_point)))
    y = np.rint(scaled).astype(np.int64) + int(zero_point)
    return np.clip(y, lo, hi).astype(np.int32)


# -- convolution and matrix products ------------------------------------------------------------

def _pair(v) -> tuple[int, int]:
    if np.ndim(v) == 0:
        return int(v), int(v)
    a, b = v
    return int(a), int(b)


def _pads4(pads) -> tuple[int, int, int, int]:
    if np.ndim(pads) == 0:
        p = int(pads)
        return p, p, p, p
    pads = tuple(int(p) for p in pads)
    if len(pads) == 2:
        return pads[0], pads[1], pads[0], pads[1]
    return pads  # type: ignore[return-value]


def _u8s8_pair_correction(x_raw_padded: np.ndarray, w: np.ndarray, stride: tuple[int, int],
                          oh: int, ow: int, depthwise: bool = False,
                          chunk: int = 1 << 22) -> np.ndarray:
    """Σ over saturating pairs of (sat16(p) − p), the difference between MLAS's AVX2 U8S8
    accumulation and the exact sum. ``x_raw_padded``: raw uint8 codes (C, Hp, Wp), padded with
    the zero point; ``w``: raw int8 weights (O, C, kh, kw), or (C, 1, kh, kw) with
    ``depthwise`` (one GEMM per channel, K = the kh·kw taps). Returns (O, oh, ow) int64.

    K is ordered (ky, kx, c) and paired (2i, 2i+1); an odd last element pairs with 0 and cannot
    saturate. A pair can only saturate if 255 · (|w0| + |w1|) > 32767, i.e. |w0| + |w1| ≥ 129,
    so only those (channel, pair) candidates are evaluated, vectorised over output pixels."""
    o, c, kh, kw = w.shape
    wk = w.transpose(0, 2, 3, 1).reshape(o, -1).astype(np.int64)
    k = wk.shape[1]
    npairs = k // 2
    corr = np.zeros((o, oh, ow), dtype=np.int64)
    if npairs == 0:
        return corr
    w0 = wk[:, 0:2 * npairs:2]
    w1 = wk[:, 1:2 * npairs:2]
    oc, pc = np.nonzero(np.abs(w0) + np.abs(w1) >= 129)
    if oc.size == 0:
        return corr
    sh, sw = stride
    ri = sh * np.arange(oh)
    ci = sw * np.arange(ow)
    per = max(1, chunk // max(1, oh * ow))
    for s in range(0, oc.size, per):
        ocs, pcs = oc[s:s + per], pc[s:s + per]
        k0, k1 = 2 * pcs, 2 * pcs + 1
        vals = []
        for kk in (k0, k1):
            tap, ch = np.divmod(kk, c)
            ky, kx = np.divmod(tap, kw)
            if depthwise:
                ch = ocs
            vals.append(x_raw_padded[ch[:, None, None], ky[:, None, None] + ri[None, :, None],
                                     kx[:, None, None] + ci[None, None, :]].astype(np.int64))
        v = vals[0] * w0[ocs, pcs][:, None, None] + vals[1] * w1[ocs, pcs][:, None, None]
        d = np.clip(v, -32768, 32767) - v
        # candidates come out of np.nonzero sorted by output channel: reduce per channel
        starts = np.flatnonzero(np.r_[True, ocs[1:] != ocs[:-1]])
        corr[ocs[starts]] += np.add.reduceat(d, starts, axis=0)
    return corr


def conv_accumulate(x: np.ndarray, x_zp: int, w: np.ndarray, w_zp, bias: np.ndarray | None,
                    stride: tuple[int, int] = (1, 1),
                    pads: tuple[int, int, int, int] = (0, 0, 0, 0),
                    depthwise: bool = False, *,
                    u8s8_pair_saturation: bool = False) -> np.ndarray:
    """Exact int32 accumulators of a convolution (QLinearConv before requantisation).

    ``x``: ``(C, H, W)`` int8/uint8; ``w``: ``(O, I, kh, kw)`` int8 (``I = 1`` when
    ``depthwise``); ``w_zp``: scalar or per output channel; ``pads``: top, left, bottom, right,
    filled with ``x_zp`` (so padding contributes zero); ``bias``: int32 per output channel.
    Returns ``(O, OH, OW)`` int32. Vectorised over output pixels: one matrix product per tap.

    ``acc = Σ (x − x_zp)(w − w_zp) + bias``.

    ``u8s8_pair_saturation=True`` reproduces onnxruntime's U8S8 QLinearConv on AVX2 without
    VNNI (uint8 activations, int8 weights; see :func:`ort_u8s8_saturates`): the GEMM kernel
    (``vpmaddubsw``) sums the raw products in adjacent pairs along K = (ky, kx, c) with int16
    saturation, then the zero-point terms are applied exactly::

        acc = Σ_i sat16(x[2i]·w[2i] + x[2i+1]·w[2i+1])
              − x_zp·Σw − w_zp·Σx + K·x_zp·w_zp + bias

    (``x`` raw codes, padding = ``x_zp``, an odd last element pairs with 0). Depthwise
    convolutions run MLAS's exact depthwise kernel when all weight zero points are equal (the
    usual symmetric case); with differing per-channel weight zero points onnxruntime falls back
    to one GEMM per channel over K = (ky, kx), which saturates the same way — both reproduced.
    """
    x_raw = np.asarray(x)
    # float64 holds every partial sum exactly (|acc| < 2**53 for any layer of 8-bit data),
    # and lets numpy use BLAS: one matrix product per kernel tap.
    xf = x_raw.astype(np.float64) - int(x_zp)
    w = np.asarray(w)
    o, i, kh, kw = w.shape
    w_zp = np.asarray(w_zp, dtype=np.float64)
    wz = w.astype(np.float64) - (w_zp.reshape(-1, 1, 1, 1) if w_zp.ndim else w_zp)
    top, left, bottom, right = pads
    xp = np.pad(xf, ((0, 0), (top, bottom), (left, right)))  # zero after the zp shift
    sh, sw = stride
    oh = (xp.shape[1] - kh) // sh + 1
    ow = (xp.shape[2] - kw) // sw + 1
    acc = np.zeros((o, oh, ow), dtype=np.float64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, ky:ky + sh * (oh - 1) + 1:sh, kx:kx + sw * (ow - 1) + 1:sw]
            if depthwise:
                acc += wz[:, 0, ky, kx, None, None] * patch
            else:
                acc += np.tensordot(wz[:, :, ky, kx], patch, axes=(1, 0))
    if bias is not None:
        acc += np.asarray(bias, dtype=np.float64).reshape(-1, 1, 1)
    acc = acc.astype(np.int64)
    if u8s8_pair_saturation and not (depthwise and np.unique(w_zp).size <= 1):
        xr = np.pad(x_raw.astype(np.int64), ((0, 0), (top, bottom), (left, right)),
                    constant_values=int(x_zp))
        acc += _u8s8_pair_correction(xr, w, (sh, sw), oh, ow, depthwise)
    if acc.size and (acc.min() < -2**31 or acc.max() >= 2**31):
        raise OverflowError("convolution accumulator exceeds int32")
    return acc.astype(np.int32)


_U8S8_SATURATES: bool | None = None


def ort_u8s8_saturates() -> bool:
    """Whether the installed onnxruntime's U8S8 QLinearConv saturates pair sums on this CPU
    (AVX2 without VNNI: yes; AVX-VNNI/AVX512-VNNI: no). Measured once, exactly, by running a
    1×1 QDQ convolution whose every pair overflows int16 (x = 255, w = 127)."""
    global _U8S8_SATURATES
    if _U8S8_SATURATES is None:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
        c = 16
        inits = [numpy_helper.from_array(np.float32(1.0), "xs"),
                 numpy_helper.from_array(np.uint8(0), "xz"),
                 numpy_helper.from_array(np.full((1, c, 1, 1), 127, np.int8), "w"),
                 numpy_helper.from_array(np.float32(1.0), "ws"),
                 numpy_helper.from_array(np.int8(0), "wz"),
                 numpy_helper.from_array(np.float32(4096.0), "ys"),
                 numpy_helper.from_array(np.uint8(0), "yz")]
        nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
                 helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"]),
                 helper.make_node("Conv", ["xf", "wf"], ["yf"]),
                 helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"])]
        graph = helper.make_graph(
            nodes, "u8s8_probe",
            [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, c, 4, 4])],
            [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 1, 4, 4])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = min(model.ir_version, 8)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        y = sess.run(None, {"x": np.full((1, c, 4, 4), 255, np.uint8)})[0]
        exact = round(c * 255 * 127 / 4096.0)           # 127, the exact result
        saturated = round(c // 2 * 32767 / 4096.0)      # 64
        if np.all(y == saturated):
            _U8S8_SATURATES = True
        elif np.all(y == exact):
            _U8S8_SATURATES = False
        else:
            raise RuntimeError(f"unexpected U8S8 probe result {np.unique(y)}")
    return _U8S8_SATURATES


def gemm_accumulate(x: np.ndarray, x_zp: int, w: np.ndarray, w_zp, bias: np.ndarray | None,
                    *, u8s8_pair_saturation: bool = False) -> np.ndarray:
    """Exact int32 accumulators of a quantised matrix product (QGemm, QLinearMatMul).

    ``x``: ``(M, K)`` 8-bit codes; ``w``: ``(N, K)`` int8 (the ``transB = 1`` layout; pass
    ``w.T`` for a MatMul weight ``(K, N)``); ``w_zp``: scalar or per column ``(N,)``;
    ``bias``: int32 ``(N,)`` or ``None``. Returns ``(M, N)`` int32; requantise with
    ``requantize(acc, requant_multiplier(x_s, w_s, y_s), y_zp, lo, hi, channel_axis=1)``.

    It is a 1×1 convolution over ``M`` pixels, so the arithmetic (and the U8S8 pair saturation
    along K of uint8 × int8 products, ``u8s8_pair_saturation=True``) is that of
    :func:`conv_accumulate`. QGemm computes its multiplier as ``float32(float32(alpha·x_s)·w_s)
    / y_s`` = :func:`requant_multiplier` for ``alpha = 1``, and adds the int32 bias to the
    accumulator before requantisation.
    """
    x = np.asarray(x)
    w = np.asarray(w)
    m, k = x.shape
    n = w.shape[0]
    acc = conv_accumulate(x.T.reshape(k, m, 1), x_zp, w.reshape(n, k, 1, 1), w_zp, bias,
                          u8s8_pair_saturation=u8s8_pair_saturation)
    return np.ascontiguousarray(acc[:, :, 0].T)


# -- float32 helpers ----------------------------------------------------------------------------

def fma_f32(a, b, c) -> np.ndarray:
    """Correctly rounded float32 fused multiply-add ``a·b + c`` (one rounding, to nearest even),
    as the x86 ``vfmadd`` instructions compute it, for float32 inputs.

    The product of two float32 is exact in float64; the float64 sum is made exact with a
    TwoSum error term, and the only case where rounding that sum to float32 could differ from
    rounding the exact value — the float64 sum lying exactly halfway between two float32 while
    the error term is non-zero — is resolved towards the error term's sign.
    """
    a = np.asarray(a, dtype=np.float32).astype(np.float64)
    b = np.asarray(b, dtype=np.float32).astype(np.float64)
    c = np.asarray(c, dtype=np.float32).astype(np.float64)
    p = a * b
    s = p + c
    bv = s - p
    e = (p - (s - bv)) + (c - bv)
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    other = np.nextafter(r, np.where(r64 > s, -np.inf, np.inf).astype(np.float32))
    mid = (r64 + other.astype(np.float64)) * 0.5
    halfway = (s == mid) & (e != 0)
    # halfway: pick the neighbour on the side of the error term
    lo_v = np.minimum(r, other)
    hi_v = np.maximum(r, other)
    fixed = np.where(e > 0, hi_v, lo_v)
    return np.where(halfway, fixed, r).astype(np.float32)


def _cvtps_pack(t: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``_mm_cvtps_epi32`` (round half to even; NaN or |t| ≥ 2**31 gives INT32_MIN) followed by
    the saturating packs to 8 bits: returns int32 in ``[lo, hi]``."""
    t = np.asarray(t, dtype=np.float32)
    r = np.rint(t).astype(np.float64)
    bad = ~np.isfinite(r) | (r >= 2.0**31) | (r < -2.0**31)
    ri = np.where(bad, _INT_MIN, np.where(bad, 0, r)).astype(np.int64)
    return np.clip(ri, lo, hi).astype(np.int32)


def _quantize_linear(v: np.ndarray, y_scale, y_zp: int, signed: bool) -> np.ndarray:
    """QuantizeLinear / ``MlasQuantizeLinear``: ``clamp(rint(float32(v / y_s)) + y_zp)``."""
    lo, hi = qrange(signed)
    q = np.asarray(v, dtype=np.float32) / np.float32(y_scale)
    q = np.clip(q, np.float32(lo - int(y_zp)), np.float32(hi - int(y_zp)))
    return (np.rint(q).astype(np.int64) + int(y_zp)).astype(np.int32)


def _dequantize(x: np.ndarray, x_scale, x_zp: int) -> np.ndarray:
    """DequantizeLinear: ``float32(x − x_zp) · x_s`` (one float32 rounding)."""
    return (np.asarray(x).astype(np.int32) - int(x_zp)).astype(np.float32) * np.float32(x_scale)


# -- element-wise binary operations ------------------------------------------------------------

def qlinear_add_params(a_scale, a_zp: int, b_scale, b_zp: int, y_scale, y_zp: int
                       ) -> tuple[np.float32, np.float32, np.float32]:
    """The three float32 constants of onnxruntime's QLinearAdd (``MlasQLinearAdd`` AVX2
    kernel), for operand A (the one streamed along the span) and B::

        r_a   = float32(a_s / y_s)
        r_b   = float32(b_s / y_s)
        fixed = float32(y_zp − fma(a_zp, r_a, float32(r_b · b_zp)))

    (the compiler contracted ``r_a·a_zp + r_b·b_zp`` into one fused multiply-add).
    """
    ra = np.float32(np.float32(a_scale) / np.float32(y_scale))
    rb = np.float32(np.float32(b_scale) / np.float32(y_scale))
    inner = fma_f32(np.float32(int(a_zp)), ra, np.float32(rb * np.float32(int(b_zp))))
    fixed = np.float32(np.float32(int(y_zp)) - inner)
    return ra, rb, fixed


def _first_is_span_scalar(a_shape, b_shape) -> bool:
    """onnxruntime's broadcaster walks spans over the innermost dimensions; when input 0 is
    constant along the innermost non-trivial output dimension while input 1 varies (e.g.
    ``(C, 1, 1) + (C, H, W)``), QLinearAdd/QLinearMul are called with the operands swapped
    (input 1 as A, input 0 as the scalar B)."""
    out = np.broadcast_shapes(tuple(a_shape), tuple(b_shape))
    nd = len(out)
    a = (1,) * (nd - len(a_shape)) + tuple(a_shape)
    for k in range(nd - 1, -1, -1):
        if out[k] != 1:
            return a[k] == 1
    return False


def qlinear_add(a: np.ndarray, a_scale, a_zp: int, b: np.ndarray, b_scale, b_zp: int,
                y_scale, y_zp: int, signed: bool) -> np.ndarray:
    """onnxruntime QLinearAdd (QDQ ``Add``), bit-exact; numpy broadcasting of ``a`` and ``b``.

    MLAS AVX2 kernel ``MlasQLinearAddKernelAvx2Helper``, with A the operand walked along the
    span (input 0, unless input 0 is the broadcast one — then the operands swap) and the
    constants of :func:`qlinear_add_params`; for raw codes ``a``, ``b``::

        t = fma(a, r_a, fma(b, r_b, fixed))          two float32 fused multiply-adds
        y = sat8(cvtps_epi32(t))                      round half to even, saturate

    (a broadcast B is folded into the fixed part with the same ``fma``, so the result is the
    same). ``cvtps_epi32`` of a value out of the int32 range gives INT32_MIN, i.e. ``lo``.
    The result depends only on the two 8-bit codes: a 256×256 function.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if _first_is_span_scalar(a.shape, b.shape):
        a, b = b, a
        a_scale, a_zp, b_scale, b_zp = b_scale, b_zp, a_scale, a_zp
    ra, rb, fixed = qlinear_add_params(a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)
    return qlinear_add_codes(a, b, ra, rb, fixed, signed)


def qlinear_add_codes(a: np.ndarray, b: np.ndarray, r_a, r_b, fixed, signed: bool
                      ) -> np.ndarray:
    """QLinearAdd from its float32 constants (:func:`qlinear_add_params`), as the hardware
    holds them: ``sat8(cvtps_epi32(fma(a, r_a, fma(b, r_b, fixed))))`` for raw codes, ``a``
    being the span operand (the caller has applied onnxruntime's operand swap, see
    :func:`qlinear_add`); numpy broadcasting."""
    a = np.asarray(a)
    b = np.asarray(b)
    ra, rb, fixed = np.float32(r_a), np.float32(r_b), np.float32(fixed)
    lo, hi = qrange(signed)
    if max(a.size, b.size) > 1 << 16:
        # Large tensors: evaluate the 256×256 function once and look it up (same values).
        # Each operand's rows follow its own type: a negative value means int8; without one,
        # bytes 0..127 read the same either way and bytes ≥ 128 can only be uint8 values.
        a_codes = _codes(bool((a < 0).any())).astype(np.float32)
        b_codes = _codes(bool((b < 0).any())).astype(np.float32)
        table = _cvtps_pack(fma_f32(a_codes[:, None], ra, fma_f32(b_codes[None, :], rb, fixed)),
                            lo, hi)
        return table[a.astype(np.int64) & 0xFF, b.astype(np.int64) & 0xFF]
    t = fma_f32(a.astype(np.float32), ra, fma_f32(b.astype(np.float32), rb, fixed))
    return _cvtps_pack(t, lo, hi)


def qlinear_mul_multiplier(a_scale, b_scale, y_scale) -> np.float32:
    """float32(float32(a_s · b_s) / y_s), the one constant of QLinearMul."""
    return np.float32(np.float32(np.float32(a_scale) * np.float32(b_scale)) / np.float32(y_scale))


def qlinear_mul(a: np.ndarray, a_scale, a_zp: int, b: np.ndarray, b_scale, b_zp: int,
                y_scale, y_zp: int, signed: bool) -> np.ndarray:
    """onnxruntime QLinearMul (QDQ ``Mul``, e.g. the squeeze-and-excitation channel scale
    ``x (C,H,W) · s (C,1,1)``), bit-exact; numpy broadcasting.

    MLAS ``MlasQLinearMulKernel`` (SSE2, no FMA)::

        p = (a − a_zp)(b − b_zp)                               exact int32 (|p| ≤ 65025)
        t = float32(float32(float32(p) · m) + float32(y_zp))   m = qlinear_mul_multiplier
        y = sat8(cvtps_epi32(t))                               round half to even

    The zero point is added in float32 *before* rounding (this is not ``rint(p·m) + y_zp``:
    the addition can round ``k.49999997 + zp`` up to a tie). Symmetric in the operands, so the
    broadcast order does not matter.
    """
    return qlinear_mul_codes(a, a_zp, b, b_zp, qlinear_mul_multiplier(a_scale, b_scale, y_scale),
                             y_zp, signed)


def qlinear_mul_codes(a: np.ndarray, a_zp: int, b: np.ndarray, b_zp: int, multiplier,
                      y_zp: int, signed: bool) -> np.ndarray:
    """QLinearMul from its float32 constant (:func:`qlinear_mul_multiplier`):
    ``sat8(cvtps_epi32(float32(float32(float32(p)·m) + y_zp)))`` with
    ``p = (a − a_zp)(b − b_zp)``."""
    m = np.float32(multiplier)
    p = ((np.asarray(a).astype(np.int32) - int(a_zp)) *
         (np.asarray(b).astype(np.int32) - int(b_zp)))
    t = (p.astype(np.float32) * m).astype(np.float32) + np.float32(int(y_zp))
    lo, hi = qrange(signed)
    return _cvtps_pack(t, lo, hi)


# -- float paths (node units onnxruntime leaves unfused) ----------------------------------------

def dq_add_q(a: np.ndarray, a_scale, a_zp: int, b: np.ndarray, b_scale, b_zp: int,
             y_scale, y_zp: int, signed: bool) -> np.ndarray:
    """``DQ → Add (float) → Q``, bit-exact: what onnxruntime runs for an Add node unit it does
    not fuse (int8 QDQ models on x86 whose Q/DQ pairs were partly converted to uint8, see
    :func:`qlinear_add`; or any model at ORT_DISABLE_ALL)::

        y = clamp(rint(float32(float32(float32(a − a_zp)·a_s + float32(b − b_zp)·b_s) / y_s))
                  + y_zp)

    Every step is one IEEE float32 operation, so this is exact. It differs from QLinearAdd in
    a small fraction of outputs (by 1)."""
    v = _dequantize(a, a_scale, a_zp) + _dequantize(b, b_scale, b_zp)
    return _quantize_linear(v, y_scale, y_zp, signed)


def dq_mul_q(a: np.ndarray, a_scale, a_zp: int, b: np.ndarray, b_scale, b_zp: int,
             y_scale, y_zp: int, signed: bool) -> np.ndarray:
    """``DQ → Mul (float) → Q``, bit-exact (the unfused counterpart of :func:`qlinear_mul`)::

        y = clamp(rint(float32(float32(float32(a − a_zp)·a_s · float32(b − b_zp)·b_s) / y_s))
                  + y_zp)"""
    v = _dequantize(a, a_scale, a_zp) * _dequantize(b, b_scale, b_zp)
    return _quantize_linear(v, y_scale, y_zp, signed)


def dq_global_avg_pool_q(x: np.ndarray, x_scale, x_zp: int, y_scale, y_zp: int,
                         signed: bool) -> np.ndarray:
    """``DQ → GlobalAveragePool (float) → Q`` as MLAS ``MlasPoolGlobalKernel`` sums (the
    unfused counterpart of :func:`qlinear_global_avg_pool`, NCHW float kernel). ``x``:
    ``(..., H, W)``, ``N = H·W``, ``v`` the dequantised values in memory order::

        lane[j] = (((0 + v[j]) + v[j+4]) + v[j+8]) + …     j = 0..3, over the first 4·⌊N/4⌋
        s = (lane0 + lane2) + (lane1 + lane3)              SSE horizontal add
        s = ((s + v[4⌊N/4⌋]) + …) + v[N−1]                 the tail, in order
        y = clamp(rint(float32(float32(s / float32(N)) / y_s)) + y_zp)

    all in float32."""
    x = np.asarray(x)
    v = _dequantize(x, x_scale, x_zp).reshape(x.shape[:-2] + (-1,))
    n = v.shape[-1]
    body = (n // 4) * 4
    lanes = np.zeros(v.shape[:-1] + (4,), dtype=np.float32)
    blocks = v[..., :body].reshape(v.shape[:-1] + (n // 4, 4))
    for k in range(n // 4):
        lanes = (lanes + blocks[..., k, :]).astype(np.float32)
    s = ((lanes[..., 0] + lanes[..., 2]).astype(np.float32) +
         (lanes[..., 1] + lanes[..., 3]).astype(np.float32)).astype(np.float32)
    for k in range(body, n):
        s = (s + v[..., k]).astype(np.float32)
    avg = (s / np.float32(n)).astype(np.float32)
    return _quantize_linear(avg, y_scale, y_zp, signed)[..., None, None]


# -- pooling -------------------------------------------------------------------------------------

def global_avg_pool_multiplier(x_scale, y_scale, image_size: int) -> np.float32:
    """float32(x_s / float32(y_s · float32(N))) — QLinearGlobalAveragePool's requantisation
    multiplier for ``N = H·W`` (``CheckQLinearGlobalAveragePoolScaleAndSize``)."""
    return np.float32(np.float32(x_scale) /
                      np.float32(np.float32(y_scale) * np.float32(int(image_size))))


def qlinear_global_avg_pool(x: np.ndarray, x_scale, x_zp: int, y_scale, y_zp: int,
                            signed: bool) -> np.ndarray:
    """onnxruntime QLinearGlobalAveragePool, bit-exact. ``x``: ``(..., H, W)``; returns
    ``(..., 1, 1)`` int32.

    MLAS ``MlasQLinearGlobalAveragePoolNchw``: an exact integer sum, then
    ``MlasRequantizeOutput``::

        acc = Σ x − x_zp·N                                     exact int32, N = H·W
        y   = clamp(rint(float32(acc) · global_avg_pool_multiplier(x_s, y_s, N)) + y_zp)

    QLinearAveragePool whose kernel covers the whole (unpadded) input falls back to this.
    """
    x = np.asarray(x)
    n = x.shape[-1] * x.shape[-2]
    return global_avg_pool_codes(x, x_zp, global_avg_pool_multiplier(x_scale, y_scale, n), y_zp,
                                 signed)


def global_avg_pool_codes(x: np.ndarray, x_zp: int, multiplier, y_zp: int,
                          signed: bool) -> np.ndarray:
    """QLinearGlobalAveragePool from its float32 constant (:func:`global_avg_pool_multiplier`
    of the input's ``H·W``): ``requantize(Σx − x_zp·N, multiplier, y_zp)``; returns
    ``(..., 1, 1)``."""
    x = np.asarray(x)
    n = x.shape[-1] * x.shape[-2]
    acc = x.astype(np.int64).sum(axis=(-2, -1), keepdims=True) - int(x_zp) * n
    lo, hi = qrange(signed)
    return requantize(acc, np.float32(multiplier), y_zp, lo, hi)


def pool_output_size(size: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                     ceil_mode: bool = False) -> int:
    """Output length of a pooling window along one axis (onnxruntime ``PoolAttributes``): floor
    or ceil of ``(size + pads − kernel) / stride`` + 1; with ``ceil_mode`` a last window that
    would start in the end padding is dropped."""
    span = size + pad_begin + pad_end - kernel
    if ceil_mode:
        out = -(-span // stride) + 1
        if (out - 1) * stride >= size + pad_begin:
            out -= 1
    else:
        out = span // stride + 1
    return int(out)


def _pool_geometry(x, kernel, stride, pads, ceil_mode, out_hw):
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride)
    top, left, bottom, right = _pads4(pads)
    h, w = x.shape[-2:]
    if out_hw is None:
        out_hw = (pool_output_size(h, kh, sh, top, bottom, ceil_mode),
                  pool_output_size(w, kw, sw, left, right, ceil_mode))
    oh, ow = out_hw
    # enough room for every window, including ceil-mode windows past the end padding
    eb = max(bottom, (oh - 1) * sh + kh - top - h)
    er = max(right, (ow - 1) * sw + kw - left - w)
    return (kh, kw), (sh, sw), (top, left, eb, er), (oh, ow)


def qlinear_avg_pool(x: np.ndarray, x_scale, x_zp: int, y_scale, y_zp: int, signed: bool,
                     kernel, stride, pads=0, count_include_pad: bool = False,
                     ceil_mode: bool = False, out_hw: tuple[int, int] | None = None
                     ) -> np.ndarray:
    """onnxruntime QLinearAveragePool (QDQ ``AveragePool``), bit-exact. ``x``: ``(..., H, W)``.

    The kernel (``QLinearPool2DTask<AveragePool>``) works in float32::

        v   = float32(x − x_zp) · x_s                   dequantised (one rounding)
        s   = (((0 + v_00) + v_01) + …)                  float32 adds, row by row over the
                                                         window clipped to the input
        avg = float32(s / float32(n))                    n = kh·kw if count_include_pad else
                                                         the number of clipped-window elements
        y   = clamp(rint(float32(float32(avg / y_s) + float32(y_zp))))   half to even

    Windows are clipped to the input (``hend = min(hstart + kh, H)``), so with ``ceil_mode`` and
    ``count_include_pad`` the divisor stays ``kh·kw`` even for windows reaching past the end
    padding. A kernel equal to the unpadded input falls back to
    :func:`qlinear_global_avg_pool` (integer arithmetic), as onnxruntime does. ``kernel``,
    ``stride``: int or (h, w); ``pads``: int, (h, w) or (top, left, bottom, right).
    """
    x = np.asarray(x)
    kh, kw = _pair(kernel)
    top, left, bottom, right = _pads4(pads)
    if (kh, kw) == x.shape[-2:] and (top, left, bottom, right) == (0, 0, 0, 0):
        return qlinear_global_avg_pool(x, x_scale, x_zp, y_scale, y_zp, signed)
    (kh, kw), (sh, sw), (t, l, b, r), (oh, ow) = _pool_geometry(
        x, kernel, stride, pads, ceil_mode, out_hw)
    h, w = x.shape[-2:]
    lead = [(0, 0)] * (x.ndim - 2)
    v = _dequantize(x, x_scale, x_zp)
    vp = np.pad(v, lead + [(t, b), (l, r)])           # 0.0 outside: adding +0 changes nothing
    valid = np.pad(np.ones((h, w), np.int32), [(t, b), (l, r)])
    s = np.zeros(x.shape[:-2] + (oh, ow), dtype=np.float32)
    n = np.zeros((oh, ow), dtype=np.int32)
    for ky in range(kh):
        for kx in range(kw):
            sl = (slice(ky, ky + sh * (oh - 1) + 1, sh), slice(kx, kx + sw * (ow - 1) + 1, sw))
            s = (s + vp[(...,) + sl]).astype(np.float32)
            n += valid[sl]
    if count_include_pad:
        n = np.full((oh, ow), kh * kw, dtype=np.int32)
    avg = (s / n.astype(np.float32)).astype(np.float32)
    q = ((avg / np.float32(y_scale)).astype(np.float32) + np.float32(int(y_zp))).astype(np.float32)
    lo, hi = qrange(signed)
    return np.clip(np.rint(q).astype(np.int64), lo, hi).astype(np.int32)


def max_pool(x: np.ndarray, kernel, stride, pads=0, out_hw: tuple[int, int] | None = None, *,
             ceil_mode: bool = False) -> np.ndarray:
    """Max pooling of 8-bit codes, ``x``: ``(..., H, W)``; returns int32 codes.

    onnxruntime drops the DQ/Q pair around a MaxPool whose input and output quantisation are
    equal and runs MaxPool on the 8-bit tensor: the exact integer maximum over the window
    clipped to the input (padding never wins). With different scales it runs
    DQ → float MaxPool → Q, which equals ``apply_table(max_pool(x), requant_table(...))``
    because both maps are monotonic. ``kernel``, ``stride``: int or (h, w); ``pads``: int,
    (h, w) or (top, left, bottom, right); ``out_hw`` overrides the output size, otherwise it
    follows :func:`pool_output_size` with ``ceil_mode``.
    """
    x = np.asarray(x)
    (kh, kw), (sh, sw), (t, l, b, r), (oh, ow) = _pool_geometry(
        x, kernel, stride, pads, ceil_mode, out_hw)
    lead = [(0, 0)] * (x.ndim - 2)
    xp = np.pad(x.astype(np.int32), lead + [(t, b), (l, r)], constant_values=-2**31)
    y = np.full(x.shape[:-2] + (oh, ow), -2**31, dtype=np.int32)
    for ky in range(kh):
        for kx in range(kw):
            np.maximum(y, xp[..., ky:ky + sh * (oh - 1) + 1:sh, kx:kx + sw * (ow - 1) + 1:sw],
                       out=y)
    return y


def upsample_nearest2x(x: np.ndarray) -> np.ndarray:
    """Resize(mode="nearest", scales (1, 1, 2, 2)) of 8-bit codes: ``y[i, j] = x[i // 2, j // 2]``
    (for every coordinate_transformation_mode/nearest_mode onnxruntime's quantizer emits:
    half_pixel and asymmetric with round_prefer_floor or floor). onnxruntime runs Resize on the
    8-bit tensor when input and output quantisation agree; otherwise DQ → Resize → Q, i.e. this
    followed by :func:`requant_table`."""
    x = np.asarray(x)
    return x.repeat(2, axis=-2).repeat(2, axis=-1).astype(np.int32)


# -- tables --------------------------------------------------------------------------------------

def _codes(signed: bool) -> np.ndarray:
    """The 256 codes in table order: index = raw byte (``x & 0xFF``)."""
    return np.arange(256, dtype=np.uint8).view(np.int8 if signed else np.uint8)


def requant_table(x_scale, x_zp: int, y_scale, y_zp: int, signed: bool,
                  y_signed: bool | None = None) -> np.ndarray:
    """256-entry requantisation table ``Q_y(DQ_x(code))``, indexed by the raw byte.

    ``QlinearBuildLookupTable`` with the identity (QLinearConcat) and the DQ → MaxPool/Resize →
    Q float path both compute ``clamp(rint(float32(float32(x − x_zp)·x_s) / y_s) + y_zp)``
    (``MlasQuantizeLinear``: a float32 division, round half to even)."""
    y_signed = signed if y_signed is None else y_signed
    return _quantize_linear(_dequantize(_codes(signed), x_scale, x_zp), y_scale, y_zp, y_signed)


def qlinear_concat(inputs: Sequence[tuple[np.ndarray, float, int]], y_scale, y_zp: int,
                   signed: bool, axis: int = 0) -> np.ndarray:
    """onnxruntime QLinearConcat (QDQ ``Concat``): every input ``(x, x_scale, x_zp)`` is copied
    when its scale and zero point equal the output's, otherwise mapped through its own
    :func:`requant_table`; the results are concatenated along ``axis`` (channels of a
    ``(C, H, W)`` tensor by default) — in hardware, writes at the destination's channel
    offset."""
    parts = []
    for x, s, z in inputs:
        x = np.asarray(x)
        if np.float32(s) == np.float32(y_scale) and int(z) == int(y_zp):
            parts.append(x.astype(np.int32))
        else:
            parts.append(apply_table(x, requant_table(s, z, y_scale, y_zp, signed), signed))
    return np.concatenate(parts, axis=axis)


def apply_table(x: np.ndarray, table: np.ndarray, signed: bool) -> np.ndarray:
    """Look 8-bit codes up in a 256-entry table indexed by the raw byte (``x & 0xFF``), as
    ``QLinearLookupTableTransform`` does. ``table``: ``(256,)``, or ``(C, 256)`` for one table
    per channel along axis 0 of ``x`` (``(C, ...)``). Returns int32. ``signed`` is the input
    type (accepted for symmetry; the byte index is the same for both)."""
    del signed
    idx = np.asarray(x).astype(np.int64) & 0xFF
    table = np.asarray(table).astype(np.int32)
    if table.ndim == 1:
        return table[idx]
    c = table.shape[0]
    return table[np.arange(c).reshape((c,) + (1,) * (idx.ndim - 1)), idx]


def onnx_op(op_type: str, *const_inputs, **attrs) -> Callable:
    """An ``op_builder`` for :func:`activation_table`: one ONNX node ``op_type`` whose first
    input is the dequantised tensor, the remaining inputs float32 constants (``None`` leaves an
    optional input empty) and ``attrs`` its attributes. ``onnx_op("Clip", 0.0, 6.0)`` is Relu6,
    ``onnx_op("LeakyRelu", alpha=0.1)``, ``onnx_op("PRelu", slope[:, None, None])``."""
    def build(inp: str, out: str):
        from onnx import helper, numpy_helper
        names, inits = [inp], []
        for k, v in enumerate(const_inputs):
            if v is None:
                names.append("")
                continue
            name = f"{op_type.lower()}_c{k}"
            inits.append(numpy_helper.from_array(np.asarray(v, dtype=np.float32), name))
            names.append(name)
        return [helper.make_node(op_type, names, [out], **attrs)], inits
    return build


def activation_table(op_builder, x_scale, x_zp: int, x_signed: bool, y_scale, y_zp: int,
                     y_signed: bool, *, channels: int | None = None,
                     opset: int = 17) -> np.ndarray:
    """The exact int8 → int8 table of a unary QDQ op, ``DQ → op → Q``, built by running
    onnxruntime itself (default session options, CPU) on all 256 input codes — exact by
    construction, whatever kernel onnxruntime picks (QLinearSigmoid, QLinearLeakyRelu or the
    float op between DequantizeLinear and QuantizeLinear). Every unary op onnxruntime computes
    element-wise without dependence on the position in the tensor is covered; the tests check
    position independence on odd-sized tensors.

    ``op_builder``: an op type (``"Sigmoid"``), or a callable ``(input_name, output_name) ->
    nodes`` or ``(nodes, initializers)`` (see :func:`onnx_op`); it may build several nodes
    (e.g. HardSwish exported as ``x · HardSigmoid(x)`` in float, or a DQ'd PRelu slope).
    Returns ``(256,)`` int32 values indexed by the raw input byte (:func:`apply_table`).

    ``channels=C`` builds one table per channel (input ``(1, C, 16, 16)``, every channel holding
    all 256 codes) and returns ``(C, 256)``: PRelu with a per-channel slope needs one table per
    *distinct* slope value (at most C); the entries for codes ``≥ x_zp`` are the same in all of
    them (the identity requantisation), only the ``x_zp − lo`` codes below the zero point differ.

    Composite SiLU/Swish exported as ``x · Sigmoid(x)`` with QDQ around both nodes is a
    QLinearSigmoid table followed by a QLinearMul of ``x`` with the table output; since both
    depend only on the code of ``x`` it collapses into one table, :func:`qlinear_silu_table`.
    """
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    def qt(signed):
        return TensorProto.INT8 if signed else TensorProto.UINT8

    if isinstance(op_builder, str):
        op_builder = onnx_op(op_builder)
    built = op_builder("x_deq", "y_float")
    nodes, inits = (built if isinstance(built, tuple) else (built, []))
    c = 1 if channels is None else int(channels)
    zx = np.array(x_zp, dtype=np.int8 if x_signed else np.uint8)
    zy = np.array(y_zp, dtype=np.int8 if y_signed else np.uint8)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "x_scale", "x_zp"], ["x_deq"]),
         *nodes,
         helper.make_node("QuantizeLinear", ["y_float", "y_scale", "y_zp"], ["y"])],
        "activation_table",
        [helper.make_tensor_value_info("x", qt(x_signed), [1, c, 16, 16])],
        [helper.make_tensor_value_info("y", qt(y_signed), [1, c, 16, 16])],
        [numpy_helper.from_array(np.array(x_scale, dtype=np.float32), "x_scale"),
         numpy_helper.from_array(zx, "x_zp"),
         numpy_helper.from_array(np.array(y_scale, dtype=np.float32), "y_scale"),
         numpy_helper.from_array(zy, "y_zp"), *inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 8)
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    codes = np.broadcast_to(_codes(x_signed).reshape(1, 1, 16, 16), (1, c, 16, 16))
    y = sess.run(None, {"x": np.ascontiguousarray(codes)})[0].astype(np.int32)
    table = y.reshape(c, 256)
    return table[0] if channels is None else table


def qlinear_silu_table(x_scale, x_zp: int, sigmoid_table: np.ndarray, sigmoid_scale,
                       sigmoid_zp: int, y_scale, y_zp: int, signed: bool,
                       mul: str = "qlinear") -> np.ndarray:
    """SiLU/Swish exported as ``Mul(x, Sigmoid(x))`` with QDQ around both ops: a Sigmoid table
    (``sigmoid_table`` = :func:`activation_table` of Sigmoid with output quantisation
    ``(sigmoid_scale, sigmoid_zp)``) and then the product of ``x`` and that output::

        mul="qlinear":  y = qlinear_mul(x, x_s, x_zp, sig[x], sig_s, sig_zp, y_s, y_zp)
        mul="float":    y = dq_mul_q(x, x_s, x_zp, sig[x], sig_s, sig_zp, y_s, y_zp)

    uint8 graphs get QLinearSigmoid + QLinearMul ("qlinear"). In int8 graphs on x86 the
    Sigmoid's Q→DQ pair is converted to uint8, so neither node unit is fused and the Mul runs
    in float ("float") — unless the surrounding pairs were converted too (see the module notes);
    the optimised graph decides. Both factors are functions of the code of ``x``, so the whole
    op is this 256-entry table (indexed by the raw byte; apply with :func:`apply_table`).
    :func:`activation_table` with the composite as ``op_builder`` gives the same table straight
    from onnxruntime."""
    codes = _codes(signed)
    sig = apply_table(codes, sigmoid_table, signed)
    f = {"qlinear": qlinear_mul, "float": dq_mul_q}[mul]
    return f(codes, x_scale, x_zp, sig, sigmoid_scale, sigmoid_zp, y_scale, y_zp, signed)
