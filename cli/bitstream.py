"""``sfnpu bitstream`` (``make bitstream``): the ULX3S bitstream with the open flow, or a
Vivado project for the Xilinx boards."""

import argparse
import time
from pathlib import Path

from .common import REPO_ROOT, CliError, console

NAME = "bitstream"
HELP = "FPGA build: ULX3S bitstream or a Vivado project"


def add_arguments(parser):
    from sfnpu.tools.bitstream import BOARDS, DEFAULT_BAUD, DEFAULT_ROUTER, DEFAULT_SEEDS, ROUTERS

    parser.add_argument("--board", default="ulx3s-85f", choices=BOARDS)
    parser.add_argument("--synth-only", action="store_true",
                        help="ulx3s-85f: stop after synthesis (cell counts, no Fmax)")
    parser.add_argument("--clock-mhz", type=float, help="ulx3s-85f: PLL clock (default: config)")
    parser.add_argument("--baud", type=int, default=DEFAULT_BAUD, help="ulx3s-85f: UART speed")
    parser.add_argument("--memory", choices=("sdram", "bram"),
                        help="ulx3s-85f: the image memory, the board's SDRAM (default) or block "
                        "RAM")
    parser.add_argument("--memory-kib", type=int,
                        help="ulx3s-85f with --memory bram: block RAM size (default 64)")
    parser.add_argument("--link-only", action="store_true",
                        help="ulx3s-85f: leave the accelerator out (a quick check of the flow)")
    parser.add_argument("--config",
                        help="ulx3s-85f: the accelerator's configuration (default ecp5-ulx3s); "
                        "one the resource estimate puts beyond the part is refused")
    parser.add_argument("--seed", type=_seeds, default=DEFAULT_SEEDS, metavar="N[,N...]",
                        help="ulx3s-85f: nextpnr's placement seeds; each places and routes "
                        "(as many at once as there are cores) and the fastest is kept "
                        f"(default {','.join(map(str, DEFAULT_SEEDS))})")
    parser.add_argument("--router", choices=("auto", *ROUTERS), default=DEFAULT_ROUTER,
                        help="ulx3s-85f: nextpnr's router (default auto: router2 with the "
                        "accelerator, router1 without)")
    parser.add_argument("--skip-fit-check", action="store_true",
                        help="ulx3s-85f: build even if the estimate says it does not fit")
    parser.add_argument("--out", help="output folder (default build/bitstream/BOARD)")


def _seeds(text: str) -> tuple[int, ...]:
    """``--seed 1`` or ``--seed 1,2,3`` (:func:`~sfnpu.tools.bitstream.build_ecp5` refuses a
    seed given twice)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: seeds are integers, comma-separated "
                                         "(e.g. 1,2)") from None


def _board_options(args) -> dict:
    """The keyword arguments of :func:`build_board` the options give for the board."""
    from sfnpu.tools.bitstream import DEFAULT_ROUTER, DEFAULT_SEEDS

    if args.board == "ulx3s-85f":
        if args.memory_kib and args.memory != "bram":
            raise CliError("--memory-kib sizes block RAM: add --memory bram")
        from sfnpu.config import ConfigError, get_config

        try:
            config = get_config(args.config) if args.config else None
        except (ConfigError, KeyError) as e:
            raise CliError(f"--config: {e}") from None
        return dict(synth_only=args.synth_only, clock_mhz=args.clock_mhz, baud=args.baud,
                    memory=args.memory or "sdram",
                    memory_bytes=args.memory_kib * 1024 if args.memory_kib else None,
                    with_accelerator=not args.link_only, config=config,
                    check_fit=not args.skip_fit_check, seeds=args.seed, router=args.router)
    if (args.synth_only or args.clock_mhz or args.memory or args.memory_kib or args.link_only
            or args.config or args.skip_fit_check or args.seed != DEFAULT_SEEDS
            or args.router != DEFAULT_ROUTER):
        raise CliError(f"--synth-only, --link-only, --clock-mhz, --memory, --memory-kib, "
                       f"--config, --skip-fit-check, --seed and --router apply to ulx3s-85f; "
                       f"{args.board} gets a Vivado project")
    return {}


def run(args) -> int:
    from sfnpu.tools.bitstream import build_board

    out = Path(args.out or REPO_ROOT / "build" / "bitstream" / args.board)
    t0 = time.perf_counter()
    kwargs = _board_options(args)
    result = build_board(args.board, out, **kwargs,
                         log=lambda text: console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] "
                                                        f"{text}"))
    if args.board == "ulx3s-85f":
        console.print((out / "report.md").read_text())
    else:
        console.print(f"Vivado project: {', '.join(result)}")
    console.print(f"wrote {out} in {time.perf_counter() - t0:.0f} s")
    return 0
