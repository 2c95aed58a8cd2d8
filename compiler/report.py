"""Readable compile report: what became which group, and what runs on the host."""

from __future__ import annotations

from sfnpu import isa

from .pipeline import Compiled

__all__ = ["compile_report"]


def _stages(instr: isa.Instruction) -> str:
    parts = []
    if instr.act != isa.Activation.NONE:
        parts.append(instr.act.name.lower())
    if instr.eltwise != isa.Eltwise.NONE:
        parts.append(instr.eltwise.name.lower())
    if instr.pool != isa.Pool.NONE:
        parts.append(f"{instr.pool.name.lower()}"
                     + (f" {instr.pool_size}/{instr.pool_stride}"
                        if instr.pool != isa.Pool.GLOBAL_AVG else ""))
    if instr.upsample:
        parts.append("up2x")
    if instr.out_c_offset:
        parts.append(f"@ch{instr.out_c_offset}")
    return ", ".join(parts) or "—"


def compile_report(compiled: Compiled, source: str, notes: list[str] = ()) -> str:
    prog = compiled.program
    host = compiled.imported.host
    lines = [
        f"# sfnpu compile report: {source}",
        "",
        f"- hardware: {prog.config.summary()}",
        f"- ONNX nodes: {compiled.imported.onnx_nodes} → IR nodes: "
        f"{len(compiled.graph.nodes)} → groups (instructions): {len(prog.instructions)}",
        "- pipeline steps: " + ", ".join(
            f"{r.name} ({r.seconds:.2f} s{'' if r.changed else ', no change'})"
            for r in compiled.steps),
        f"- DRAM image: {prog.layout.image_bytes} bytes (parameters {len(prog.params)})",
        f"- host before the accelerator: QuantizeLinear of {len(prog.inputs)} input(s)"
        + "".join(f", then {what} into `{name}` ({'x'.join(map(str, shape))})"
                  for what, names in (("SpaceToDepth(2)", host.space_to_depth),
                                      ("the stem's taps as channels",
                                       [t.name for t in host.input_taps]))
                  for name, shape in ((n, compiled.graph.tensors[n].shape) for n in names)),
        f"- host after the accelerator: "
        f"{', '.join(sorted(set(host.epilogue_ops))) or 'nothing'}",
        *[f"- {note}" for note in notes],
        "",
        "| # | fused IR nodes | conv | in | out | post | reuse | input | output |",
        "| ---: | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g, i in zip(compiled.groups, prog.instructions):
        conv = "—" if i.conv == isa.ConvKind.NONE else \
            f"{i.conv.name.lower()} {i.kh}x{i.kw}/{i.sh}x{i.sw}"
        fused = " + ".join(f"{n.op}" for n in g.nodes) or "copy"
        lines.append(
            f"| {g.index} | {fused} (`{g.name}`) | {conv} | {i.in_c}x{i.in_h}x{i.in_w} | "
            f"{i.out_c}x{i.out_h}x{i.out_w} | {_stages(i)} | {i.reuse.name.lower()} | "
            f"{i.input.space.name}+{i.input.offset:#x} | {i.output.space.name}+"
            f"{i.output.offset:#x} |")
    return "\n".join(lines) + "\n"
