"""``sfnpu modules`` (``make modules``): module-level allocation beside Kim et al.'s Table 1."""

from pathlib import Path

from .common import CliError, console

NAME = "modules"
HELP = ("module-level on-chip allocation (Kim et al., seeds/000-001) beside the paper's "
        "Table 1 (markdown, CSV, PNG)")


def add_arguments(parser):
    parser.add_argument("model", metavar="MODEL|BUILDER", help="builder name or ONNX file")
    parser.add_argument("--sram-kb", type=float, default=1024,
                        help="buffers {0, 1, 2} together, KiB (default 1024, the paper's)")
    parser.add_argument("--size", type=int, help="input size for builders (default: theirs)")
    parser.add_argument("--out", default="build/modules", help="output folder")


def run(args) -> int:
    from sfnpu.studies.module_allocation import ModuleReportError, write_report

    command = f"sfnpu modules {args.model} --sram-kb {args.sram_kb:g}" + (
        f" --size {args.size}" if args.size else "")
    try:
        written = write_report(args.model, Path(args.out), args.sram_kb, args.size, command)
    except ModuleReportError as e:
        raise CliError(str(e)) from None
    for path in written:
        console.print(f"wrote {path}")
    return 0
