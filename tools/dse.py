"""``sfnpu dse``: design-space exploration — hardware configurations × networks × input sizes.

A sweep is a TOML spec (:class:`Spec`; the bundled one is :data:`DEFAULT_SPEC`): networks
(architecture builders at given input sizes, bundled trained models, ONNX files) and one or
more *spaces*, each a reference configuration and axes of :class:`~sfnpu.config.HwConfig`
fields whose cartesian product are the hardware points. Every (configuration, network) point
compiles (tiling included), runs the cut-point search on the configuration's buffers with the
cycle model as its latency (:func:`evaluate_point`) and records latency, MAC efficiency, DRAM
bytes, SRAM and the resource estimate against the target part (:mod:`sfnpu.resources`). A
point that cannot be built or run is recorded with its reason; it never stops the sweep.

Points run as Ray tasks (:class:`RayRunner`): ``ray.init()`` starts a local Ray on this
machine's cores, or joins the cluster ``RAY_ADDRESS`` names, unchanged. Results stream back
into a per-point cache keyed by a content hash of the configuration, the model's bytes and
the compiler's source (:func:`compiler_version`), so a re-run, an enlarged sweep or a sweep
killed half-way computes only the points it has not seen. :mod:`.dse_report` writes the CSV,
the Pareto fronts and the summary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator, Mapping, Sequence

from sfnpu.config import CONFIGS, DEVICES, ConfigError, HwConfig
from sfnpu.fingerprint import source_digest

__all__ = ["DEFAULT_SPEC", "SpecError", "NetworkSpec", "Space", "Spec", "Point", "PointCache",
           "SerialRunner", "RayRunner", "compiler_version", "evaluate_point", "fastest_program",
           "guarded_point", "prepare_model",
           "run_sweep", "SweepResult"]

#: The sweep ``make dse`` runs.
DEFAULT_SPEC = Path(__file__).with_name("dse_default.toml")

#: HwConfig fields an axis may set (``name`` is the point's own).
FIELDS = tuple(f.name for f in dataclasses.fields(HwConfig) if f.name != "name")


class SpecError(ValueError):
    """A sweep spec that cannot be read; names the field and what it takes."""


# --------------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NetworkSpec:
    """One network of a sweep at one input size (None: the model's own input)."""
    model: str
    size: int | None = None

    @property
    def key(self) -> str:
        return self.model if self.size is None else f"{self.model}@{self.size}"


@dataclass(frozen=True)
class Space:
    """A reference configuration and the axes varied around it: each axis is a field of
    :class:`HwConfig` with its values, or a named axis whose values are tables of fields
    (to vary Ti and To together, say)."""
    base: str
    axes: tuple[tuple[str, tuple], ...]

    def configurations(self) -> Iterator[dict]:
        """The field values of every point of the space, in axis order."""
        base = CONFIGS[self.base].to_dict()
        names = [name for name, _ in self.axes]
        for values in itertools.product(*(values for _, values in self.axes)):
            fields = dict(base)
            for name, value in zip(names, values):
                fields.update(value if isinstance(value, dict) else {name: value})
            yield fields


@dataclass(frozen=True)
class Spec:
    name: str
    networks: tuple[NetworkSpec, ...]
    spaces: tuple[Space, ...]

    @staticmethod
    def load(path) -> "Spec":
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SpecError(f"{path}: no such sweep spec") from None
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"{path}: not valid TOML ({e})") from None
        return Spec.parse(data, str(path))

    @staticmethod
    def parse(data: Mapping, where: str = "spec") -> "Spec":
        unknown = set(data) - {"name", "networks", "space"}
        if unknown:
            raise SpecError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; a spec "
                            "has name, [[networks]] and [[space]]")
        networks = tuple(n for i, entry in enumerate(data.get("networks", ()))
                         for n in _networks(entry, f"{where}: networks[{i}]"))
        spaces = tuple(_space(entry, f"{where}: space[{i}]")
                       for i, entry in enumerate(data.get("space", ())))
        if not networks:
            raise SpecError(f"{where}: no [[networks]]; give at least one model")
        if not spaces:
            raise SpecError(f"{where}: no [[space]]; give at least one base configuration")
        return Spec(str(data.get("name", Path(where).stem)), networks, spaces)

    def points(self) -> list["Point"]:
        """Every (configuration, network) point, configurations in space order, each
        configuration once (spaces that overlap share their points)."""
        configs, seen = [], set()
        for space in self.spaces:
            for fields in space.configurations():
                key = json.dumps(fields, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    configs.append((space.base, fields))
        return [Point(f"c{k:04d}", base, fields, network)
                for k, (base, fields) in enumerate(configs) for network in self.networks]


def _networks(entry, where: str) -> list[NetworkSpec]:
    if not isinstance(entry, dict) or "model" not in entry:
        raise SpecError(f"{where}: a network is a table with 'model' (a builder, a bundled "
                        "model or an ONNX file) and optional 'sizes'")
    if unknown := set(entry) - {"model", "sizes"}:
        raise SpecError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    sizes = entry.get("sizes", [None])
    if not isinstance(sizes, list) or not all(s is None or (isinstance(s, int) and s > 0)
                                              for s in sizes):
        raise SpecError(f"{where}: sizes={sizes!r}: a list of input sides in pixels")
    return [NetworkSpec(str(entry["model"]), size) for size in sizes]


def _space(entry, where: str) -> Space:
    if not isinstance(entry, dict) or entry.get("base") not in CONFIGS:
        raise SpecError(f"{where}: base={entry.get('base') if isinstance(entry, dict) else None!r}"
                        f": name a reference configuration ({', '.join(CONFIGS)})")
    axes = []
    for name, values in entry.items():
        if name == "base":
            continue
        if not isinstance(values, list) or not values:
            raise SpecError(f"{where}: {name}: an axis is a non-empty list of values")
        if name not in FIELDS and not all(isinstance(v, dict) for v in values):
            raise SpecError(f"{where}: {name}: not a configuration field (fields: "
                            f"{', '.join(FIELDS)}); a named axis takes tables of fields")
        axes.append((name, tuple(_axis_value(name, v, where) for v in values)))
    return Space(entry["base"], tuple(axes))


def _axis_value(name: str, value, where: str):
    if isinstance(value, dict):
        if bad := set(value) - set(FIELDS):
            raise SpecError(f"{where}: {name}: {', '.join(sorted(bad))} not configuration "
                            f"field(s) (fields: {', '.join(FIELDS)})")
        return {k: _field_value(k, v) for k, v in value.items()}
    return _field_value(name, value)


def _field_value(name: str, value):
    # One size for the three buffers, or a list of three.
    if name == "buffer_bytes" and isinstance(value, int):
        return [value] * 3
    return value


# --------------------------------------------------------------------------------------------
# One point
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    config_id: str
    base: str
    fields: dict          # HwConfig fields (the device among them)
    network: NetworkSpec

    @property
    def name(self) -> str:
        return f"{self.config_id}:{self.network.key}"

    def key(self, model_digest: str, version: str) -> str:
        """The cache key: what the result depends on, hashed."""
        identity = {"config": {k: v for k, v in self.fields.items() if k != "name"},
                    "model": model_digest, "size": self.network.size, "compiler": version}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


#: The packages whose source decides a point's result (the layers below the studies).
_VERSIONED = ("sfnpu", "sfnpu.hw", "sfnpu.sim", "sfnpu.compiler", "sfnpu.models")


def compiler_version() -> str:
    """A hash of the source that computes a point: the contracts, the RTL blocks whose
    constants the cycle model takes, the cycle model, the compiler and the model builders."""
    return source_digest(*_VERSIONED)


def prepare_model(network: NetworkSpec, workdir: Path) -> bytes:
    """The network's QDQ model, serialised: a builder built at its size and quantised from one
    synthetic sample (shapes are what a sweep measures), a bundled model quantised from its
    rendered images, an ONNX file quantised as ``sfnpu compile`` does."""
    from sfnpu.models import builders, real_models
    from sfnpu.models.catalog import UnknownModel, resolve_model
    from sfnpu.studies.networks import study_model

    workdir.mkdir(parents=True, exist_ok=True)
    if network.model in builders.BUILDERS:
        size = network.size or builders.DEFAULT_INPUT_SIZE[network.model]
        return study_model(SimpleNamespace(network=network.model, input_size=size,
                                           conv_only=False), workdir).read_bytes()
    if network.size is not None:
        what = "the bundled model" if network.model in real_models.REAL_MODELS else "an ONNX file"
        raise SpecError(f"network {network.model!r}: {what} has its own input size; leave "
                        "'sizes' out (sizes are for the architecture builders)")
    try:
        path, *_ = resolve_model(network.model, workdir)
    except UnknownModel as e:
        raise SpecError(str(e)) from None
    return Path(path).read_bytes()


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split())[:500]


