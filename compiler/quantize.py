"""Float ONNX -> int8 QDQ ONNX with onnxruntime's quantiser (and nothing else).

The QDQ model this writes is what the rest of sfnpu consumes (see the numeric contract in the
design brief): int8 per-output-channel symmetric weights, uint8 (default) or int8 asymmetric
activations, MinMax calibration by default.

Steps of :func:`quantize_model`; 2–4 and 6 are small ``(model) -> (model, changed)`` passes, 5 and 7
are onnxruntime's own:

1. load and check (missing file, not ONNX, external data outside the model's folder, input rank);
2. :func:`constants_to_initializers` — ``quantize_static`` does *not* treat weights held in
   ``Constant`` nodes as weights: it inserts an activation-style per-tensor uint8 Q/DQ pair after
   the Constant (measured with onnxruntime 1.31 on rapidocr's classifier), so per-channel int8
   weights need them as initializers first;
3. :func:`fix_input_shape` — batch 1 and the calibration sample's spatial size, so that shape
   computations (``Shape → Slice → Concat → Reshape`` flatten idioms) fold to constants;
4. :func:`upgrade_opset` — per-channel DequantizeLinear needs opset ≥ 13 (the quantiser itself
   does not convert older models);
5. ``onnxruntime.quantization.shape_inference.quant_pre_process`` (symbolic shape inference,
   basic ORT optimisation which folds BatchNormalization into Conv, ONNX shape inference). If
   symbolic shape inference fails (it rejects a 1-D ``Concat`` with ``axis=-1``, as in
   PaddlePaddle exports) it is skipped — the shapes are static by then — and a note says so;
6. :func:`fuse_hardswish` — onnxruntime inlines ``HardSwish`` as ``HardSigmoid`` + ``Mul`` (it
   has no CPU kernel for it) and PaddlePaddle spells it ``Add/Clip/Mul/Div``; re-fused, each
   quantises as one unary op between DequantizeLinear and QuantizeLinear (one table);
7. ``onnxruntime.quantization.quantize_static`` with ``QuantFormat.QDQ``.

Calibration data (:class:`CalibrationSource`):

* ``images(folder)`` — every image file in ``folder`` (sorted by name), converted to RGB (or
  L for one-channel models), resized to the model's H×W (bilinear), scaled to [0, 1], then
  ``(x − mean)/std`` per channel; defaults ``mean = 0``, ``std = 1`` (plain [0, 1] scaling);
* ``npy(folder)`` — every ``.npy`` file: one sample (C×H×W) or a batch (N×C×H×W), used as is;
* ``arrays(x)`` — samples already in memory (e.g. rendered images after normalisation);
* ``synthetic(n, seed)`` — seeded uniform noise in [0, 1] pixel space, then ``mean``/``std``.
  Labelled as synthetic in the result: fine for exercising the flow, not representative.
"""

from __future__ import annotations

import pathlib
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader

from .importer import all_tensors

