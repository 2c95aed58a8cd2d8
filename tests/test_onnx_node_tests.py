"""The ONNX backend node tests of the operators sfnpu accelerates: golden model vs onnxruntime.

``onnx.backend.test.loader.load_node_model_tests()`` generates the node tests (a one-node model
and input/output data sets each). Every test whose single node has an op type in
``importer.SUPPORTED_OPS`` runs here, with one of two acceptable outcomes:

* **passed** — quantised (calibrated on the test's own input plus a few random samples),
  compiled for the ``tiny`` configuration and run on the golden model: every output equals
  onnxruntime's on the QDQ model, value for value, and the op ran on the accelerator;
* **unsupported** — the model is outside what sfnpu runs (batch ≠ 1, a rank that is not a
  feature map, dilations, integer tensors, …) and sfnpu says so with one of its own errors
  (``ModelError``, ``IRError``, ``CodegenError``, ``QuantizeError``).

Anything else — a mismatch, or any other exception — is a failure.

How a node test becomes an sfnpu model (recorded per test in the summary):

* operands that the accelerator needs as constants (Conv/Gemm/MatMul weights and bias,
  BatchNormalization statistics, Clip bounds, Resize/Upsample roi/scales/sizes) are graph inputs
  in the node tests; they become initializers holding the test's own values;
* one data input: ``sfnpu.compiler.quantize.quantize_model`` (the product path); several data
  inputs (Add, Mul, Concat): onnxruntime's ``quantize_static`` directly, with the options
  ``quantize_model`` uses (:func:`_quantize_ort`);
* sfnpu refuses opset 22 (it supports 11–21); when that is the error, the node's attributes
  exist in opset 21 and onnx's full check there agrees with the test's output shapes (opset 22
  mostly added bfloat16, but it also changed the ceil-mode pooling output size, which this
  catches), the model is declared at opset 21 and tried again;
* onnxruntime leaves pass-through operators (MaxPool, Resize, …) float when nothing quantised
  precedes them — in a network a convolution does; when sfnpu reports that nothing was
  quantised, the model is quantised again with ``ForceQuantizeNoInputCheck``.

Results are cached per node test in a directory shared by the xdist workers, so the summary
(:func:`test_summary`) costs nothing extra; it prints the per-op table (``-s`` without xdist),
records it as a property (``--junitxml``), writes it to ``onnx_node_tests/summary.txt`` in the
session's base temp folder, and asserts no failures besides the known
bugs and at least the measured number of passes per op type.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import pathlib
import re
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from sfnpu.compiler.codegen import CodegenError
from sfnpu.compiler.importer import SUPPORTED_OPS, ModelError
from sfnpu.compiler.ir import IRError
from sfnpu.compiler.pipeline import compile_model, run_onnxruntime
from sfnpu.compiler.quantize import (CalibrationSource, QuantizeError, quantize_model,
                                     upgrade_opset)
from sfnpu.config import get_config
from sfnpu.sim.golden import GoldenModel

TINY = get_config("tiny")
CLEAR_ERRORS = (ModelError, IRError, CodegenError, QuantizeError)



class Mismatch(AssertionError):
    """Golden and onnxruntime disagree (or the op did not run on the accelerator)."""


class HarnessError(RuntimeError):
    """This file's own preparation went wrong (not sfnpu): reported as a failure to look at."""


#: Inputs (by position) that the accelerator takes as constants, per op type.
PARAMETER_INPUTS = {"Conv": (1, 2), "Gemm": (1, 2), "MatMul": (1,),
                    "BatchNormalization": (1, 2, 3, 4), "Clip": (1, 2),
                    "Resize": (1, 2, 3), "Upsample": (1,)}
RANDOM_CALIBRATION_SAMPLES = 3
MAX_OPSET = 21

#: Node tests that fail because of an sfnpu bug (strict xfail, so fixing the bug flags them),
#: each with a minimal reproduction at the end of this file. None at present.
KNOWN_BUGS: dict[str, str] = {}

#: Measured passes per op type (onnx 1.23, onnxruntime 1.31); floors, so a regression that
#: loses one fails the summary. Raise them when sfnpu learns more.
MIN_PASSED = {"AveragePool": 6, "Conv": 6, "GlobalAveragePool": 2, "MaxPool": 5}


# ---------------------------------------------------------------------------------------------
# the node tests


def _model(case) -> onnx.ModelProto | None:
    if case.model is None and case.model_dir:   # an on-disk test (older onnx releases)
        case.model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    return case.model


def _load_cases() -> dict:
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # overflow warnings from unrelated generators
        cases = load_node_model_tests()
    return {c.name: c for c in cases
            if (m := _model(c)) is not None and len(m.graph.node) == 1
            and m.graph.node[0].op_type in SUPPORTED_OPS}


