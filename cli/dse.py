"""``sfnpu dse SPEC -o DIR`` (``make dse``: the bundled spec): design-space exploration on Ray,
local by default, a cluster when ``RAY_ADDRESS`` is set."""

from pathlib import Path

from .common import console

NAME = "dse"
HELP = ("design-space sweep: hardware configurations x networks on Ray (CSV, Pareto plots, "
        "summary)")


def add_arguments(parser):
    parser.add_argument("spec", nargs="?", help="sweep spec (TOML; default: the bundled "
                        "tools/dse_default.toml)")
    parser.add_argument("-o", "--out", default="build/dse", help="output folder (its cache/ "
                        "keeps every point: a re-run computes only new ones)")
    parser.add_argument("--serial", action="store_true",
                        help="evaluate the points in this process instead of on Ray")
    parser.add_argument("--cpus", type=int, help="CPUs of the local Ray (default: all); "
                        "ignored when RAY_ADDRESS names a cluster")


def run(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from sfnpu.tools.dse import DEFAULT_SPEC, RayRunner, SerialRunner, Spec, run_sweep

    spec = Spec.load(args.spec or DEFAULT_SPEC)
    runner = SerialRunner() if args.serial else RayRunner(num_cpus=args.cpus)
    points = len(spec.points())
    console.print(f"sweep {spec.name!r}: {points} points; runner: {runner.name}")
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("points", total=None)

        def tick(done: int, total: int, _key: str):
            bar.update(task, completed=done, total=total)

        result = run_sweep(spec, Path(args.out), runner, tick)
    feasible = sum(r.get("feasible") == 1 for r in result.rows)
    console.print(f"{len(result.rows)} points, {feasible} feasible; computed "
                  f"{result.computed} in {result.seconds:.1f} s ({result.runner}), the rest "
                  "from the cache")
    console.print("wrote " + ", ".join(str(p) for p in result.files))
    if result.errors:
        for r in result.errors:
            console.print(f"[red]error:[/] {r['point']}: {r['error']}")
        return 1
    return 0