__all__ = [
    "IMAGE_SUFFIXES",
    "CalibrationSource",
    "QuantizeError",
    "QuantizeResult",
    "SampleReader",
    "constants_to_initializers",
    "fix_input_shape",
    "fuse_hardswish",
    "load_float_model",
    "quantize_model",
    "upgrade_opset",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
MIN_OPSET = 13  # per-channel (axis) DequantizeLinear
HARDSWISH_OPSET = 14  # HardSwish entered the default domain in opset 14


class QuantizeError(ValueError):
    """A model or calibration set that cannot be quantised, with the reason."""


# ---------------------------------------------------------------------------------------------
# loading and checking


def _check_external_data(model: onnx.ModelProto, base_dir: pathlib.Path, what: str) -> bool:
    """The importer's external-data check (one definition), reported as a QuantizeError."""
    from .importer import ModelError, check_external_data

    try:
        return check_external_data(model, base_dir, what)
    except ModelError as e:
        raise QuantizeError(str(e)) from None


def load_float_model(model: onnx.ModelProto | str | pathlib.Path) -> onnx.ModelProto:
    """Load and check a float ONNX model; clear errors for the usual mistakes.

    ``FileNotFoundError`` for a missing path; :class:`QuantizeError` for a file that is not an
    ONNX model, an invalid graph, or external data outside the model's folder. A ``ModelProto``
    is copied, never modified.
    """
    if isinstance(model, onnx.ModelProto):
        what = f"model {model.graph.name or '<unnamed>'}"
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        if any(
            t.data_location == onnx.TensorProto.EXTERNAL
            for t in all_tensors(proto.graph)
        ):
            raise QuantizeError(
                f"{what} references external data that is not loaded; pass the model's path instead"
            )
    else:
        path = pathlib.Path(model)
        what = str(path)
        if not path.is_file():
            raise FileNotFoundError(f"ONNX model not found: {path}")
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as e:  # protobuf DecodeError and friends
            raise QuantizeError(f"{path} is not an ONNX model ({type(e).__name__}: {e})") from None
        if _check_external_data(proto, path.parent, what):
            onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
    if not proto.graph.node or not proto.opset_import:
        raise QuantizeError(f"{what} is not an ONNX model (no graph nodes or no opset)")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise QuantizeError(f"{what} is not a valid ONNX model: {first}") from None
    return proto


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _dims(vi: onnx.ValueInfoProto) -> list[int | None]:
    """Static dims as ints, symbolic/unknown dims as None."""
    t = vi.type.tensor_type
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim]


# ---------------------------------------------------------------------------------------------
# passes: (model) -> (model, changed)


def constants_to_initializers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """Move top-level tensor-valued ``Constant`` nodes into graph initializers.

    ``value``, ``value_float(s)`` and ``value_int(s)`` Constants become initializers named after
    the node's output; ``sparse_value``/string Constants and Constants inside subgraphs are left
    alone. Returns a new model and whether anything changed.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    keep: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    for n in g.node:
        if n.op_type != "Constant" or n.domain not in ("", "ai.onnx") or len(n.attribute) != 1:
            keep.append(n)
            continue
        a = n.attribute[0]
        name = n.output[0]
        if a.name == "value":
            t = onnx.TensorProto()
            t.CopyFrom(a.t)
            t.name = name
        elif a.name == "value_float":
            t = numpy_helper.from_array(np.array(a.f, np.float32), name)
        elif a.name == "value_floats":
            t = numpy_helper.from_array(np.array(list(a.floats), np.float32), name)
        elif a.name == "value_int":
            t = numpy_helper.from_array(np.array(a.i, np.int64), name)
        elif a.name == "value_ints":
            t = numpy_helper.from_array(np.array(list(a.ints), np.int64), name)
        else:
            keep.append(n)
            continue
        new_inits.append(t)
    if not new_inits:
        return model, False
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new_inits)
    return out, True


def fix_input_shape(
    model: onnx.ModelProto, shape: Sequence[int]
) -> tuple[onnx.ModelProto, bool]:
    """Give the (single) graph input the static ``shape``; drop stale intermediate shapes.

    Static dims already present must agree with ``shape``. ``value_info`` and output dims are
    cleared so shape inference recomputes them consistently.
    """
    inputs = _graph_inputs(model)
    if len(inputs) != 1:
        raise QuantizeError(f"expected a model with one input, got {len(inputs)}")
    dims = _dims(inputs[0])
    if len(dims) != len(shape):
        raise QuantizeError(
            f"input {inputs[0].name!r} has rank {len(dims)}, the calibration samples rank {len(shape)}"
        )
    for i, (d, s) in enumerate(zip(dims, shape)):
        if d is not None and d != s:
            raise QuantizeError(
                f"input {inputs[0].name!r} dim {i} is {d}, the calibration samples have {s}"
            )
    if dims == list(shape) and not model.graph.value_info:
        return model, False
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        if vi.name == inputs[0].name:
            del vi.type.tensor_type.shape.dim[:]
            for s in shape:
                vi.type.tensor_type.shape.dim.add().dim_value = int(s)
    for vi in out.graph.output:
        vi.type.tensor_type.ClearField("shape")
    del out.graph.value_info[:]
    return out, True


def upgrade_opset(model: onnx.ModelProto, minimum: int = MIN_OPSET) -> tuple[onnx.ModelProto, bool]:
    """Convert the default-domain opset to at least ``minimum`` with onnx's version converter."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is None or version >= minimum:
        return model, False
    try:
        return onnx.version_converter.convert_version(model, minimum), True
    except Exception as e:
        raise QuantizeError(f"cannot convert the model from opset {version} to {minimum}: {e}") from None


