"""BN fission-n-fusion for training: a memory-sweep model of one training step (seeds/004).

The paper (*Restructuring Batch Normalization to Accelerate CNN Training*, seeds/004) counts a
training step in **memory sweeps**: a kernel that reads or writes a whole feature map of the
mini-batch (N·C·H·W values) costs one sweep of that tensor, because at batch ≥ 100 no on-chip
buffer holds it (Sec. 3.2, the grey boxes of Fig. 5). This module turns an ONNX graph into the
list of kernels ("passes") of one forward + backward step, counts the sweeps and their bytes, and
applies the paper's restructurings cumulatively as ``(schedule) -> (schedule, changed)`` passes,
with a checker between passes:

* **baseline** — every BN / ReLU / Conv / Concat / pool a kernel of its own. BN forward is three
  reads of its input (mean, variance, normalisation) and one write (Fig. 5a: I₂, I₃, I₄, O₂);
  BN backward is a parameter pass (∂γ, ∂β: reads ∂y and x) then a data pass (reads ∂y and x,
  writes ∂x). Conv backward is two kernels, data and weight gradient (twice the forward's
  accesses, Sec. 3.2). Concat copies; a tensor read by several layers is a Split whose backward
  sums the gradient contributions (Caffe).
* **RCF** (ReLU-Conv fusion): a ReLU whose only consumer is a conv is applied while the conv
  reads its input; backward, the conv's data-gradient kernel applies the ReLU mask as it writes.
* **MVF** (mean/variance fusion): E[x] and E[x²] in one read, Var = E[x²] − E[x]².
* **BNFF** (fission-n-fusion, includes RCF and MVF): the statistics half of a BN is computed by
  the producer conv while it writes its output; the normalisation half + ReLU runs in the
  consumer conv's input path, which also writes the BN output once (kept for backward, O₂' in
  Fig. 5a). Backward, ∂γ/∂β are accumulated by the kernel that writes ∂y, and ∂x is recomputed
  from ∂y and y by every kernel that would have read it. Applied to BNs between two convs (the
  second BN of every DenseNet composite layer, "BNFF within CPLs").
* **ICF** (inter-composite-layer fusion): the same for BNs whose producer is a Concat (or the
  pooling that opens a dense block / ends a transition): statistics fused into the Concat's
  write, ∂x fused into the Split (gradient sum) or Concat backward.

Everything is derived from the graph: layer shapes from ONNX shape inference, sweeps from the
pass lists. Nothing is a hard-coded per-layer table. Step times are *not* measured here; the
report gives a roofline estimate with the paper's machine peaks, labelled as such.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Sequence

import onnx
from onnx import shape_inference

from sfnpu.compiler.importer import ModelError

__all__ = [
    "BnffError", "Layer", "Net", "Pass", "Schedule", "Traffic", "Step", "Machine",
    "BYTES_PER_ELEMENT", "PAPER_BATCH", "PAPER_INPUT_SIZE", "PAPER", "SKYLAKE", "STEPS",
    "SUPPORTED_OPS", "BNFF_PRODUCERS", "ICF_PRODUCERS", "net_from_onnx", "incremental_concat",
    "lower_training_step",
    "check_schedule", "relu_conv_fusion", "mean_variance_fusion", "bn_fission_fusion",
    "inter_composite_fusion", "run_steps", "traffic", "by_category", "segment_sweeps",
    "roofline_time",
    "densenet121_study", "Study", "report_markdown", "write_report",
]

#: fp32 training: the paper trains in single precision (Sec. 3.2 "single-precision floating
#: point arithmetic is good enough for E(X²)"; Sec. 3.1 "58 FLOPs per 32-bit data").
BYTES_PER_ELEMENT = 4
#: Sec. 4: "the mini-batch size was set to 120" (Skylake; Fig. 7 uses 120 too).
PAPER_BATCH = 120
#: Not stated in the paper; ImageNet training crops for DenseNet-121 are 224×224.
PAPER_INPUT_SIZE = 224

#: Reference figures quoted from seeds/004 (numbers only; where each comes from).
PAPER = MappingProxyType({
    "memory_reduction_bnff": (0.191, "Sec. 5, Fig. 7b: BNFF reduces memory accesses by 19.1 %"),
    "relu_share_baseline": (0.168, "Sec. 5: ReLU layers take 16.8 % of the baseline's memory "
                                   "accesses"),
    "perf_rcf": (0.092, "Sec. 5, Fig. 7a: RCF improves overall execution speed by 9.2 %"),
    "perf_mvf_extra": (0.017, "Sec. 5, Fig. 7a: MVF adds 1.7 % over RCF (5.5 % of the forward "
                              "pass)"),
    "perf_bnff": (0.257, "Sec. 5/7, Fig. 7a: BNFF 25.7 % over baseline (14.8 % over RCF+MVF), "
                         "measured on 2× Xeon Gold 6138"),
    "perf_bnff_fwd": (0.479, "Sec. 5/7: forward pass 47.9 %"),
    "perf_bnff_bwd": (0.154, "Sec. 5/7: backward pass 15.4 %"),
    "perf_icf": (0.437, "Sec. 5, Fig. 7a: BNFF+ICF estimated 43.7 % over baseline (not "
                        "measured)"),
    "perf_gpu": (0.174, "Sec. 5: BNFF on a GPU with CUTLASS: 17.4 %"),
    "bn_fwd_sweeps": ((8, 3), "Sec. 3.2, Fig. 5a: O₁,I₂,I₃ → O₁' and I₄,I₅,I₆,O₂,O₃ → I₂',O₂' "
                              "(8 → 3 sweeps per BN, forward)"),
    "bn_bwd_removed": (5, "Sec. 3.2, Fig. 5b: BNFF removes five memory sweeps per BN layer in "
                          "the backward pass"),
})


class BnffError(ModelError):
    """A graph the training sweep model cannot describe; the message names the node."""


# ---------------------------------------------------------------------------------------------
# The network: layers with per-image tensor sizes
# ---------------------------------------------------------------------------------------------

#: ONNX operator → layer kind of the model (others are rejected, naming the node).
SUPPORTED_OPS = {
    "Conv": "conv", "Gemm": "gemm", "BatchNormalization": "bn", "Relu": "relu",
    "Concat": "concat", "MaxPool": "maxpool", "AveragePool": "avgpool",
    "GlobalAveragePool": "gap",
}
_ALIASES = {"Flatten", "Identity", "Reshape", "Squeeze", "Unsqueeze"}


@dataclass(frozen=True)
class Layer:
    name: str
    op: str                      # a value of SUPPORTED_OPS
    inputs: tuple[str, ...]      # feature-map inputs only (no weights)
    output: str
    macs: int = 0                # multiply-accumulates per image (conv, gemm)


@dataclass(frozen=True)
class Net:
    name: str
    layers: tuple[Layer, ...]            # topological order
    elements: Mapping[str, int]          # values per image of every feature map
    input: str
    output: str

    def producer(self, tensor: str) -> Layer | None:
        return next((l for l in self.layers if l.output == tensor), None)

    def consumers(self, tensor: str) -> list[Layer]:
        return [l for l in self.layers if tensor in l.inputs]

    def layer(self, name: str) -> Layer:
        return next(l for l in self.layers if l.name == name)


def _dims(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = tuple(d.dim_value for d in t.shape.dim)
    return dims if all(d > 0 for d in dims) else None


def net_from_onnx(model: onnx.ModelProto) -> Net:
    """The layer list of a float ONNX classifier graph (batch dimension first)."""
    inferred = shape_inference.infer_shapes(model)
    g = inferred.graph
    inits = {t.name: tuple(t.dims) for t in g.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        d = _dims(vi)
        if d is not None:
            shapes[vi.name] = d
    inputs = [i.name for i in g.input if i.name not in inits]
    if len(inputs) != 1 or len(g.output) != 1:
        raise BnffError(f"graph {g.name!r}: the training model needs one input and one output, "
                        f"got {len(inputs)} and {len(g.output)}")
    alias: dict[str, str] = {}

    def resolve(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    elements: dict[str, int] = {}

    def size(name: str, node: onnx.NodeProto) -> int:
        if name not in shapes:
            raise BnffError(f"ONNX node {node.name!r} ({node.op_type}): no static shape for "
                            f"{name!r}")
        return math.prod(shapes[name][1:])   # per image: drop the batch dimension

    elements[inputs[0]] = math.prod(shapes[inputs[0]][1:])
    layers: list[Layer] = []
    for node in g.node:
        where = f"ONNX node {node.name or node.output[0]!r} ({node.op_type})"
        if node.op_type in _ALIASES:
            alias[node.output[0]] = resolve(node.input[0])
            continue
        op = SUPPORTED_OPS.get(node.op_type)
        if op is None:
            raise BnffError(f"{where}: not supported by the training sweep model; supported: "
                            f"{', '.join(sorted(SUPPORTED_OPS))} (and {', '.join(sorted(_ALIASES))}"
                            " as aliases)")
        feats = [resolve(i) for i in node.input if i and i not in inits]
        if op in ("conv", "gemm", "bn", "relu", "maxpool", "avgpool", "gap") and len(feats) != 1:
            raise BnffError(f"{where}: expected one feature-map input, got {feats}")
        if op == "concat":
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            if axis not in (1, -3):
                raise BnffError(f"{where}: only channel concatenation (axis 1) is modelled")
        out = node.output[0]
        elements[out] = size(out, node)
        macs = 0
        if op == "conv":
            w = inits.get(node.input[1]) or shapes.get(node.input[1])
            if w is None:
                raise BnffError(f"{where}: weight shape unknown")
            macs = elements[out] * math.prod(w[1:])       # Cout·Ho·Wo × Cin/g·kh·kw
        elif op == "gemm":
            w = inits.get(node.input[1]) or shapes.get(node.input[1])
            macs = math.prod(w) if w is not None else 0
        for f in feats:
            if f not in elements:
                raise BnffError(f"{where}: input {f!r} is not a feature map of the graph")
        layers.append(Layer(node.name or out, op, tuple(feats), out, macs))
    output = resolve(g.output[0].name)
    return Net(g.name or "model", tuple(layers), MappingProxyType(elements), inputs[0], output)


def incremental_concat(net: Net) -> tuple[Net, bool]:
    """Rewrite ``Concat(f0, …, fk)`` as ``Concat(Concat(f0, …, fk−1), fk)`` when the shorter
    concat exists: the form of the paper's reference DenseNet (Caffe, one Concat per composite
    layer, each output Split between the next composite layer and the next Concat). Forward
    bytes are identical (both copy Σ channels); backward, every Split has two consumers."""
    by_inputs = {l.inputs: l.output for l in net.layers if l.op == "concat"}
    layers, changed = [], False
    for l in net.layers:
        if l.op == "concat" and len(l.inputs) > 2 and l.inputs[:-1] in by_inputs:
            l = replace(l, inputs=(by_inputs[l.inputs[:-1]], l.inputs[-1]))
            changed = True
        layers.append(l)
    return (replace(net, layers=tuple(layers)), True) if changed else (net, False)


# ---------------------------------------------------------------------------------------------
# Passes (kernels) of one training step
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pass:
    """One kernel: every tensor in ``reads``/``writes`` is one sweep over the mini-batch."""
    layer: str
    kind: str                          # "conv.fwd", "bn.norm", "relu.bwd", "split.bwd", …
    phase: str                         # "fwd" | "bwd"
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    flops: int = 0                     # per image (convolutions and the classifier only)
    absorbed: tuple[str, ...] = ()     # kinds of the passes fused into this one

    @property
    def name(self) -> str:
        return f"{self.layer}:{self.kind}"

    @property
    def sweeps(self) -> int:
        return len(self.reads) + len(self.writes)

    def elements(self, sizes: Mapping[str, int]) -> int:
        return sum(sizes[t] for t in (*self.reads, *self.writes))


def grad(t: str) -> str:
    return f"d({t})"


def _base(t: str) -> str:
    """The feature map a gradient tensor belongs to: ``d(x)`` and ``d(x)@layer`` → ``x``."""
    if not t.startswith("d("):
        return t
    body = t[2:]
    at = body.rfind(")@")
    return body[:at] if at >= 0 else body[:-1]


@dataclass(frozen=True)
class Schedule:
    net: Net
    passes: tuple[Pass, ...]
    sizes: Mapping[str, int]           # values per image, feature maps and gradients
    applied: tuple[str, ...] = ()
    fused_bn: tuple[str, ...] = ()     # BN layers whose halves were both fused

    def find(self, layer: str, kind: str) -> int | None:
        return next((i for i, p in enumerate(self.passes)
                     if p.layer == layer and p.kind == kind), None)


def _grad_in(net: Net, x: str, layer: str) -> str | None:
    """Gradient tensor ``layer`` writes for its input ``x``: ∂x itself when ``layer`` is the
    only reader, else its contribution to the Split's sum. None for the graph input."""
    if x == net.input:
        return None
    return grad(x) if len(net.consumers(x)) == 1 else f"{grad(x)}@{layer}"


