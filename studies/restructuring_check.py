"""Functional equivalence of a restructured graph, executed on the golden model.

Every operator — original or a branch's copy with its cropped input and asymmetric padding — is
compiled on its own (fusion, code generation, DRAM image) and executed by
:class:`sfnpu.sim.golden.GoldenModel`, so all arithmetic is the accelerator's. A pooling copy
whose padding differs between sides — the instruction has one padding for every side — is
computed by the same kernels of :mod:`sfnpu.numeric` instead (:func:`encodable` tells whether a
restructuring needs that). The host only moves bytes: it crops the window a copy reads out of
the region its producer computed (the split), writes each branch's tiles into the join tensors
(the spatial concatenation) and concatenates channels for ``concat`` nodes, whose parts already
carry the destination's quantisation (:func:`.passes.requantize_concat_inputs`).

:func:`check_on_golden` feeds the critical sub-graph's inputs with random codes, runs the
original sub-graph and every branch, and compares each join tensor byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from sfnpu import numeric
from sfnpu.compiler.codegen import generate
from sfnpu.compiler.groups import fuse
from sfnpu.compiler.ir import Graph, Node, Tensor
from sfnpu.compiler.passes import on_lane_blocks
from sfnpu.compiler.restructure import (Region, Restructured, RestructureError, SplitBlock,
                                        hardware_pads)
from sfnpu.config import HwConfig, get_config
from sfnpu.sim.golden import GoldenModel

__all__ = ["Equivalence", "run_node", "check_on_golden", "run_program", "run_pieces",
           "encodable"]


def run_node(graph: Graph, node: Node, values: Mapping[str, np.ndarray],
             out_hw: tuple[int, int] | None = None, pads=None,
             config: HwConfig | None = None) -> np.ndarray:
    """Execute one IR node on the golden model with ``values`` (8-bit codes, ``(C, H, W)``)
    as its inputs; ``out_hw`` and ``pads`` override the output size and the padding of a
    branch's copy."""
    config = config or get_config("tiny")
    out = graph.tensors[node.output]
    shape = out.shape if out_hw is None else (out.shape[0], *out_hw)
    if node.op == "concat":
        for t in node.inputs:
            if graph.tensors[t].qtype != out.qtype:
                raise RestructureError(f"node {node.name!r}: concat part {t!r} is quantised "
                                       "differently from the result; run the compiler passes "
                                       "(requantize_concat_inputs) first")
        y = np.concatenate([values[t] for t in node.inputs], axis=0)
        assert y.shape == shape, (node.name, y.shape, shape)
        return y
    if pads is not None:
        node = node.replace(attrs={**node.attrs, "pads": hardware_pads(node, pads)})
        if node.op in ("maxpool", "avgpool") and len(set(node.attrs["pads"])) > 1:
            return _pool_in_numeric(graph, node, values[node.inputs[0]], shape[1:])
    names = tuple(dict.fromkeys(node.inputs))
    tensors = {t: Tensor(t, values[t].shape, graph.tensors[t].qtype) for t in names}
    tensors[node.output] = Tensor(node.output, shape, out.qtype)
    one = Graph(tensors, (node,), names, (node.output,))
    one, _ = on_lane_blocks(one, config)
    program = generate(one, fuse(one), config)
    blob = program.pack([values[t] for t in program.inputs])
    return GoldenModel(config).outputs(blob)[0]


def _pool_in_numeric(graph: Graph, node: Node, x: np.ndarray, out_hw) -> np.ndarray:
    """A pooling copy whose padding differs between sides, which no instruction encodes:
    computed by the golden model's own kernels (:mod:`sfnpu.numeric`) with that padding."""
    xq, yq = graph.tensors[node.inputs[0]].qtype, graph.tensors[node.output].qtype
    a = node.attrs
    if node.op == "maxpool":
        y = numeric.max_pool(x, a["kernel"], a["stride"], a["pads"], tuple(out_hw))
    else:
        y = numeric.qlinear_avg_pool(x, xq.scale, xq.zero_point, yq.scale, yq.zero_point,
                                     yq.signed, a["kernel"], a["stride"], a["pads"],
                                     bool(a["count_include_pad"]), out_hw=tuple(out_hw))
    return y.astype(yq.dtype)


