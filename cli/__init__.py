"""The ``sfnpu`` command: one module per command, registered in :data:`COMMANDS`.

A command module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.
Errors that describe bad input (:func:`user_errors`) are printed without a traceback and exit
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse

from . import (bench, bitstream, bnff, board, compare, compile, configs, docs, dse, firmware,
               image, modules, report, restructure, run, sim, verilog)
from .common import CliError, console

__all__ = ["COMMANDS", "build_parser", "main"]

#: Every command, in the order ``sfnpu --help`` lists them.
COMMANDS = (configs, docs, image, sim, compile, run, compare, bench, verilog, bnff, modules,
            restructure, report, dse, bitstream, firmware, board)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sfnpu",
                                     description="sfnpu CNN accelerator co-design kit")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command_parser = sub.add_parser(command.NAME, help=command.HELP)
        command.add_arguments(command_parser)
        command_parser.set_defaults(func=command.run)
    return parser


def user_errors() -> tuple[type, ...]:
    """Errors that describe bad input, printed without a traceback."""
    from sfnpu import image as image_format
    from sfnpu import isa
    from sfnpu.compiler.importer import ModelError
    from sfnpu.compiler.ir import IRError
    from sfnpu.compiler.pipeline import InputError
    from sfnpu.compiler.quantize import QuantizeError
    from sfnpu.config import ConfigError
    from sfnpu.models.catalog import UnknownModel
    from sfnpu.sim.golden import GoldenError
    from sfnpu.tools.bitstream import BitstreamError
    from sfnpu.tools.board import LinkError
    from sfnpu.tools.dse import SpecError

    return (CliError, ConfigError, image_format.ImageError, isa.InstructionError, IRError,
            ModelError, QuantizeError, GoldenError, FileNotFoundError, BitstreamError,
            LinkError, UnknownModel, InputError, SpecError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as e:
        if not isinstance(e, user_errors()):
            raise  # a bug: keep the traceback
        console.print(f"[red]error:[/] {e}")
        return 2
