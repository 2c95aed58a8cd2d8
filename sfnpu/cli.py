"""The ``sfnpu`` command line."""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from . import docs, image, isa
from .config import CONFIGS, ConfigError, get_config
from .sim.cycle import CycleModel, compare

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


DEFAULT_MODEL = "pplcnet_orientation"


def _sim_model(name: str, workdir: Path, config_name: str):
    """(QDQ path, sample inputs, description) for a path, a builder or a bundled real model."""
    from .compiler import builders, real_models
    from .compiler.pipeline import ensure_qdq
    from .compiler.quantize import CalibrationSource

    if name in real_models.REAL_MODELS:
        x, _ = real_models.rendered_inputs(name, 24, seed=0)
        path, notes = ensure_qdq(real_models.real_model_path(name), workdir,
                                 CalibrationSource.arrays(x[:16], label="rendered images"))
        return path, x[16:], f"{name} (trained, from its PyPI wheel)", notes
    if name in builders.BUILDERS:
        import onnx

        size = 64
        model = builders.build(name, input_size=size)
        onnx.save(model, str(workdir / f"{name}.onnx"))
        path, notes = ensure_qdq(workdir / f"{name}.onnx", workdir)
        x = np.random.default_rng(0).uniform(0, 1, (4, 3, size, size)).astype(np.float32)
        return path, x, f"{name} at {size}x{size} (random weights)", notes
    path = Path(name)
    if not path.is_file():
        raise CliError(f"MODEL={name}: not a file, a builder ({', '.join(builders.BUILDERS)}) "
                       f"or a bundled model ({', '.join(real_models.REAL_MODELS)})")
    qdq, notes = ensure_qdq(path, workdir)
    from .compiler.importer import load_model
    model = load_model(qdq)
    dims = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).uniform(0, 1, (4, *dims[1:])).astype(np.float32)
    return qdq, x, str(path), notes


def cmd_sim(args) -> int:
    """Compile a model and run every executor available, cross-checking them."""
    import tempfile

    import onnx

    from .compiler.pipeline import compile_model, run_onnxruntime
    from .sim.golden import GoldenModel

    config = get_config(args.config)
    name = args.model or DEFAULT_MODEL
    console.print(f"[bold]sfnpu sim[/] — {name} — {config.summary()}")
    stages = []
    with tempfile.TemporaryDirectory(prefix="sfnpu-sim-") as tmp:
        t0 = time.perf_counter()
        path, inputs, description, notes = _sim_model(name, Path(tmp), args.config)
        stages.append(("quantise (onnxruntime)", "; ".join(notes)))
        compiled = compile_model(path, config)
        stages.append(("compile", f"{compiled.imported.onnx_nodes} QDQ nodes → "
                       f"{len(compiled.groups)} groups ({time.perf_counter() - t0:.1f} s)"))
        reference = onnx.load(str(path))
        input_name = reference.graph.input[0].name
        golden = GoldenModel(config)
        same = total = agree = 0
        t1 = time.perf_counter()
        for x in inputs:
            feeds = {input_name: x[None]}
            blob = compiled.program.pack(compiled.quantise_inputs(feeds))
            image.unpack(blob, config)  # checksums, fingerprint, instruction decode, ranges
            got = compiled.finish(golden.outputs(blob))
            want = run_onnxruntime(reference, feeds)
            for key in want:
                same += int((want[key] == got[key]).sum())
                total += want[key].size
            first = next(iter(want))
            agree += int(want[first].argmax() == got[first].argmax())
        identical = same / total
        stages.append(("DRAM image", f"{compiled.program.layout.image_bytes} bytes, validated"))
        stages.append(("golden model vs onnxruntime",
                       f"{identical:.4%} identical over {len(inputs)} inputs, top-1 "
                       f"{agree}/{len(inputs)} ({time.perf_counter() - t1:.1f} s)"))
        timing = CycleModel(config).run(blob)
        stages.append(("cycle model", f"{timing.cycles} cycles = {timing.seconds * 1e3:.2f} ms "
                       f"at {config.clock_mhz:g} MHz; {timing.read_bytes} B read, "
                       f"{timing.write_bytes} B written"))
        result = _sim_rtl(config, compiled, blob, golden, stages, waves=args.waves)
        comparison = None
        if result is not None and not (result.timeout or result.error):
            comparison = compare(timing, result.group_cycles, result.group_read_bytes,
                                 result.group_write_bytes)
            problems = comparison.problems()
            verdict = comparison.summary() + (
                "" if not problems else "[red]; " + "; ".join(problems[:4]) + "[/]")
            stages.append(("cycle model vs RTL", verdict))

    console.print(program_table(compiled.program.instructions, title=description))
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
    if result is not None and rtl_ok(result, golden, blob) is False:
        console.print("[red]FAIL[/]: the RTL differs from the golden model")
        return 1
    if comparison is not None and comparison.problems():
        console.print("[red]FAIL[/]: the RTL's group log disagrees with the cycle model")
        return 1
    console.print("[green]PASS[/] (every available stage)")
    return 0


