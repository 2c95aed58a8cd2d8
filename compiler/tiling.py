"""Tiling: a group that overflows an on-chip store runs as several instructions.

:func:`sfnpu.limits.overflows` names every store an instruction exceeds. Instead of refusing
such a layer, the code generator asks :func:`plan` for tiles, each of which fits:

* **output-channel slices** for the parameter stores (``max_channels``), the pooling line
  stores, the depthwise weights and the input tables. A slice writes its channels at the
  destination's channel offset; a depthwise (or conv NONE) slice reads only its own input
  channel blocks, which also narrows its input rows; the shortcut operand is read from the
  slice's first block. Slices need no window: every operand is a whole-height, whole-width
  run of channel blocks.
* **column strips** for rows wider than the row buffer or the partial-sum buffer (and
  pooling line stores a slice alone cannot relieve). A strip computes a range of output
  columns: it reads the input columns they need — the neighbours' columns as a halo, zero
  padding only at the tensor's own edges — and writes its columns of the output in place.
  Its operands are *windows* of the whole tensors (``windowed``: the pitches go in the
  parameter block's window record, :data:`sfnpu.layout.WINDOW_RECORD`), so no tile copies
  anything. A pool inside the group is recomputed over the strip's halo (only padding-free
  pools: the instruction's pool padding is the same on every side); a global pool cannot be
  split by columns.

Every tile is exact with the untiled layer: the same arithmetic on the same codes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from sfnpu import layout
from sfnpu.config import HwConfig
from sfnpu.isa import ConvKind, Eltwise, Instruction, Pool, eltwise_reads_map
from sfnpu.limits import StoreSizes, overflows

__all__ = ["Tile", "TileError", "plan"]


class TileError(ValueError):
    """No tiling makes the group fit; the message says why."""


@dataclass(frozen=True)
class Tile:
    """One instruction's share of a tiled group: its instruction (locations still those of the
    whole tensors), its parameter arrays and weights, and the byte offsets of its operands
    inside the whole tensors."""
    instr: Instruction
    arrays: dict = field(compare=False)
    weights: np.ndarray | None = field(compare=False)
    input_offset: int = 0
    output_offset: int = 0
    shortcut_offset: int = 0
    geometry: layout.Geometry | None = None      # windowed: the whole tensors' pitches
    index: int = 0
    count: int = 1

    @property
    def label(self) -> str:
        return f"tile {self.index + 1}/{self.count}"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _fits(instr: Instruction, config: HwConfig) -> list[str]:
    # Tiles are DRAM-to-DRAM; the buffers' extents are the allocator's business.
    return overflows(instr, config, buffers=False)


def _channel_slice(instr: Instruction, arrays: dict, weights, c0: int, c1: int,
                   config: HwConfig, geometry: layout.Geometry) -> Tile:
    """Output channels ``c0 … c1-1`` (block-aligned) of the group, whose operands have the
    pitches ``geometry``."""
    L = config.lanes
    per_channel = instr.conv != ConvKind.NORMAL      # depthwise / NONE: input channels too
    changes = dict(out_c=c1 - c0, out_c_offset=instr.out_c_offset + c0)
    arr = dict(arrays)
    for name in ("bias", "multiplier", "weight_zp"):
        if name in arr:
            arr[name] = np.asarray(arr[name])[c0:c1]
    w = None if weights is None else weights[c0:c1]
    input_offset = 0
    if per_channel:
        changes["in_c"] = c1 - c0
        input_offset = c0 // L * geometry.in_plane
        if "channel_table" in arr:
            arr["channel_table"] = np.asarray(arr["channel_table"]).reshape(
                -1, 256 * L)[c0 // L:_ceil_div(c1, L)].reshape(-1)
    shortcut_offset = 0
    if instr.eltwise != Eltwise.NONE:
        shortcut_offset = c0 // L * geometry.sc_plane
    return Tile(instr.replace(**changes), arr, w, input_offset=input_offset,
                shortcut_offset=shortcut_offset, geometry=geometry if instr.windowed else None)


def _pooled_to_conv(instr: Instruction, p0: int, p1: int, conv_w: int) -> tuple[int, int]:
    """Conv output columns that pooled columns ``p0 … p1-1`` read."""
    if instr.pool in (Pool.MAX, Pool.AVG):
        s, k = instr.pool_stride, instr.pool_size
        return p0 * s, min(conv_w, (p1 - 1) * s + k)
    return p0, p1


def _strip(whole: Tile, x0: int, x1: int, config: HwConfig, base: Instruction,
           geometry: layout.Geometry) -> Tile:
    """Output columns ``x0 … x1-1`` of a (channel-sliced) tile ``whole`` of ``base``, whose
    operands have the pitches ``geometry``."""
    L = config.lanes
    i = whole.instr
    up = 2 if i.upsample else 1
    p0, p1 = x0 // up, _ceil_div(x1, up)
    conv_w = layout.conv_output_hw(base)[1]
    c0, c1 = _pooled_to_conv(i, p0, p1, conv_w)
    first = c0 * i.sw - i.pad_left
    last = (c1 - 1) * i.sw - i.pad_left + i.kw           # one past the last input column
    in0, in1 = max(0, first), min(base.in_w, last)
    changes = dict(in_w=in1 - in0, out_w=x1 - x0, windowed=1,
                   pad_left=in0 - first if i.conv != ConvKind.NONE else 0,
                   pad_right=last - in1 if i.conv != ConvKind.NONE else 0)
    return replace(
        whole, instr=i.replace(**changes),
        input_offset=whole.input_offset + in0 * L,
        output_offset=whole.output_offset + x0 * L,
        shortcut_offset=whole.shortcut_offset + (c0 * L if eltwise_reads_map(i.eltwise) else 0),
        geometry=geometry)


def _strippable(instr: Instruction) -> str:
    """Why the group cannot run in column strips ('' when it can)."""
    if instr.pool == Pool.GLOBAL_AVG:
        return "a global pool needs whole rows"
    if instr.pool in (Pool.MAX, Pool.AVG) and instr.pool_pad:
        return "its pool pads every side alike, which an inner strip must not"
    if instr.upsample and instr.pool != Pool.NONE:
        return "a pool followed by an upsample"
    return ""


def _strips(whole: Tile, n: int, config: HwConfig, base: Instruction,
            geometry: layout.Geometry) -> list[Tile]:
    """``whole`` in ``n`` strips of about equal output width (even with an upsample)."""
    ow, up = whole.instr.out_w, 2 if whole.instr.upsample else 1
    units = ow // up
    bounds = [round(k * units / n) * up for k in range(n + 1)]
    bounds[-1] = ow
    return [_strip(whole, a, b, config, base, geometry)
            for a, b in zip(bounds, bounds[1:]) if b > a]


def plan(instr: Instruction, arrays: dict, weights, config: HwConfig,
         geometry: layout.Geometry | None = None, shares: bool = True) -> list[Tile]:
    """The fewest tiles, each fitting every store of ``config`` — channel slices first, each
    cut into column strips where it must be; one tile (the group itself) when it fits.
    ``geometry``: the pitches of the group's operands when they are windows of larger tensors
    themselves (spatial views, stitched tiles); then every tile is windowed. ``shares``: input-
    channel shares (one instruction per output row and share) are a last resort; off, the
    caller tries something cheaper first (taking the group apart).
    Raises :class:`TileError` when no tiling fits."""
    L = config.lanes
    dense = layout.Geometry.dense(instr, L)
    geometry = geometry or dense
    if geometry != dense:
        instr = instr.replace(windowed=1)
    if not _fits(instr, config):
        return [Tile(instr, arrays, weights, geometry=geometry if instr.windowed else None)]
    blocks = layout.channel_blocks(instr.out_c, L)
    why_not = _strippable(instr)
    best, reasons = None, []

    def cost(tiles):        # fewest tiles; at a tie, fewest strips (no halo re-reads)
        return len(tiles), sum(t.instr.windowed for t in tiles)

    for per in range(blocks, 0, -1):
        count = _ceil_div(blocks, per)
        if best is not None and count > len(best):
            break
        slices = [_channel_slice(instr, arrays, weights, k * per * L,
                                 min(instr.out_c, (k + 1) * per * L), config, geometry)
                  for k in range(count)]
        tiles = _fitting_strips(slices, config, instr, why_not, best, reasons, geometry)
        if tiles is not None and (best is None or cost(tiles) < cost(best)):
            best = tiles
    if best is None and shares:
        best = _input_splits(instr, arrays, weights, config, geometry, reasons)
    if best is None:
        raise TileError(reasons[-1] if reasons else "no tiling fits")
    return [replace(t, index=k, count=len(best)) for k, t in enumerate(best)]


def _input_channels(tile: Tile, k0: int, k1: int, first: bool, last: bool, L: int,
                    geometry: layout.Geometry) -> Tile:
    """Input channels ``k0 … k1-1`` (block-aligned) of a one-row tile: their weights, their
    input tables and their channel blocks of the input; partial sums carried to and from the
    neighbouring shares."""
    i = tile.instr
    arr = dict(tile.arrays)
    if "channel_table" in arr:
        arr["channel_table"] = np.asarray(arr["channel_table"]).reshape(
            -1, 256 * L)[k0 // L:_ceil_div(k1, L)].reshape(-1)
    return replace(tile, instr=i.replace(in_c=k1 - k0, psum_keep=int(not first),
                                         psum_hold=int(not last)),
                   arrays=arr, weights=tile.weights[:, k0:k1],
                   input_offset=tile.input_offset + k0 // L * geometry.in_plane)


def _output_row(tile: Tile, oy: int, geometry: layout.Geometry) -> Tile:
    """Conv output row ``oy`` of a (channel-sliced) tile: the input rows its window reads,
    padded only at the tensor's own edges."""
    i = tile.instr
    first = oy * i.sh - i.pad_top
    last = first + i.kh
    in0, in1 = max(0, first), min(i.in_h, last)
    sc = oy * geometry.sc_row if eltwise_reads_map(i.eltwise) else 0
    return replace(tile, instr=i.replace(in_h=in1 - in0, out_h=1, windowed=1,
                                         pad_top=in0 - first, pad_bottom=last - in1),
                   input_offset=tile.input_offset + in0 * geometry.in_row,
                   output_offset=tile.output_offset + oy * geometry.out_row,
                   shortcut_offset=tile.shortcut_offset + sc, geometry=geometry)


