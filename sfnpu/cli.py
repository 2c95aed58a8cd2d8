"""The ``sfnpu`` command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import docs, image, isa
from .config import CONFIGS, ConfigError, get_config

REPO_ROOT = Path(__file__).resolve().parents[1]
# Wide enough for the program table when the output is a file or CI log.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


class CliError(Exception):
    """A user-facing failure: printed without a traceback, exit status 2."""


def _location(loc: isa.Location) -> str:
    return f"{loc.space.name}+{loc.offset:#x}"


def program_table(program: list, title: str = "program") -> Table:
    """One row per group: what it computes and where its data lives."""
    t = Table(title=title)
    for col in ("#", "conv", "reuse", "in CxHxW", "out CxHxW", "post", "input", "output"):
        t.add_column(col)
    for n, g in enumerate(program):
        conv = "—" if g.conv == isa.ConvKind.NONE else \
            f"{g.conv.name.lower()} {g.kh}x{g.kw}/{g.sh}"
        post = [s for s, on in ((g.act.name.lower(), g.act != isa.Activation.NONE),
                                (g.eltwise.name.lower(), g.eltwise != isa.Eltwise.NONE),
                                (g.pool.name.lower(), g.pool != isa.Pool.NONE),
                                ("up2x", g.upsample)) if on]
        t.add_row(str(n), conv, g.reuse.name.lower(), f"{g.in_c}x{g.in_h}x{g.in_w}",
                  f"{g.out_c}x{g.out_h}x{g.out_w}", ",".join(post) or "—",
                  _location(g.input), _location(g.output))
    return t


def sections_table(layout: image.ImageLayout) -> Table:
    t = Table(title=f"DRAM image: {layout.image_bytes} bytes")
    for col in ("section", "offset", "bytes", "tensor"):
        t.add_column(col)
    for s in layout.sections:
        tensor = "" if s.tensor is None else (
            f"{'int8' if s.tensor.signed else 'uint8'} {s.tensor.channels}x{s.tensor.height}"
            f"x{s.tensor.width} zp={s.tensor.zero_point} scale={s.tensor.scale:g}")
        t.add_row(s.label, f"{s.offset:#x}", str(s.size), tensor)
    return t


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------

def cmd_configs(args) -> int:
    for c in CONFIGS.values():
        console.print(c.summary())
        console.print(f"  fingerprint {c.fingerprint:#018x}, DRAM "
                      f"{c.dram_bytes_per_cycle} bytes/cycle")
    return 0


def cmd_docs(args) -> int:
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


def cmd_image(args) -> int:
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


def cmd_sim(args) -> int:
    from .examples import sample_image

    config = get_config(args.config)
    if args.model:
        raise CliError(f"cannot compile {args.model}: the ONNX front end is not built yet; "
                       "run `make sim` without MODEL= for the built-in sample program")
    console.print(f"[bold]sfnpu sim[/] — {config.summary()}")
    stages = []

    t0 = time.perf_counter()
    sample = sample_image(config, seed=args.seed)
    stages.append(("assemble sample program + pack DRAM image",
                   f"{len(sample.program)} groups, {len(sample.blob)} bytes "
                   f"({time.perf_counter() - t0:.2f} s)"))
    loaded = image.unpack(sample.blob, config)
    if loaded.program != sample.program:
        raise CliError("decoded program differs from the assembled one")
    inp = loaded.tensor(image.SectionKind.INPUT, 0, config.lanes)
    if (inp != sample.input).any():
        raise CliError("input tensor read back from the image differs from the packed one")
    stages.append(("validate image (checksums, fingerprint, instruction decode, address "
                   "ranges)", "ok"))
    for name in ("compile ONNX model", "golden model", "cycle-accurate model",
                 "RTL on Verilator"):
        stages.append((name, "not built yet"))

    console.print(sections_table(loaded.layout))
    console.print(program_table(loaded.program, title="sample program"))
    table = Table(title="pipeline stages")
    table.add_column("stage")
    table.add_column("result")
    for name, result in stages:
        style = "yellow" if result == "not built yet" else "green"
        table.add_row(name, f"[{style}]{result}[/]")
    console.print(table)
    console.print("[green]PASS[/] (every available stage)")
    return 0


def cmd_not_built(args) -> int:
    raise CliError(f"`{args.command}` is not built yet in this version of sfnpu")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sfnpu", description="sfnpu CNN accelerator co-design kit")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("configs", help="list the reference hardware configurations") \
        .set_defaults(func=cmd_configs)

    d = sub.add_parser("docs", help="regenerate docs/ and firmware headers from their sources")
    d.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    d.add_argument("--root", default=str(REPO_ROOT), help="repository root")
    d.set_defaults(func=cmd_docs)

    i = sub.add_parser("image", help="validate a DRAM image and show its sections and program")
    i.add_argument("file")
    i.add_argument("--config", choices=list(CONFIGS), help="also check it against this config")
    i.set_defaults(func=cmd_image)

    s = sub.add_parser("sim", help="run every available pipeline stage")
    s.add_argument("--config", default="tiny", choices=list(CONFIGS))
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--model", help="ONNX model path or builder name")
    s.set_defaults(func=cmd_sim)

    for name in ("bench", "verilog", "bitstream", "firmware"):
        sub.add_parser(name, help="not built yet").set_defaults(func=cmd_not_built)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, ConfigError, image.ImageError, isa.InstructionError) as e:
        console.print(f"[red]error:[/] {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