def _sim_rtl(config, compiled, blob, golden, stages, waves=False):
    """Run the last input's image on the RTL and compare the whole DRAM with the golden
    model's; adds a stage row. None when the config is model-only."""
    if config.dram_bus_bytes > 8:
        stages.append(("RTL on Verilator", f"not simulated: {config.name} is a model-only "
                       "configuration (use CONFIG=tiny or ecp5)"))
        return None
    waves_file = None
    if waves:
        from .tb.system import SystemHarness, wave_format

        kind, why = wave_format()
        if kind != "fst":
            console.print(f"[yellow]waves: {why}[/]")
        build = REPO_ROOT / "build" / "rtl" / f"{config.name}-waves-{kind}"
        with console.status(f"RTL: building the Verilated accelerator with {kind.upper()} "
                            f"tracing ({config.name}); cached in {build}"):
            harness = SystemHarness(config, build, waves=kind)
        waves_file = REPO_ROOT / "build" / "waves" / f"{config.name}.{kind}"
        waves_file.parent.mkdir(parents=True, exist_ok=True)
    else:
        harness = rtl_harness(config)
    t0 = time.perf_counter()
    with console.status(f"RTL: running {len(compiled.program.instructions)} groups on "
                        "Verilator"):
        result = harness.run(blob, max_cycles=RTL_MAX_CYCLES, waves_file=waves_file)
    seconds = time.perf_counter() - t0
    if waves_file is not None:
        stages.append(("waves", f"{waves_file} ({waves_file.stat().st_size / 1e6:.1f} MB)"))
    if result.timeout or result.error:
        stages.append(("RTL on Verilator", f"[red]stopped: {result.error_code.name} in group "
                       f"{result.error_group}{' (timeout)' if result.timeout else ''}[/]"))
        return result
    differ = _dram_differences(result, golden, blob)
    cycles = result.counters["CYCLES"]
    ms = cycles / (config.clock_mhz * 1e3)
    verdict = "DRAM identical to the golden model" if differ == 0 else \
        f"[red]{differ} DRAM bytes differ from the golden model[/]"
    stages.append(("RTL on Verilator",
                   f"{verdict} (outputs and every intermediate); "
                   f"{cycles} cycles = {ms:.2f} ms at {config.clock_mhz:g} MHz; "
                   f"{result.counters['DRAM_READ_BYTES']} B read, "
                   f"{result.counters['DRAM_WRITE_BYTES']} B written; simulated in "
                   f"{seconds:.1f} s ({cycles / seconds / 1e3:.0f} k cycles/s)"))
    return result


@functools.lru_cache(maxsize=4)
def _golden_dram(golden, blob: bytes) -> bytes:
    return bytes(golden.run(blob).dram)


def _dram_differences(result, golden, blob) -> int:
    want = _golden_dram(golden, blob)
    return int(np.count_nonzero(np.frombuffer(result.dram[:len(want)], np.uint8)
                                != np.frombuffer(want, np.uint8)))


