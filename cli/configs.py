"""``sfnpu configs``: the reference hardware configurations."""

from sfnpu import resources
from sfnpu.config import CONFIGS, DEVICES

from .common import console

NAME = "configs"
HELP = "list the reference hardware configurations"


def add_arguments(parser):
    parser.add_argument("--yosys", nargs="*", metavar="CONFIG",
                        help="synthesise the accelerator of these configurations (default: "
                             "every one without an UltraScale part) with Yosys synth_ecp5 and "
                             "compare the estimate with it (3-25 min each)")
    parser.add_argument("--out", default="build/resources",
                        help="working folder of --yosys (default: %(default)s)")


def run(args) -> int:
    if args.yosys is not None:
        return _yosys(args)
    for c in CONFIGS.values():
        console.print(c.summary())
        console.print(f"  fingerprint {c.fingerprint:#018x}, DRAM "
                      f"{c.dram_bytes_per_cycle} bytes/cycle")
        need = resources.estimate(c)
        short = resources.shortfalls(need, DEVICES[c.device]) if c.device else []
        fit = "" if not c.device else f"; on {c.device}: " + ("fits" if not short else
                                                                "; ".join(short))
        console.print(f"  estimate (sfnpu.resources): {need.multipliers} multipliers, "
                      f"{need.bram18k} 18K block RAMs, {need.luts} LUT4{fit}")
    return 0


def _yosys(args) -> int:
    from pathlib import Path

    from sfnpu.config import get_config
    from sfnpu.tools.resource_check import errors, synthesize

    names = args.yosys or [n for n, c in CONFIGS.items()
                           if not c.device or DEVICES[c.device].family == "ecp5"]
    for name in names:
        config = get_config(name)
        console.print(f"{name}: synth_ecp5 of the accelerator ...")
        measured = synthesize(config, Path(args.out) / name)
        console.print(f"  Yosys ({measured.seconds:.0f} s): {measured.multipliers} MULT18X18D, "
                      f"{measured.bram18k} DP16KD, {measured.lut4} LUT4 + {measured.ccu2c} "
                      f"CCU2C = {measured.luts} LUT positions")
        for resource, (got, want, err) in errors(measured).items():
            console.print(f"  {resource:12s} estimate {got:7d}  Yosys {want:7d}  {err:+.1%}")
    return 0
