"""``sfnpu bench`` (``make bench``): speeds and counts measured on this machine."""

from pathlib import Path

from sfnpu.config import CONFIGS

NAME = "bench"
HELP = "golden-model speed and node → group counts"


def add_arguments(parser):
    parser.add_argument("models", nargs="*", help="builder names (default: all, ResNet-50 first)")
    parser.add_argument("--config", default="kcu1500", choices=list(CONFIGS))
    parser.add_argument("-o", "--output", default="build/bench")


def run(args) -> int:
    from sfnpu.tools.bench import run_bench

    run_bench(Path(args.output), args.config, args.models or None, rtl=not args.models)
    return 0
