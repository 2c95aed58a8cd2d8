"""The compile pipeline: QDQ ONNX → IR → groups → program, and running a compiled model.

A compiled model runs in three parts: the host prologue (onnxruntime: quantise the inputs),
the accelerator program (the golden model today; the RTL later), and the host epilogue
(onnxruntime: dequantise, Softmax, …). The outputs are what onnxruntime returns for the whole
QDQ model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from sfnpu.config import HwConfig

from .codegen import Program, generate
from .groups import Group, fuse
from .ir import Graph, check
from .passes import (fold_input_taps, on_lane_blocks, run_passes,
                     space_to_depth_on_host,
                     space_to_depth_strided_convs, split_shared_wide_convs)
from .importer import HostPlan, Imported, import_model

__all__ = ["Compiled", "CompileState", "InputError", "PipelineConfig", "STEPS", "Step",
           "StepRecord", "check_inputs",
           "compile_model", "run_onnxruntime", "is_quantised", "ensure_qdq"]


@dataclass(frozen=True)
class PipelineConfig:
    """The switches of the compile pipeline — one definition, read by :func:`compile_model`,
    the command line (``--modules``) and the tests."""
    #: Kim et al.'s module-level on-chip allocation (:mod:`.modules`): branches re-ordered,
    #: module feature maps in the buffers {0, 1, 2} instead of DRAM.
    modules: bool = False
    #: Bytes of each buffer the module allocation may use; None: the configuration's.
    module_capacity: tuple[int, int, int] | None = None
    #: Stride-2 convolutions over few channels (network stems) rewritten as SpaceToDepth and a
    #: stride-1 convolution where that takes fewer array cycles
    #: (:func:`.passes.space_to_depth_strided_convs`; bit-exact either way).
    space_to_depth: bool = True
    #: Convolutions over a network input whose taps fit one lane block (3×3 stems over RGB)
    #: run as 1×1 over the taps, which the host prologue lays out as channels
    #: (:func:`.passes.fold_input_taps`; bit-exact either way).
    fold_input_taps: bool = True

    @property
    def steps(self) -> tuple[str, ...]:
        """The names of the steps this configuration runs, in order."""
        return tuple(step.name for step in STEPS if step.enabled(self))


@dataclass(frozen=True)
class CompileState:
    """What the pipeline carries from step to step: the target, the imported graph with its
    host plan, then the groups and the program as the steps produce them."""
    source: object                     # the QDQ model (a path or a ModelProto)
    target: HwConfig
    imported: Imported | None = None
    groups: tuple[Group, ...] | None = None
    program: Program | None = None
    #: The configuration-dependent rewrites that changed the graph, in order.
    rewrites: tuple[str, ...] = ()

    @property
    def graph(self) -> Graph:
        return self.imported.graph

    def with_graph(self, graph: Graph, host: HostPlan | None = None) -> "CompileState":
        return replace(self, imported=replace(self.imported, graph=graph,
                                              host=host or self.imported.host))

    def rewritten(self, name: str) -> "CompileState":
        return self if name in self.rewrites else replace(self, rewrites=self.rewrites + (name,))


#: A step: ``(state, pipeline) -> (state, changed)``.
StepFunction = Callable[[CompileState, "PipelineConfig"], tuple[CompileState, bool]]


@dataclass(frozen=True)
class Step:
    """One step of :data:`STEPS`: a pass with the one contract of :data:`StepFunction`."""
    name: str
    run: StepFunction
    #: The :class:`PipelineConfig` field that switches it on; None: it always runs.
    switch: str | None = None
    #: The name it records in :attr:`Compiled.rewrites` when it changes the graph; None for
    #: the steps every compilation takes.
    rewrite: str | None = None

    def enabled(self, pipeline: "PipelineConfig") -> bool:
        return self.switch is None or getattr(pipeline, self.switch)


@dataclass(frozen=True)
class StepRecord:
    """What the driver measured of one step: its wall time and whether it changed anything."""
    name: str
    seconds: float
    changed: bool


def _import(state, pipeline):
    return replace(state, imported=import_model(state.source)), True


def _passes(state, pipeline):
    graph, applied = run_passes(state.graph)
    return state.with_graph(graph), bool(applied)


def _split_shared_wide_convs(state, pipeline):
    graph, changed = split_shared_wide_convs(state.graph, state.target)
    return state.with_graph(graph), changed


def _fold_input_taps(state, pipeline):
    graph, folded = fold_input_taps(state.graph, state.target)
    if not folded:
        return state, False
    return state.with_graph(graph, state.imported.host.with_input_taps(folded)), True


def _fold_row_taps(state, pipeline):
    """The rows of a stride-1 stem over a SpaceToDepth that the host runs."""
    if not state.imported.host.space_to_depth:
        return state, False
    return _fold_input_taps(state, pipeline)


def _space_to_depth(state, pipeline):
    graph, changed = space_to_depth_strided_convs(state.graph, state.target)
    return state.with_graph(graph), changed


def _space_to_depth_on_host(state, pipeline):
    before = state.graph
    graph, moved = space_to_depth_on_host(before)
    if not moved:
        return state, False
    host = state.imported.host.with_space_to_depth(
        {new: (old, before.tensors[old].shape) for new, old in moved.items()})
    return state.with_graph(graph, host), True


def _lane_blocks(state, pipeline):
    graph, changed = on_lane_blocks(state.graph, state.target)
    return state.with_graph(graph), changed


def _fuse(state, pipeline):
    return replace(state, groups=tuple(fuse(state.graph))), True


def _generate(state, pipeline):
    program = generate(state.graph, list(state.groups), state.target)
    return replace(state, groups=tuple(program.groups), program=program), True


def _modules(state, pipeline):
    from .modules import plan_modules

    plan = plan_modules(state.graph, list(state.groups), state.target,
                        pipeline.module_capacity)
    return replace(state.with_graph(plan.graph), groups=tuple(plan.groups),
                   program=plan.program), True


#: The compile pipeline, in order; :func:`compile_model` runs, times and checks each step that
#: the :class:`PipelineConfig` switches on.
STEPS: tuple[Step, ...] = (
    Step("import", _import),                      # QDQ ONNX → IR (importer.py)
    Step("passes", _passes),                      # IR clean-ups (passes.PASSES)
    Step("split_shared_wide_convs", _split_shared_wide_convs,       # shared convs fit the store
         rewrite="split_shared_wide_convs"),
    Step("fold_input_taps", _fold_input_taps, "fold_input_taps",    # stems: host im2col + 1×1
         rewrite="fold_input_taps"),
    Step("space_to_depth", _space_to_depth, "space_to_depth",       # stems: SpaceToDepth +
         rewrite="space_to_depth"),                                 # a stride-1 conv
    Step("space_to_depth_on_host", _space_to_depth_on_host, "space_to_depth",  # …of an input:
         rewrite="space_to_depth_on_host"),                                     # on the host
    Step("fold_row_taps", _fold_row_taps, "fold_input_taps",        # its rows' taps: host
         rewrite="fold_input_taps"),
    Step("lane_blocks", _lane_blocks),            # Split/Slice views, Concat parts aligned
    Step("fuse", _fuse),                          # IR nodes → groups (groups.py)
    Step("generate", _generate),                  # groups → instructions + image (codegen.py)
    Step("modules", _modules, "modules"),         # module-level allocation (modules.py)
)


class InputError(ValueError):
    """Inputs that do not fit the model: names the input, what it takes and what it got."""


def check_inputs(expected: Sequence[onnx.ValueInfoProto], feeds: Mapping[str, np.ndarray]):
    """Every input the model takes, of its element type and shape (free dimensions match
    anything), and nothing else."""
    names = [vi.name for vi in expected]
    for name in feeds:
        if name not in names:
            raise InputError(f"input {name!r}: the model has no such input; it takes "
                             f"{', '.join(map(repr, names))}")
    for vi in expected:
        if vi.name not in feeds:
            raise InputError(f"input {vi.name!r} is missing; the model takes "
                             f"{', '.join(map(repr, names))}")
        t, given = vi.type.tensor_type, np.asarray(feeds[vi.name])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        shape = "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"
        if given.dtype != dtype:
            raise InputError(f"input {vi.name!r}: {given.dtype} values; the model takes "
                             f"{dtype} of shape {shape}")
        if len(dims) != given.ndim or any(d is not None and d != g
                                          for d, g in zip(dims, given.shape)):
            raise InputError(f"input {vi.name!r}: shape {tuple(given.shape)}; the model takes "
                             f"{shape}")


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict:
    """The reference: onnxruntime's CPU execution with default optimisation."""
    session = _session(model)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds))))


