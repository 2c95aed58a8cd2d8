"""``sfnpu run``: a model on a backend (golden model, onnxruntime, the RTL, the cycle model)."""

import tempfile
from pathlib import Path

import numpy as np

from sfnpu import image
from sfnpu.config import get_config

from .common import CliError, console
from .model_options import add_model_options, calibration, compile_from_args
from .rtl import rtl_outputs
from .tables import group_table

NAME = "run"
HELP = "run a model on a backend; writes .npy (.npz if several)"


def add_arguments(parser):
    add_model_options(parser)
    parser.add_argument("--input", required=True, help=".npy (one input) or .npz")
    parser.add_argument("--backend", default="golden",
                        choices=["golden", "onnxruntime", "rtl", "model"],
                        help="golden model, onnxruntime on the QDQ model, the RTL on Verilator, "
                        "or the cycle model (latency and DRAM bytes per group; values from the "
                        "golden model)")
    parser.add_argument("-o", "--output", required=True)


def _load_inputs(path: str, names: list[str]) -> dict:
    data = np.load(path)
    if isinstance(data, np.ndarray):
        if len(names) != 1:
            raise CliError(f"the model has {len(names)} inputs; give an .npz with {names}")
        return {names[0]: data.astype(np.float32)}
    missing = set(names) - set(data.files)
    if missing:
        raise CliError(f"{path} lacks inputs {sorted(missing)}")
    return {n: data[n].astype(np.float32) for n in names}


def _save_outputs(path: str, outputs: dict):
    if len(outputs) == 1:
        np.save(path, next(iter(outputs.values())))
    else:
        np.savez(path, **outputs)


def model_outputs(config):
    """An ``accelerator`` callable: the golden model's outputs, with the cycle model's
    per-group latency and DRAM bytes printed."""
    from sfnpu.sim.cycle import CycleModel
    from sfnpu.sim.golden import GoldenModel

    golden = GoldenModel(config)

    def run(blob: bytes) -> list[np.ndarray]:
        timing = CycleModel(config).run(blob)
        console.print(group_table(image.unpack(blob, config).program, timing))
        console.print(f"cycle model: {timing.cycles} cycles = {timing.seconds * 1e3:.3f} ms "
                      f"at {config.clock_mhz:g} MHz; {timing.read_bytes} B read, "
                      f"{timing.write_bytes} B written")
        return golden.outputs(blob)
    return run


def _onnxruntime_outputs(args, workdir) -> dict:
    from sfnpu.compiler.importer import load_model
    from sfnpu.compiler.pipeline import ensure_qdq, run_onnxruntime

    path, _ = ensure_qdq(args.model, workdir, calibration(args),
                         activation_signed=args.int8_activations)
    model = load_model(path)
    names = [i.name for i in model.graph.input
             if i.name not in {t.name for t in model.graph.initializer}]
    return run_onnxruntime(model, _load_inputs(args.input, names))


def _accelerator_outputs(args, workdir) -> dict:
    from sfnpu.sim.golden import GoldenModel

    program, _, _ = compile_from_args(args, Path(workdir))
    config = get_config(args.config)
    backend = {"rtl": rtl_outputs, "model": model_outputs}.get(
        args.backend, lambda c: GoldenModel(c).outputs)(config)
    outputs = program.run(_load_inputs(args.input, program.input_names), backend)
    console.print(f"convolution MACs on the accelerator: {program.mac_share:.2%}")
    return outputs


def run(args) -> int:
    with tempfile.TemporaryDirectory(prefix="sfnpu-run-") as tmp:
        outputs = (_onnxruntime_outputs if args.backend == "onnxruntime"
                   else _accelerator_outputs)(args, tmp)
    _save_outputs(args.output, outputs)
    console.print(f"wrote {args.output}: " + ", ".join(f"{k} {v.dtype}{list(v.shape)}"
                                                     for k, v in outputs.items()))
    return 0
