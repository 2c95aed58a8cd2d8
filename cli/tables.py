"""Rich tables of a program, an image's sections and the per-group timing."""

from __future__ import annotations

from rich.table import Table

from sfnpu import image, isa

__all__ = ["group_table", "program_table", "sections_table"]


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


def group_table(instructions, timing, result=None) -> Table:
    """Per group: the instruction's kind, the cycle model's latency and DRAM bytes, and
    (given an RTL run) the RTL's group log beside them."""
    table = Table(title="per group: cycle model" + (" vs RTL (GROUP_LOG)" if result else ""))
    columns = ["#", "conv", "reuse", "bound", "model cycles"]
    if result is not None:
        columns += ["RTL cycles", "error"]
    columns += ["model read/written B"]
    if result is not None:
        columns += ["RTL read/written B"]
    for col in columns:
        table.add_column(col, justify="right" if col != "conv" else "left")
    log = list(zip(result.group_cycles, result.group_read_bytes, result.group_write_bytes)) \
        if result is not None else []
    for k, (instr, g) in enumerate(zip(instructions, timing.groups)):
        row = [str(k), instr.conv.name.lower(), instr.reuse.name.lower(), g.bound,
               str(g.cycles)]
        if result is not None:
            cycles, read, written = log[k] if k < len(log) else (0, 0, 0)
            error = (g.cycles - cycles) / cycles if cycles else float("nan")
            style = "green" if g.cycles == cycles else ("yellow" if abs(error) <= 0.05
                                                        else "red")
            row += [str(cycles), f"[{style}]{error:+.1%}[/]"]
        row.append(f"{g.read_bytes}/{g.write_bytes}")
        if result is not None:
            same = (g.read_bytes, g.write_bytes) == (read, written)
            row.append(f"[{'green' if same else 'red'}]{read}/{written}[/]")
        table.add_row(*row)
    return table
