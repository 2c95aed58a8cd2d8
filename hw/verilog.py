"""Verilog of the convolution datapath for the reference configurations, and its lint.

:func:`write_verilog` writes, for each configuration, ``<out_dir>/<config>/<block>.v`` for every
entry of :data:`BLOCKS`; :func:`lint` runs ``verilator --lint-only -Wall`` on one file with the
waivers of :data:`LINT_WAIVERS` — the only place where warnings are waived.

Blocks written: the convolution datapath (:class:`~sfnpu.hw.datapath.ConvDatapath`) and the
requantiser.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Const
from amaranth.lib import data, wiring

from sfnpu.config import CONFIGS, get_config

from .datapath import ConvDatapath
from .requant import Requantizer

__all__ = ["BLOCKS", "LINT_WAIVERS", "write_verilog", "lint", "lint_command"]


#: Blocks written for every configuration: file stem → component factory.
BLOCKS = {
    "conv_datapath": ConvDatapath,
    "requantizer": lambda config: Requantizer(),
}

#: The only lint waivers: (Verilator rule, message pattern or None for the whole rule, reason).
#: All of them answer constructs of the generated Verilog, not of the design.
LINT_WAIVERS = (
    ("PROCASSINIT", None,
     "Amaranth declares every register with its reset value as initialiser (the FPGA power-up "
     "value) and assigns it in an always block."),
    ("UNUSEDSIGNAL", None,
     "Amaranth keeps a named wire for every Signal, data.View field and submodule-port alias "
     "for debugging, also where Yosys reads the value through its own temporaries, so these "
     "names look unused; Yosys temporaries also carry unused upper bits of Amaranth's "
     "widened arithmetic."),
    ("WIDTHEXPAND", None,
     "Yosys writes each operand at its Amaranth width and relies on Verilog's context-"
     "determined extension, which is the sign/zero extension Amaranth specifies."),
    ("WIDTHTRUNC", "Logical operator LOGNOT expects 1 bit on the LHS*",
     "Yosys writes Amaranth's `value == 0` as `!value`."),
    ("WIDTHTRUNC", "Operator ASSIGNW expects * bits on the Assign RHS, but Assign RHS's SHIFTR "
                   "generates * bits.",
     "Yosys writes Amaranth's bit_select/word_select (a part-select at a variable offset) as a "
     "right shift assigned to the narrower result."),
    ("CASEINCOMPLETE", None,
     "Yosys writes a default assignment before each case statement instead of a default arm."),
    ("DECLFILENAME", None,
     "one file holds the whole hierarchy; submodule names are hierarchical (`top.sub`)."),
)


def _ports(component: wiring.Component) -> dict:
    """The component's ports for Amaranth's Verilog backend, without constant members
    (``ready`` of an ``always_ready`` stream is ``Const(1)`` and is not a port)."""
    ports = {}
    for path, member, value in component.signature.flatten(component):
        value = value.as_value() if isinstance(value, data.View) else value
        if isinstance(value, Const):
            continue
        ports["__".join(map(str, path))] = (value, None)   # direction: from the netlist
    return ports


def to_verilog(component: wiring.Component, name: str) -> str:
    from .toolchain import ensure_yosys
    ensure_yosys()
    return verilog.convert(component, name=name, ports=_ports(component), emit_src=False)


def write_verilog(out_dir, configs=tuple(CONFIGS), blocks=tuple(BLOCKS)) -> list[Path]:
    """Write ``<out_dir>/<config>/<block>.v`` (top module ``<block>``); returns the paths."""
    written = []
    for config_name in configs:
        config = get_config(config_name)
        folder = Path(out_dir) / config_name
        folder.mkdir(parents=True, exist_ok=True)
        for block in blocks:
            path = folder / f"{block}.v"
            path.write_text(to_verilog(BLOCKS[block](config), block))
            written.append(path)
    return written


def lint_command(path, top: str) -> list[str]:
    """The lint command for one file; writes the waiver file next to it."""
    lines = ["`verilator_config"]
    for rule, match, _reason in LINT_WAIVERS:
        lines.append(f"lint_off -rule {rule}" + (f' -file "*" -match "{match}"' if match else ""))
    waivers = Path(path).with_name("lint_waivers.vlt")
    waivers.write_text("\n".join(lines) + "\n")
    return ["verilator", "--lint-only", "-Wall", "--top-module", top, str(waivers), str(path)]


def lint(path, top: str) -> subprocess.CompletedProcess:
    """``verilator --lint-only -Wall`` with :data:`LINT_WAIVERS`; warnings fail (exit ≠ 0)."""
    from .toolchain import verilator_env
    return subprocess.run(lint_command(path, top), env=verilator_env(), capture_output=True,
                          text=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--config", action="append", choices=list(CONFIGS))
    parser.add_argument("--lint", action="store_true", help="lint every written file")
    args = parser.parse_args(argv)
    failed = False
    for path in write_verilog(args.out_dir, tuple(args.config or CONFIGS)):
        print(path)
        if args.lint:
            result = lint(path, path.stem)
            if result.returncode:
                failed = True
                print(result.stderr)
    return int(failed)


if __name__ == "__main__":
    raise SystemExit(main())
