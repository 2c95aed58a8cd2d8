"""``make bench``: measured on this machine, printed with the command that produced it.

* golden-model speed: ResNet-50 at 224×224 (target ≤ 10 s on 2 cores), and every other
  architecture builder at its default input size;
* fusion: ONNX nodes of each float model → groups (instructions) after quantisation;
* the exhaustive cut-point search on the configuration's budget (YOLOv3's double cut at 416:
  target ≤ 60 s), with its number of candidates;
* the cycle model: seconds to model the whole network (ResNet-152: target ≤ 1 s) and the
  modelled latency on the configuration;
* the largest trained detector (PP-OCRv4's text detector at 320×320) run whole, partitioned:
  the golden model's time with the host segments (target ≤ 5 s), the MAC share on the
  accelerator, agreement with onnxruntime;
* design-space exploration (:mod:`.dse`): points per second serial and on a local Ray, and
  a 1 000-point sweep's time;
* the RTL on Verilator (config ``tiny``): the Verilator build time of the whole accelerator
  from scratch and the simulation speed on the bundled default model (target ≥ 200 k
  cycles/s), with the cycle model's agreement on that run.

Weights are random and calibration is synthetic (fine for timing and structure; the figures
say so). Results go to ``build/bench/bench.md`` and ``.csv``.
"""

from __future__ import annotations

import csv
import os
import platform
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from sfnpu.config import get_config

__all__ = ["run_bench"]

FIELDS = ("model", "input", "float ONNX nodes", "groups", "compile s", "golden s",
          "identical to onnxruntime", "cut search s (candidates)", "cycle model s",
          "model latency ms")


def _bench_one(name: str, size: int, config, workdir: Path) -> dict:
    import onnx

    from sfnpu.models import builders
    from sfnpu.compiler.pipeline import compile_model, run_onnxruntime
    from sfnpu.compiler.quantize import CalibrationSource, quantize_model
    from sfnpu.sim.golden import GoldenModel

    model = builders.build(name, input_size=size)
    path = workdir / f"{name}.qdq.onnx"
    t0 = time.perf_counter()
    quantize_model(model, path, CalibrationSource.synthetic(2, seed=0))
    compiled = compile_model(path, config)
    t1 = time.perf_counter()
    x = np.random.default_rng(0).uniform(0, 1, (1, 3, size, size)).astype(np.float32)
    blob = compiled.program.pack(compiled.quantise_inputs({model.graph.input[0].name: x}))
    golden = GoldenModel(config)
    t2 = time.perf_counter()
    outputs = golden.outputs(blob)
    t3 = time.perf_counter()
    got = compiled.finish(outputs)
    want = run_onnxruntime(onnx.load(str(path)), {model.graph.input[0].name: x})
    same = np.mean([float((want[k] == got[k]).mean()) for k in want])
    from sfnpu.compiler.blocks import detect_blocks
    from sfnpu.compiler.cutpoints import (NoFeasiblePolicy, count_policies, long_path_options,
                                     search)
    blocks = detect_blocks(compiled.graph, compiled.groups)
    candidates = count_policies(blocks, long_paths=long_path_options(compiled, blocks))
    t4 = time.perf_counter()
    try:
        search(compiled)
        fits = ""
    except NoFeasiblePolicy:
        fits = ", none fits"
    searched = f"{time.perf_counter() - t4:.2f} ({candidates}{fits})"
    from sfnpu.sim.cycle import CycleModel
    t5 = time.perf_counter()
    timing = CycleModel(config).run(blob)
    modelled = time.perf_counter() - t5
    return {"model": name, "input": size, "float ONNX nodes": len(model.graph.node),
            "groups": len(compiled.groups), "compile s": round(t1 - t0, 2),
            "golden s": round(t3 - t2, 2), "identical to onnxruntime": f"{same:.4%}",
            "cut search s (candidates)": searched, "cycle model s": round(modelled, 3),
            "model latency ms": round(timing.seconds * 1e3, 3)}


_PLAIN_MAIN = """#include "Vsim_system.h"
#include "verilated.h"
int main(int argc, char** argv) {
    Verilated::commandArgs(argc, argv);
    Vsim_system top;
    top.eval();
    return 0;
}
"""


