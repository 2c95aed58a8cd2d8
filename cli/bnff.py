"""``sfnpu bnff``: BN fission-n-fusion memory sweeps of a DenseNet-121 training step."""

from pathlib import Path

from .common import console

NAME = "bnff"
HELP = "BN fission-n-fusion: DenseNet-121 training-step memory sweeps (seeds/004)"


def add_arguments(parser):
    parser.add_argument("--batch", type=int, default=120, help="mini-batch size (paper: 120)")
    parser.add_argument("--size", type=int, default=224, help="input size (default 224)")
    parser.add_argument("--out", default="build/bnff", help="output folder")


def run(args) -> int:
    from sfnpu.studies.bn_fission import write_report

    for path in write_report(Path(args.out), batch=args.batch, input_size=args.size):
        console.print(f"wrote {path}")
    return 0
