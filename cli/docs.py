"""``sfnpu docs``: regenerate (or check) docs/ and the firmware's C headers."""

from pathlib import Path

from sfnpu import docs

from .common import REPO_ROOT, CliError, console

NAME = "docs"
HELP = "regenerate docs/ and firmware headers from their sources"


def add_arguments(parser):
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    parser.add_argument("--root", default=str(REPO_ROOT), help="repository root")


def run(args) -> int:
    root = Path(args.root)
    if args.check:
        stale = docs.stale(root)
        if stale:
            raise CliError(f"stale generated files: {', '.join(stale)} — run `make docs`")
        console.print(f"{len(docs.GENERATED)} generated files up to date")
        return 0
    changed = docs.write(root)
    for path in docs.GENERATED:
        console.print(f"{'wrote' if path in changed else 'unchanged'} {path}")
    return 0