def encodable(r: Restructured) -> bool:
    """Whether every copy of every block is an instruction the accelerator encodes."""
    return all(sn.pads is None or sn.node.op not in ("maxpool", "avgpool")
               or len(set(hardware_pads(sn.node, sn.pads))) == 1
               for blk in r.blocks for copies in blk.branches for sn in copies)


@dataclass(frozen=True)
class Equivalence:
    """Per join tensor: how many values differ between the original and the branches."""
    mismatches: Mapping[str, int]
    values: int                       # values compared in all

    @property
    def identical(self) -> bool:
        return not any(self.mismatches.values())


def _random_codes(graph: Graph, name: str, rng: np.random.Generator) -> np.ndarray:
    t = graph.tensors[name]
    lo, hi = t.qtype.range
    return rng.integers(lo, hi + 1, size=t.shape).astype(t.qtype.dtype)


def check_on_golden(r: Restructured, seed: int = 0, config: HwConfig | None = None
                    ) -> Equivalence:
    """Run each critical sub-graph as it was and as branches on the golden model, from the
    same random input codes; compare every join tensor."""
    graph = r.graph
    rng = np.random.default_rng(seed)
    mismatches: dict[str, int] = {}
    values = 0
    for blk in r.blocks:
        inputs = {t: _random_codes(graph, t, rng) for t in blk.forks}
        whole = dict(inputs)
        for k in blk.critical:
            node = graph.nodes[k]
            whole[node.output] = run_node(graph, node, whole, config=config)
        joined = _run_branches(graph, blk, inputs, config)
        for t in blk.joins:
            mismatches[t] = int(np.count_nonzero(joined[t] != whole[t]))
            values += whole[t].size
    return Equivalence(mismatches, values)


def _run_branches(graph: Graph, blk: SplitBlock, inputs: Mapping[str, np.ndarray],
                  config: HwConfig | None) -> dict[str, np.ndarray]:
    """Every branch of a block from the same inputs; the join tensors assembled from tiles."""
    joined = {t: np.zeros(graph.tensors[t].shape, graph.tensors[t].qtype.dtype)
              for t in blk.joins}
    for b, copies in enumerate(blk.branches):
        computed: dict[str, tuple[Region, np.ndarray]] = {
            t: (Region.whole(graph.tensors[t].shape), v) for t, v in inputs.items()}
        for sn in copies:
            feed = {}
            for t, need in zip(sn.node.inputs, sn.inputs):
                have, codes = computed[t]
                feed[t] = need.within(have).crop(codes)
            y = run_node(graph, sn.node, feed, sn.region.hw, sn.pads, config)
            computed[sn.node.output] = (sn.region, y)
        for t, tile in blk.tiles[b].items():
            if tile.empty:
                continue
            have, codes = computed[t]
            joined[t][:, tile.r0:tile.r1, tile.c0:tile.c1] = tile.within(have).crop(codes)
    return joined


def run_program(graph: Graph, inputs: Mapping[str, np.ndarray],
                config: HwConfig | None = None) -> dict[str, np.ndarray]:
    """A whole IR graph compiled (fusion, code generation) and executed on the golden model."""
    config = config or get_config("tiny")
    graph, _ = on_lane_blocks(graph, config)
    program = generate(graph, fuse(graph), config)
    outs = GoldenModel(config).outputs(program.pack([inputs[t] for t in program.inputs]))
    return dict(zip(program.outputs, outs))


def run_pieces(graph: Graph, pieces, inputs: Mapping[str, np.ndarray],
               config: HwConfig | None = None) -> dict[str, np.ndarray]:
    """Execute a sequence of pieces (:func:`.restructuring_sram.piece_graphs`) on the golden
    model, the host reading each input window and assembling the join tensors; returns the
    network's outputs."""
    stored = {t: (Region.whole(graph.tensors[t].shape), v) for t, v in inputs.items()}
    for piece in pieces:
        feed = {}
        for local, (key, need) in piece.windows.items():
            have, codes = stored[key]
            feed[local] = need.within(have).crop(codes)
        for key, codes in run_program(piece.graph, feed, config).items():
            stored[key] = (piece.regions[key], codes)
        for join, tiles in piece.assemble:
            t = graph.tensors[join]
            whole = np.zeros(t.shape, t.qtype.dtype)
            for key, tile in tiles:
                have, codes = stored[key]
                whole[:, tile.r0:tile.r1, tile.c0:tile.c1] = tile.within(have).crop(codes)
            stored[join] = (Region.whole(t.shape), whole)
    return {t: stored[t][1] for t in graph.outputs}
