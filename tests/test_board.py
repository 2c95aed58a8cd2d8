"""The board top in simulation: the host tool (sfnpu.tools.board) runs a compiled image over the UART
link of the Verilated BoardSystem (UART receiver/transmitter, bridge, block RAM, accelerator)
and gets the golden model's DRAM back; protocol errors are answered, not hung on."""

import functools

import pytest

from sfnpu import image
from sfnpu.tools.board import BoardRunner, LinkError, UartLink
from sfnpu.hw.ulx3s import MEMORY_BYTES, ulx3s_config
from sfnpu.hostlink import Command, Status
from sfnpu.regmap import ErrorCode
from sfnpu.sim.golden import GoldenModel
from sfnpu.tb.board import BoardHarness, PipeTransport
from sfnpu.tb.verilator import REPO_ROOT
from test_system import compiled_image, conv_stack

CONFIG = ulx3s_config()          # what the ULX3S bitstream holds


@functools.cache
def board_harness():
    return BoardHarness(CONFIG, REPO_ROOT / "build" / "board" / CONFIG.name,
                        memory_bytes=MEMORY_BYTES)


@pytest.fixture
def board():
    process = board_harness().open()
    transport = PipeTransport(process, timeout_s=30)
    yield transport
    process.stdin.close()
    process.wait(timeout=60)
    assert process.returncode == 0, process.stderr.read().decode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    net, outputs = conv_stack()
    return compiled_image(tmp_path_factory.mktemp("stack"), net, outputs, CONFIG)


def test_image_over_uart_matches_golden(board, stack):
    compiled, blob = stack
    link = UartLink(board)
    assert (link.memory_bytes, link.word_bytes) == (MEMORY_BYTES, 4)
    run = BoardRunner(link).run(blob, timeout_s=60)
    assert not run.error and run.error_code == ErrorCode.NONE
    want = bytes(GoldenModel(CONFIG).run(blob).dram)
    assert run.dram[:len(want)] == want
    assert len(run.group_cycles) == len(compiled.program.instructions)
    assert sum(run.group_cycles) == run.counters["CYCLES"] > 0
    assert sum(w for _, w in run.group_bytes) == run.counters["DRAM_WRITE_BYTES"] > 0


def test_hardware_error_over_uart(board, stack):
    """A DMA window that ends before the output: the run stops with DMA_WINDOW."""
    _, blob = stack
    output = image.unpack(blob, CONFIG).layout.of_kind(image.SectionKind.OUTPUT)[0]
    run = BoardRunner(UartLink(board)).run(blob, timeout_s=60, window=(0, output.offset))
    assert run.error and run.error_code == ErrorCode.DMA_WINDOW
    assert run.error_addr >= output.offset


def test_link_errors_are_answered(board):
    link = UartLink(board)
    board.write(bytes([0x7F]))                       # not a command
    assert board.read(1) == bytes([Status.UNKNOWN_COMMAND.value])
    with pytest.raises(LinkError, match="SLVERR"):   # a register that does not exist
        link.csr_read(0xFFC)
    # A read that runs past the memory: words inside come back, the status says DECERR.
    last = MEMORY_BYTES // 4 - 1
    link.mem_write(last * 4, b"\x01\x02\x03\x04")
    board.write(bytes([Command.MEM_READ.value]) + last.to_bytes(4, "little") +
                (2).to_bytes(2, "little"))
    assert board.read(9) == b"\x01\x02\x03\x04" + bytes(4) + bytes([Status.DECERR.value])
    with pytest.raises(ValueError, match="beyond the board"):
        link.mem_read(MEMORY_BYTES, 4)
    assert link.csr_read(0) == int.from_bytes(b"SFNP", "little")   # still in step
