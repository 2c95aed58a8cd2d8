"""``sfnpu board``: run a DRAM image on a board over its UART host link."""

from pathlib import Path

from .common import console

NAME = "board"
HELP = "run a DRAM image on a board over its UART link"


def add_arguments(parser):
    from sfnpu.tools.bitstream import DEFAULT_BAUD

    parser.add_argument("image")
    parser.add_argument("--port", required=True, help="serial device, e.g. /dev/ttyUSB0")
    parser.add_argument("--baud", type=int, default=DEFAULT_BAUD)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a run may take")
    parser.add_argument("-o", "--output", help="write the image footprint after the run here")


def run(args) -> int:
    from sfnpu.tools.board import BoardRunner, UartLink, open_serial

    blob = Path(args.image).read_bytes()
    link = UartLink(open_serial(args.port, args.baud))
    result = BoardRunner(link).run(blob, timeout_s=args.timeout)
    console.print(f"status {result.status:#x}, error {result.error_code.name}"
                  f"{f' in group {result.error_group}' if result.error else ''}")
    for name, value in result.counters.items():
        console.print(f"{name:<18} {value}")
    console.print(f"per-group cycles: {result.group_cycles}")
    if args.output:
        Path(args.output).write_bytes(result.dram)
        console.print(f"wrote the image footprint after the run to {args.output}")
    return 1 if result.error else 0
