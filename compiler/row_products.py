"""Matrix products over rows as 1×1 convolutions over pixels.

A transformer block or a sequence head (SVTR, CTC) multiplies a ``(T, K)`` activation matrix
by a constant ``(K, N)`` weight: ``Gemm`` or ``MatMul`` on the rows of a sequence. The
accelerator's matrix product is a convolution, so each row becomes a pixel: the rewrite turns

    codes (T, K) → DQ → Gemm(W, b) → Q → codes (T, N)

into

    codes (T, K) → DQ → Transpose → Reshape (1, K, 1, T) → Q → codes ─┐  host
    ┌─────────────────────────────────────────────────────────────────┘
    └→ DQ → Conv 1×1 (W as (N, K, 1, 1), b) → Q → codes (1, N, 1, T) ─┐  accelerator
    ┌─────────────────────────────────────────────────────────────────┘
    └→ DQ → Reshape (N, T) → Transpose → (T, N) → the original Q      host

with every Q of the layout change quantising as the codes it re-arranges: ``Q(DQ(c)) = c``
for 8-bit codes, so the host's glue moves codes without changing one. The convolution
computes the same int32 sums with the same per-channel requantisation as the product, so the
partitioned model gives onnxruntime's bits on the original model.

:func:`rows_as_pixels` applies it where it is exact: a 2-D (or leading-1 3-D) activation with
more than one row, quantised per tensor; int8 constant weights per tensor or per output
column; ``Gemm`` without ``alpha`` or ``beta`` (``transA`` reads the
activation as (K, T)); an output read only by
QuantizeLinear. A single row (a classifier's flattened features) keeps the importer's fully
connected path.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .importer import _attr, _Model

__all__ = ["rows_as_pixels"]


def _const_dq(g: _Model, name: str) -> onnx.NodeProto | None:
    """The DequantizeLinear of a constant that produces ``name``, if one does."""
    p = g.producer.get(name)
    if p is not None and p.op_type == "DequantizeLinear" and p.input[0] in g.consts:
        return p
    return None


def _activation_dq(g: _Model, name: str) -> onnx.NodeProto | None:
    """The DequantizeLinear of 8-bit codes, per tensor, that produces ``name``, if one does."""
    p = g.producer.get(name)
    if p is None or p.op_type != "DequantizeLinear" or p.input[0] in g.consts:
        return None
    if g.consts.get(p.input[1], np.zeros(2)).size != 1:
        return None
    return p


class _Rewrite:
    """One product at a time; new names carry the product's output name."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.g = _Model(model)

    def candidate(self, node: onnx.NodeProto):
        """(activation DQ, weight (N, K) int8, its scale, zero point, rows T, leading rank)
        when ``node`` is a row product the rewrite keeps exact, else None."""
        g = self.g
        if node.op_type not in ("Gemm", "MatMul") or len(node.input) < 2:
            return None
        if node.op_type == "Gemm" and (_attr(node, "alpha", 1.0) != 1.0 or
                                       _attr(node, "beta", 1.0) != 1.0):
            return None
        a_dq, w_dq = _activation_dq(g, node.input[0]), _const_dq(g, node.input[1])
        shape = g.shapes.get(node.input[0], ())
        if a_dq is None or w_dq is None or len(shape) not in (2, 3) or 0 in shape:
            return None
        if len(shape) == 3 and shape[0] != 1:
            return None
        # transA: the activation is stored (K, T), already the map's layout
        trans_a = bool(node.op_type == "Gemm" and _attr(node, "transA", 0))
        rows, features = (shape[-1], shape[-2]) if trans_a else (shape[-2], shape[-1])
        if rows < 2:
            return None
        users = g.consumers.get(node.output[0], [])
        if not users or any(u.op_type != "QuantizeLinear" for u in users):
            return None
        weight = g.consts[w_dq.input[0]]
        if weight.ndim != 2 or weight.dtype != np.int8 or len(w_dq.input) < 3:
            return None
        scale, zp = g.consts.get(w_dq.input[1]), g.consts.get(w_dq.input[2])
        if scale is None or zp is None:
            return None
        axis = _attr(w_dq, "axis", 1)
        trans_b = node.op_type == "Gemm" and _attr(node, "transB", 0)
        if trans_b:     # (N, K): a column's scale sits on axis 0
            per_column = axis in (0, -2)
        else:           # (K, N)
            weight, per_column = weight.T, axis in (1, -1)
        if scale.size > 1 and not per_column:
            return None
        if weight.shape[1] != features:
            return None
        return a_dq, weight, scale, zp, rows, len(shape), trans_a

    def apply(self) -> int:
        """Replaces every row product of the graph; returns how many."""
        g = self.model.graph
        count = 0
        for node in list(g.node):
            found = self.candidate(node)
            if found is None:
                continue
            at = list(g.node).index(node)
            new = self.replacement(node, *found)
            g.node.remove(node)
            for k, n in enumerate(new):
                g.node.insert(at + k, n)
            count += 1
        return count

    def replacement(self, node, a_dq, weight, w_scale, w_zp, rows, rank, trans_a):
        g = self.model.graph
        out = node.output[0]
        n_out, k_in = weight.shape
        tag = f"{out}_as_pixels"
        a_scale, a_zp = a_dq.input[1], a_dq.input[2] if len(a_dq.input) > 2 else ""
        q_out = self.g.consumers[out][0]
        y_scale, y_zp = q_out.input[1], q_out.input[2] if len(q_out.input) > 2 else ""

        def const(name, value):
            g.initializer.append(numpy_helper.from_array(np.asarray(value), f"{tag}_{name}"))
            return f"{tag}_{name}"

        def q(x, s, z, name):
            return helper.make_node("QuantizeLinear", [x, s, z], [f"{tag}_{name}"],
                                    name=f"{tag}_{name}")

        def dq(x, s, z, name, **kw):
            return helper.make_node("DequantizeLinear", [x, s, z], [f"{tag}_{name}"],
                                    name=f"{tag}_{name}", **kw)

        to_rows = [0, 2, 1] if rank == 3 else [1, 0]
        nodes, features = [], node.input[0]
        if not trans_a:
            features = f"{tag}_in_t"
            nodes.append(helper.make_node("Transpose", [node.input[0]], [features],
                                          perm=to_rows, name=features))
        nodes += [
            helper.make_node("Reshape", [features, const("in_shape", [1, k_in, 1, rows])],
                             [f"{tag}_in_map"], name=f"{tag}_in_map"),
            q(f"{tag}_in_map", a_scale, a_zp, "in_codes"),
            dq(f"{tag}_in_codes", a_scale, a_zp, "in"),
        ]
        w_name = const("weight", weight.reshape(n_out, k_in, 1, 1))
        nodes.append(dq(w_name, const("w_scale", w_scale), const("w_zp", w_zp), "w", axis=0))
        conv_inputs = [f"{tag}_in", f"{tag}_w"]
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            conv_inputs.append(node.input[2])
        nodes += [
            helper.make_node("Conv", conv_inputs, [f"{tag}_map"], kernel_shape=[1, 1],
                             name=f"{tag}_conv"),
            q(f"{tag}_map", y_scale, y_zp, "out_codes"),
            dq(f"{tag}_out_codes", y_scale, y_zp, "out"),
            helper.make_node("Reshape", [f"{tag}_out", const("out_shape", (
                [1, n_out, rows] if rank == 3 else [n_out, rows]))], [f"{tag}_out_rows"],
                name=f"{tag}_out_rows"),
            helper.make_node("Transpose", [f"{tag}_out_rows"], [out], perm=to_rows,
                             name=f"{tag}_out_t"),
        ]
        return nodes


def rows_as_pixels(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with its row products (module doc) as 1×1 convolutions, and how many; the
    model itself when there are none."""
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    count = _Rewrite(rewritten).apply()
    return (rewritten, count) if count else (model, 0)
