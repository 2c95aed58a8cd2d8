"""``sfnpu verilog`` (``make verilog``): Verilog of the datapath blocks for every configuration."""

from pathlib import Path

from .common import console

NAME = "verilog"
HELP = "Verilog of the datapath blocks for every config"


def add_arguments(parser):
    parser.add_argument("-o", "--output", default="build/verilog")


def run(args) -> int:
    from sfnpu.hw.verilog import write_verilog

    written = write_verilog(Path(args.output))
    console.print(f"wrote {len(written)} Verilog files under {args.output}")
    return 0