CASES = _load_cases()


def _case_data(case) -> tuple[onnx.ModelProto, list[np.ndarray], list[np.ndarray]]:
    """Model, inputs and expected outputs of the first data set (generated, or the
    ``data_set_0/input_*.pb`` / ``output_*.pb`` files of an on-disk test)."""
    if case.data_sets:
        inputs, outputs = case.data_sets[0]
        return case.model, [np.asarray(a) for a in inputs], [np.asarray(a) for a in outputs]
    folder = sorted(glob.glob(os.path.join(case.model_dir, "data_set_*")))[0]

    def read(kind):
        files = sorted(glob.glob(os.path.join(folder, f"{kind}_*.pb")),
                       key=lambda p: int(re.findall(r"(\d+)\.pb$", p)[0]))
        return [numpy_helper.to_array(onnx.TensorProto.FromString(pathlib.Path(p).read_bytes()))
                for p in files]
    return _model(case), read("input"), read("output")


def _freeze_parameters(model: onnx.ModelProto, inputs: list[np.ndarray]):
    """The model with parameter inputs turned into initializers, and the remaining feeds."""
    node = model.graph.node[0]
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    feeds = dict(zip(names, inputs))
    frozen = {node.input[i] for i in PARAMETER_INPUTS.get(node.op_type, ())
              if i < len(node.input) and node.input[i] in feeds}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [i for i in out.graph.input if i.name not in frozen]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.graph.initializer.extend(numpy_helper.from_array(feeds[n], n) for n in sorted(frozen))
    return out, {n: a for n, a in feeds.items() if n not in frozen}, sorted(frozen)


def _calibration(feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The test's own inputs, then a few seeded random samples of the same shape and spread."""
    rng = np.random.default_rng(0)
    samples = [dict(feeds)]
    for _ in range(RANDOM_CALIBRATION_SAMPLES):
        sample = {}
        for name, x in feeds.items():
            if np.issubdtype(x.dtype, np.floating) and x.size:
                spread = float(x.std()) or 1.0
                sample[name] = (x.mean() + spread * rng.standard_normal(x.shape)).astype(x.dtype)
            else:
                sample[name] = x
        samples.append(sample)
    return samples


def _lower_opset(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model declared at opset 21 when its node means the same there, else None."""
    node = model.graph.node[0]
    version = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if version <= MAX_OPSET:
        return None
    try:
        schema = onnx.defs.get_schema(node.op_type, MAX_OPSET)
    except onnx.defs.SchemaError:
        return None
    if not {a.name for a in node.attribute} <= set(schema.attributes):
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = MAX_OPSET
    out.ir_version = min(out.ir_version, 10)
    try:   # shape inference under opset 21 must agree with the test's declared output shape
        onnx.checker.check_model(out, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return None
    return out


def _quantize_ort(model: onnx.ModelProto, path: pathlib.Path, samples, force: bool):
    """onnxruntime's quantize_static with quantize_model's options (several inputs, or
    ``ForceQuantizeNoInputCheck`` for pass-through operators)."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    model, _ = upgrade_opset(model)
    float_path = path.with_suffix(".float.onnx")
    onnx.save(model, str(float_path))
    quantize_static(str(float_path), str(path), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, reduce_range=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True,
                                   "ForceQuantizeNoInputCheck": force})


def _quantize(model, feeds, path: pathlib.Path, force: bool) -> str:
    """Quantise ``model`` to ``path``; returns how (for the summary)."""
    samples = _calibration(feeds)
    if len(feeds) == 1 and not force:
        (name,) = feeds
        quantize_model(model, path, CalibrationSource.arrays(
            np.concatenate([s[name] for s in samples])))
        return "quantize_model"
    if any(not np.issubdtype(x.dtype, np.floating) for x in feeds.values()):
        # integer inputs: sfnpu's quantiser has the last word (it refuses them)
        quantize_model(model, path, CalibrationSource.arrays(next(iter(feeds.values()))))
    try:
        _quantize_ort(model, path, samples, force)
    except Exception as e:
        raise HarnessError(f"onnxruntime quantize_static: {type(e).__name__}: {e}") from e
    return "quantize_static" + (" (ForceQuantizeNoInputCheck)" if force else "")


def _compare(path: pathlib.Path, feeds, op_type: str, expected=None) -> str:
    """Golden vs onnxruntime on the QDQ model at ``path``: every output value identical."""
    compiled = compile_model(path, TINY)
    reference = onnx.load(str(path))
    want = run_onnxruntime(reference, feeds)
    got = compiled.run(feeds, GoldenModel(TINY).outputs)
    if expected is not None:   # the float test's own outputs: same shapes (harness sanity)
        shapes = [want[o.name].shape for o in reference.graph.output]
        if shapes != [e.shape for e in expected]:
            raise HarnessError(f"QDQ output shapes {shapes} differ from the node test's "
                               f"{[e.shape for e in expected]}")
    if want.keys() != got.keys():
        raise Mismatch(f"outputs {sorted(got)} instead of {sorted(want)}")
    for name in want:
        w, g = want[name], got[name]
        if w.shape != g.shape or w.dtype != g.dtype:
            raise Mismatch(f"{name}: {g.dtype}{g.shape} instead of {w.dtype}{w.shape}")
        diff = w != g
        if diff.any():
            raise Mismatch(f"{name}: {int(diff.sum())}/{diff.size} values differ, largest by "
                           f"{np.abs(w.astype(np.float64) - g).max()}")
    if op_type in compiled.imported.host.epilogue_ops:
        raise Mismatch(f"{op_type} ran on the host, not on the accelerator "
                       f"(epilogue {compiled.imported.host.epilogue_ops})")
    kinds = sorted({n.op for n in compiled.graph.nodes})
    return f"accelerator ops {kinds}"


_OPSET_REFUSED = re.compile(r"ONNX opset \d+; sfnpu supports opsets")
_NOTHING_QUANTISED = "no quantised tensor reaches the model outputs"


def evaluate(name: str, workdir: pathlib.Path) -> dict:
    """Run one node test; ``{"op", "status", "detail", "route"}``."""
    model, inputs, expected = _case_data(CASES[name])
    op = model.graph.node[0].op_type
    route = []
    try:
        model, feeds, frozen = _freeze_parameters(model, inputs)
    except Exception as e:   # the test data does not fit its own model: harness problem
        return dict(op=op, status="failed", detail=f"harness: {type(e).__name__}: {e}",
                    route=route)
    if frozen:
        route.append(f"{'/'.join(frozen)} as initializers")
    force = False
    while True:
        path = workdir / f"{name}{'_force' if force else ''}.qdq.onnx"
        try:
            route.append(_quantize(model, feeds, path, force))
            detail = _compare(path, feeds, op, expected)
            return dict(op=op, status="passed", detail=detail, route=route)
        except CLEAR_ERRORS as e:
            msg = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            if _OPSET_REFUSED.search(msg) and (lowered := _lower_opset(model)) is not None:
                model = lowered
                route.append(f"[{msg}] → opset {MAX_OPSET}")
                continue
            if _NOTHING_QUANTISED in msg and not force:
                force = True
                route.append(f"[{msg}] → again")
                continue
            return dict(op=op, status="unsupported", detail=msg, route=route)
        except Mismatch as e:
            return dict(op=op, status="failed", detail=f"mismatch: {e}", route=route)
        except Exception as e:
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            return dict(op=op, status="failed", detail=f"{type(e).__name__}: {first}",
                        route=route)


# ---------------------------------------------------------------------------------------------
# results shared by the xdist workers


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory) -> pathlib.Path:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent   # the workers' basetemps share the session's folder
    folder = base / "onnx_node_tests"
    folder.mkdir(exist_ok=True)
    return folder


