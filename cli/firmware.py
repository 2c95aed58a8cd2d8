"""``sfnpu firmware`` (``make firmware``): the Linux host program for a memory-mapped
accelerator, built with the system C compiler."""

import os
import subprocess
from pathlib import Path

from .common import REPO_ROOT, CliError, console

NAME = "firmware"
HELP = "build the C host program for a memory-mapped board"


def add_arguments(parser):
    parser.add_argument("--out", default=str(REPO_ROOT / "build" / "firmware"))


def run(args) -> int:
    from sfnpu.tb.firmware import C_FLAGS, FIRMWARE, INCLUDE_DIRS, LIBRARY_SOURCES

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exe = out / "sfnpu-run"
    cc = os.environ.get("CC", "cc")
    result = subprocess.run([cc, *C_FLAGS, *(f"-I{d}" for d in INCLUDE_DIRS),
                             *map(str, LIBRARY_SOURCES), str(FIRMWARE / "host" / "main_devmem.c"),
                             "-o", str(exe)], capture_output=True, text=True)
    if result.returncode:
        raise CliError(f"the firmware does not compile with {cc}:\n{result.stderr}")
    console.print(f"wrote {exe} (run it without arguments for its usage)")
    return 0