def rtl_ok(result, golden, blob) -> bool:
    """The run finished without error and left the golden model's DRAM."""
    return not (result.timeout or result.error) and _dram_differences(result, golden, blob) == 0


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


def _calibration(args):
    from .compiler.quantize import CalibrationSource

    if args.calib is None:
        return None
    folder = Path(args.calib)
    if not folder.is_dir():
        raise CliError(f"--calib {folder}: not a folder (give images or .npy files)")
    if any(folder.glob("*.npy")):
        return CalibrationSource.npy(folder)
    return CalibrationSource.images(folder)


def _compile(args, workdir: Path):
    from .compiler.pipeline import PipelineConfig, compile_model, ensure_qdq

    path, notes = ensure_qdq(args.model, workdir, _calibration(args),
                             activation_signed=args.int8_activations)
    pipeline = PipelineConfig(modules=args.modules, space_to_depth=not args.no_space_to_depth,
                              fold_input_taps=not args.no_fold_input_taps)
    return compile_model(path, get_config(args.config), pipeline), path, notes


def cmd_compile(args) -> int:
    from .compiler.report import compile_report

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    compiled, qdq, notes = _compile(args, out)
    feeds = compiled.imported.host.prologue.graph.input
    zeros = [np.zeros(compiled.graph.tensors[n].shape, compiled.graph.tensors[n].qtype.dtype)
             for n in compiled.program.inputs]
    (out / "image.bin").write_bytes(compiled.program.pack(zeros))
    report = compile_report(compiled, str(args.model), notes)
    (out / "report.md").write_text(report)
    console.print(report)
    console.print(f"wrote {out / 'image.bin'} (input section zeroed; `sfnpu run` fills it) "
                  f"and {out / 'report.md'}; {len(feeds)} model input(s)")
    return 0


def _load_inputs(path: str, names: list[str]) -> dict:
    data = np.load(path)
    if isinstance(data, np.ndarray):
        if len(names) != 1:
            raise CliError(f"the model has {len(names)} inputs; give an .npz with {names}")
        return {names[0]: data.astype(np.float32)}
    missing = set(names) - set(data.files)
    if missing:
        raise CliError(f"{path} lacks inputs {sorted(missing)}")
    return {n: data[n].astype(np.float32) for n in names}


def _save_outputs(path: str, outputs: dict):
    if len(outputs) == 1:
        np.save(path, next(iter(outputs.values())))
    else:
        np.savez(path, **outputs)


def rtl_harness(config):
    """The Verilated accelerator of ``config`` (built once, cached under build/rtl/)."""
    return _rtl_harness(config.name)


@functools.cache
def _rtl_harness(config_name: str):
    from .tb.system import SystemHarness

    with console.status(f"RTL: building the Verilated accelerator ({config_name}); cached in "
                        f"build/rtl/{config_name} after the first build"):
        return SystemHarness(get_config(config_name), REPO_ROOT / "build" / "rtl" / config_name)


def rtl_outputs(config):
    """An ``accelerator`` callable for :meth:`Compiled.run`: image → outputs, on the RTL."""
    harness = rtl_harness(config)

    def run(blob: bytes) -> list[np.ndarray]:
        with console.status("RTL: running the image on Verilator"):
            result = harness.run(blob, max_cycles=RTL_MAX_CYCLES)
        _check_rtl_run(result)
        img = image.unpack(blob, config)
        img.dram[:] = result.dram[:len(img.dram)]
        return [img.tensor(image.SectionKind.OUTPUT, s.index, config.lanes)
                for s in img.layout.of_kind(image.SectionKind.OUTPUT)]
    return run


def model_outputs(config):
    """An ``accelerator`` callable: the golden model's outputs, with the cycle model's
    per-group latency and DRAM bytes printed."""
    from .sim.golden import GoldenModel

    golden = GoldenModel(config)

    def run(blob: bytes) -> list[np.ndarray]:
        timing = CycleModel(config).run(blob)
        console.print(group_table(image.unpack(blob, config).program, timing))
        console.print(f"cycle model: {timing.cycles} cycles = {timing.seconds * 1e3:.3f} ms "
                      f"at {config.clock_mhz:g} MHz; {timing.read_bytes} B read, "
                      f"{timing.write_bytes} B written")
        return golden.outputs(blob)
    return run