def result(name: str, folder: pathlib.Path) -> dict:
    """The outcome of one node test, computed once per session (file lock per test)."""
    done = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            work = folder / name
            work.mkdir(exist_ok=True)
            tmp = folder / f"{name}.json.tmp"
            tmp.write_text(json.dumps(evaluate(name, work)))
            tmp.replace(done)
    return json.loads(done.read_text())


def _params():
    for name in CASES:
        marks = ()
        if name in KNOWN_BUGS:
            marks = pytest.mark.xfail(strict=True, reason=f"sfnpu bug: {KNOWN_BUGS[name]}")
        yield pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", list(_params()))
def test_node(name, results_dir, record_property):
    r = result(name, results_dir)
    record_property("outcome", r["status"])
    record_property("detail", r["detail"])
    record_property("route", " ; ".join(r["route"]))
    if r["status"] == "failed":
        pytest.fail(f"{r['op']} {name}: {r['detail']}\n  route: {' ; '.join(r['route'])}",
                    pytrace=False)


def test_summary(results_dir, record_property):
    results = {name: result(name, results_dir) for name in CASES}
    counts = {}
    for name, r in results.items():
        counts.setdefault(r["op"], Counter())[r["status"]] += 1
    lines = [f"{'op':20s} {'found':>5s} {'passed':>6s} {'unsup':>5s} {'failed':>6s}"]
    for op in sorted(counts):
        c = counts[op]
        lines.append(f"{op:20s} {sum(c.values()):5d} {c['passed']:6d} {c['unsupported']:5d} "
                     f"{c['failed']:6d}")
    total = Counter()
    for c in counts.values():
        total.update(c)
    lines.append(f"{'total':20s} {sum(total.values()):5d} {total['passed']:6d} "
                 f"{total['unsupported']:5d} {total['failed']:6d}")
    reasons = Counter(re.sub(r"'[^']*'|\d+", "…", r["detail"])[:110]
                      for r in results.values() if r["status"] == "unsupported")
    lines.append("unsupported, by reason:")
    lines += [f"  {n:3d}  {why}" for why, n in reasons.most_common()]
    failed = {n: r for n, r in results.items() if r["status"] == "failed"}
    lines += [f"failed{' (known bug)' if n in KNOWN_BUGS else ''}: {n}: {r['detail'][:160]}"
              for n, r in sorted(failed.items())]
    table = "\n".join(lines)
    (results_dir / "summary.txt").write_text(table + "\n")
    print(f"\nONNX node tests, golden vs onnxruntime ({results_dir / 'summary.txt'})\n{table}")
    record_property("summary", table)

    unexpected = sorted(set(failed) - set(KNOWN_BUGS))
    assert not unexpected, "failures:\n" + "\n".join(
        f"  {n}: {failed[n]['detail']}" for n in unexpected)
    low = {op: (counts.get(op, Counter())["passed"], floor) for op, floor in MIN_PASSED.items()
           if counts.get(op, Counter())["passed"] < floor}
    assert not low, f"fewer node tests pass than measured (passed, floor): {low}\n{table}"


