"""``sfnpu compile``: an ONNX model to a DRAM image and a compile report."""

from pathlib import Path

import numpy as np

from .common import console
from .model_options import add_model_options, compile_from_args

NAME = "compile"
HELP = "compile an ONNX model to a DRAM image and a report"


def add_arguments(parser):
    add_model_options(parser)
    parser.add_argument("-o", "--output", required=True, help="output folder")


def run(args) -> int:
    from sfnpu.compiler.report import compile_report

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    compiled, qdq, notes = compile_from_args(args, out)
    feeds = compiled.imported.host.prologue.graph.input
    zeros = [np.zeros(compiled.graph.tensors[n].shape, compiled.graph.tensors[n].qtype.dtype)
             for n in compiled.program.inputs]
    (out / "image.bin").write_bytes(compiled.program.pack(zeros))
    report = compile_report(compiled, str(args.model), notes)
    (out / "report.md").write_text(report)
    console.print(report)
    console.print(f"wrote {out / 'image.bin'} (input section zeroed; `sfnpu run` fills it) "
                  f"and {out / 'report.md'}; {len(feeds)} model input(s)")
    return 0