#: Cycles a run may take before the harness reports a hang.
RTL_MAX_CYCLES = 200_000_000


def _check_rtl_run(result):
    if result.timeout:
        raise CliError(f"RTL: no interrupt after {RTL_MAX_CYCLES} cycles")
    if result.error:
        raise CliError(f"RTL: the accelerator stopped with {result.error_code.name} in group "
                       f"{result.error_group} (address {result.error_addr:#x})")


def cmd_run(args) -> int:
    import tempfile

    from .compiler.pipeline import ensure_qdq, run_onnxruntime
    from .compiler.importer import load_model

    with tempfile.TemporaryDirectory(prefix="sfnpu-run-") as tmp:
        if args.backend == "onnxruntime":
            path, _ = ensure_qdq(args.model, tmp, _calibration(args),
                                 activation_signed=args.int8_activations)
            model = load_model(path)
            names = [i.name for i in model.graph.input
                     if i.name not in {t.name for t in model.graph.initializer}]
            outputs = run_onnxruntime(model, _load_inputs(args.input, names))
        else:
            from .sim.golden import GoldenModel

            compiled, _, _ = _compile(args, Path(tmp))
            names = [i.name for i in compiled.imported.host.prologue.graph.input]
            config = get_config(args.config)
            backend = {"rtl": rtl_outputs, "model": model_outputs}.get(
                args.backend, lambda c: GoldenModel(c).outputs)(config)
            outputs = compiled.run(_load_inputs(args.input, names), backend)
    _save_outputs(args.output, outputs)
    console.print(f"wrote {args.output}: " + ", ".join(f"{k} {v.dtype}{list(v.shape)}"
                                                     for k, v in outputs.items()))
    return 0


def cmd_compare(args) -> int:
    def load(path):
        data = np.load(path)
        return {"": data} if isinstance(data, np.ndarray) else {k: data[k] for k in data.files}
    a, b = load(args.a), load(args.b)
    if a.keys() != b.keys():
        raise CliError(f"different outputs: {sorted(a)} vs {sorted(b)}")
    worst = 0
    for name in a:
        if a[name].shape != b[name].shape:
            raise CliError(f"{name or 'output'}: shapes {a[name].shape} and {b[name].shape}")
        same = float((a[name] == b[name]).mean())
        diff = float(np.abs(a[name].astype(np.float64) - b[name].astype(np.float64)).max())
        console.print(f"{name or 'output'}: {same:.4%} identical, largest difference {diff:g}")
        worst = max(worst, diff)
    return 0 if worst == 0 else 1


def cmd_bench(args) -> int:
    from .bench import run_bench

    run_bench(Path(args.output), args.config, args.models or None, rtl=not args.models)
    return 0


def cmd_verilog(args) -> int:
    from .hw.verilog import write_verilog

    written = write_verilog(Path(args.output))
    console.print(f"wrote {len(written)} Verilog files under {args.output}")
    return 0


def cmd_bnff(args) -> int:
    from .compiler.bn_fission import write_report

    for path in write_report(Path(args.out), batch=args.batch, input_size=args.size):
        console.print(f"wrote {path}")
    return 0


def cmd_modules(args) -> int:
    from .compiler.modules_report import ModuleReportError, write_report

    command = f"sfnpu modules {args.model} --sram-kb {args.sram_kb:g}" + (
        f" --size {args.size}" if args.size else "")
    try:
        written = write_report(args.model, Path(args.out), args.sram_kb, args.size, command)
    except ModuleReportError as e:
        raise CliError(str(e)) from None
    for path in written:
        console.print(f"wrote {path}")
    return 0


