"""The board runs a real model in simulation: the Verilated board top (UART, bridge, block RAM,
accelerator) runs the bundled model `make sim` runs — PP-LCNet, the trained orientation
classifier — compiled for the board's configuration (``ecp5-ulx3s``, in one piece), under the
host tool (sfnpu.tools.board), and its memory after the run equals the golden model's bit for
bit over the image's whole footprint: the image itself, every intermediate and the output.

The image is 1.95 MB and its activations take it to 4.5 MB: far beyond the 64 KiB of block RAM
the ULX3S bitstream spares beside the accelerator (on the board the model runs from the 32 MB
SDRAM, whose behavioural model runs only in Amaranth's simulator, far too slowly for millions
of cycles). The simulated board therefore has 8 MiB of block RAM, the footprint rounded up to a
power of two, with the block RAM's file backdoor (sfnpu.tb.board; the logic around the
storage is the board's): the image is in memory before reset is released, as loading it over
the UART at 40 cycles per byte would cost 180 M cycles, and the process writes the memory to a
file when it exits. The registers — start, polling, error code, counters, the group
log — go over the simulated UART; tests/test_board.py covers memory over the UART.

It runs in `make regress` only: 11.4 M cycles take about 40 s, and a first run builds its own
simulator (the 8 MiB memory is not test_board.py's 64 KiB), about a minute more.
"""

import functools
import os
import subprocess

import numpy as np
import pytest

from sfnpu.compiler.pipeline import compile_model
from sfnpu.hw.ulx3s import ulx3s_config
from sfnpu.models.catalog import DEFAULT_MODEL, resolve_model
from sfnpu.regmap import ErrorCode
from sfnpu.sim.golden import GoldenModel
from sfnpu.tb.board import BoardHarness, PipeTransport
from sfnpu.tb.verilator import REPO_ROOT
from sfnpu.tools.board import BoardRunner, LinkError, UartLink

CONFIG = ulx3s_config()
MEMORY_BYTES = 8 << 20
#: The run takes 11.4 M cycles from block RAM (the cycle model, which assumes the
#: configuration's slower DRAM, says 18.9 M) and the link's traffic about 0.1 M; a board still
#: going after 40 M is hung.
MAX_CYCLES = 40_000_000
#: Wall-clock limits: the whole run, one reply, the process's exit (it writes 4.5 MB of hex).
RUN_S, REPLY_S, EXIT_S = 600, 60, 120


@functools.cache
def board_harness():
    return BoardHarness(CONFIG, REPO_ROOT / "build" / "board" / f"{CONFIG.name}-8mib-backdoor",
                        memory_bytes=MEMORY_BYTES, backdoor=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The compiled model and its image for the last sample input (as `make sim` runs it)."""
    path, inputs, _, _ = resolve_model(DEFAULT_MODEL, tmp_path_factory.mktemp("model"))
    compiled = compile_model(path, CONFIG)
    feeds = {compiled.input_names[0]: inputs[-1:]}
    return compiled, compiled.program.pack(compiled.quantise_inputs(feeds))


def run_on_board(blob: bytes, footprint: int, workdir):
    """(the host tool's run, the memory's first ``footprint`` bytes after it)."""
    harness = board_harness()
    process = harness.open_preloaded(blob, workdir, dump_bytes=footprint,
                                     max_cycles=MAX_CYCLES)
    try:
        run = BoardRunner(UartLink(PipeTransport(process, timeout_s=REPLY_S))).run(
            blob, timeout_s=RUN_S, preloaded=True)
        process.stdin.close()
        process.wait(timeout=EXIT_S)
    except (LinkError, subprocess.TimeoutExpired) as error:
        process.kill()
        process.wait()
        pytest.fail(f"{error}; the simulated board: {process.stderr.read().decode().strip()}")
    finally:
        if process.poll() is None:          # any other failure: no process left behind
            process.kill()
            process.wait()
    said = process.stderr.read().decode().strip()
    assert process.returncode == 0, f"the simulated board exited with {process.returncode}: {said}"
    return run, harness.memory(workdir)


@pytest.mark.skipif(not os.environ.get("SFNPU_REGRESS"),
                    reason="PP-LCNet on the simulated board runs in `make regress`")
def test_bundled_model_on_the_board(model, tmp_path):
    compiled, blob = model
    want = bytes(GoldenModel(CONFIG).run(blob).dram)
    assert len(want) == compiled.program.layout.image_bytes <= MEMORY_BYTES
    run, memory = run_on_board(blob, len(want), tmp_path)
    assert not run.error and run.error_code == ErrorCode.NONE, \
        f"{run.error_code.name} in group {run.error_group} at {run.error_addr:#x}"
    assert len(memory) == len(want)
    differ = np.flatnonzero(np.frombuffer(memory, np.uint8) != np.frombuffer(want, np.uint8))
    assert not differ.size, (f"{differ.size} of {len(want)} bytes differ from the golden "
                             f"model's DRAM, the first at {differ[0]:#x}")
    assert len(run.group_cycles) == len(compiled.program.instructions)
    assert sum(run.group_cycles) == run.counters["CYCLES"] > 0
    assert sum(w for _, w in run.group_bytes) == run.counters["DRAM_WRITE_BYTES"] > 0
