"""``sfnpu configs``: the reference hardware configurations."""

from sfnpu.config import CONFIGS

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
    return 0
