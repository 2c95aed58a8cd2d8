"""Host tool for a board top (:mod:`sfnpu.hw.board`): run a DRAM image over the UART link.

:class:`UartLink` speaks the :mod:`sfnpu.hostlink` protocol over any byte transport (a serial
port from :func:`open_serial`, or the simulated board of :mod:`sfnpu.tb.board`).
:class:`BoardRunner` does what the C driver does, from Python: check the hardware, load the
image, program the DMA window, start, poll with a timeout, then read the error registers,
counters, per-group cycles and the image's memory footprint back.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

from sfnpu import image, regmap
from sfnpu.hostlink import HEADER_BYTES, LINK_VERSION, MAX_COUNT, Command, Status
from sfnpu.regmap import ErrorCode

__all__ = ["LinkError", "UartLink", "BoardRunner", "BoardRun", "open_serial"]


class LinkError(RuntimeError):
    """The board did not answer, or answered with an error status."""


def _reg(name: str) -> int:
    return regmap.register(name).offset


def _mask(reg: str, fld: str) -> int:
    return regmap.register(reg).field(fld).mask


class UartLink:
    """Requests of the host link protocol over ``transport`` (``write(bytes)``,
    ``read(n) -> bytes``; a short read means a timeout)."""

    def __init__(self, transport):
        self.transport = transport
        version, self.memory_bytes, self.word_bytes = self.ident()
        if version != LINK_VERSION:
            raise LinkError(f"the board speaks link version {version}; this tool speaks "
                            f"{LINK_VERSION}")

    def _request(self, command: Command, header: bytes, payload: bytes = b"") -> None:
        assert len(header) == HEADER_BYTES[command]
        self.transport.write(bytes([command.value]) + header + payload)

    def _read(self, n: int, what: str) -> bytes:
        data = self.transport.read(n)
        if len(data) != n:
            raise LinkError(f"no reply from the board to {what} ({len(data)} of {n} bytes)")
        return data

    def _status(self, what: str) -> None:
        status = self._read(1, what)[0]
        if status != Status.OKAY.value:
            name = Status(status).name if status in {s.value for s in Status} else hex(status)
            raise LinkError(f"{what}: the board answered {name}")

    def ident(self) -> tuple[int, int, int]:
        self._request(Command.IDENT, b"")
        version, memory_bytes, word_bytes = struct.unpack("<BIB", self._read(6, "IDENT"))
        self._status("IDENT")
        return version, memory_bytes, word_bytes

    def csr_write(self, offset: int, value: int) -> None:
        self._request(Command.CSR_WRITE, struct.pack("<HI", offset, value))
        self._status(f"register write at {offset:#x}")

    def csr_read(self, offset: int) -> int:
        self._request(Command.CSR_READ, struct.pack("<H", offset))
        value, = struct.unpack("<I", self._read(4, f"register read at {offset:#x}"))
        self._status(f"register read at {offset:#x}")
        return value

    def read64(self, name: str) -> int:
        """A ``*_LO``/``*_HI`` pair, LO first (it latches a counter's HI)."""
        lo = self.csr_read(_reg(f"{name}_LO"))
        return lo | self.csr_read(_reg(f"{name}_HI")) << 32

    def write64(self, name: str, value: int) -> None:
        self.csr_write(_reg(f"{name}_LO"), value & 0xFFFF_FFFF)
        self.csr_write(_reg(f"{name}_HI"), value >> 32)

    def _check_span(self, addr: int, nbytes: int):
        W = self.word_bytes
        if addr % W or nbytes % W:
            raise ValueError(f"memory access at {addr:#x}, {nbytes} bytes: address and length "
                             f"must be multiples of the {W}-byte word")
        if addr + nbytes > self.memory_bytes:
            raise ValueError(f"memory access at {addr:#x}, {nbytes} bytes: beyond the board's "
                             f"{self.memory_bytes}-byte memory")

    def mem_write(self, addr: int, data: bytes) -> None:
        self._check_span(addr, len(data))
        W = self.word_bytes
        for start in range(0, len(data), MAX_COUNT * W):
            chunk = data[start:start + MAX_COUNT * W]
            self._request(Command.MEM_WRITE,
                          struct.pack("<IH", (addr + start) // W, len(chunk) // W), chunk)
            self._status(f"memory write at {addr + start:#x}")

    def mem_read(self, addr: int, nbytes: int) -> bytes:
        self._check_span(addr, nbytes)
        W = self.word_bytes
        out = bytearray()
        for start in range(0, nbytes, MAX_COUNT * W):
            n = min(MAX_COUNT * W, nbytes - start)
            self._request(Command.MEM_READ, struct.pack("<IH", (addr + start) // W, n // W))
            out += self._read(n, f"memory read at {addr + start:#x}")
            self._status(f"memory read at {addr + start:#x}")
        return bytes(out)


@dataclass
class BoardRun:
    status: int
    error_code: ErrorCode
    error_group: int
    error_addr: int
    counters: dict[str, int]
    group_cycles: list[int] = field(default_factory=list)
    group_bytes: list[tuple[int, int]] = field(default_factory=list)   # DRAM read, written
    dram: bytes = b""          # the image footprint after the run

    @property
    def error(self) -> bool:
        return bool(self.status & _mask("STATUS", "error"))


class BoardRunner:
    """Run DRAM images on a board through a :class:`UartLink`; the image sits at address 0
    and the DMA window is the whole board memory."""

    def __init__(self, link: UartLink):
        self.link = link
        if link.csr_read(_reg("ID")) != regmap.MAGIC:
            raise LinkError("the ID register does not hold the sfnpu magic: no accelerator "
                            "behind this link")
        self.fingerprint = link.read64("FINGERPRINT")
        self.log_depth = link.csr_read(_reg("GROUP_LOG_DEPTH"))

    def check(self, blob: bytes) -> int:
        """Check the image against this board; returns its footprint (bytes, whole words)."""
        image.unpack(blob)                  # a malformed image fails here, with the reason
        fingerprint, = struct.unpack_from(
            "<Q", blob, image.field_offset(image.HEADER_FIELDS, "fingerprint"))
        if fingerprint != self.fingerprint:
            raise ValueError(f"image fingerprint {fingerprint:#018x} differs from the board's "
                             f"{self.fingerprint:#018x}: compile it for this configuration")
        footprint, = struct.unpack_from(
            "<I", blob, image.field_offset(image.HEADER_FIELDS, "image_bytes"))
        W = self.link.word_bytes
        footprint = -(-footprint // W) * W
        if footprint > self.link.memory_bytes:
            raise ValueError(f"image footprint of {footprint} bytes does not fit the board's "
                             f"{self.link.memory_bytes}-byte memory")
        return footprint

    def load(self, blob: bytes) -> int:
        """Check and write the image, clear the rest of its footprint; returns the footprint."""
        footprint = self.check(blob)
        self.link.mem_write(0, blob + bytes(footprint - len(blob)))
        return footprint

    def run(self, blob: bytes, *, timeout_s: float = 10.0, poll_s: float = 0.0,
            window: tuple[int, int] | None = None, preloaded: bool = False) -> BoardRun:
        """Run ``blob``; the DMA window defaults to the whole board memory.

        ``preloaded``: the image is in the board's memory already, the rest of its footprint
        cleared (a simulated board's backdoor, :mod:`sfnpu.tb.board`, put it there and reads
        the memory after the run): it is checked but not written, and ``dram`` stays empty.
        """
        link = self.link
        window_base, window_limit = window or (0, link.memory_bytes)
        footprint = self.check(blob) if preloaded else self.load(blob)
        if link.csr_read(_reg("STATUS")) & _mask("STATUS", "busy"):
            raise LinkError("the accelerator is busy")
        link.write64("IMAGE_BASE", 0)
        link.write64("DMA_WINDOW_BASE", window_base)
        link.write64("DMA_WINDOW_LIMIT", window_limit)
        link.csr_write(_reg("CONTROL"), _mask("CONTROL", "start"))
        finished = _mask("STATUS", "done") | _mask("STATUS", "error")
        deadline = time.monotonic() + timeout_s
        while not (status := link.csr_read(_reg("STATUS"))) & finished:
            if time.monotonic() > deadline:
                link.csr_write(_reg("CONTROL"), _mask("CONTROL", "soft_reset"))
                raise LinkError(f"the run did not finish within {timeout_s} s; aborted")
            time.sleep(poll_s)
        counters = {name: link.read64(name) for name, (lo, _) in
                    regmap.wide_registers().items() if lo.latched}
        groups = link.csr_read(_reg("GROUP_COUNT"))
        link.csr_write(_reg("GROUP_LOG_INDEX"), 0)
        cycles, group_bytes = [], []
        for _ in range(min(groups, self.log_depth)):
            # Byte counts first: reading GROUP_LOG_DATA advances the index.
            group_bytes.append((link.csr_read(_reg("GROUP_LOG_READ_BYTES")),
                                link.csr_read(_reg("GROUP_LOG_WRITE_BYTES"))))
            cycles.append(link.csr_read(_reg("GROUP_LOG_DATA")))
        return BoardRun(
            status=status,
            error_code=ErrorCode(link.csr_read(_reg("ERROR_CODE")) & 0xFF),
            error_group=link.csr_read(_reg("ERROR_GROUP")),
            error_addr=link.read64("ERROR_ADDR"),
            counters=counters, group_cycles=cycles, group_bytes=group_bytes,
            dram=b"" if preloaded else link.mem_read(0, footprint))


class _SerialTransport:
    def __init__(self, port):
        self.port = port

    def write(self, data: bytes):
        self.port.write(data)

    def read(self, n: int) -> bytes:
        return self.port.read(n)


def open_serial(device: str, baud: int, timeout_s: float = 2.0):
    """A transport on a serial port (needs the ``pyserial`` package on the host)."""
    try:
        import serial
    except ImportError:
        raise LinkError("talking to a board needs pyserial: pip install pyserial") from None
    return _SerialTransport(serial.Serial(device, baud, timeout=timeout_s))