# ---------------------------------------------------------------------------------------------
# regressions: minimal reproductions of bugs the node tests once found; each must now be refused
# with a clear error or match onnxruntime exactly


def _float_model(nodes, shapes: dict, inits: dict, ir_version: int = 8):
    """A float model with input ``x``; ``shapes`` gives every graph input and output shape."""
    g = helper.make_graph(
        nodes, "repro",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shapes["x"])],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT if n != "i" else
                                       onnx.TensorProto.INT64, s)
         for n, s in shapes.items() if n != "x"],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=ir_version)


def _refused_or_exact(tmp_path, model, shape):
    """sfnpu either refuses the model with a clear error or matches onnxruntime exactly."""
    rng = np.random.default_rng(1)
    path = tmp_path / "repro.qdq.onnx"
    quantize_model(model, path, CalibrationSource.arrays(
        rng.standard_normal((6, *shape[1:])).astype(np.float32)))
    x = rng.standard_normal(shape).astype(np.float32)
    try:
        _compare(path, {"x": x}, model.graph.node[-1].op_type)
    except CLEAR_ERRORS:
        pass


def test_matmul_with_4d_constant(tmp_path):
    w = np.random.default_rng(0).standard_normal((1, 2, 4, 3))
    model = _float_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                         {"x": [1, 2, 3, 4], "y": [1, 2, 3, 3]}, {"w": w})
    _refused_or_exact(tmp_path, model, (1, 2, 3, 4))


def test_resize_nearest_mode_floor(tmp_path):
    w = np.random.default_rng(0).standard_normal((2, 2, 1, 1))
    model = _float_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]),
         helper.make_node("Resize", ["c", "", "s"], ["y"], mode="nearest",
                          coordinate_transformation_mode="half_pixel", nearest_mode="floor")],
        {"x": [1, 2, 4, 5], "y": [1, 2, 8, 10]}, {"w": w, "s": [1, 1, 2, 2]})
    _refused_or_exact(tmp_path, model, (1, 2, 4, 5))


def test_maxpool_with_indices(tmp_path):
    w = np.random.default_rng(0).standard_normal((2, 2, 1, 1))
    model = _float_model(
        [helper.make_node("Conv", ["x", "w"], ["c"]),
         helper.make_node("MaxPool", ["c"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])],
        {"x": [1, 2, 4, 4], "y": [1, 2, 2, 2], "i": [1, 2, 2, 2]}, {"w": w})
    _refused_or_exact(tmp_path, model, (1, 2, 4, 4))


def test_quantize_ir_version_14(tmp_path):
    """onnx 1.23's ``helper.make_model`` writes IR 14 by default; onnxruntime 1.31 reads ≤ 13."""
    w = np.random.default_rng(0).standard_normal((2, 2, 1, 1))
    model = _float_model([helper.make_node("Conv", ["x", "w"], ["y"])],
                         {"x": [1, 2, 4, 4], "y": [1, 2, 4, 4]}, {"w": w}, ir_version=14)
    try:
        _refused_or_exact(tmp_path, model, (1, 2, 4, 4))
    except QuantizeError:
        pass


if __name__ == "__main__":   # quick look without pytest: python tests/test_onnx_node_tests.py [names]
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for n in sys.argv[1:] or CASES:
            r = evaluate(n, pathlib.Path(tmp))
            print(f"{n:60s} {r['status']:11s} {r['detail'][:150]}  <{' ; '.join(r['route'])}>")
