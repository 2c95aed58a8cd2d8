"""Readable compile report: what became which group, and what runs on the host."""

from __future__ import annotations

from sfnpu import isa
from sfnpu.config import HwConfig

from .partition import AcceleratorSegment, Partitioned, profile
from .pipeline import Compiled

__all__ = ["compile_report", "partition_report"]


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


def _sides(partitioned: Partitioned, config: HwConfig) -> list[str]:
    sides = profile(partitioned, config)
    total = {f: sum(getattr(p, f) for p in sides.values())
             for f in ("macs", "seconds", "dram_bytes")}

    def share(side, f):
        return f"{getattr(side, f) / total[f]:.1%}" if total[f] else "-"
    lines = ["", "| side | segments | MACs | time | DRAM bytes |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, side in sides.items():
        lines.append(f"| {name} | {side.segments} | {side.macs} ({share(side, 'macs')}) | "
                     f"{side.seconds * 1e3:.3f} ms ({share(side, 'seconds')}) | "
                     f"{side.dram_bytes} ({share(side, 'dram_bytes')}) |")
    return lines + ["", f"Accelerator time: the cycle model at {config.clock_mhz:g} MHz; host "
                    "time: onnxruntime on this machine, one run on zero inputs; host DRAM bytes: "
                    "the codes it reads from and writes to the images' regions."]


def partition_report(partitioned: Partitioned, source: str, notes: list[str] = (),
                     config: HwConfig | None = None) -> str:
    """The segments of a partitioned model in order, every host node with the reason it runs
    on the host, the MAC share (with ``config``: MACs, time and DRAM bytes on each side), then
    each accelerator segment's own report."""
    lines = [
        f"# sfnpu compile report: {source} (partitioned)",
        "",
        f"- ONNX nodes: {partitioned.onnx_nodes}; {len(partitioned.segments)} segments, "
        f"{len(partitioned.accelerated)} on the accelerator",
        f"- convolution MACs on the accelerator: {partitioned.mac_share:.2%}",
        *[f"- {note}" for note in notes],
        *(_sides(partitioned, config) if config is not None else []),
        "",
        "| segment | runs on | inputs | outputs | groups or host nodes |",
        "| ---: | --- | --- | --- | --- |",
    ]
    for k, segment in enumerate(partitioned.segments):
        where, what = ("accelerator", f"{len(segment.compiled.groups)} groups") \
            if isinstance(segment, AcceleratorSegment) else \
            ("host", ", ".join(n.op for n in segment.nodes) or "dequantisation")
        lines.append(f"| {k} | {where} | {', '.join(f'`{n}`' for n in segment.inputs)} | "
                     f"{', '.join(f'`{n}`' for n in segment.outputs)} | {what} |")
    host = partitioned.host_nodes
    if host:
        lines += ["", "## Host nodes", "", "| node | op | MACs | why on the host |",
                  "| --- | --- | ---: | --- |"]
        lines += [f"| `{n.name}` | {n.op} | {n.macs} | {n.reason} |" for n in host]
    for k, segment in enumerate(partitioned.segments):
        if isinstance(segment, AcceleratorSegment):
            lines += ["", compile_report(segment.compiled, f"segment {k}").replace(
                "# sfnpu compile report:", "## Accelerator").rstrip()]
    return "\n".join(lines) + "\n"
