"""``sfnpu restructure`` (``make restructure``): dataflow restructuring beside Cipolletta &
Calimera's Tables II–III."""

from pathlib import Path

from .common import CliError, console

NAME = "restructure"
HELP = ("dataflow restructuring sweep vs Cipolletta & Calimera, Tables II–III "
        "(markdown, CSV, PNG)")


def add_arguments(parser):
    parser.add_argument("networks", nargs="*", metavar="BUILDER",
                        help="builder names (default: VGG-16, MobileNetV2, SqueezeNet1.1, "
                        "ResNet-18, Inception-V3)")
    parser.add_argument("--size", type=int, help="input size (default: 224, Inception-V3 299)")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the golden-model equivalence check of the chosen points")
    parser.add_argument("--no-sram", action="store_true",
                        help="skip Table II's minimum SRAM with split fronts (VGG-CONV, YOLOv2)")
    parser.add_argument("--out", default="build/restructure", help="output folder")


def _networks(args) -> list[tuple[str, int]]:
    from sfnpu.models.builders import BUILDERS, DEFAULT_INPUT_SIZE
    from sfnpu.studies.restructuring import NETWORKS

    if args.networks:
        unknown = [n for n in args.networks if n not in BUILDERS]
        if unknown:
            raise CliError(f"unknown network {', '.join(unknown)}; builders: "
                           f"{', '.join(BUILDERS)}")
        paper = dict(NETWORKS)
        return [(n, args.size or paper.get(n, DEFAULT_INPUT_SIZE[n])) for n in args.networks]
    if args.size:
        return [(n, args.size) for n, _ in NETWORKS]
    return list(NETWORKS)


def run(args) -> int:
    from sfnpu.studies.restructuring import run_report

    networks = _networks(args)
    command = "sfnpu restructure " + " ".join(
        [*args.networks, *([f"--size {args.size}"] if args.size else []),
         *(["--no-verify"] if args.no_verify else []), *(["--no-sram"] if args.no_sram else [])])
    extra = {"sram": ()} if args.no_sram else {}
    run_report(networks, Path(args.out), verify=not args.no_verify, console=console,
               command=command.strip(), **extra)
    return 0
