"""``sfnpu configs``: the reference hardware configurations."""

from sfnpu import resources
from sfnpu.config import CONFIGS, DEVICES

from .common import console

NAME = "configs"
HELP = "list the reference hardware configurations"


def add_arguments(parser):
    parser.add_argument("--yosys", nargs="*", metavar="CONFIG",
                        help="synthesise the accelerator of these configurations (default: "
                             "every one without an UltraScale part) with Yosys and compare "
                             "the estimate with it (3-25 min each)")
    parser.add_argument("--family", choices=("ecp5", "ultrascale"), default=None,
                        help="with --yosys: synth_ecp5 or synth_xilinx -family xcup "
                             "(default: the configuration's part's family, else ecp5)")
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
        terms = resources.TERMS[need.family]
        console.print(f"  estimate (sfnpu.resources): {need.multipliers} multipliers "
                      f"({terms.multiplier_name}), {need.bram18k} 18K block RAMs, "
                      f"{need.luts} {terms.lut_name}{fit}")
    return 0


def _yosys(args) -> int:
    from pathlib import Path

    from sfnpu.config import get_config
    from sfnpu.tools.resource_check import SYNTH_SCRIPTS, errors, synthesize

    names = args.yosys or [n for n, c in CONFIGS.items()
                           if not c.device or DEVICES[c.device].family == "ecp5"]
    for name in names:
        config = get_config(name)
        family = args.family or resources.family_of(config)
        console.print(f"{name}: {SYNTH_SCRIPTS[family].split()[0]} of the accelerator ...")
        measured = synthesize(config.replace(device=None), Path(args.out) / name, family)
        got = measured.calibration(name, {})
        console.print(f"  Yosys ({measured.seconds:.0f} s): {got!r}")
        for resource, (mine, theirs, err) in errors(measured).items():
            console.print(f"  {resource:12s} estimate {mine:7d}  Yosys {theirs:7d}  {err:+.1%}")
    return 0