def evaluate_point(fields: Mapping, network: NetworkSpec, model: bytes) -> dict:
    """One point: build the configuration, estimate its resources against its part, compile
    the network (tiling included, partitioned where the host must run nodes) and choose each
    accelerator segment's program (:func:`fastest_program`). Returns the metrics; ``feasible``
    0 with ``reason`` when the point cannot be built, run or placed on its part."""
    import onnx

    from sfnpu import resources
    from sfnpu.compiler.codegen import CodegenError
    from sfnpu.compiler.cutpoints import conv_macs
    from sfnpu.compiler.importer import ModelError
    from sfnpu.compiler.ir import IRError
    from sfnpu.compiler.partition import compile_partitioned
    from sfnpu.compiler.pipeline import Compiled
    from sfnpu.limits import rtl_problems

    t0 = time.perf_counter()
    row: dict = {"feasible": 0, "reason": "", "version": compiler_version()}
    device = fields.get("device")
    try:
        # The part is checked below against the estimate, so that a point that does not fit
        # still gets its figures.
        config = HwConfig(**{**fields, "device": None})
    except ConfigError as e:
        return row | {"reason": _reason(e), "seconds": time.perf_counter() - t0}
    need = resources.estimate(config, DEVICES[device].family if device else None)
    row.update(multipliers=need.multipliers, bram18k=need.bram18k, luts=need.luts,
               sram_B=need.sram_bytes)
    misfit = resources.shortfalls(need, DEVICES[device]) if device else []
    row["fits_device"] = int(not misfit) if device else ""
    # The cycle model times the RTL. Hardware the RTL cannot generate yet (the paper's
    # 512-bit port) is still modelled where the model can time it, and is infeasible.
    if unbuildable := rtl_problems(config):
        misfit = ["the RTL cannot be generated: " + "; ".join(unbuildable), *misfit]
    try:
        compiled = compile_partitioned(onnx.load_from_string(model), config)
        segments = [compiled] if isinstance(compiled, Compiled) else \
            [s.compiled for s in compiled.accelerated]
        if not segments:
            raise CodegenError("no part of the network runs on the accelerator")
        chosen = [fastest_program(c) for c in segments]
    except (CodegenError, ModelError, IRError) as e:
        return row | {"reason": _reason(e), "seconds": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 - a bug only where the RTL exists to be timed
        if not unbuildable:
            raise
        return row | {"reason": f"{misfit[0]} (nor timed: {type(e).__name__})",
                      "seconds": time.perf_counter() - t0}
    cycles = sum(c.latency for c in chosen)
    macs = sum(conv_macs(i) for c in segments for i in c.program.instructions)
    row.update(
        latency_cycles=int(cycles), latency_ms=cycles / config.clock_mhz / 1e3,
        macs=macs, mac_efficiency=macs / (cycles * config.macs) if cycles else 0.0,
        dram_B=sum(c.traffic.total for c in chosen),
        dram_fm_B=sum(c.traffic.fm for c in chosen),
        dram_weights_B=sum(c.traffic.weights for c in chosen),
        groups=sum(len(c.program.instructions) for c in segments),
        tiles=sum(bool(g.part) for c in segments for g in c.groups),
        policy=" | ".join(c.label for c in chosen),
        eq10=int(all(c.eq10 for c in chosen)),
        mac_share=1.0 if isinstance(compiled, Compiled) else round(compiled.mac_share, 6),
        host_nodes=0 if isinstance(compiled, Compiled) else len(compiled.host_nodes),
        feasible=int(not misfit), reason="; ".join(misfit))
    row["seconds"] = time.perf_counter() - t0
    return row


@dataclass(frozen=True)
class Chosen:
    """The program a point runs: its label, cycles, DRAM traffic and whether it meets
    constraint (10) (weights read once, feature maps at most once)."""
    label: str
    latency: float
    traffic: object
    eq10: bool


def fastest_program(compiled) -> Chosen:
    """The fastest program the compiler makes for the configuration: every cut-point policy
    the buffers can hold (:func:`~sfnpu.compiler.cutpoints.evaluate`, the cycle model's
    latency) and the program as compiled (every tensor in DRAM, row reuse: what
    ``sfnpu compile`` emits). Latencies within :data:`LATENCY_TIE` go to the least DRAM
    traffic. Policies that reread weights (a row-reuse layer past the weight store streams
    them) run too; ``eq10`` says whether the chosen one does not."""
    from sfnpu.compiler.blocks import detect_blocks
    from sfnpu.compiler.cutpoints import (LATENCY_TIE, cut_policies, evaluate,
                                          long_path_options, model_latency)
    from sfnpu.compiler.memory import Budget, traffic, weights_read_again

    config = compiled.program.config
    blocks = detect_blocks(compiled.graph, compiled.groups)
    budget = Budget.of(config)
    candidates = []
    for policy in cut_policies(blocks, long_paths=long_path_options(compiled, blocks)):
        e = evaluate(compiled, blocks, policy, budget)
        if e.latency is not None:
            candidates.append(Chosen(policy.label, e.latency, e.traffic, e.feasible))
    program = compiled.program
    latency = model_latency(config)
    instructions = program.instructions
    cycles = sum(latency(i, n, program.window(i))
                 for i, n in zip(instructions, instructions[1:] + [None]))
    dram = traffic(instructions, config, compiled.groups, compiled.graph)
    candidates.append(Chosen("as compiled (all in DRAM)", cycles, dram,
                             not weights_read_again(instructions, config)))
    fastest = min(c.latency for c in candidates)
    return min((c for c in candidates if c.latency <= fastest * (1 + LATENCY_TIE)),
               key=lambda c: (c.traffic.total, c.latency, not c.eq10))


# --------------------------------------------------------------------------------------------
# Cache and runners
# --------------------------------------------------------------------------------------------

class PointCache:
    """One JSON file per evaluated point, named by its key: written whole (rename) so a
    killed sweep leaves no half-written result."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict | None:
        try:
            return json.loads(self._path(key).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def put(self, key: str, row: dict) -> None:
        tmp = self._path(key).with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(row, sort_keys=True))
        tmp.replace(self._path(key))


#: What a runner takes: (cache key, configuration fields, network, model digest).
Task = tuple[str, dict, NetworkSpec, str]


class SerialRunner:
    """Every point in this process, one after the other (``--serial``; the baseline of
    ``make bench``)."""
    name = "serial"

    def run(self, tasks: Sequence[Task], models: Mapping[str, bytes]) -> Iterator[
            tuple[str, dict]]:
        for key, fields, network, digest in tasks:
            yield key, guarded_point(fields, network, models[digest])


def guarded_point(fields: Mapping, network: NetworkSpec, model: bytes) -> dict:
    """:func:`evaluate_point`, with a failure of sfnpu's own (a bug, not the point's) kept
    as the point's ``error`` so that the sweep goes on; such rows are not cached."""
    import traceback

    try:
        return evaluate_point(fields, network, model)
    except Exception as e:  # noqa: BLE001 - reported per point, and the sweep fails at its end
        where = traceback.extract_tb(e.__traceback__)[-1]
        return {"feasible": 0, "version": compiler_version(),
                "error": f"{type(e).__name__}: {_reason(e)} "
                         f"({Path(where.filename).name}:{where.lineno})",
                "reason": "sfnpu failed on this point (a bug): see 'error'"}


