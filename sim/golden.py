"""The golden model: executes a DRAM image group by group with the numeric contract.

It reads nothing but the image — instructions, weights and parameter blocks in the hardware
layouts — so a match with onnxruntime proves the instructions carry everything the accelerator
needs. Every tensor operation is vectorised numpy; the arithmetic is :mod:`sfnpu.numeric`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sfnpu import image, isa, layout, numeric
from sfnpu.config import HwConfig
from sfnpu.isa import Activation, ActOrder, ConvKind, Eltwise, MemSpace, Pool, eltwise_reads_map

__all__ = ["GoldenModel", "GoldenError", "run_image"]


class GoldenError(RuntimeError):
    """The program does something the hardware would refuse; names the group."""


@dataclass
class _Memories:
    dram: bytearray
    buffers: tuple[bytearray, bytearray, bytearray]

    def space(self, space: MemSpace) -> bytearray:
        return self.dram if space == MemSpace.DRAM else self.buffers[space.value - 1]


class GoldenModel:
    """Bit-exact functional model of the accelerator for one hardware configuration."""

    def __init__(self, config: HwConfig):
        self.config = config
        #: Partial sums a psum_hold group left for the next group (:meth:`_carry`).
        self._held: np.ndarray | None = None

    # -- memory helpers (layouts from sfnpu.layout only) ---------------------------------------

    def _window(self, mem: _Memories, loc: isa.Location, blocks: int, h: int, w: int,
                row: int, plane: int) -> np.ndarray:
        """The ``(blocks, h, w, lanes)`` bytes of a tensor window at ``loc`` whose rows are
        ``row`` bytes and channel blocks ``plane`` bytes apart (a view: writes go through)."""
        lanes = self.config.lanes
        space = np.frombuffer(mem.space(loc.space), dtype=np.uint8)
        end = loc.offset + layout.window_extent(h, w, blocks, row, plane, lanes)
        if end > space.size:
            raise GoldenError(f"a {blocks}-block {h}x{w} window at {loc} passes the end of "
                              f"its memory ({space.size} bytes)")
        return np.lib.stride_tricks.as_strided(space[loc.offset:], (blocks, h, w, lanes),
                                               (plane, row, lanes, 1))

    def _read(self, mem: _Memories, loc: isa.Location, c: int, h: int, w: int,
              signed: bool, row: int, plane: int) -> np.ndarray:
        lanes = self.config.lanes
        region = self._window(mem, loc, layout.channel_blocks(c, lanes), h, w, row, plane)
        codes = region.transpose(0, 3, 1, 2).reshape(-1, h, w)[:c]
        return codes.view(np.int8).copy() if signed else codes.copy()

    def _write(self, mem: _Memories, loc: isa.Location, codes: np.ndarray, c_offset: int,
               row: int, plane: int):
        """Write ``codes`` (C, H, W) as channels ``c_offset..`` of a channel-blocked tensor."""
        lanes = self.config.lanes
        c, h, w = codes.shape
        region = self._window(mem, loc, layout.channel_blocks(c_offset + c, lanes), h, w, row,
                              plane)
        channels = np.arange(c_offset, c_offset + c)
        region[channels // lanes, :, :, channels % lanes] = codes.astype(np.int64) & 0xFF

    # -- one group --------------------------------------------------------------------------

    def _group(self, mem: _Memories, i: isa.Instruction, index: int):
        cfg = self.config
        block = bytes(mem.dram[i.params.offset:i.params.offset + layout.param_bytes(i, cfg)])
        params = layout.unpack_params(block, i, cfg)
        geo = layout.geometry(i, cfg, block)
        post = params["post"][0]
        stage = {name: k for k, name in enumerate(layout.STAGES)}

        def qout(name):
            k = stage[name]
            signed = bool(post["signed"][k])
            return int(post["zp"][k]), signed, numeric.qrange(signed)

        x = self._read(mem, i.input, i.in_c, i.in_h, i.in_w, bool(i.in_signed), geo.in_row,
                       geo.in_plane)
        cur_zp, cur_signed = i.in_zp, bool(i.in_signed)
        if i.in_transform == isa.InputTransform.CHANNEL_TABLE:
            cur_zp, cur_signed, _ = qout("in_transform")
            tables = layout.unpack_channel_tables(params["channel_table"], cfg.lanes, i.in_c)
            x = numeric.apply_table(x, tables.astype(np.int8 if cur_signed else np.uint8),
                                    bool(i.in_signed))
        if i.conv != ConvKind.NONE:
            wbytes = layout.weight_bytes(i, cfg)
            w = layout.unpack_weights(bytes(mem.dram[i.weights.offset:i.weights.offset + wbytes]),
                                      i, cfg)
            n = i.out_c
            sums = numeric.conv_accumulate(
                x, cur_zp, w, params["weight_zp"][:n], None, (i.sh, i.sw),
                (i.pad_top, i.pad_left, i.pad_bottom, i.pad_right),
                depthwise=i.conv == ConvKind.DEPTHWISE)
            sums = self._carry(sums, i, index)
            acc = sums.astype(np.int64) + params["bias"][:n].astype(np.int64)[:, None, None]
            if acc.size and (acc.min() < -2**31 or acc.max() >= 2**31):
                raise OverflowError(f"group {index}: convolution accumulator exceeds int32")
            cur_zp, cur_signed, (lo, hi) = qout("conv")
            y = numeric.requantize(acc, params["multiplier"][:n], cur_zp, lo, hi)
        else:
            y = x.astype(np.int32)

        def table(values, name):
            zp, signed, _ = qout(name)
            t = params["act_table"].astype(np.int8 if signed else np.uint8).astype(np.int32)
            return t[values & 0xFF], zp, signed

        if i.act == Activation.TABLE and (i.eltwise == Eltwise.NONE or
                                          i.act_order == ActOrder.BEFORE_ELTWISE):
            y, cur_zp, cur_signed = table(y, "act")
        if i.eltwise != Eltwise.NONE:
            zp, signed, _ = qout("eltwise")
            if eltwise_reads_map(i.eltwise):
                h, w_ = layout.conv_output_hw(i)
                b = self._read(mem, i.shortcut, i.out_c, h, w_, bool(i.sc_signed), geo.sc_row,
                               geo.sc_plane)
            else:
                if geo.sc_plane != cfg.lanes:
                    raise GoldenError(f"group {index}: a CHANNEL_SCALE vector's blocks are one "
                                      f"word apart; the window record says {geo.sc_plane} "
                                      f"bytes, not {cfg.lanes}")
                b = self._read(mem, i.shortcut, i.out_c, 1, 1, bool(i.sc_signed), cfg.lanes,
                               cfg.lanes)
            c0, c1, c2 = (float(v) for v in post["eltwise_const"])
            if i.eltwise == Eltwise.ADD:
                a_codes, b_codes = (b, y) if post["eltwise_swap"] else (y, b)
                y = numeric.qlinear_add_codes(a_codes, b_codes, c0, c1, c2, signed)
            else:
                y = numeric.qlinear_mul_codes(y, cur_zp, b, i.sc_zp, c0, zp, signed)
            cur_zp, cur_signed = zp, signed
            if i.act == Activation.TABLE and i.act_order == ActOrder.AFTER_ELTWISE:
                y, cur_zp, cur_signed = table(y, "act_after")
        if i.act == Activation.CLAMP:
            y = np.clip(y, i.clamp_lo, i.clamp_hi)
        pooled_hw = (i.out_h // 2, i.out_w // 2) if i.upsample else (i.out_h, i.out_w)
        if i.pool == Pool.MAX:
            y = numeric.max_pool(y, i.pool_size, i.pool_stride, i.pool_pad, pooled_hw)
        elif i.pool == Pool.GLOBAL_AVG:
            zp, signed, _ = qout("pool")
            y = numeric.global_avg_pool_codes(y, cur_zp, float(post["pool_const"][0]), zp,
                                              signed)
            cur_zp, cur_signed = zp, signed
        elif i.pool == Pool.AVG:
            zp, signed, _ = qout("pool")
            x_scale, y_scale = (float(v) for v in post["pool_const"])
            y = numeric.qlinear_avg_pool(
                y, x_scale, cur_zp, y_scale, zp, signed, i.pool_size, i.pool_stride,
                i.pool_pad, bool(i.pool_count_pad), out_hw=pooled_hw)
            cur_zp, cur_signed = zp, signed
        if i.upsample:
            y = numeric.upsample_nearest2x(y)
        if (cur_zp, cur_signed) != (i.out_zp, bool(i.out_signed)):
            raise GoldenError(f"group {index}: the last stage produces zp {cur_zp} "
                              f"{'int8' if cur_signed else 'uint8'}, the instruction says "
                              f"{i.out_zp} {'int8' if i.out_signed else 'uint8'}")
        if y.shape != (i.out_c, i.out_h, i.out_w):
            raise GoldenError(f"group {index}: computed {y.shape}, instruction says "
                              f"{(i.out_c, i.out_h, i.out_w)}")
        self._write(mem, i.output, y, i.out_c_offset, geo.out_row, geo.out_plane)

    def _carry(self, sums: np.ndarray, i: isa.Instruction, index: int) -> np.ndarray:
        """The partial-sum buffer between groups of an input-channel split: ``psum_keep``
        adds what the previous group held (it must be a ``psum_hold`` group of the same output
        channels and width); ``psum_hold`` holds the sums (without bias) for the next group.
        Any other group's convolution overwrites the buffer."""
        held, self._held = self._held, None
        if i.psum_keep:
            if held is None or held.shape != sums.shape:
                raise GoldenError(
                    f"group {index}: psum_keep, but the previous group held "
                    f"{'no partial sums' if held is None else f'sums of shape {held.shape}'} "
                    f"for these {sums.shape}")
            sums = sums + held
        if i.psum_hold:
            self._held = sums
        return sums

    # -- whole programs ---------------------------------------------------------------------

    def run(self, blob: bytes) -> image.Image:
        """Execute an image; returns it with DRAM as the accelerator leaves it."""
        img = image.unpack(blob, self.config)
        mem = _Memories(img.dram, tuple(bytearray(n) for n in self.config.buffer_bytes))
        self._held = None
        for index, instr in enumerate(img.program):
            self._group(mem, instr, index)
        return img

    def outputs(self, blob: bytes) -> list[np.ndarray]:
        """Execute an image and return its OUTPUT sections as ``(C, H, W)`` arrays."""
        img = self.run(blob)
        return [img.tensor(image.SectionKind.OUTPUT, s.index, self.config.lanes)
                for s in img.layout.of_kind(image.SectionKind.OUTPUT)]


def run_image(blob: bytes, config: HwConfig) -> list[np.ndarray]:
    return GoldenModel(config).outputs(blob)
