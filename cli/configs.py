"""``sfnpu configs``: the reference hardware configurations."""

from sfnpu import resources
from sfnpu.config import CONFIGS, DEVICES

from .common import console

NAME = "configs"
HELP = "list the reference hardware configurations"


def add_arguments(parser):
    pass


def run(args) -> int:
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
