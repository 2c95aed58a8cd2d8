"""The numeric contract: the integer and float32 arithmetic every executor reproduces.

The reference is onnxruntime's CPU execution of an int8 QDQ model. The golden model calls these
functions; the RTL blocks are tested against them. Nothing else may re-implement them.

Convolution (onnxruntime QLinearConv, reproduced exactly)::

    acc = Σ (x − x_zp)(w − w_zp) + bias                      exact int32
    y   = clamp(rint(float32(acc) · float32(x_s·w_s / y_s)) + y_zp, lo, hi)

with ``rint`` rounding half to even, and ``lo``/``hi`` the output type's range narrowed by an
absorbed Relu/Clip.
"""

from __future__ import annotations

import numpy as np

__all__ = ["qrange", "requant_multiplier", "requantize", "conv_accumulate"]


def qrange(signed: bool) -> tuple[int, int]:
    """Value range of an 8-bit tensor."""
    return (-128, 127) if signed else (0, 255)


def requant_multiplier(x_scale, w_scale, y_scale) -> np.ndarray:
    """float32(x_s · w_s / y_s), per output channel, computed as onnxruntime does: the
    products and quotient in float32."""
    x_scale = np.float32(x_scale)
    w_scale = np.asarray(w_scale, dtype=np.float32)
    return (x_scale * w_scale / np.float32(y_scale)).astype(np.float32)


def requantize(acc: np.ndarray, multiplier, zero_point: int, lo: int, hi: int,
               channel_axis: int = 0) -> np.ndarray:
    """int32 accumulators → 8-bit outputs (as int32 values in ``[lo, hi]``).

    ``multiplier`` is a float32 scalar or one value per channel along ``channel_axis``.
    float32(acc) rounds to nearest even; the product is a single float32 multiply; the
    result rounds half to even before the zero point is added.
    """
    acc = np.asarray(acc, dtype=np.int32)
    m = np.asarray(multiplier, dtype=np.float32)
    if m.ndim == 1:
        shape = [1] * acc.ndim
        shape[channel_axis] = m.size
        m = m.reshape(shape)
    scaled = acc.astype(np.float32) * m
    y = np.rint(scaled).astype(np.int64) + int(zero_point)
    return np.clip(y, lo, hi).astype(np.int32)


def conv_accumulate(x: np.ndarray, x_zp: int, w: np.ndarray, w_zp, bias: np.ndarray | None,
                    stride: tuple[int, int] = (1, 1),
                    pads: tuple[int, int, int, int] = (0, 0, 0, 0),
                    depthwise: bool = False) -> np.ndarray:
    """Exact int32 accumulators of a convolution.

    ``x``: ``(C, H, W)`` int8/uint8; ``w``: ``(O, I, kh, kw)`` int8 (``I = 1`` when
    ``depthwise``); ``w_zp``: scalar or per output channel; ``pads``: top, left, bottom, right,
    filled with ``x_zp`` (so padding contributes zero); ``bias``: int32 per output channel.
    Returns ``(O, OH, OW)`` int32. Vectorised over output pixels: one matrix product per tap.
    """
    # float64 holds every partial sum exactly (|acc| < 2**53 for any layer of 8-bit data),
    # and lets numpy use BLAS: one matrix product per kernel tap.
    x = np.asarray(x).astype(np.float64) - int(x_zp)
    w = np.asarray(w)
    o, i, kh, kw = w.shape
    w_zp = np.asarray(w_zp, dtype=np.float64)
    wz = w.astype(np.float64) - (w_zp.reshape(-1, 1, 1, 1) if w_zp.ndim else w_zp)
    top, left, bottom, right = pads
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right)))  # zero after the zp shift
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
    if acc.size and (acc.min() < -2**31 or acc.max() >= 2**31):
        raise OverflowError("convolution accumulator exceeds int32")
    return acc.astype(np.int32)