def lower_training_step(net: Net) -> Schedule:
    """The baseline kernels of a forward + backward step (see the module docstring)."""
    fwd: list[Pass] = []
    for l in net.layers:
        x = l.inputs[0]
        if l.op == "bn":
            fwd += [Pass(l.name, "bn.mean", "fwd", (x,), ()),
                    Pass(l.name, "bn.var", "fwd", (x,), ()),
                    Pass(l.name, "bn.norm", "fwd", (x,), (l.output,))]
        else:
            fwd.append(Pass(l.name, f"{l.op}.fwd", "fwd", l.inputs, (l.output,), 2 * l.macs))
    bwd: list[Pass] = [Pass("loss", "loss", "bwd", (net.output,), (grad(net.output),))]
    for l in reversed(net.layers):
        y, gy = l.output, grad(l.output)
        readers = net.consumers(y)
        if len(readers) > 1:                 # Split: sum the contributions
            bwd.append(Pass(l.name, "split.bwd", "bwd",
                            tuple(f"{gy}@{r.name}" for r in readers), (gy,)))
        gxs = [_grad_in(net, x, l.name) for x in l.inputs]
        x, gx = l.inputs[0], gxs[0]
        out = (gx,) if gx else ()
        if l.op in ("conv", "gemm"):
            if gx:
                bwd.append(Pass(l.name, f"{l.op}.bwd_data", "bwd", (gy,), out, 2 * l.macs))
            bwd.append(Pass(l.name, f"{l.op}.bwd_weight", "bwd", (x, gy), (), 2 * l.macs))
        elif l.op == "bn":
            bwd += [Pass(l.name, "bn.bwd_param", "bwd", (gy, x), ()),
                    Pass(l.name, "bn.bwd_data", "bwd", (gy, x), out)]
        elif l.op in ("relu", "maxpool"):    # the mask / arg-max comes from the input
            bwd.append(Pass(l.name, f"{l.op}.bwd", "bwd", (gy, x), out))
        elif l.op in ("avgpool", "gap"):
            bwd.append(Pass(l.name, f"{l.op}.bwd", "bwd", (gy,), out))
        elif l.op == "concat":               # copy each slice out
            bwd.append(Pass(l.name, "concat.bwd", "bwd", (gy,),
                            tuple(g for g in gxs if g)))
        else:  # pragma: no cover - SUPPORTED_OPS and this switch are kept together
            raise BnffError(f"layer {l.name!r}: no backward rule for {l.op}")
    sizes = dict(net.elements)
    for p in (*fwd, *bwd):
        for t in (*p.reads, *p.writes):
            if t not in sizes:
                sizes[t] = net.elements[_base(t)]
    return check_schedule(Schedule(net, tuple(fwd + bwd), MappingProxyType(sizes)))