@dataclass
class Compiled:
    imported: Imported
    groups: list[Group]
    program: Program
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)   # what produced it
    #: The configuration-dependent rewrites that changed the graph ("split_shared_wide_convs",
    #: "space_to_depth"): the program computes the network through them.
    rewrites: tuple[str, ...] = ()
    #: Each step the pipeline ran: its time and whether it changed anything.
    steps: tuple[StepRecord, ...] = ()

    @property
    def graph(self):
        return self.imported.graph

    @property
    def input_names(self) -> list[str]:
        """The model inputs :meth:`run` takes."""
        return [i.name for i in self.imported.host.prologue.graph.input]

    @property
    def mac_share(self) -> float:
        """The share of convolution MACs on the accelerator: all of them (the host's
        epilogue holds no convolution or matrix product)."""
        return 1.0

    def zero_image(self) -> bytes:
        """The program's image with its input sections zeroed (``sfnpu run`` fills them)."""
        tensors = self.graph.tensors
        return self.program.pack([np.zeros(tensors[n].shape, tensors[n].qtype.dtype)
                                  for n in self.program.inputs])

    def quantise_inputs(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Host prologue: float graph inputs → 8-bit ``(C, H, W)`` accelerator inputs."""
        q = run_onnxruntime(self.imported.host.prologue, feeds)
        return [q[name][0] if q[name].ndim == 4 else q[name].reshape(-1, 1, 1)
                for name in self.program.inputs]

    def finish(self, outputs: list[np.ndarray]) -> dict:
        """Host epilogue: accelerator outputs → the model's outputs."""
        by_name = dict(zip(self.program.outputs, outputs))
        feeds = {name: by_name[ir_name][None].reshape(shape)
                 for name, (ir_name, shape) in self.imported.host.epilogue_feeds.items()}
        return run_onnxruntime(self.imported.host.epilogue, feeds)

    def run(self, feeds: Mapping[str, np.ndarray],
            accelerator: Callable[[bytes], list[np.ndarray]]) -> dict:
        """Run the whole model with ``accelerator`` (image bytes → output arrays)."""
        check_inputs(self.imported.host.prologue.graph.input, feeds)
        blob = self.program.pack(self.quantise_inputs(feeds))
        return self.finish(accelerator(blob))


def is_quantised(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def ensure_qdq(src, workdir, calibration=None, activation_signed: bool = False):
    """A QDQ model path for ``src``: itself when already quantised, otherwise quantised with
    onnxruntime from ``calibration`` (a CalibrationSource; synthetic data when None).
    Returns (path, notes for the report)."""
    from pathlib import Path

    from .importer import load_model
    from .quantize import CalibrationSource, quantize_model

    model = load_model(src)
    if is_quantised(model):
        return Path(src), ["input model is already int8 QDQ"]
    if calibration is None:
        calibration = CalibrationSource.synthetic()
    out = Path(workdir) / (Path(str(src)).stem + ".qdq.onnx")
    result = quantize_model(model, out, calibration, activation_signed=activation_signed)
    notes = [f"quantised with onnxruntime from {result.calibration_label} "
             f"({result.n_samples} samples{', SYNTHETIC' if result.synthetic else ''})"]
    return out, notes


def compile_model(src, config: HwConfig, pipeline: PipelineConfig = PipelineConfig()
                  ) -> Compiled:
    """Run the steps of :data:`STEPS` that ``pipeline`` switches on, timing each and checking
    the graph after every step that changed it."""
    state, log = CompileState(src, config), []
    for step in STEPS:
        if not step.enabled(pipeline):
            continue
        t0 = time.perf_counter()
        before = state.imported and state.graph
        state, changed = step.run(state, pipeline)
        if state.graph is not before:
            check(state.graph)
        if changed and step.rewrite is not None:
            state = state.rewritten(step.rewrite)
        log.append(StepRecord(step.name, time.perf_counter() - t0, changed))
    return Compiled(state.imported, list(state.groups), state.program, pipeline,
                    state.rewrites, tuple(log))