def cmd_restructure(args) -> int:
    from .compiler.builders import BUILDERS, DEFAULT_INPUT_SIZE
    from .compiler.restructure_report import NETWORKS, run_report as run_restructure

    networks = list(NETWORKS)
    if args.networks:
        unknown = [n for n in args.networks if n not in BUILDERS]
        if unknown:
            raise CliError(f"unknown network {', '.join(unknown)}; builders: "
                           f"{', '.join(BUILDERS)}")
        paper = dict(NETWORKS)
        networks = [(n, args.size or paper.get(n, DEFAULT_INPUT_SIZE[n]))
                    for n in args.networks]
    elif args.size:
        networks = [(n, args.size) for n, _ in networks]
    command = "sfnpu restructure " + " ".join(
        [*args.networks, *([f"--size {args.size}"] if args.size else []),
         *(["--no-verify"] if args.no_verify else []), *(["--no-sram"] if args.no_sram else [])])
    extra = {"sram": ()} if args.no_sram else {}
    run_restructure(networks, Path(args.out), verify=not args.no_verify, console=console,
                    command=command.strip(), **extra)
    return 0


def cmd_report(args) -> int:
    from .compiler.reports import ReportError, resolve_studies, run_report

    try:
        studies = resolve_studies(args.models, args.size)
    except ReportError as e:
        raise CliError(str(e)) from None
    run_report(studies, args.config, Path(args.out), console=console)
    return 0


