"""The Verilated accelerator for commands: one cached build per configuration, runs checked
for errors and hangs, the DRAM compared with the golden model's."""

from __future__ import annotations

import functools

import numpy as np

from sfnpu import image
from sfnpu.config import get_config

from .common import CliError, console

__all__ = ["RTL_MAX_CYCLES", "check_rtl_run", "dram_differences", "rtl_harness", "rtl_ok",
           "rtl_outputs"]

#: Cycles a run may take before the harness reports a hang.
RTL_MAX_CYCLES = 200_000_000


def rtl_harness(config):
    """The Verilated accelerator of ``config`` (built once, cached under build/rtl/)."""
    return _rtl_harness(config.name)


@functools.cache
def _rtl_harness(config_name: str):
    from sfnpu.tb.system import SYSTEM_BUILDS, SystemHarness

    with console.status(f"RTL: building the Verilated accelerator ({config_name}); cached in "
                        f"build/rtl/{config_name} after the first build"):
        return SystemHarness(get_config(config_name), SYSTEM_BUILDS / config_name)


def check_rtl_run(result):
    if result.timeout:
        raise CliError(f"RTL: no interrupt after {RTL_MAX_CYCLES} cycles")
    if result.error:
        raise CliError(f"RTL: the accelerator stopped with {result.error_code.name} in group "
                       f"{result.error_group} (address {result.error_addr:#x})")


def rtl_outputs(config):
    """An ``accelerator`` callable for :meth:`Compiled.run`: image → outputs, on the RTL."""
    harness = rtl_harness(config)

    def run(blob: bytes) -> list[np.ndarray]:
        with console.status("RTL: running the image on Verilator"):
            result = harness.run(blob, max_cycles=RTL_MAX_CYCLES)
        check_rtl_run(result)
        img = image.unpack(blob, config)
        img.dram[:] = result.dram[:len(img.dram)]
        return [img.tensor(image.SectionKind.OUTPUT, s.index, config.lanes)
                for s in img.layout.of_kind(image.SectionKind.OUTPUT)]
    return run


@functools.lru_cache(maxsize=4)
def _golden_dram(golden, blob: bytes) -> bytes:
    return bytes(golden.run(blob).dram)


def dram_differences(result, golden, blob) -> int:
    """Bytes of the image footprint where the RTL's DRAM differs from the golden model's."""
    want = _golden_dram(golden, blob)
    return int(np.count_nonzero(np.frombuffer(result.dram[:len(want)], np.uint8)
                                != np.frombuffer(want, np.uint8)))


def rtl_ok(result, golden, blob) -> bool:
    """The run finished without error and left the golden model's DRAM."""
    return not (result.timeout or result.error) and dram_differences(result, golden, blob) == 0
