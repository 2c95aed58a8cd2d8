"""The C firmware driver and host program, compiled with the system C compiler, drive the
Verilated accelerator (tb/firmware.py): outputs identical to the golden model, counters and the
group log read back, hardware errors decoded to their names, driver errors refused clearly."""

import functools
import subprocess

import pytest

from sfnpu import image
from sfnpu.config import get_config
from sfnpu.docs import render_all
from sfnpu.regmap import ErrorCode
from sfnpu.sim.golden import GoldenModel
from sfnpu.tb.firmware import FIRMWARE, INCLUDE_DIRS, C_FLAGS, FirmwareHarness
from sfnpu.tb.verilator import REPO_ROOT
from test_system import compiled_image, conv_stack, patch_instruction, table_net

CONFIG = "ecp5"      # the board's configuration


@functools.cache
def firmware_harness():
    return FirmwareHarness(get_config(CONFIG), REPO_ROOT / "build" / "firmware" / CONFIG)


@pytest.fixture(scope="module")
def harness():
    return firmware_harness()


@pytest.mark.parametrize("build", [conv_stack, table_net])
def test_host_program_output_matches_golden(harness, tmp_path, build):
    net, outputs = build()
    compiled, blob = compiled_image(tmp_path, net, outputs, harness.config)
    run = harness.run(blob)
    assert run.exit_code == 0, run.text
    assert run.report["error"].startswith("0 NONE")
    want = bytes(GoldenModel(harness.config).run(blob).dram)
    assert len(run.dram) == len(want), "the host program reads back the image footprint"
    assert run.dram == want, "DRAM after the run differs from the golden model"
    # The outputs alone, as a user would read them.
    img = image.unpack(blob, harness.config)
    for section in img.layout.of_kind(image.SectionKind.OUTPUT):
        assert run.dram[section.offset:section.offset + section.size] == \
            want[section.offset:section.offset + section.size]
    groups = len(compiled.program.instructions)
    assert int(run.report["groups"]) == groups and len(run.group_cycles) == groups
    assert sum(run.group_cycles) == run.counters["CYCLES"] > 0
    assert sum(run.group_write_bytes) == run.counters["DRAM_WRITE_BYTES"] > 0
    assert sum(run.group_read_bytes) <= run.counters["DRAM_READ_BYTES"]
    assert all(n > 0 for n in run.group_read_bytes)


@pytest.fixture(scope="module")
def stack_blob(tmp_path_factory):
    net, outputs = conv_stack()
    _, blob = compiled_image(tmp_path_factory.mktemp("stack"), net, outputs,
                             get_config(CONFIG))
    return blob


def test_hardware_error_is_decoded(harness, stack_blob):
    run = harness.run(patch_instruction(stack_blob, harness.config, 1, opcode=0x5))
    assert run.exit_code == 1, run.text
    assert run.report["error"] == (f"{ErrorCode.ILLEGAL_OPCODE.value} ILLEGAL_OPCODE: the "
                                   "fetched instruction's opcode is not GROUP")
    assert run.report["error_group"] == "1"


def test_image_for_other_hardware_is_refused(harness, tmp_path):
    net, outputs = conv_stack()
    _, blob = compiled_image(tmp_path, net, outputs, get_config("tiny"))
    run = harness.run(blob)
    assert run.exit_code == 2
    assert "image built for another hardware configuration" in run.report["driver"]


def test_timeout_aborts_the_run(harness, stack_blob):
    run = harness.run(stack_blob, timeout_us=1)
    assert run.exit_code == 2
    assert run.report["driver"].startswith("wait: timeout: the run was aborted")
    assert int(run.report["status"], 16) == 0, "the aborted core is idle with a clear status"


def test_window_must_cover_the_image(harness, stack_blob):
    run = harness.run(stack_blob, window=(0, 4096))
    assert run.exit_code == 2 and "outside the DMA window" in run.report["driver"]


def test_generated_headers_are_current():
    for path, text in render_all().items():
        if path.startswith("firmware/"):
            assert (REPO_ROOT / path).read_text() == text, f"{path} is stale: run make docs"


def test_linux_host_program_compiles(tmp_path):
    """The memory-mapped (Zynq / PCIe BAR) host program builds with the system compiler."""
    sources = [FIRMWARE / "src" / "sfnpu.c", FIRMWARE / "host" / "sfnpu_run.c",
               FIRMWARE / "host" / "main_devmem.c"]
    subprocess.run(["cc", *C_FLAGS, *(f"-I{d}" for d in INCLUDE_DIRS), *map(str, sources),
                    "-o", str(tmp_path / "sfnpu-run")], check=True)
    usage = subprocess.run([str(tmp_path / "sfnpu-run")], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