@contextmanager
def _without_compiler_cache():
    """Builds from scratch: ccache compiles without storing or reusing objects, so neither
    build reuses what the other one (or an earlier run) compiled."""
    saved = os.environ.get("CCACHE_DISABLE")
    os.environ["CCACHE_DISABLE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["CCACHE_DISABLE"]
        else:
            os.environ["CCACHE_DISABLE"] = saved


def _rtl_bench(workdir: Path) -> list[str]:
    """The cocotb system testbench on `tiny`: its Verilator build from scratch beside a plain
    Verilator build of the same Verilog (no VPI), both without ccache; the build again in a
    new folder with ccache (as a test run's later builds find it) and with its stamp (as
    every later test finds it); its speed on the default model. Markdown lines."""
    from sfnpu.models.catalog import DEFAULT_MODEL, resolve_model
    from sfnpu.compiler.pipeline import compile_model
    from sfnpu.sim.cycle import CycleModel, compare
    from sfnpu.tb.elaborate import system_verilog
    from sfnpu.tb.system import TOP, SystemHarness
    from sfnpu.tb.verilator import build_verilated

    config = get_config("tiny")
    t0 = time.perf_counter()
    verilog = system_verilog(config, 1 << 24, TOP)
    elaborated = time.perf_counter() - t0
    with _without_compiler_cache():
        t0 = time.perf_counter()
        build_verilated(workdir / "plain", TOP, verilog.read_text(), _PLAIN_MAIN,
                        ["-O2", "-MAKEFLAGS", "OPT_FAST=-O2"], jobs=2)
        plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        SystemHarness(config, workdir / "cold")
        cocotb_build = time.perf_counter() - t0
    SystemHarness(config, workdir / "warm")             # fills ccache
    t0 = time.perf_counter()
    harness = SystemHarness(config, workdir / "rtl")
    compiler_cached = time.perf_counter() - t0
    t0 = time.perf_counter()
    SystemHarness(config, workdir / "rtl")
    cached = time.perf_counter() - t0
    path, inputs, description, _ = resolve_model(DEFAULT_MODEL, workdir)
    compiled = compile_model(path, config)
    import onnx
    name = onnx.load(str(path)).graph.input[0].name
    blob = compiled.program.pack(compiled.quantise_inputs({name: inputs[:1]}))
    t1 = time.perf_counter()
    result = harness.run(blob, max_cycles=200_000_000)
    ran = time.perf_counter() - t1
    cycles = result.counters["CYCLES"]
    comparison = compare(CycleModel(config).run(blob), result.group_cycles,
                         result.group_read_bytes, result.group_write_bytes)
    ratio = cocotb_build / plain
    return ["## RTL on Verilator: the cocotb system testbench (config `tiny`)", "",
            f"- elaborating the accelerator to Verilog: {elaborated:.0f} s "
            "(0 s when `build/verilog/` holds this design's fingerprint)",
            f"- Verilator build from scratch (ccache off): plain (C++ main, no VPI) "
            f"{plain:.0f} s, cocotb (VPI, only the ports public, the clock a timed process) "
            f"{cocotb_build:.0f} s = {ratio:.2f}× (target ≤ 1.25×); the cocotb build in a new "
            f"folder with ccache holding its objects: {compiler_cached:.0f} s; with its "
            f"stamp (every later test): {cached:.1f} s",
            f"- {description}: {cycles} cycles simulated in {ran:.1f} s = "
            f"{cycles / ran / 1e3:.0f} k cycles/s (target ≥ 200 k cycles/s; the cocotb start, "
            "the image's $readmemh load and the DRAM's $writememh dump included)",
            f"- cycle model vs RTL on that run: {comparison.summary()}", ""]


#: The largest trained detector the suite carries, at the input size of the partitioned
#: golden-model target (≤ 5 s at 320×320 on 2 cores).
DETECTOR, DETECTOR_SIDE = "ppocr_v4_det", 320


def _partitioned_bench(workdir: Path, config_names=("kcu1500", "tiny")) -> list[str]:
    """The detector run whole: compile time, partitioned golden-model time beside
    onnxruntime's, the accelerator's MAC share and agreement; markdown lines."""
    import onnx

    from sfnpu.compiler.partition import compile_partitioned
    from sfnpu.compiler.pipeline import run_onnxruntime
    from sfnpu.compiler.quantize import CalibrationSource, quantize_model
    from sfnpu.models import real_models
    from sfnpu.sim.golden import GoldenModel

    spec = real_models.real_model(DETECTOR)
    images, _ = real_models.document_images(5, 0, DETECTOR_SIDE)
    x = real_models.normalise(images, spec.mean, spec.std)
    path = workdir / f"{DETECTOR}.qdq.onnx"
    quantize_model(real_models.real_model_path(DETECTOR), path,
                   CalibrationSource.arrays(x[:4], label="rendered pages"))
    reference = onnx.load(str(path))
    feeds = {reference.graph.input[0].name: x[4:5]}
    t0 = time.perf_counter()
    want = run_onnxruntime(reference, feeds)
    ort_s = time.perf_counter() - t0
    lines = [f"## {DETECTOR} at {DETECTOR_SIDE}×{DETECTOR_SIDE}, partitioned", "",
             "| config | compile s | golden model s (whole model, host segments included) | "
             "onnxruntime s | MACs on the accelerator | identical |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name in config_names:
        config = get_config(name)
        t0 = time.perf_counter()
        program = compile_partitioned(path, config)
        t1 = time.perf_counter()
        got = program.run(feeds, GoldenModel(config).outputs)
        t2 = time.perf_counter()
        same = all(np.array_equal(want[k], got[k]) for k in want)
        lines.append(f"| `{name}` | {t1 - t0:.2f} | {t2 - t1:.2f} (target ≤ 5) | {ort_s:.2f} | "
                     f"{program.mac_share:.2%} | {'yes' if same else 'NO'} |")
    return lines + [""]


def _corpus_bench(workdir: Path, config_name: str = "tiny", held_out: int = 2) -> list[str]:
    """Every trained model of the corpus on ``config_name`` (the command line's default),
    quantised from 16 rendered inputs and run on ``held_out`` others: its nodes, groups,
    host work, the accelerator's MAC share, the share of outputs identical to onnxruntime and
    the golden model's time per input (host segments included); markdown lines."""
    import collections

    import onnx

    from sfnpu.compiler.partition import compile_partitioned
    from sfnpu.compiler.pipeline import Compiled, run_onnxruntime
    from sfnpu.compiler.quantize import CalibrationSource, quantize_model
    from sfnpu.models import real_models
    from sfnpu.sim.golden import GoldenModel

    config = get_config(config_name)
    lines = [f"## Trained-model corpus on `{config_name}`", "",
             f"Quantised from 16 rendered inputs; {held_out} held-out inputs run on the golden "
             "model (host segments on onnxruntime) and on onnxruntime.", "",
             "| model | wheel (exporter) | ONNX nodes | segments | groups | host nodes (ops) | "
             "MACs on the accelerator | identical outputs | golden model s/input |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for name, spec in real_models.REAL_MODELS.items():
        try:
            x, _ = real_models.rendered_inputs(name, 16 + held_out, seed=0)
            path = workdir / f"{name}.qdq.onnx"
            quantize_model(real_models.real_model_path(name), path,
                           CalibrationSource.arrays(x[:16], label="rendered images"))
        except real_models.RealModelMissing as e:
            lines.append(f"| {name} | not installed: {e} | | | | | | | |")
            continue
        reference = onnx.load(str(path))
        program = compile_partitioned(path, config)
        pieces = [program] if isinstance(program, Compiled) else [
            s.compiled for s in program.accelerated]
        groups = sum(len(p.program.instructions) for p in pieces)
        host = collections.Counter(n.op for n in getattr(program, "host_nodes", ()))
        golden, same, total, seconds = GoldenModel(config), 0, 0, 0.0
        feed = reference.graph.input[0].name
        for sample in x[16:]:
            want = run_onnxruntime(reference, {feed: sample[None]})
            t0 = time.perf_counter()
            got = program.run({feed: sample[None]}, golden.outputs)
            seconds += time.perf_counter() - t0
            same += sum(int(np.count_nonzero(want[k] == got[k])) for k in want)
            total += sum(want[k].size for k in want)
        ops = ", ".join(f"{op} {n}" for op, n in host.most_common()) or "none"
        lines.append(f"| {name} | `{spec.pip_package}` ({spec.exporter}) | "
                     f"{len(reference.graph.node)} | {len(pieces)} | {groups} | "
                     f"{sum(host.values())}: {ops} | {program.mac_share:.3%} | "
                     f"{same / total:.2%} | {seconds / len(x[16:]):.2f} |")
    return lines + [""]


#: Networks of the tiling section: the bundled classifier and two detectors (random weights;
#: YOLOv2's 3×3 convolutions over 1024 channels run in input-channel shares on ``ecp5``).
TILING_MODELS = (("pplcnet_orientation", None), ("yolov3", 256), ("yolov2", 416))


def _roomy(config):
    """``config`` with stores large enough that nothing tiles (the same array, buffers and
    DRAM): the reference for what tiling costs. Not a buildable part (no device)."""
    return config.replace(name=f"{config.name}-roomy", device=None,
                          row_buffer_bytes=64 * config.row_buffer_bytes,
                          psum_buffer_bytes=64 * config.psum_buffer_bytes,
                          max_channels=8192, max_table_channels=8192, pool_row_pixels=1 << 16)


def tiling_figures(qdq: Path, config) -> dict:
    """One model compiled for ``config``: instructions, tiles, the cycle model's cycles and
    DRAM bytes, and the bytes strips read twice (their halo columns)."""
    from sfnpu import layout
    from sfnpu.compiler.pipeline import compile_model
    from sfnpu.sim.cycle import CycleModel

    program = compile_model(qdq, config).program
    tensors = program.graph.tensors
    zeros = [np.zeros(tensors[n].shape, np.int8 if tensors[n].qtype.signed else np.uint8)
             for n in program.inputs]
    run = CycleModel(config).run(program.pack(zeros))
    whole, read = {}, {}
    for group, instr in zip(program.groups, program.instructions):
        if group.part:
            key = (group.input, group.nodes[0].name if group.nodes else group.output)
            whole[key] = layout.tensor_bytes(*tensors[group.input].shape, config.lanes)
            read[key] = read.get(key, 0) + layout.tensor_bytes(
                instr.in_c, instr.in_h, instr.in_w, config.lanes)
    return dict(instructions=len(program.instructions),
                tiles=sum(1 for g in program.groups if g.part), cycles=run.cycles,
                read=run.read_bytes, write=run.write_bytes,
                halo=sum(read[k] - whole[k] for k in read))


def _tiling_bench(workdir: Path, config_names=("tiny", "ecp5", "kcu1500")) -> list[str]:
    """Each tiling network on each configuration and on its roomy twin; markdown lines."""
    import onnx

    from sfnpu.compiler.pipeline import ensure_qdq
    from sfnpu.models import builders
    from sfnpu.models.catalog import resolve_model

    lines = ["## Tiling: layers larger than the stores", "",
             "Cycle model, zero inputs. *roomy*: the same configuration with stores large enough "
             "that nothing tiles.", "",
             "| network | config | instructions (tiles) | cycles | roomy cycles | "
             "DRAM read B | roomy read B | halo B |", "| --- | --- | ---: | ---: | ---: | ---: | "
             "---: | ---: |"]
    for name, size in TILING_MODELS:
        if size is None:
            qdq = resolve_model(name, workdir)[0]
        else:
            path = workdir / f"{name}{size}.onnx"
            onnx.save(builders.build(name, input_size=size), str(path))
            qdq, _ = ensure_qdq(path, workdir)
        for config_name in config_names:
            config = get_config(config_name)
            t, r = tiling_figures(qdq, config), tiling_figures(qdq, _roomy(config))
            label = name if size is None else f"{name}@{size}"
            lines.append(f"| {label} | `{config_name}` | {t['instructions']} ({t['tiles']}) | "
                         f"{t['cycles']} | {r['cycles']} | {t['read']} | {r['read']} | "
                         f"{t['halo']} |")
    return lines + [""]


#: The sweep of the DSE section: a small network over 1 000 configurations around ``ecp5``.
DSE_SPEC = {
    "name": "bench",
    "networks": [{"model": "squeezenet1_1", "sizes": [32]}],
    "space": [{"base": "ecp5",
               "mac_array": [{"ti": 4, "to": 4}, {"ti": 8, "to": 8}],
               "buffer_bytes": [16384, 32768, 65536, 131072, 262144],
               "psum_buffer_bytes": [8192, 16384, 32768, 65536],
               "dram_bandwidth_gbps": [0.05, 0.1, 0.2, 0.3, 0.4],
               "dram_latency": [8, 16, 32, 64, 128]}],
}
#: The serial and Ray speed sample: 40 of those configurations.
DSE_SAMPLE = {"mac_array": [{"ti": 4, "to": 4}, {"ti": 8, "to": 8}],
              "buffer_bytes": [16384, 65536], "psum_buffer_bytes": [8192, 32768],
              "dram_latency": [16]}


def _dse_bench(workdir: Path) -> list[str]:
    """Points per second serial and on a local Ray (the same 40 points, each from an empty
    cache), and the whole 1 000-point sweep's time on Ray."""
    import os

    from sfnpu.tools.dse import RayRunner, SerialRunner, Spec, run_sweep

    spec = Spec.parse(DSE_SPEC)
    sample = Spec.parse({**DSE_SPEC, "space": [{**DSE_SPEC["space"][0], **DSE_SAMPLE}]})
    runs = [(name, run_sweep(spec_, workdir / f"dse-{k}", runner, report=False))
            for k, (name, spec_, runner) in enumerate((
                ("serial", sample, SerialRunner()), ("local Ray", sample, RayRunner()),
                ("local Ray, whole sweep", spec, RayRunner())))]
    whole = runs[-1][1]
    feasible = sum(r.get("feasible") == 1 for r in whole.rows)
    lines = ["## Design-space exploration (`sfnpu dse`)", "",
             f"{DSE_SPEC['networks'][0]['model']}@32 over {len(whole.rows)} configurations "
             f"around `ecp5` ({feasible} feasible); {os.cpu_count()} CPUs. Each time includes "
             "quantising the model once and, on Ray, starting it.", "",
             "| run | points computed | seconds | points/s |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {r.computed} | {r.seconds:.1f} | {r.computed / r.seconds:.2f} |"
              for name, r in runs]
    return lines + [""]


def run_bench(out_dir: Path = Path("build/bench"), config_name: str = "kcu1500",
              models: list[str] | None = None, rtl: bool = True) -> list[dict]:
    from sfnpu.models import builders

    console = Console()
    config = get_config(config_name)
    sizes = {"resnet50": 224}
    names = models or ["resnet50"] + [n for n in builders.BUILDERS if n != "resnet50"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="sfnpu-bench-") as tmp, Progress(
            console=console, transient=True) as progress:
        task = progress.add_task("benchmarks", total=len(names))
        for name in names:
            progress.update(task, description=f"{name}: quantise, compile, run golden model")
            size = sizes.get(name, builders.DEFAULT_INPUT_SIZE[name])
            rows.append(_bench_one(name, size, config, Path(tmp)))
            progress.advance(task)
        progress.update(task, description=f"{DETECTOR}: partitioned golden model")
        partition_lines = _partitioned_bench(Path(tmp)) if models is None else []
        progress.update(task, description="trained-model corpus: partitioned golden model")
        partition_lines += _corpus_bench(Path(tmp)) if models is None else []
        progress.update(task, description="tiling: cycle model with and without tiles")
        partition_lines += _tiling_bench(Path(tmp)) if models is None else []
        progress.update(task, description="design-space sweep: serial and on Ray")
        partition_lines += _dse_bench(Path(tmp)) if models is None else []
        rtl_lines = []
        if rtl:
            progress.update(task, description="RTL: Verilator build and default-model run")
            rtl_lines = _rtl_bench(Path(tmp))

    table = Table(title=f"sfnpu bench — config {config.name}, {platform.processor() or 'cpu'}")
    for f in FIELDS:
        table.add_column(f)
    for r in rows:
        table.add_row(*(str(r[f]) for f in FIELDS))
    console.print(table)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "bench.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["# sfnpu bench", "",
             f"Command: `make bench` (`sfnpu bench`), config `{config.name}`, random weights, "
             "synthetic calibration (2 samples), one image. Times are wall-clock seconds on "
             "this machine.", "",
             "| " + " | ".join(FIELDS) + " |", "|" + " --- |" * len(FIELDS)]
    lines += ["| " + " | ".join(str(r[f]) for f in FIELDS) + " |" for r in rows]
    lines += ["", *partition_lines, *rtl_lines]
    console.print("\n".join(partition_lines + rtl_lines))
    (out_dir / "bench.md").write_text("\n".join(lines) + "\n")
    console.print(f"wrote {out_dir / 'bench.md'} and {out_dir / 'bench.csv'}")
    return rows