def check_schedule(s: Schedule) -> Schedule:
    """Every tensor is written once before it is read (the graph input is given), every
    written tensor is read later, forward passes precede backward ones."""
    written = {s.net.input}
    produced: dict[str, str] = {}
    read_after: set[str] = set()
    seen_bwd = False
    for p in s.passes:
        if p.phase == "bwd":
            seen_bwd = True
        elif seen_bwd:
            raise BnffError(f"pass {p.name}: forward pass after the backward pass started")
        for t in p.reads:
            if t not in written:
                raise BnffError(f"pass {p.name} reads {t!r} before it is written")
            read_after.add(t)
        for t in p.writes:
            if t in written:
                raise BnffError(f"pass {p.name} writes {t!r} again (first by "
                                f"{produced.get(t, 'the graph input')})")
            written.add(t)
            produced[t] = p.name
        for t in (*p.reads, *p.writes):
            if t not in s.sizes:
                raise BnffError(f"pass {p.name}: tensor {t!r} has no size")
    dead = [t for t in produced if t not in read_after]
    if dead:
        raise BnffError(f"tensor {dead[0]!r} written by {produced[dead[0]]} is never read")
    return s


# ---------------------------------------------------------------------------------------------
# Restructurings, each (schedule) -> (schedule, changed)
# ---------------------------------------------------------------------------------------------


