"""The networks of the paper's memory study, built and quantised once, and the Table II search.

Table II is the minimum on-chip SRAM (eq. 6) over every cut-point policy, with the DRAM access
constraint (10) met by construction (the budget is unlimited, so every policy whose buffers are
allocated reads weights once and feature maps at most once). The networks are the architecture
builders' graphs with random weights, quantised from one synthetic calibration sample (shapes
are all that matter here). The full report — Tables II, III, IV and VI and Figs. 16–17 beside
the paper — is :mod:`.shortcut_fusion` (``sfnpu report``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import onnx

from sfnpu.compiler.blocks import Blocks
from sfnpu.compiler.cutpoints import Progress, SearchResult, search
from sfnpu.compiler.memory import Budget
from sfnpu.compiler.pipeline import Compiled
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.models import builders

__all__ = ["VGG_CONV_OUTPUT", "float_model", "study_model", "minimum_sram"]

#: Last tensor of VGG-16's convolution part (the fifth max-pool) in the builder's graph.
VGG_CONV_OUTPUT = "features.30"


class _Network(Protocol):
    network: str
    input_size: int
    conv_only: bool


def float_model(network: str, input_size: int, conv_only: bool = False) -> onnx.ModelProto:
    """The builder's float graph; ``conv_only``: VGG-16's 13 convolutions with their pools."""
    model = builders.build(network, input_size)
    if conv_only:
        if network != "vgg16":
            raise ValueError(f"conv_only is defined for vgg16 (VGG-CONV), not {network!r}")
        inferred = onnx.shape_inference.infer_shapes(model)
        model = onnx.utils.Extractor(inferred).extract_model(["input"], [VGG_CONV_OUTPUT])
    return model


def study_model(ref: _Network, workdir: Path) -> Path:
    """The QDQ model of one studied network (a Table II row or any object with ``network``,
    ``input_size`` and ``conv_only``), built and quantised once per ``workdir``."""
    suffix = "_conv" if ref.conv_only else ""
    path = Path(workdir) / f"{ref.network}{suffix}_{ref.input_size}.qdq.onnx"
    if not path.exists():
        partial = path.with_name(path.name.replace(".qdq.onnx", ".partial.qdq.onnx"))
        quantize_model(float_model(ref.network, ref.input_size, ref.conv_only), partial,
                       CalibrationSource.synthetic(1))
        partial.replace(path)
    return path


def minimum_sram(compiled: Compiled, blocks: Blocks | None = None,
                 progress: Progress | None = None,
                 segments: Sequence[int] | None = None) -> SearchResult:
    """The policy with the least SRAM (eq. 6) meeting constraint (10), buffers unlimited;
    ``segments``: as :func:`~sfnpu.compiler.cutpoints.search` (default: the network's)."""
    return search(compiled, Budget.unlimited(), objective="sram", blocks=blocks,
                  progress=progress, segments=segments)