class RayRunner:
    """One Ray task per point; each model's bytes go to the object store once. ``ray.init()``
    with no address: a local Ray on this machine's cores, or the cluster ``RAY_ADDRESS``
    names. The cluster's nodes need the same sfnpu installed: each result carries its
    worker's :func:`compiler_version`, and a different one is an error."""
    name = "ray"

    def __init__(self, num_cpus: int | None = None):
        self.num_cpus = num_cpus

    def run(self, tasks: Sequence[Task], models: Mapping[str, bytes]) -> Iterator[
            tuple[str, dict]]:
        import ray

        started = not ray.is_initialized()
        if started:
            local = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": self.num_cpus}
            ray.init(include_dashboard=False, log_to_driver=False, **local)
        try:
            remote = ray.remote(num_cpus=1, max_retries=0)(guarded_point)
            refs = {digest: ray.put(blob) for digest, blob in models.items()}
            pending = {remote.remote(fields, network, refs[digest]): key
                       for key, fields, network, digest in tasks}
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                key = pending.pop(done[0])
                yield key, ray.get(done[0])
        finally:
            if started:
                ray.shutdown()


# --------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------

@dataclass
class SweepResult:
    spec: Spec
    rows: list[dict]            # one per point, in spec order
    computed: int               # points evaluated by this run (the rest came from the cache)
    seconds: float
    runner: str
    files: list[Path] = dataclasses.field(default_factory=list)

    @property
    def errors(self) -> list[dict]:
        """Points sfnpu failed on (bugs, not infeasibility)."""
        return [r for r in self.rows if r.get("error")]