def _scalar(name: str, inits: dict[str, onnx.TensorProto]) -> float | None:
    t = inits.get(name)
    if t is None:
        return None
    a = numpy_helper.to_array(t)
    if a.size != 1:
        return None
    return float(a.reshape(()))


def fuse_hardswish(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Rewrite spelt-out HardSwish sub-graphs as one ``HardSwish`` node (opset >= 14).

    Patterns (``x`` any tensor, constants as scalar initializers, every intermediate used once):

    * ``Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))`` — what onnxruntime makes of ``HardSwish``
      (it has no CPU kernel for it and inlines the ONNX function definition, even with all
      optimisations off);
    * ``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)`` or ``… Mul(…, 1/6)`` — PaddlePaddle's export.

    One ``HardSwish`` between DequantizeLinear and QuantizeLinear is a single 256-entry table in
    the numeric contract; the unfused forms quantise into a table *and* an element-wise
    QLinearMul (plus extra requantisations for the Paddle form). Returns ``(model, n_fused)``.
    """
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    uses: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    for o in g.output:
        uses[o.name] = uses.get(o.name, 0) + 1

    def prod(name: str, op: str) -> onnx.NodeProto | None:
        n = producer.get(name)
        return n if n is not None and n.op_type == op and uses.get(name, 0) == 1 else None

    def other(n: onnx.NodeProto, name: str) -> str | None:
        a, b = n.input[0], n.input[1]
        return b if a == name else a if b == name else None

    def close(v: float | None, want: float) -> bool:
        return v is not None and abs(v - want) <= 1e-6 * max(1.0, abs(want))

    replace: dict[int, onnx.NodeProto] = {}  # id(last node) -> HardSwish
    dead: set[int] = set()
    for n in g.node:
        if id(n) in dead:
            continue
        chain: list[onnx.NodeProto] | None = None
        x = None
        if n.op_type == "Mul":  # Mul(x, HardSigmoid(x))
            for hs_in in n.input:
                hs = prod(hs_in, "HardSigmoid")
                if hs is None:
                    continue
                attrs = {a.name: a.f for a in hs.attribute}
                if (other(n, hs_in) == hs.input[0] and close(attrs.get("alpha", 0.2), 1 / 6)
                        and close(attrs.get("beta", 0.5), 0.5)):
                    chain, x = [hs, n], hs.input[0]
                    break
        if chain is None and n.op_type in ("Div", "Mul"):  # (x * Clip(x + 3, 0, 6)) / 6
            for mul_in in n.input:
                c = other(n, mul_in)
                k = _scalar(c, inits) if c is not None else None
                if not (close(k, 6.0) if n.op_type == "Div" else close(k, 1 / 6)):
                    continue
                if n.op_type == "Div" and mul_in != n.input[0]:
                    continue
                mul = prod(mul_in, "Mul")
                if mul is None:
                    continue
                for clip_in in mul.input:
                    clip = prod(clip_in, "Clip")
                    if clip is None or len(clip.input) != 3:
                        continue
                    if not (close(_scalar(clip.input[1], inits), 0.0)
                            and close(_scalar(clip.input[2], inits), 6.0)):
                        continue
                    add = prod(clip.input[0], "Add")
                    xx = other(mul, clip_in)
                    if add is None or xx is None or other(add, xx) is None:
                        continue
                    if not close(_scalar(other(add, xx), inits), 3.0):
                        continue
                    chain, x = [add, clip, mul, n], xx
                    break
                if chain is not None:
                    break
        if chain is None:
            continue
        for c in chain[:-1]:
            dead.add(id(c))
        replace[id(n)] = helper.make_node(
            "HardSwish", [x], [n.output[0]], name=(n.name or n.output[0]) + "/hardswish"
        )
    if not replace:
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = [replace.get(id(n), n) for n in g.node if id(n) not in dead]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    used = {i for n in nodes for i in n.input} | {v.name for v in g.input} | {v.name for v in g.output}
    keep = [t for t in out.graph.initializer if t.name in used]
    if len(keep) != len(out.graph.initializer):
        del out.graph.initializer[:]
        out.graph.initializer.extend(keep)
    names = {o for n in nodes for o in n.output}
    vis = [v for v in out.graph.value_info if v.name in names]
    del out.graph.value_info[:]
    out.graph.value_info.extend(vis)
    return out, len(replace)


# ---------------------------------------------------------------------------------------------
# calibration data


@dataclass(frozen=True, eq=False)
class CalibrationSource:
    """Where calibration samples come from; build with the class methods."""

    kind: str  # "images" | "npy" | "arrays" | "synthetic"
    path: pathlib.Path | None = None
    data: np.ndarray | None = None
    label: str = ""
    limit: int | None = None  # at most this many samples (folders, arrays)
    n: int = 0  # synthetic sample count
    seed: int = 0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    size: tuple[int, int] | None = None  # (H, W) when the model's are symbolic

    @classmethod
    def images(
        cls,
        folder: str | pathlib.Path,
        *,
        mean: Sequence[float] = (0.0,),
        std: Sequence[float] = (1.0,),
        size: tuple[int, int] | None = None,
        limit: int | None = None,
    ) -> CalibrationSource:
        """Image files in ``folder``: RGB, resized to H×W, [0, 1], then ``(x − mean)/std``."""
        return cls("images", path=pathlib.Path(folder), mean=tuple(mean), std=tuple(std),
                   size=size, limit=limit, label=f"images from {folder}")

    @classmethod
    def npy(cls, folder: str | pathlib.Path, *, limit: int | None = None) -> CalibrationSource:
        """``.npy`` files in ``folder``, each one sample (C×H×W) or a batch (N×C×H×W)."""
        return cls("npy", path=pathlib.Path(folder), limit=limit, label=f".npy files from {folder}")

    @classmethod
    def arrays(
        cls, x: np.ndarray, label: str = "in-memory arrays", *, limit: int | None = None
    ) -> CalibrationSource:
        """Samples already prepared for the model: N×C×H×W (or one C×H×W sample)."""
        return cls("arrays", data=np.asarray(x), limit=limit, label=label)

    @classmethod
    def synthetic(
        cls,
        n: int = 16,
        seed: int = 0,
        *,
        mean: Sequence[float] = (0.0,),
        std: Sequence[float] = (1.0,),
        size: tuple[int, int] | None = None,
    ) -> CalibrationSource:
        """``n`` seeded uniform-noise inputs in [0, 1] pixel space, then ``(x − mean)/std``."""
        if n < 1:
            raise QuantizeError("synthetic calibration needs n >= 1")
        return cls("synthetic", n=n, seed=seed, mean=tuple(mean), std=tuple(std), size=size,
                   label=(f"SYNTHETIC: {n} seeded uniform-noise inputs (seed={seed}); "
                          "not representative of real data"))

    @property
    def synthetic_data(self) -> bool:
        return self.kind == "synthetic"

    # -- sample generation -------------------------------------------------------------------

    def _spatial(self, model_dims: list[int | None], input_name: str) -> tuple[int, int]:
        h, w = model_dims[-2], model_dims[-1]
        if self.size is not None:
            sh, sw = self.size
            if (h is not None and h != sh) or (w is not None and w != sw):
                raise QuantizeError(
                    f"calibration size {self.size} disagrees with input {input_name!r} "
                    f"H×W {h}×{w}"
                )
            return int(sh), int(sw)
        if h is None or w is None:
            raise QuantizeError(
                f"input {input_name!r} has a symbolic height/width; give the calibration source "
                "size=(H, W)"
            )
        return h, w

    def _norm(self, x: np.ndarray) -> np.ndarray:
        c = x.shape[1]
        m = np.asarray(self.mean, np.float32)
        s = np.asarray(self.std, np.float32)
        if m.size not in (1, c) or s.size not in (1, c):
            raise QuantizeError(f"mean/std need 1 or {c} values, got {m.size}/{s.size}")
        if np.any(s == 0):
            raise QuantizeError("std must be non-zero")
        return ((x - m.reshape(1, -1, 1, 1)) / s.reshape(1, -1, 1, 1)).astype(np.float32)

    def samples(self, model_input: onnx.ValueInfoProto) -> list[np.ndarray]:
        """The calibration samples, each shaped ``1×…`` for ``model_input``."""
        dims = _dims(model_input)
        name = model_input.name
        if self.kind in ("images", "synthetic"):
            if len(dims) != 4:
                raise QuantizeError(
                    f"{self.kind} calibration needs a rank-4 N×C×H×W input; input {name!r} has "
                    f"rank {len(dims)}"
                )
            c = dims[1]
            if c is None:
                raise QuantizeError(f"input {name!r} has a symbolic channel count")
            h, w = self._spatial(dims, name)
            if self.kind == "synthetic":
                rng = np.random.default_rng(self.seed)
                x = rng.random((self.n, c, h, w), dtype=np.float32)
                return list(self._norm(x)[:, None])
            return list(self._norm(self._load_images(c, h, w))[:, None])
        if self.kind == "npy":
            arrays = self._load_npy()
        elif self.kind == "arrays":
            arrays = [self.data]
        else:
            raise QuantizeError(f"unknown calibration kind {self.kind!r}")
        out: list[np.ndarray] = []
        for i, a in enumerate(arrays):
            what = f"{self.label} (array {i})" if len(arrays) > 1 else self.label
            if a.ndim == len(dims) - 1:
                a = a[None]
            if a.ndim != len(dims):
                raise QuantizeError(
                    f"{what}: samples of rank {a.ndim} (shape {a.shape}) do not fit input "
                    f"{name!r} of rank {len(dims)}"
                )
            for j, (d, s) in enumerate(zip(dims[1:], a.shape[1:]), start=1):
                if d is not None and d != s:
                    raise QuantizeError(
                        f"{what}: sample shape {a.shape[1:]} does not fit input {name!r} "
                        f"(dim {j} is {d})"
                    )
            if not np.issubdtype(a.dtype, np.number):
                raise QuantizeError(f"{what}: dtype {a.dtype} is not numeric")
            out.extend(np.asarray(s, np.float32)[None] for s in a)
        if self.limit is not None:
            out = out[: self.limit]
        if not out:
            raise QuantizeError(f"{self.label}: no calibration samples")
        shapes = {s.shape for s in out}
        if len(shapes) != 1:
            raise QuantizeError(f"{self.label}: samples differ in shape: {sorted(shapes)}")
        return out

    def _files(self, suffixes: Sequence[str]) -> list[pathlib.Path]:
        assert self.path is not None
        if not self.path.is_dir():
            raise FileNotFoundError(f"calibration folder not found: {self.path}")
        files = sorted(p for p in self.path.iterdir() if p.is_file() and p.suffix.lower() in suffixes)
        if not files:
            raise QuantizeError(f"no {'/'.join(suffixes)} files in calibration folder {self.path}")
        return files[: self.limit] if self.limit is not None else files

    def _load_images(self, c: int, h: int, w: int) -> np.ndarray:
        from PIL import Image, UnidentifiedImageError

        if c not in (1, 3):
            raise QuantizeError(f"image calibration needs 1 or 3 input channels, the model has {c}")
        out = np.empty((0, c, h, w), np.float32)
        batch = []
        for p in self._files(IMAGE_SUFFIXES):
            try:
                with Image.open(p) as im:
                    im = im.convert("RGB" if c == 3 else "L")
                    if im.size != (w, h):
                        im = im.resize((w, h), Image.Resampling.BILINEAR)
                    a = np.asarray(im, np.float32) / np.float32(255.0)
            except (UnidentifiedImageError, OSError) as e:
                raise QuantizeError(f"cannot read calibration image {p}: {e}") from None
            batch.append(a[None] if c == 1 else a.transpose(2, 0, 1))
        return np.stack(batch) if batch else out

    def _load_npy(self) -> list[np.ndarray]:
        arrays = []
        for p in self._files((".npy",)):
            try:
                arrays.append(np.load(p, allow_pickle=False))
            except ValueError as e:
                raise QuantizeError(f"cannot read {p}: {e}") from None
        return arrays


class SampleReader(CalibrationDataReader):
    """``onnxruntime.quantization.CalibrationDataReader`` over a list of samples (rewindable)."""

    def __init__(self, input_name: str, samples: Sequence[np.ndarray]):
        self.input_name = input_name
        self.samples = list(samples)
        self._i = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._i >= len(self.samples):
            return None
        self._i += 1
        return {self.input_name: self.samples[self._i - 1]}

    def rewind(self) -> None:
        self._i = 0

    def __len__(self) -> int:
        return len(self.samples)


# ---------------------------------------------------------------------------------------------
# the driver


@dataclass(frozen=True)
class QuantizeResult:
    path: pathlib.Path
    calibration_label: str
    n_samples: int
    synthetic: bool
    activation_type: str  # "uint8" | "int8"
    calibrate_method: str
    input_shape: tuple[int, ...]
    seconds: float
    notes: tuple[str, ...] = field(default=())


def _trim_opset_imports(path: pathlib.Path) -> None:
    """Drop opset imports of domains no node uses (onnxruntime's optimiser adds a dozen)."""
    m = onnx.load(str(path))
    used = {n.domain or "" for n in m.graph.node} | {""}
    keep = [o for o in m.opset_import if (o.domain or "") in used or o.domain == "ai.onnx"]
    if len(keep) != len(m.opset_import):
        del m.opset_import[:]
        m.opset_import.extend(keep)
        onnx.save(m, str(path))


_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile",
            "distribution": "Distribution"}


