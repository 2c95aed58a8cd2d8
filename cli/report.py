"""``sfnpu report`` (``make report``): the memory optimizer beside ShortcutFusion's tables."""

from pathlib import Path

from sfnpu.config import CONFIGS

from .common import CliError, console

NAME = "report"
HELP = "memory optimizer vs the paper: Tables II–IV, VI, Figs. 16–17 (markdown, CSV, PNG)"


def add_arguments(parser):
    parser.add_argument("models", nargs="*", metavar="MODEL|BUILDER",
                        help="builder name, vgg16_conv or ONNX file (default: every paper network)")
    parser.add_argument("--config", default="kcu1500", choices=list(CONFIGS))
    parser.add_argument("--size", type=int, help="input size for builders (default: the paper's)")
    parser.add_argument("--out", default="build/report", help="output folder")


def run(args) -> int:
    from sfnpu.studies.shortcut_fusion import ReportError, resolve_studies, run_report

    try:
        studies = resolve_studies(args.models, args.size)
    except ReportError as e:
        raise CliError(str(e)) from None
    run_report(studies, args.config, Path(args.out), console=console)
    return 0