def _shares(row: Tile, base: Instruction, config: HwConfig, geometry: layout.Geometry,
            in_blocks: int) -> tuple[int, list[tuple[int, int]]] | str:
    """(column strips, input-channel bounds) that make every share of a one-row tile ``row``
    fit: the fewest shares of whole rows, else the fewest shares of one-column strips and
    then the fewest strips; else why none does."""
    L = config.lanes

    def bounds(shares):
        size = _ceil_div(in_blocks, shares) * L
        return [(k, min(base.in_c, k + size)) for k in range(0, base.in_c, size)]

    def problems(strips, shares):
        pieces = _strips(row, strips, config, base, geometry) if strips > 1 else [row]
        return [p for piece in pieces for p in _fits(
            _input_channels(piece, *bounds(shares)[0], False, False, L, geometry).instr,
            config)]

    narrowest = row.instr.out_w
    for strips in (1, narrowest):
        for shares in range(2, in_blocks + 1):
            if not problems(strips, shares):
                return _fewest(lambda n: not problems(n, shares), 0, strips), bounds(shares)
    why = problems(narrowest, in_blocks)
    return (f"{'; '.join(dict.fromkeys(why))} even with the input channels split "
            f"{in_blocks} ways and the rows in one-column strips")


def _input_splits(instr: Instruction, arrays: dict, weights, config: HwConfig,
                  geometry: layout.Geometry, reasons: list[str]) -> list[Tile] | None:
    """A normal convolution whose input rows exceed the row buffer even one output column at
    a time: each output row in its own instructions, one per share of the input channels,
    the partial sums carried from share to share in the partial-sum buffer (``psum_hold``,
    ``psum_keep``) — output-channel slices first where the carried sums or the parameter
    stores need them, and column strips of the row where even one block of a row is too
    wide. The shares before the last write their row's codes too; the last one overwrites
    them. None (with the reason) where this does not fit either."""
    if instr.conv != ConvKind.NORMAL or instr.pool != Pool.NONE or instr.upsample:
        return None
    L = config.lanes
    conv_h, conv_w = layout.conv_output_hw(instr)
    out_blocks, in_blocks = _ceil_div(instr.out_c, L), _ceil_div(instr.in_c, L)
    z = StoreSizes.of(config)
    # carried sums: blocks × conv width words of the partial-sum buffer
    most = min(out_blocks, z.psum_words // conv_w, z.max_channels // L)
    for per in range(most, 0, -1):
        c_slices = [(k * per * L, min(instr.out_c, (k + 1) * per * L))
                    for k in range(_ceil_div(out_blocks, per))]
        row = _output_row(_channel_slice(instr, arrays, weights, *c_slices[0], config,
                                         geometry), 0, geometry)
        found = _shares(row, instr, config, geometry, in_blocks)
        if isinstance(found, str):
            reasons.append(found)
            continue
        strips, bounds = found
        tiles = []
        for c0, c1 in c_slices:
            sliced = _channel_slice(instr, arrays, weights, c0, c1, config, geometry)
            for oy in range(conv_h):
                row = _output_row(sliced, oy, geometry)
                for piece in (_strips(row, strips, config, instr, geometry) if strips > 1
                              else [row]):
                    tiles += [_input_channels(piece, k0, k1, k == 0, k == len(bounds) - 1, L,
                                              geometry) for k, (k0, k1) in enumerate(bounds)]
        if all(not _fits(t.instr, config) for t in tiles):
            return tiles
        reasons.append(f"{'; '.join(p for t in tiles for p in _fits(t.instr, config))} "
                       "with the input channels split")
    return None


def _fitting_strips(slices: list[Tile], config: HwConfig, base: Instruction, why_not: str,
                    best: list[Tile] | None, reasons: list[str],
                    geometry: layout.Geometry) -> list[Tile] | None:
    """Each slice whole or in the fewest column strips that fit; None if one does not."""
    tiles = []
    for sl in slices:
        problems = _fits(sl.instr, config)
        if not problems:
            tiles.append(sl)
            continue
        if why_not:
            reasons.append(f"{'; '.join(problems)}; it cannot run in column strips: {why_not}")
            return None


        def problems_of(n):
            return [p for t in _strips(sl, n, config, base, geometry)
                    for p in _fits(t.instr, config)]

        # Double the count until the strips fit, then bisect back to the fewest.
        lo, hi = 1, 2
        while (problems := problems_of(min(hi, sl.instr.out_w))) and hi < sl.instr.out_w:
            lo, hi = hi, 2 * hi
        if problems:
            reasons.append(f"{'; '.join(problems)} even in one-column strips")
            return None
        n = _fewest(lambda n: not problems_of(n), lo, min(hi, sl.instr.out_w))
        if best is not None and len(tiles) + n > len(best):
            return None
        tiles += _strips(sl, n, config, base, geometry)
    return tiles


def _fewest(fits, lo: int, hi: int) -> int:
    """The least count in ``lo + 1 … hi`` for which ``fits``, where ``lo`` does not fit and
    ``hi`` does: narrower strips fit where wider ones do, so bisect."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi
