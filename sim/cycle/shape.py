"""A group's derived parameters and one chunk's array timing, shared by the components."""

from __future__ import annotations

from dataclasses import dataclass

from sfnpu.config import ROW_BUFFER_ROWS
from sfnpu.isa import Eltwise, Instruction, eltwise_reads_map
from sfnpu.layout import Geometry

__all__ = ["Shape", "ChunkPlan"]


@dataclass(frozen=True)
class Shape:
    """The quantities the controller derives in DECODE/DECODE2/DIVIDE/CHUNK."""
    depthwise: bool
    identity: bool
    in_blocks: int
    out_blocks: int
    ib: int                 # input-channel blocks per output block (1: depthwise)
    conv_h: int
    conv_w: int
    steps: int              # P
    taps: int
    row_words: int
    places: int
    streaming: bool         # row reuse, weights larger than the store: streamed per row
    chunk_obs: int          # output-channel blocks per chunk


@dataclass(frozen=True)
class ChunkPlan:
    """One chunk of ``obs`` output blocks from block ``ob_base`` on, its operands at the
    controller's addresses (``base``: IMAGE_BASE; ``geo``: their pitches), and the array's
    pace over it: one conv row of every pass of the chunk takes ``row`` cycles, a pass
    ``pass_cycles``."""
    instr: Instruction
    s: Shape
    obs: int
    ob_base: int
    base: int
    geo: Geometry
    f0: int                 # fetch cycles of a pass's first pixel
    f1: int                 # of its later ones
    pass_cycles: int
    row: int
    block_cycles: int       # an output block's results leave the array in its last pass
    capacity: int           # rows the row buffer holds

    @classmethod
    def of(cls, instr: Instruction, s: Shape, obs: int, ob_base: int, base: int,
           geo: Geometry) -> ChunkPlan:
        from sfnpu.hw.conv_array import fetch_cycles

        p = s.steps
        f0 = fetch_cycles(instr.kh, instr.kw, instr.sw, True)
        f1 = fetch_cycles(instr.kh, instr.kw, instr.sw, False)
        pass_cycles = max(p, f0) + (s.conv_w - 1) * max(p, f1)
        passes = (1 if s.depthwise else obs) * s.in_blocks
        return cls(instr, s, obs, ob_base, base, geo, f0, f1, pass_cycles, passes * pass_cycles,
                   s.ib * pass_cycles, ROW_BUFFER_ROWS * s.places)

    @property
    def first_fetch(self) -> int:
        """Cycles from a row's input to its time base, past one: a pass's first window
        costs ``max(P, F₀)`` (:attr:`first_step`), but a row's very first window is emitted
        ``F₀`` cycles after its read with nothing to overlap, so the row counts from
        ``max(P, F₀) − P`` cycles before that (``hw/row_buffer.py``'s timing contract).
        Only depthwise layers on wide arrays (``P`` below ``F₀``) tell the two apart."""
        return min(self.s.steps, self.f0)

    @property
    def first_step(self) -> int:
        """A pass's first result: its pixel's last step."""
        return max(self.s.steps, self.f0) - 1

    @property
    def pixel_step(self) -> int:
        """Cycles between two pixels' results in a pass."""
        return max(self.s.steps, self.f1)

    @property
    def reads_map(self) -> bool:
        """The element-wise stage reads a tensor of the conv output's shape (ADD, MUL)."""
        return bool(eltwise_reads_map(self.instr.eltwise))

    @property
    def eltwise_latency(self) -> int:
        """Pipeline depth of the element-wise unit the shortcut stream feeds."""
        from sfnpu.hw.chscale import ChannelScale
        from sfnpu.hw.eltwise_add import EltwiseAdd

        return EltwiseAdd.LATENCY if self.instr.eltwise == Eltwise.ADD else ChannelScale.LATENCY

    @property
    def pooled_h(self) -> int:
        """Output rows before the upsampler."""
        return self.instr.out_h >> 1 if self.instr.upsample else self.instr.out_h

    @property
    def pooled_w(self) -> int:
        return self.instr.out_w >> 1 if self.instr.upsample else self.instr.out_w

    @property
    def row_results(self) -> int:
        """Result words of one conv row."""
        return self.obs * self.s.conv_w