def _swap(ts: tuple[str, ...], old: str, new: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for t in ts:
        for n in ((*new,) if t == old else (t,)):
            if n not in out:
                out.append(n)
    return tuple(out)


def _absorb(p: Pass, *kinds: str) -> Pass:
    return replace(p, absorbed=p.absorbed + tuple(kinds))


def relu_conv_fusion(s: Schedule) -> tuple[Schedule, bool]:
    """RCF: ReLU applied on the conv's input read (forward) and as the mask of the conv's
    data-gradient write (backward). Needs the ReLU's only consumer to be a conv."""
    net, passes, changed = s.net, list(s.passes), False
    for r in net.layers:
        if r.op != "relu" or r.output == net.output:
            continue
        readers = net.consumers(r.output)
        if len(readers) != 1 or readers[0].op != "conv":
            continue
        i_f = next((i for i, p in enumerate(passes)
                    if p.layer == r.name and p.kind == "relu.fwd"), None)
        if i_f is None:
            continue                                   # already fused
        c, x, u = readers[0], r.inputs[0], r.output
        relu_b = next(p for p in passes if p.layer == r.name and p.kind == "relu.bwd")
        gx = relu_b.writes[0]
        new = []
        for p in passes:
            if p.layer == r.name:
                continue
            if p.layer == c.name and p.kind == "conv.fwd":
                p = _absorb(replace(p, reads=_swap(p.reads, u, [x])), "relu.fwd")
            elif p.layer == c.name and p.kind == "conv.bwd_data":
                p = _absorb(replace(p, reads=p.reads + (x,),         # x > 0 is the mask
                                    writes=_swap(p.writes, grad(u), [gx])), "relu.bwd")
            elif p.layer == c.name and p.kind == "conv.bwd_weight":
                p = replace(p, reads=_swap(p.reads, u, [x]))
            new.append(p)
        passes, changed = new, True
    if not changed:
        return s, False
    return check_schedule(replace(s, passes=tuple(passes))), True


def mean_variance_fusion(s: Schedule) -> tuple[Schedule, bool]:
    """MVF: the mean and variance reads of every BN become one read (E[x], E[x²])."""
    passes, changed = [], False
    for p in s.passes:
        if p.kind == "bn.var":
            changed = True
            continue
        if p.kind == "bn.mean":
            p = _absorb(replace(p, kind="bn.stats"), "bn.mean", "bn.var")
        passes.append(p)
    return (check_schedule(replace(s, passes=tuple(passes))), True) if changed else (s, False)


#: Producers into whose output write BN statistics may be fused.
BNFF_PRODUCERS = frozenset({"conv"})
ICF_PRODUCERS = frozenset({"conv", "concat", "maxpool", "avgpool"})


def bn_fission_fusion(s: Schedule, producers: frozenset[str] = BNFF_PRODUCERS
                      ) -> tuple[Schedule, bool]:
    """BNFF: split each eligible BN into its statistics half (fused into the producer's output
    write) and its normalisation half (fused, with the RCF'd ReLU, into the consumer conv's
    input read; that conv also writes the BN output for the backward pass). Backward: ∂γ/∂β
    are accumulated by the kernel writing ∂y; ∂x is recomputed from (∂y, y) by each kernel
    that read it. Eligible: the producer's kind is in ``producers`` and, after RCF, a single
    conv reads the BN output. Requires MVF (it fuses the ``bn.stats`` pass)."""
    net, changed = s.net, False
    passes = list(s.passes)
    fused = list(s.fused_bn)
    for b in net.layers:
        if b.op != "bn":
            continue
        kinds = {p.kind for p in passes if p.layer == b.name}
        if "bn.mean" in kinds:
            raise BnffError(f"BN {b.name!r}: fission-n-fusion needs mean/variance fusion first")
        if "bn.stats" not in kinds:
            continue                                   # already fused
        x, y = b.inputs[0], b.output
        prod = net.producer(x)
        if prod is None or prod.op not in producers:
            continue
        fwd_readers = [p for p in passes if p.phase == "fwd" and y in p.reads]
        if len(fwd_readers) != 1 or fwd_readers[0].kind != "conv.fwd":
            continue                                   # ReLU not fused into a conv
        consumer = fwd_readers[0]
        gy_writers = [p for p in passes if grad(y) in p.writes]
        if len(gy_writers) != 1 or y not in gy_writers[0].reads:
            continue
        gy_writer = gy_writers[0]
        bwd_data = next(p for p in passes if p.layer == b.name and p.kind == "bn.bwd_data")
        gx = bwd_data.writes[0] if bwd_data.writes else None
        new = []
        for p in passes:
            if p.layer == b.name:
                continue
            if p.phase == "fwd" and x in p.writes:          # producer: + statistics
                p = _absorb(p, "bn.stats")
            elif p is consumer:                            # consumer: + normalisation
                p = _absorb(replace(p, reads=_swap(p.reads, y, [x]), writes=p.writes + (y,)),
                            "bn.norm")
            elif p is gy_writer:                           # + ∂γ, ∂β
                p = _absorb(p, "bn.bwd_param")
            elif gx and gx in p.reads:                     # readers of ∂x: recompute it
                p = _absorb(replace(p, reads=_swap(p.reads, gx, [grad(y), y])), "bn.bwd_data")
            new.append(p)
        passes, changed = new, True
        fused.append(b.name)
    if not changed:
        return s, False
    return check_schedule(replace(s, passes=tuple(passes), fused_bn=tuple(fused))), True


def inter_composite_fusion(s: Schedule) -> tuple[Schedule, bool]:
    """ICF: fission-n-fusion also for BNs fed by a Concat (statistics fused into the Concat's
    write, ∂x into the Split / Concat backward) or by the pooling that starts a dense block."""
    return bn_fission_fusion(s, ICF_PRODUCERS)


# ---------------------------------------------------------------------------------------------
# Steps, counting, time estimate
# ---------------------------------------------------------------------------------------------

Transform = Callable[[Schedule], "tuple[Schedule, bool]"]


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    transforms: tuple[tuple[str, Transform], ...]
    paper_memory: float | None = None     # paper's memory-access reduction, if stated
    paper_perf: str = ""                  # paper's performance improvement (Fig. 7a, Sec. 5)


_RCF = ("RCF", relu_conv_fusion)
_MVF = ("MVF", mean_variance_fusion)
_BNFF = ("BNFF", bn_fission_fusion)
_ICF = ("ICF", inter_composite_fusion)

STEPS: tuple[Step, ...] = (
    Step("baseline", "separate kernels", ()),
    Step("RCF", "ReLU-Conv fusion", (_RCF,), None, "+9.2 %"),
    Step("RCF+MVF", "+ mean/variance fusion", (_RCF, _MVF), None, "+1.7 % over RCF"),
    Step("BNFF", "fission-n-fusion within composite layers", (_RCF, _MVF, _BNFF),
         PAPER["memory_reduction_bnff"][0], "+25.7 % (+14.8 % over RCF+MVF)"),
    Step("BNFF+ICF", "+ inter-composite-layer fusion", (_RCF, _MVF, _BNFF, _ICF), None,
         "+43.7 % (estimated by the paper)"),
)


def run_steps(base: Schedule, steps: Sequence[Step] = STEPS) -> list[Schedule]:
    """Each step's schedule, built from the baseline by its transforms in order."""
    out = []
    for step in steps:
        s = base
        for name, fn in step.transforms:
            s, changed = fn(s)
            if changed:
                s = replace(s, applied=s.applied + (name,))
        out.append(s)
    return out


@dataclass(frozen=True)
class Traffic:
    kernels: int
    sweeps_fwd: int
    sweeps_bwd: int
    bytes_fwd: int
    bytes_bwd: int

    @property
    def sweeps(self) -> int:
        return self.sweeps_fwd + self.sweeps_bwd

    @property
    def bytes(self) -> int:
        return self.bytes_fwd + self.bytes_bwd


def _category(kind: str) -> str:
    op = kind.split(".")[0]
    return {"maxpool": "pool", "avgpool": "pool", "gap": "pool", "gemm": "classifier",
            "loss": "classifier", "split": "concat/split", "concat": "concat/split"}.get(op, op)


def traffic(s: Schedule, batch: int, bytes_per_element: int = BYTES_PER_ELEMENT,
            where: Callable[[Pass], bool] = lambda p: True) -> Traffic:
    unit = batch * bytes_per_element
    sel = [p for p in s.passes if where(p)]
    f = [p for p in sel if p.phase == "fwd"]
    b = [p for p in sel if p.phase == "bwd"]
    return Traffic(len(sel), sum(p.sweeps for p in f), sum(p.sweeps for p in b),
                   unit * sum(p.elements(s.sizes) for p in f),
                   unit * sum(p.elements(s.sizes) for p in b))


def by_category(s: Schedule, batch: int, bytes_per_element: int = BYTES_PER_ELEMENT
                ) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in s.passes:
        c = _category(p.kind)
        out[c] = out.get(c, 0) + p.elements(s.sizes) * batch * bytes_per_element
    return out


def segment_sweeps(s: Schedule, tensors: Iterable[str]) -> tuple[int, int]:
    """(forward, backward) sweeps of the given tensors (gradients and Split contributions of
    the named tensors included) — the paper's per-BN count of Fig. 5."""
    names = set(tensors)

    def mine(t: str) -> bool:
        return _base(t) in names

    fwd = bwd = 0
    for p in s.passes:
        k = sum(1 for t in (*p.reads, *p.writes) if mine(t))
        if p.phase == "fwd":
            fwd += k
        else:
            bwd += k
    return fwd, bwd


@dataclass(frozen=True)
class Machine:
    name: str
    peak_flops: float          # FLOP/s
    bandwidth: float           # bytes/s


#: Paper Table 1 / Sec. 4: two-socket Xeon Gold 6138, 3.34 TFLOPS fp32, 230.4 GB/s.
SKYLAKE = Machine("2× Xeon Gold 6138 (paper Table 1)", 3.34e12, 230.4e9)


def roofline_time(s: Schedule, batch: int, machine: Machine = SKYLAKE,
                  bytes_per_element: int = BYTES_PER_ELEMENT) -> tuple[float, float]:
    """(forward, backward) seconds if every kernel ran at the roofline:
    ``max(flops / peak, bytes / bandwidth)``. An estimate, not a measurement."""
    t = {"fwd": 0.0, "bwd": 0.0}
    for p in s.passes:
        t[p.phase] += max(p.flops * batch / machine.peak_flops,
                          p.elements(s.sizes) * batch * bytes_per_element / machine.bandwidth)
    return t["fwd"], t["bwd"]


# ---------------------------------------------------------------------------------------------
# The DenseNet-121 study and its report
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Study:
    batch: int
    input_size: int
    net: Net
    steps: tuple[Step, ...]
    schedules: tuple[Schedule, ...]
    bytes_per_element: int = BYTES_PER_ELEMENT
    machine: Machine = SKYLAKE
    notes: tuple[str, ...] = field(default=())

    def traffic(self) -> list[Traffic]:
        return [traffic(s, self.batch, self.bytes_per_element) for s in self.schedules]

    def reductions(self) -> list[float]:
        """Feature-map byte reduction of every step relative to the baseline."""
        t = self.traffic()
        return [1 - x.bytes / t[0].bytes for x in t]


def densenet121_study(batch: int = PAPER_BATCH, input_size: int = PAPER_INPUT_SIZE,
                      incremental: bool = True) -> Study:
    """Sweep model of one DenseNet-121 training step, from ``builders.densenet121``."""
    from sfnpu.models import builders

    if batch < 1:
        raise BnffError(f"batch must be positive, got {batch}")
    try:
        model = builders.densenet121(input_size)
    except ValueError as e:           # e.g. an input too small for five down-samplings
        raise BnffError(str(e)) from None
    net = net_from_onnx(model)
    notes = []
    if incremental:
        net, changed = incremental_concat(net)
        if changed:
            notes.append("dense-block Concats rewritten in the incremental (Caffe) form")
    base = lower_training_step(net)
    return Study(batch, input_size, net, STEPS, tuple(run_steps(base)), notes=tuple(notes))


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.1f} %"


