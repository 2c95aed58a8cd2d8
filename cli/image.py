"""``sfnpu image``: validate a DRAM image and show its sections and program."""

from pathlib import Path

from sfnpu import image
from sfnpu.config import CONFIGS, get_config

from .common import CliError, console
from .tables import program_table, sections_table

NAME = "image"
HELP = "validate a DRAM image and show its sections and program"


def add_arguments(parser):
    parser.add_argument("file")
    parser.add_argument("--config", choices=list(CONFIGS), help="also check it against this config")


def run(args) -> int:
    config = get_config(args.config) if args.config else None
    try:
        blob = Path(args.file).read_bytes()
    except OSError as e:
        raise CliError(f"cannot read {args.file}: {e.strerror}") from None
    img = image.unpack(blob, config)
    console.print(f"{args.file}: format {image.FORMAT_VERSION}, hardware fingerprint "
                  f"{img.fingerprint:#018x}"
                  + (f" (matches {config.name!r})" if config else ""))
    console.print(sections_table(img.layout))
    console.print(program_table(img.program))
    return 0
