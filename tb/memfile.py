"""The files of the simulated memories' backdoors (:data:`sfnpu.hw.axi_mem.SIM_DRAM_VERILOG`):
``$readmemh`` text from bytes, and bytes from a ``$writememh`` file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["hex_image", "read_dump"]


def hex_image(blob: bytes, base: int, bus_bytes: int) -> str:
    """``$readmemh`` text: the image's words from word ``base / bus_bytes`` on."""
    padded = blob + bytes(-len(blob) % bus_bytes)
    words = np.frombuffer(padded, np.uint8).reshape(-1, bus_bytes)[:, ::-1]
    digits = words.tobytes().hex()
    width = 2 * bus_bytes
    lines = [digits[k:k + width] for k in range(0, len(digits), width)]
    return f"@{base // bus_bytes:x}\n" + "\n".join(lines) + "\n"


def read_dump(path: Path, bus_bytes: int) -> bytes:
    """The bytes of a ``$writememh`` file (one word per line, most significant digit first)."""
    lines = [line for line in path.read_text().split()
             if not line.startswith(("@", "//"))]
    width = 2 * bus_bytes
    digits = "".join(line.rjust(width, "0") for line in lines)
    words = np.frombuffer(bytes.fromhex(digits), np.uint8).reshape(-1, bus_bytes)
    return words[:, ::-1].tobytes()