def _bn_groups(net: Net) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {"intra-CPL (conv → BN → ReLU → conv)": [],
                                    "CPL boundary / transition (concat or pool → BN)": [],
                                    "stem / head (BN → ReLU → pool)": []}
    keys = list(groups)
    for l in net.layers:
        if l.op != "bn":
            continue
        prod = net.producer(l.inputs[0])
        relu = net.consumers(l.output)
        nxt = net.consumers(relu[0].output) if relu and relu[0].op == "relu" else []
        if not (len(nxt) == 1 and nxt[0].op == "conv"):
            groups[keys[2]].append(l.name)
        elif prod is not None and prod.op == "conv":
            groups[keys[0]].append(l.name)
        else:
            groups[keys[1]].append(l.name)
    return groups


def report_markdown(st: Study) -> str:
    t = st.traffic()
    red = st.reductions()
    base = t[0]
    times = [roofline_time(s, st.batch, st.machine, st.bytes_per_element) for s in st.schedules]
    mem_times = [x.bytes / st.machine.bandwidth for x in t]
    cats = [by_category(s, st.batch, st.bytes_per_element) for s in st.schedules]
    n_conv = sum(1 for l in st.net.layers if l.op == "conv")
    n_bn = sum(1 for l in st.net.layers if l.op == "bn")
    per_sweep = st.batch * st.bytes_per_element
    L = [
        "# BN fission-n-fusion: DenseNet-121 training-step memory sweeps",
        "",
        "Paper: *Restructuring Batch Normalization to Accelerate CNN Training* (seeds/004). "
        "Model: `sfnpu.studies.bn_fission`; graph: `models.builders.densenet121("
        f"{st.input_size})` ({len(st.net.layers)} layers: {n_conv} conv, {n_bn} BN).",
        "",
        "## Setting",
        "",
        f"- mini-batch {st.batch} (paper Sec. 4: 120), input {st.input_size}×{st.input_size} "
        "(not stated in the paper; ImageNet crop), fp32 = "
        f"{st.bytes_per_element} bytes/value (paper trains in single precision).",
        "- one **sweep** = one kernel reading or writing one whole feature map of the "
        "mini-batch (paper Sec. 3.2, grey boxes of Fig. 5); bytes = sweeps × N·C·H·W × 4. "
        "Weights, optimizer state, labels and cache effects are not counted (the paper's "
        "Fig. 7b counts measured DRAM accesses of everything).",
        "- baseline kernels: BN forward = mean read + variance read + normalise (read+write); "
        "BN backward = ∂γ/∂β pass (reads ∂y, x) + ∂x pass (reads ∂y, x, writes ∂x); ReLU "
        "backward reads ∂y and its input; conv backward = data-gradient and weight-gradient "
        "kernels; Concat copies (backward copies slices out); a tensor read by two layers is a "
        "Split whose backward sums the contributions; max-pool backward re-reads its input.",
        *[f"- {n}" for n in st.notes],
        "",
        "## Memory traffic per step (cumulative restructurings)",
        "",
        "| step | kernels | sweeps fwd | sweeps bwd | GB fwd | GB bwd | GB total | "
        "Δ bytes vs baseline | Δ vs previous | BNs fused | paper: memory accesses | "
        "paper: performance |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, (step, s, x) in enumerate(zip(st.steps, st.schedules, t)):
        prev = "—" if k == 0 else _pct(x.bytes / t[k - 1].bytes - 1)
        L.append(f"| {step.name} ({step.title}) | {x.kernels} | {x.sweeps_fwd} | "
                 f"{x.sweeps_bwd} | {_gb(x.bytes_fwd)} | {_gb(x.bytes_bwd)} | {_gb(x.bytes)} | "
                 f"{_pct(-red[k]) if k else '—'} | {prev} | {len(s.fused_bn)}/{n_bn} | "
                 f"{_pct(-step.paper_memory) if step.paper_memory else '—'} | "
                 f"{step.paper_perf or '—'} |")
    L += [
        "",
        "GB = 10⁹ bytes. Paper columns: only the BNFF memory-access figure (−19.1 %) is given "
        "as a number in the text (Sec. 5, Fig. 7b; the other bars of Fig. 7b are not in the "
        "text). Performance is the paper's 'performance improvement' (Fig. 7a, Sec. 5), "
        "measured on 2× Xeon Gold 6138 (a CPU; on a GPU with CUTLASS BNFF gave 17.4 %); the "
        "ICF figure is the paper's own estimate. Our reductions are of feature-map sweeps "
        "only; the paper's denominator also holds weight, im2col/blocking and cache-miss "
        "traffic of the convolutions, which no step changes, so its percentages are smaller.",
        "",
        "## Where the bytes are (GB per step, by layer type)",
        "",
        "| layer type | " + " | ".join(s.name for s in st.steps) + " |",
        "| --- | " + " | ".join("---:" for _ in st.steps) + " |",
    ]
    for c in sorted(cats[0], key=lambda c: -cats[0][c]):
        L.append(f"| {c} | " + " | ".join(_gb(cat.get(c, 0)) for cat in cats) + " |")
    relu_share = cats[0].get("relu", 0) / base.bytes
    bn_share = cats[0].get("bn", 0) / base.bytes
    L += [
        "",
        f"Baseline shares: ReLU {relu_share:.1%} of the feature-map bytes (paper Sec. 5: 16.8 % "
        f"of all measured memory accesses), BN {bn_share:.1%}. Fused kernels are listed under "
        "their conv / concat.",
        "",
        "## Sweeps around one BN (paper Fig. 5)",
        "",
    ]
    bns = [l for l in st.net.layers if l.op == "bn"]
    intra = next(l for l in bns if st.net.producer(l.inputs[0]).op == "conv"
                 and st.net.consumers(l.output)[0].op == "relu"
                 and st.net.consumers(st.net.consumers(l.output)[0].output)[0].op == "conv")
    boundary = next(l for l in bns if st.net.producer(l.inputs[0]).op == "concat")
    L += ["| BN | tensors | " + " | ".join(s.name for s in st.steps) + " | paper |",
          "| --- | --- | " + " | ".join("---:" for _ in st.steps) + " | --- |"]
    for l, paper in ((intra, "fwd 8 → 3, bwd −5 (Sec. 3.2)"), (boundary, "all BN sweeps "
                                                                          "removed with ICF")):
        relu = st.net.consumers(l.output)[0]
        ts = (l.inputs[0], l.output, relu.output)
        cells = [segment_sweeps(s, ts) for s in st.schedules]
        L.append(f"| `{l.name}` | x, y, relu(y) and gradients | "
                 + " | ".join(f"{f} / {b}" for f, b in cells) + f" | {paper} |")
    L += [
        "",
        "Cells: forward / backward sweeps of the BN input x, its output y, relu(y) and their "
        "gradients (for the boundary BN, x is also read by the next Concat). Our BNFF keeps "
        "one write of y (the paper's O₂') and, backward, re-reads y in each kernel that "
        "recomputes ∂x = f(∂y, y): both conv-backward kernels of the producer, or the Split.",
        "",
        "## Which BNs each step fuses",
        "",
    ]
    for title, names in _bn_groups(st.net).items():
        per = [sum(1 for n in names if n in s.fused_bn) for s in st.schedules]
        L.append(f"- {title}: {len(names)} BNs; fused per step: "
                 + ", ".join(f"{s.name} {k}" for s, k in zip(st.steps, per)))
    L += [
        "",
        "The stem BN (conv0 → BN → ReLU → max-pool) and the last BN (→ ReLU → global average "
        "pool) are never fused: their ReLU feeds a pooling layer, not a conv, so neither RCF "
        "nor the normalisation half applies (the paper's ICF claims all BNs; we keep these two).",
        "",
        "## Step time: a roofline estimate (not a measurement)",
        "",
        f"Every kernel is charged max(FLOPs / {st.machine.peak_flops / 1e12:.2f} TFLOPS, bytes / "
        f"{st.machine.bandwidth / 1e9:.1f} GB/s) — the peaks of the paper's {st.machine.name}; "
        "convolution FLOPs 2·MACs per forward, data-gradient and weight-gradient kernel; "
        "element-wise work assumed free. Real kernels reach neither peak, so absolute times "
        "are optimistic; only the relative change is of interest.",
        "",
        "| step | est. fwd ms | est. bwd ms | est. step ms | Δ time vs baseline | "
        "speed-up vs baseline | bandwidth-only ms | paper: performance improvement |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    t0 = sum(times[0])
    for step, (f, b), m in zip(st.steps, times, mem_times):
        first = not step.transforms
        L.append(f"| {step.name} | {f * 1e3:,.0f} | {b * 1e3:,.0f} | {(f + b) * 1e3:,.0f} | "
                 f"{'—' if first else _pct((f + b) / t0 - 1)} | "
                 f"{'—' if first else _pct(t0 / (f + b) - 1)} | {m * 1e3:,.0f} | "
                 f"{step.paper_perf or '—'} |")
    f0, b0 = times[0]
    fb, bb = times[3]
    L += [
        "",
        f"BNFF by phase (estimate): forward time {_pct(fb / f0 - 1)} (speed-up "
        f"{_pct(f0 / fb - 1)}), backward time {_pct(bb / b0 - 1)} (speed-up {_pct(b0 / bb - 1)}); "
        "paper, measured: forward 47.9 %, backward 15.4 % performance improvement. The paper "
        "does not say whether 'performance improvement' is a speed-up or a time reduction.",
        "",
        f"One sweep of a 1-value-per-image tensor costs {per_sweep} bytes at this batch; "
        f"the largest feature map (stem conv output) is "
        f"{max(st.net.elements.values()) * per_sweep / 1e6:,.0f} MB per sweep.",
        "",
    ]
    return "\n".join(L)


def _write_csv(st: Study, path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "kernels", "sweeps_fwd", "sweeps_bwd", "bytes_fwd", "bytes_bwd",
                    "bytes_total", "reduction_vs_baseline", "bns_fused", "est_time_fwd_s",
                    "est_time_bwd_s", "paper_memory_reduction", "paper_perf_improvement"])
        for step, s, x, r in zip(st.steps, st.schedules, st.traffic(), st.reductions()):
            f, b = roofline_time(s, st.batch, st.machine, st.bytes_per_element)
            w.writerow([step.name, x.kernels, x.sweeps_fwd, x.sweeps_bwd, x.bytes_fwd,
                        x.bytes_bwd, x.bytes, f"{r:.6f}", len(s.fused_bn), f"{f:.6f}",
                        f"{b:.6f}", "" if step.paper_memory is None else step.paper_memory,
                        step.paper_perf])


def _write_png(st: Study, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t = st.traffic()
    names = [s.name for s in st.steps]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    xs = range(len(names))
    ax.bar(xs, [x.bytes_fwd / 1e9 for x in t], label="forward")
    ax.bar(xs, [x.bytes_bwd / 1e9 for x in t], bottom=[x.bytes_fwd / 1e9 for x in t],
           label="backward")
    for i, (x, r) in enumerate(zip(t, st.reductions())):
        ax.text(i, x.bytes / 1e9, "" if i == 0 else f"−{r:.1%}", ha="center", va="bottom")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("feature-map traffic per step (GB)")
    ax.set_title(f"DenseNet-121 training, batch {st.batch}, {st.input_size}², fp32 "
                 "(paper BNFF: −19.1 % accesses)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(out_dir: Path | str, batch: int = PAPER_BATCH,
                 input_size: int = PAPER_INPUT_SIZE) -> list[Path]:
    """``bnff.md``, ``bnff.csv`` and (with matplotlib) ``bnff.png`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    st = densenet121_study(batch, input_size)
    md, cs, png = out / "bnff.md", out / "bnff.csv", out / "bnff.png"
    md.write_text(report_markdown(st))
    _write_csv(st, cs)
    return [md, cs] + ([png] if _write_png(st, png) else [])
