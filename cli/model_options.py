"""The options of commands that take a model (``compile``, ``run``) and the compilation they
drive."""

from __future__ import annotations

from pathlib import Path

from sfnpu.config import CONFIGS, get_config

from .common import CliError

__all__ = ["add_model_options", "calibration", "compile_from_args"]


def add_model_options(parser):
    parser.add_argument("model", help="ONNX model (float or int8 QDQ)")
    parser.add_argument("--config", default="tiny", choices=list(CONFIGS))
    parser.add_argument("--calib", help="folder of calibration images or .npy files "
                        "(float models; default: a synthetic set, named as such)")
    parser.add_argument("--int8-activations", action="store_true",
                        help="quantise activations to int8 instead of uint8")
    parser.add_argument("--modules", action="store_true",
                        help="pipeline step 'modules': module-level on-chip allocation "
                        "(Kim et al.; see `sfnpu modules`)")
    parser.add_argument("--no-space-to-depth", action="store_true",
                        help="skip the pipeline step 'space_to_depth' (stride-2 stems over "
                        "few channels as SpaceToDepth + a stride-1 convolution)")
    parser.add_argument("--no-fold-input-taps", action="store_true",
                        help="skip the pipeline step 'fold_input_taps' (a stem whose taps "
                        "fit one lane block as a 1x1 convolution over the taps, which the "
                        "host lays out as channels)")


def calibration(args):
    from sfnpu.compiler.quantize import CalibrationSource

    if args.calib is None:
        return None
    folder = Path(args.calib)
    if not folder.is_dir():
        raise CliError(f"--calib {folder}: not a folder (give images or .npy files)")
    if any(folder.glob("*.npy")):
        return CalibrationSource.npy(folder)
    return CalibrationSource.images(folder)


def compile_from_args(args, workdir: Path):
    """(Compiled or Partitioned, QDQ path, quantisation notes) for the model options in
    ``args``: one program where the accelerator runs the model in one piece, else accelerator
    and host segments."""
    from sfnpu.compiler.partition import compile_partitioned
    from sfnpu.compiler.pipeline import PipelineConfig, ensure_qdq

    path, notes = ensure_qdq(args.model, workdir, calibration(args),
                             activation_signed=args.int8_activations)
    pipeline = PipelineConfig(modules=args.modules, space_to_depth=not args.no_space_to_depth,
                              fold_input_taps=not args.no_fold_input_taps)
    return compile_partitioned(path, get_config(args.config), pipeline), path, notes