def _method(calibrate_method):
    from onnxruntime.quantization import CalibrationMethod

    if isinstance(calibrate_method, CalibrationMethod):
        return calibrate_method
    key = str(calibrate_method).lower()
    if key not in _METHODS:
        raise QuantizeError(f"unknown calibration method {calibrate_method!r}; one of {sorted(_METHODS)}")
    return getattr(CalibrationMethod, _METHODS[key])


#: The newest ONNX IR version onnxruntime reads; models saved with a newer one are relabelled
#: (the opsets sfnpu accepts, 11–21, all exist at this IR version).
ORT_MAX_IR_VERSION = 10


def _reported(step):
    """Run an onnxruntime quantisation step; its failures become a QuantizeError."""
    def run(*args, **kwargs):
        try:
            return step(*args, **kwargs)
        except QuantizeError:
            raise
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise QuantizeError(f"onnxruntime could not quantise the model "
                                f"({step.__name__}): {first}") from None
    return run


def quantize_model(
    model: onnx.ModelProto | str | pathlib.Path,
    out_path: str | pathlib.Path,
    calibration: CalibrationSource,
    activation_signed: bool = False,
    calibrate_method="minmax",
    hardswish: bool = True,
    reduce_range: bool = True,
) -> QuantizeResult:
    """Quantise a float model to an int8 QDQ model at ``out_path`` (see the module docstring).

    Weights: int8, per output channel, symmetric. Activations: uint8 (``activation_signed=False``,
    default) or int8, asymmetric. The written model has a static batch-1 input.
    ``calibrate_method``: ``"minmax"`` (default), ``"entropy"``, ``"percentile"``,
    ``"distribution"`` or an ``onnxruntime.quantization.CalibrationMethod``.
    ``hardswish=True`` re-fuses spelt-out HardSwish sub-graphs (:func:`fuse_hardswish`) after
    pre-processing, so each quantises as one unary op; ``False`` keeps onnxruntime's form.
    ``reduce_range`` (default on) is passed to ``quantize_static``: 7-bit weights. On x86 CPUs
    without VNNI, onnxruntime's uint8×int8 convolution kernel sums products in pairs with int16
    saturation (``vpmaddubsw``), so with full 8-bit weights the reference itself is not the
    exact integer convolution the accelerator computes; 7-bit weights cannot saturate, which
    keeps onnxruntime exact and the comparison bit for bit (see :mod:`sfnpu.numeric`).
    """
    from onnxruntime import InferenceSession
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    t0 = time.perf_counter()
    method = _method(calibrate_method)
    out_path = pathlib.Path(out_path)
    proto = load_float_model(model)
    inputs = _graph_inputs(proto)
    if len(inputs) != 1:
        raise QuantizeError(f"quantize_model supports single-input models; this one has {len(inputs)}")
    elem = inputs[0].type.tensor_type.elem_type
    if elem != onnx.TensorProto.FLOAT:
        raise QuantizeError(
            f"input {inputs[0].name!r} is {onnx.TensorProto.DataType.Name(elem)}, expected FLOAT"
        )
    samples = calibration.samples(inputs[0])
    shape = tuple(int(d) for d in samples[0].shape)

    notes: list[str] = []
    n_const = sum(n.op_type == "Constant" for n in proto.graph.node)
    proto, changed = constants_to_initializers(proto)
    if changed:
        left = sum(n.op_type == "Constant" for n in proto.graph.node)
        notes.append(f"moved {n_const - left} Constant nodes into initializers")
    proto, changed = fix_input_shape(proto, shape)
    if changed:
        notes.append(f"input {inputs[0].name!r} fixed to {shape}")
    before = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    wanted = MIN_OPSET
    if hardswish and (fuse_hardswish(proto)[1] or any(n.op_type == "HardSwish" for n in proto.graph.node)):
        wanted = HARDSWISH_OPSET
    proto, changed = upgrade_opset(proto, wanted)
    if changed:
        notes.append(f"opset {before} -> {wanted}")
    if proto.ir_version > ORT_MAX_IR_VERSION:
        # Newer onnx writes IR versions onnxruntime cannot read; the opsets sfnpu accepts
        # need no more than this one.
        notes.append(f"IR version {proto.ir_version} -> {ORT_MAX_IR_VERSION}")
        proto.ir_version = ORT_MAX_IR_VERSION

    with tempfile.TemporaryDirectory(prefix="sfnpu-quant-") as tmp:
        tmp = pathlib.Path(tmp)
        prepared = tmp / "prepared.onnx"
        pre = tmp / "preprocessed.onnx"
        onnx.save(proto, str(prepared))
        try:
            quant_pre_process(str(prepared), str(pre))
        except Exception as e:  # symbolic shape inference is the fragile part
            why = f"{type(e).__name__}: {str(e)[:80]}" if str(e) else type(e).__name__
            notes.append(
                f"symbolic shape inference failed ({why}); "
                "pre-processed without it (static shapes)"
            )
            _reported(quant_pre_process)(str(prepared), str(pre), skip_symbolic_shape=True)
        if hardswish:
            fused, n_fused = fuse_hardswish(onnx.load(str(pre)))
            if n_fused:
                notes.append(f"fused {n_fused} HardSwish sub-graphs")
                onnx.save(fused, str(pre))

        out_path.parent.mkdir(parents=True, exist_ok=True)
        _quantize_static = _reported(quantize_static)
        _quantize_static(
            str(pre),
            str(out_path),
            SampleReader(inputs[0].name, samples),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=reduce_range,
            activation_type=QuantType.QInt8 if activation_signed else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=method,
            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
        )
    _trim_opset_imports(out_path)
    try:
        InferenceSession(str(out_path), providers=["CPUExecutionProvider"])
    except Exception as e:
        raise QuantizeError(f"onnxruntime cannot load the quantised model {out_path}: {e}") from None
    return QuantizeResult(
        path=out_path,
        calibration_label=calibration.label,
        n_samples=len(samples),
        synthetic=calibration.synthetic_data,
        activation_type="int8" if activation_signed else "uint8",
        calibrate_method=method.name,
        input_shape=shape,
        seconds=time.perf_counter() - t0,
        notes=tuple(notes),
    )
