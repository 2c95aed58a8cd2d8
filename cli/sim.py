"""``sfnpu sim`` (``make sim``): compile a model and run every executor available on it,
cross-checking them: golden model vs onnxruntime, RTL vs golden model (the whole DRAM), cycle
model vs the RTL's group log."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rich.table import Table

from sfnpu import image
from sfnpu.config import CONFIGS, get_config
from sfnpu.models.catalog import DEFAULT_MODEL, resolve_model

from .common import REPO_ROOT, console
from .rtl import RTL_MAX_CYCLES, dram_differences, rtl_harness, rtl_ok
from .tables import group_table, program_table

NAME = "sim"
HELP = "run every available pipeline stage"


#: Arrays simulated on Verilator by default; larger ones (kcu1500) take ``--rtl``.
RTL_DEFAULT_MACS = 256


def add_arguments(parser):
    parser.add_argument("--config", default="tiny", choices=list(CONFIGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help=f"ONNX model path, builder name or bundled model "
                        f"(default {DEFAULT_MODEL})")
    parser.add_argument("--waves", action="store_true",
                        help="write the RTL run's waves to build/waves/ (FST, or VCD without lz4)")
    parser.add_argument("--rtl", action="store_true",
                        help=f"simulate the RTL on arrays above {RTL_DEFAULT_MACS} MACs too "
                             "(kcu1500: about 20 minutes to elaborate and build, cached after)")


def _golden_vs_onnxruntime(program, path, inputs, golden, config):
    """(share of identical output values, top-1 agreements, the images the last input's run
    gave the accelerator: one per accelerator segment)."""
    import onnx

    from sfnpu.compiler.pipeline import run_onnxruntime

    reference = onnx.load(str(path))
    input_name = reference.graph.input[0].name
    same = total = agree = 0
    for x in inputs:
        feeds = {input_name: x[None]}
        blobs = []

        def accelerator(blob: bytes):
            image.unpack(blob, config)  # checksums, fingerprint, instruction decode, ranges
            blobs.append(blob)
            return golden.outputs(blob)

        got = program.run(feeds, accelerator)
        want = run_onnxruntime(reference, feeds)
        for key in want:
            same += int((want[key] == got[key]).sum())
            total += want[key].size
        first = next(iter(want))
        agree += int(want[first].argmax() == got[first].argmax())
    return same / total, agree, blobs


def _segments(program) -> list:
    """The accelerator programs (Compiled) of a compiled or partitioned model."""
    from sfnpu.compiler.partition import Partitioned

    if isinstance(program, Partitioned):
        return [s.compiled for s in program.accelerated]
    return [program]


def _compile_stage(program, seconds: float) -> str:
    from sfnpu.compiler.partition import Partitioned

    segments = _segments(program)
    groups = sum(len(c.groups) for c in segments)
    if not isinstance(program, Partitioned):
        return (f"{program.imported.onnx_nodes} QDQ nodes → {groups} groups "
                f"({seconds:.1f} s)")
    host = program.host_nodes
    return (f"{program.onnx_nodes} QDQ nodes → {len(segments)} accelerator segments, "
            f"{groups} groups; {len(host)} host nodes "
            f"({', '.join(sorted({n.op for n in host})) or 'none'}); "
            f"{program.mac_share:.2%} of the MACs on the accelerator ({seconds:.1f} s)")


def run(args) -> int:
    from sfnpu.compiler.partition import compile_partitioned
    from sfnpu.sim.golden import GoldenModel

    config = get_config(args.config)
    name = args.model or DEFAULT_MODEL
    console.print(f"[bold]sfnpu sim[/] — {name} — {config.summary()}")
    stages = []
    with tempfile.TemporaryDirectory(prefix="sfnpu-sim-") as tmp:
        t0 = time.perf_counter()
        path, inputs, description, notes = resolve_model(name, Path(tmp))
        stages.append(("quantise (onnxruntime)", "; ".join(notes)))
        program = compile_partitioned(path, config)
        stages.append(("compile", _compile_stage(program, time.perf_counter() - t0)))
        golden = GoldenModel(config)
        t1 = time.perf_counter()
        identical, agree, blobs = _golden_vs_onnxruntime(program, path, inputs, golden, config)
        segments = _segments(program)
        stages.append(("DRAM image", ", ".join(
            f"{c.program.layout.image_bytes}" for c in segments) + " bytes, validated"))
        stages.append(("golden model vs onnxruntime",
                       f"{identical:.4%} identical over {len(inputs)} inputs, top-1 "
                       f"{agree}/{len(inputs)} ({time.perf_counter() - t1:.1f} s)"))
        verdicts = [_run_segment(config, compiled, blob, golden, stages, args.waves,
                                 f" (segment {k})" if len(segments) > 1 else "", args.rtl)
                    for k, (compiled, blob) in enumerate(zip(segments, blobs))]

    for k, (compiled, (timing, result, _)) in enumerate(zip(segments, verdicts)):
        title = description + (f", accelerator segment {k}" if len(segments) > 1 else "")
        console.print(program_table(compiled.program.instructions, title=title))
        console.print(group_table(compiled.program.instructions, timing, result))
    table = Table(title="pipeline stages")
    table.add_column("stage")
    table.add_column("result")
    for stage, outcome in stages:
        table.add_row(stage, f"[green]{outcome}[/]")
    console.print(table)
    if identical != 1.0:
        console.print("[red]FAIL[/]: the golden model differs from onnxruntime")
        return 1
    for (timing, result, comparison), blob in zip(verdicts, blobs):
        if result is not None and rtl_ok(result, golden, blob) is False:
            console.print("[red]FAIL[/]: the RTL differs from the golden model")
            return 1
        if comparison is not None and comparison.problems():
            console.print("[red]FAIL[/]: the RTL's group log disagrees with the cycle model")
            return 1
    console.print("[green]PASS[/] (every available stage)")
    return 0


def _run_segment(config, compiled, blob, golden, stages, waves, label, rtl=False):
    """The cycle model and the RTL on one accelerator image: (timing, RTL result or None,
    their comparison or None); adds the stage rows."""
    from sfnpu.sim.cycle import CycleModel, compare

    timing = CycleModel(config).run(blob)
    stages.append((f"cycle model{label}",
                   f"{timing.cycles} cycles = {timing.seconds * 1e3:.2f} ms "
                   f"at {config.clock_mhz:g} MHz; {timing.read_bytes} B read, "
                   f"{timing.write_bytes} B written"))
    result = _sim_rtl(config, compiled, blob, golden, stages, waves=waves, label=label,
                      large=rtl)
    comparison = None
    if result is not None and not (result.timeout or result.error):
        comparison = compare(timing, result.group_cycles, result.group_read_bytes,
                             result.group_write_bytes)
        problems = comparison.problems()
        verdict = comparison.summary() + (
            "" if not problems else "[red]; " + "; ".join(problems[:4]) + "[/]")
        stages.append((f"cycle model vs RTL{label}", verdict))
    return timing, result, comparison


def _waves_harness(config):
    """A traced build of the accelerator and the file its run writes."""
    from sfnpu.tb.system import SYSTEM_BUILDS, SystemHarness, wave_format

    kind, why = wave_format()
    if kind != "fst":
        console.print(f"[yellow]waves: {why}[/]")
    build = SYSTEM_BUILDS / f"{config.name}-waves-{kind}"
    with console.status(f"RTL: building the Verilated accelerator with {kind.upper()} "
                        f"tracing ({config.name}); cached in {build}"):
        harness = SystemHarness(config, build, waves=kind)
    waves_file = REPO_ROOT / "build" / "waves" / f"{config.name}.{kind}"
    waves_file.parent.mkdir(parents=True, exist_ok=True)
    return harness, waves_file


def _sim_rtl(config, compiled, blob, golden, stages, waves=False, label="", large=False):
    """Run the last input's image on the RTL and compare the whole DRAM with the golden
    model's; adds a stage row. None when the RTL is not simulated: it cannot be built for
    the configuration, or its array is large and ``large`` is not set."""
    from sfnpu.limits import rtl_problems

    if problems := rtl_problems(config):
        stages.append((f"RTL on Verilator{label}", f"not simulated: the RTL cannot be built "
                       f"for {config.name} ({'; '.join(problems)})"))
        return None
    if config.macs > RTL_DEFAULT_MACS and not large:
        stages.append((f"RTL on Verilator{label}", f"not simulated by default: {config.name}'s "
                       f"{config.macs} MACs take about 20 minutes to elaborate and build for "
                       "Verilator (cached after); add --rtl"))
        return None
    harness, waves_file = _waves_harness(config) if waves else (rtl_harness(config), None)
    t0 = time.perf_counter()
    with console.status(f"RTL: running {len(compiled.program.instructions)} groups on "
                        "Verilator"):
        result = harness.run(blob, max_cycles=RTL_MAX_CYCLES, waves_file=waves_file)
    seconds = time.perf_counter() - t0
    if waves_file is not None:
        stages.append((f"waves{label}", f"{waves_file} ({waves_file.stat().st_size / 1e6:.1f} MB)"))
    if result.timeout or result.error:
        stages.append((f"RTL on Verilator{label}", f"[red]stopped: {result.error_code.name} in group "
                       f"{result.error_group}{' (timeout)' if result.timeout else ''}[/]"))
        return result
    differ = dram_differences(result, golden, blob)
    cycles = result.counters["CYCLES"]
    ms = cycles / (config.clock_mhz * 1e3)
    verdict = "DRAM identical to the golden model" if differ == 0 else \
        f"[red]{differ} DRAM bytes differ from the golden model[/]"
    stages.append((f"RTL on Verilator{label}",
                   f"{verdict} (outputs and every intermediate); "
                   f"{cycles} cycles = {ms:.2f} ms at {config.clock_mhz:g} MHz; "
                   f"{result.counters['DRAM_READ_BYTES']} B read, "
                   f"{result.counters['DRAM_WRITE_BYTES']} B written; simulated in "
                   f"{seconds:.1f} s ({cycles / seconds / 1e3:.0f} k cycles/s)"))
    return result