#: Called with (points done, points to compute, the point just done).
Progress = Callable[[int, int, str], None]


def run_sweep(spec: Spec, out: Path, runner=None, progress: Progress | None = None,
              report: bool = True) -> SweepResult:
    """Evaluate every point of ``spec`` not in ``out``'s cache, then write the outputs
    (:func:`.dse_report.write`) into ``out``."""
    out = Path(out)
    runner = runner or RayRunner()
    t0 = time.perf_counter()
    version = compiler_version()
    models, digests = {}, {}
    for network in spec.networks:
        blob = prepare_model(network, out / "models")
        digests[network] = hashlib.sha256(blob).hexdigest()
        models[digests[network]] = blob
    cache = PointCache(out / "cache")
    points = spec.points()
    keys = [p.key(digests[p.network], version) for p in points]
    tasks = [(key, p.fields, p.network, digests[p.network])
             for key, p in zip(keys, points) if cache.get(key) is None]
    tasks = list({t[0]: t for t in tasks}.values())
    failed: dict[str, dict] = {}
    for done, (key, row) in enumerate(runner.run(tasks, models), 1):
        if row.get("version") != version:
            raise RuntimeError(f"a worker runs sfnpu {row.get('version')}, this one "
                               f"{version}: install the same sfnpu on every node")
        if not row.get("error"):
            cache.put(key, row)
        else:
            failed[key] = row
        if progress is not None:
            progress(done, len(tasks), key)
    rows = [_row(p, key, failed.get(key) or cache.get(key)) for p, key in zip(points, keys)]
    result = SweepResult(spec, rows, len(tasks), time.perf_counter() - t0, runner.name)
    if report:
        from .dse_report import write

        result.files = write(result, out)
    return result


def _row(point: Point, key: str, metrics: dict) -> dict:
    """A CSV row: the point, its configuration's fields, its metrics."""
    f = point.fields
    row = {"point": point.name, "config": point.config_id, "base": point.base,
           "network": point.network.key, "model": point.network.model,
           "input_size": point.network.size or "", "device": f.get("device") or ""}
    for name in FIELDS:
        if name == "buffer_bytes":
            row.update({f"buffer{i}_B": b for i, b in enumerate(f[name])})
        elif name != "device":
            row[name] = f[name]
    row.update({k: v for k, v in metrics.items() if k != "version"})
    row["key"] = key
    return row
