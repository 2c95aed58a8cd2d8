"""``sfnpu compile``: an ONNX model to a DRAM image and a compile report."""

from pathlib import Path

from sfnpu.config import get_config

from .common import console
from .model_options import add_model_options, compile_from_args

NAME = "compile"
HELP = "compile an ONNX model to a DRAM image and a report"


def add_arguments(parser):
    add_model_options(parser)
    parser.add_argument("-o", "--output", required=True, help="output folder")


def run(args) -> int:
    import onnx

    from sfnpu.compiler.partition import AcceleratorSegment, Partitioned
    from sfnpu.compiler.report import compile_report, partition_report

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    program, qdq, notes = compile_from_args(args, out)
    if isinstance(program, Partitioned):
        written = []
        for k, segment in enumerate(program.segments):
            if isinstance(segment, AcceleratorSegment):
                written.append(out / f"image{k}.bin")
                written[-1].write_bytes(segment.compiled.zero_image())
            else:
                written.append(out / f"host{k}.onnx")
                onnx.save(segment.model, str(written[-1]))
        report = partition_report(program, str(args.model), notes,
                                      get_config(args.config))
    else:
        written = [out / "image.bin"]
        written[0].write_bytes(program.zero_image())
        report = compile_report(program, str(args.model), notes)
    (out / "report.md").write_text(report)
    console.print(report)
    console.print(f"wrote {', '.join(str(p) for p in written)} (input sections zeroed; "
                  f"`sfnpu run` fills them) and {out / 'report.md'}; "
                  f"{len(program.input_names)} model input(s)")
    return 0