def cmd_bitstream(args) -> int:
    from .bitstream import build_board

    out = Path(args.out or REPO_ROOT / "build" / "bitstream" / args.board)
    t0 = time.perf_counter()
    kwargs = {"log": lambda text: console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {text}")}
    if args.board == "ulx3s-85f":
        if args.memory_kib and args.memory != "bram":
            raise CliError("--memory-kib sizes block RAM: add --memory bram")
        kwargs.update(synth_only=args.synth_only, clock_mhz=args.clock_mhz, baud=args.baud,
                      memory=args.memory or "sdram",
                      memory_bytes=args.memory_kib * 1024 if args.memory_kib else None,
                      with_accelerator=not args.link_only)
    elif args.synth_only or args.clock_mhz or args.memory or args.memory_kib or args.link_only:
        raise CliError(f"--synth-only, --link-only, --clock-mhz, --memory and --memory-kib "
                       f"apply to ulx3s-85f; {args.board} gets a Vivado project")
    result = build_board(args.board, out, **kwargs)
    if args.board == "ulx3s-85f":
        console.print((out / "report.md").read_text())
    else:
        console.print(f"Vivado project: {', '.join(result)}")
    console.print(f"wrote {out} in {time.perf_counter() - t0:.0f} s")
    return 0


def cmd_firmware(args) -> int:
    """Build the Linux host program (memory-mapped accelerator) with the system C compiler."""
    import os
    import subprocess

    from .tb.firmware import C_FLAGS, FIRMWARE, INCLUDE_DIRS, LIBRARY_SOURCES

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exe = out / "sfnpu-run"
    cc = os.environ.get("CC", "cc")
    result = subprocess.run([cc, *C_FLAGS, *(f"-I{d}" for d in INCLUDE_DIRS),
                             *map(str, LIBRARY_SOURCES), str(FIRMWARE / "host" / "main_devmem.c"),
                             "-o", str(exe)], capture_output=True, text=True)
    if result.returncode:
        raise CliError(f"the firmware does not compile with {cc}:\n{result.stderr}")
    console.print(f"wrote {exe} (run it without arguments for its usage)")
    return 0


def cmd_board(args) -> int:
    """Run an image on a board over its UART host link."""
    from .board import BoardRunner, UartLink, open_serial

    blob = Path(args.image).read_bytes()
    link = UartLink(open_serial(args.port, args.baud))
    run = BoardRunner(link).run(blob, timeout_s=args.timeout)
    console.print(f"status {run.status:#x}, error {run.error_code.name}"
                  f"{f' in group {run.error_group}' if run.error else ''}")
    for name, value in run.counters.items():
        console.print(f"{name:<18} {value}")
    console.print(f"per-group cycles: {run.group_cycles}")
    if args.output:
        Path(args.output).write_bytes(run.dram)
        console.print(f"wrote the image footprint after the run to {args.output}")
    return 1 if run.error else 0


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
    s.add_argument("--model", help=f"ONNX model path, builder name or bundled model "
                   f"(default {DEFAULT_MODEL})")
    s.add_argument("--waves", action="store_true",
                   help="write the RTL run's waves to build/waves/ (FST, or VCD without lz4)")
    s.set_defaults(func=cmd_sim)

    def model_options(parser):
        parser.add_argument("model", help="ONNX model (float or int8 QDQ)")
        parser.add_argument("--config", default="tiny", choices=list(CONFIGS))
        parser.add_argument("--calib", help="folder of calibration images or .npy files "
                            "(float models; default: a synthetic set, named as such)")
        parser.add_argument("--int8-activations", action="store_true",
                            help="quantise activations to int8 instead of uint8")
        parser.add_argument("--modules", action="store_true",
                            help="pipeline step 'modules': module-level on-chip allocation "
                            "(Kim et al.; see `sfnpu modules`)")
        parser.add_argument("--no-space-to-depth", action="store_true",
                            help="skip the pipeline step 'space_to_depth' (stride-2 stems over "
                            "few channels as SpaceToDepth + a stride-1 convolution)")
        parser.add_argument("--no-fold-input-taps", action="store_true",
                            help="skip the pipeline step 'fold_input_taps' (a stem whose taps "
                            "fit one lane block as a 1x1 convolution over the taps, which the "
                            "host lays out as channels)")

    c = sub.add_parser("compile", help="compile an ONNX model to a DRAM image and a report")
    model_options(c)
    c.add_argument("-o", "--output", required=True, help="output folder")
    c.set_defaults(func=cmd_compile)

    r = sub.add_parser("run", help="run a model on a backend; writes .npy (.npz if several)")
    model_options(r)
    r.add_argument("--input", required=True, help=".npy (one input) or .npz")
    r.add_argument("--backend", default="golden",
                   choices=["golden", "onnxruntime", "rtl", "model"],
                   help="golden model, onnxruntime on the QDQ model, the RTL on Verilator, or "
                        "the cycle model (latency and DRAM bytes per group; values from the "
                        "golden model)")
    r.add_argument("-o", "--output", required=True)
    r.set_defaults(func=cmd_run)

    cmp = sub.add_parser("compare", help="share of identical values of two .npy/.npz files")
    cmp.add_argument("a")
    cmp.add_argument("b")
    cmp.set_defaults(func=cmd_compare)

    b = sub.add_parser("bench", help="golden-model speed and node → group counts")
    b.add_argument("models", nargs="*", help="builder names (default: all, ResNet-50 first)")
    b.add_argument("--config", default="kcu1500", choices=list(CONFIGS))
    b.add_argument("-o", "--output", default="build/bench")
    b.set_defaults(func=cmd_bench)

    v = sub.add_parser("verilog", help="Verilog of the datapath blocks for every config")
    v.add_argument("-o", "--output", default="build/verilog")
    v.set_defaults(func=cmd_verilog)

    bn = sub.add_parser("bnff", help="BN fission-n-fusion: DenseNet-121 training-step memory "
                        "sweeps (seeds/004)")
    bn.add_argument("--batch", type=int, default=120, help="mini-batch size (paper: 120)")
    bn.add_argument("--size", type=int, default=224, help="input size (default 224)")
    bn.add_argument("--out", default="build/bnff", help="output folder")
    bn.set_defaults(func=cmd_bnff)

    mo = sub.add_parser("modules", help="module-level on-chip allocation (Kim et al., "
                        "seeds/000-001) beside the paper's Table 1 (markdown, CSV, PNG)")
    mo.add_argument("model", metavar="MODEL|BUILDER", help="builder name or ONNX file")
    mo.add_argument("--sram-kb", type=float, default=1024,
                    help="buffers {0, 1, 2} together, KiB (default 1024, the paper's)")
    mo.add_argument("--size", type=int, help="input size for builders (default: theirs)")
    mo.add_argument("--out", default="build/modules", help="output folder")
    mo.set_defaults(func=cmd_modules)

    rs = sub.add_parser("restructure", help="dataflow restructuring sweep vs Cipolletta & "
                        "Calimera, Tables II–III (markdown, CSV, PNG)")
    rs.add_argument("networks", nargs="*", metavar="BUILDER",
                    help="builder names (default: VGG-16, MobileNetV2, SqueezeNet1.1, "
                    "ResNet-18, Inception-V3)")
    rs.add_argument("--size", type=int, help="input size (default: 224, Inception-V3 299)")
    rs.add_argument("--no-verify", action="store_true",
                    help="skip the golden-model equivalence check of the chosen points")
    rs.add_argument("--no-sram", action="store_true",
                    help="skip Table II's minimum SRAM with split fronts (VGG-CONV, YOLOv2)")
    rs.add_argument("--out", default="build/restructure", help="output folder")
    rs.set_defaults(func=cmd_restructure)

    rp = sub.add_parser("report", help="memory optimizer vs the paper: Tables II–IV, VI, "
                        "Figs. 16–17 (markdown, CSV, PNG)")
    rp.add_argument("models", nargs="*", metavar="MODEL|BUILDER",
                    help="builder name, vgg16_conv or ONNX file (default: every paper network)")
    rp.add_argument("--config", default="kcu1500", choices=list(CONFIGS))
    rp.add_argument("--size", type=int, help="input size for builders (default: the paper's)")
    rp.add_argument("--out", default="build/report", help="output folder")
    rp.set_defaults(func=cmd_report)

    from .bitstream import BOARDS, DEFAULT_BAUD
    bs = sub.add_parser("bitstream", help="FPGA build: ULX3S bitstream or a Vivado project")
    bs.add_argument("--board", default="ulx3s-85f", choices=BOARDS)
    bs.add_argument("--synth-only", action="store_true",
                    help="ulx3s-85f: stop after synthesis (cell counts, no Fmax)")
    bs.add_argument("--clock-mhz", type=float, help="ulx3s-85f: PLL clock (default: config)")
    bs.add_argument("--baud", type=int, default=DEFAULT_BAUD, help="ulx3s-85f: UART speed")
    bs.add_argument("--memory", choices=("sdram", "bram"),
                    help="ulx3s-85f: the image memory, the board's SDRAM (default) or block RAM")
    bs.add_argument("--memory-kib", type=int,
                    help="ulx3s-85f with --memory bram: block RAM size (default 64)")
    bs.add_argument("--link-only", action="store_true",
                    help="ulx3s-85f: leave the accelerator out (a quick check of the flow)")
    bs.add_argument("--out", help="output folder (default build/bitstream/BOARD)")
    bs.set_defaults(func=cmd_bitstream)

    fw = sub.add_parser("firmware", help="build the C host program for a memory-mapped board")
    fw.add_argument("--out", default=str(REPO_ROOT / "build" / "firmware"))
    fw.set_defaults(func=cmd_firmware)

    bd = sub.add_parser("board", help="run a DRAM image on a board over its UART link")
    bd.add_argument("image")
    bd.add_argument("--port", required=True, help="serial device, e.g. /dev/ttyUSB0")
    bd.add_argument("--baud", type=int, default=DEFAULT_BAUD)
    bd.add_argument("--timeout", type=float, default=10.0, help="seconds a run may take")
    bd.add_argument("-o", "--output", help="write the image footprint after the run here")
    bd.set_defaults(func=cmd_board)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as e:
        if not isinstance(e, _user_errors()):
            raise  # a bug: keep the traceback
        console.print(f"[red]error:[/] {e}")
        return 2


def _user_errors() -> tuple[type, ...]:
    """Errors that describe bad input, printed without a traceback."""
    from .compiler.importer import ModelError
    from .compiler.ir import IRError
    from .compiler.quantize import QuantizeError
    from .bitstream import BitstreamError
    from .board import LinkError
    from .sim.golden import GoldenError

    return (CliError, ConfigError, image.ImageError, isa.InstructionError, IRError, ModelError,
            QuantizeError, GoldenError, FileNotFoundError, BitstreamError, LinkError)


if __name__ == "__main__":
    sys.exit(main())
