"""The compile pipeline: QDQ ONNX → IR → groups → program, and running a compiled model.

A compiled model runs in three parts: the host prologue (onnxruntime: quantise the inputs),
the accelerator program (the golden model today; the RTL later), and the host epilogue
(onnxruntime: dequantise, Softmax, …). The outputs are what onnxruntime returns for the whole
QDQ model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import numpy as np
import onnx
import onnxruntime as ort

from sfnpu.config import HwConfig

from .codegen import Program, generate
from .groups import Group, fuse
from .ir import Graph, check
from .passes import (fold_input_taps, run_passes, space_to_depth_on_host,
                     space_to_depth_strided_convs, split_shared_wide_convs)
from .importer import Imported, import_model

__all__ = ["Compiled", "PipelineConfig", "STEPS", "compile_model", "run_onnxruntime",
           "is_quantised", "ensure_qdq"]


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
        return tuple(name for name, switch in STEPS if switch is None or getattr(self, switch))


#: The compile pipeline, in order: (step, the PipelineConfig field that switches it on, or
#: None for a step that always runs).
STEPS: tuple[tuple[str, str | None], ...] = (
    ("import", None),         # QDQ ONNX → IR (importer.py)
    ("passes", None),         # IR passes (passes.py), then shared convs split to fit the store
    ("fold_input_taps", "fold_input_taps"),  # stems: the host's im2col + 1×1 conv (passes.py)
    ("space_to_depth", "space_to_depth"),   # stems: SpaceToDepth + stride-1 conv (passes.py)
    ("fuse", None),           # IR nodes → groups (groups.py)
    ("generate", None),       # groups → instructions, every feature map in DRAM (codegen.py)
    ("modules", "modules"),   # module-level allocation (modules.py)
)


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

    @property
    def graph(self):
        return self.imported.graph

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
    """Run the steps of :data:`STEPS` that ``pipeline`` switches on."""
    imported = import_model(src)
    graph, _ = run_passes(imported.graph)
    rewrites, host = [], imported.host

    def rewritten(name: str, result: Graph, changed) -> Graph:
        if changed:
            check(result)
            if name not in rewrites:
                rewrites.append(name)
        return result

    def taps_folded(graph: Graph) -> Graph:
        nonlocal host
        if not pipeline.fold_input_taps:
            return graph
        graph, folded = fold_input_taps(graph, config)
        if folded:
            host = host.with_input_taps(folded)
        return rewritten("fold_input_taps", graph, folded)

    graph = rewritten("split_shared_wide_convs", *split_shared_wide_convs(graph, config))
    graph = taps_folded(graph)
    if pipeline.space_to_depth:
        before = rewritten("space_to_depth", *space_to_depth_strided_convs(graph, config))
        graph, moved = space_to_depth_on_host(before)
        graph = rewritten("space_to_depth_on_host", graph, moved)
        if moved:
            host = host.with_space_to_depth({new: (old, before.tensors[old].shape)
                                             for new, old in moved.items()})
            graph = taps_folded(graph)      # the rows of a stride-1 stem over SpaceToDepth
    imported = replace(imported, graph=graph, host=host)
    groups = fuse(graph)
    compiled = Compiled(imported, groups, generate(graph, groups, config), pipeline,
                        tuple(rewrites))
    if pipeline.modules:
        from .modules import apply_modules
        compiled = apply_modules(compiled, pipeline.module_capacity)
    return compiled
