"""A hand-assembled sample program: four groups covering both reuse modes, on-chip buffers,
depthwise and normal convolution, a fused residual add, an activation table and global
pooling. It exercises the ISA, the layouts and the DRAM image end to end without the compiler,
and serves as a fixture for the tests of those contracts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sfnpu import image, layout
from sfnpu.config import HwConfig
from sfnpu.isa import Activation, ConvKind, Eltwise, Instruction, Pool, Reuse, buffer, dram

__all__ = ["SampleImage", "sample_image"]


@dataclass
class SampleImage:
    program: list[Instruction]
    layout: image.ImageLayout
    blob: bytes
    input: np.ndarray


def _groups(channels: int, size: int) -> list[Instruction]:
    """The program with unresolved addresses (weights/params at 0, scratch at 0)."""
    half = size // 2
    same3 = dict(kh=3, kw=3, pad_top=1, pad_left=1, pad_bottom=1, pad_right=1)
    return [
        # Row reuse: 3×3 conv stride 2 + ReLU (as a clamp at the zero point), DRAM → DRAM.
        Instruction(conv=ConvKind.NORMAL, reuse=Reuse.ROW, **same3, sh=2, sw=2, in_h=size,
                    in_w=size, in_c=3, out_h=half, out_w=half, out_c=channels, in_zp=128,
                    out_zp=3, act=Activation.CLAMP, clamp_lo=3, clamp_hi=255),
        # Frame reuse: depthwise 3×3 + table activation, DRAM → buffer 0.
        Instruction(conv=ConvKind.DEPTHWISE, reuse=Reuse.FRAME, **same3, in_h=half, in_w=half,
                    in_c=channels, out_h=half, out_w=half, out_c=channels, in_zp=3, out_zp=-5,
                    out_signed=1, act=Activation.TABLE, output=buffer(0)),
        # Frame reuse: 1×1 conv + residual add of the first group's output (from DRAM: one
        # read port per buffer) + ReLU, buffer 0 → buffer 1.
        Instruction(conv=ConvKind.NORMAL, reuse=Reuse.FRAME, in_h=half, in_w=half,
                    in_c=channels, out_h=half, out_w=half, out_c=channels, in_signed=1,
                    in_zp=-5, out_signed=1, out_zp=-128, eltwise=Eltwise.ADD, sc_signed=0,
                    sc_zp=3, act=Activation.CLAMP, clamp_lo=-128, clamp_hi=127,
                    input=buffer(0), output=buffer(1)),
        # Global average pool, buffer 1 → DRAM output.
        Instruction(conv=ConvKind.NONE, reuse=Reuse.FRAME, pool=Pool.GLOBAL_AVG, in_h=half,
                    in_w=half, in_c=channels, out_h=1, out_w=1, out_c=channels, in_signed=1,
                    in_zp=-128, out_signed=1, out_zp=-128, input=buffer(1), last=1),
    ]


def _random_params(instr: Instruction, config: HwConfig, rng) -> dict[str, np.ndarray]:
    arrays = {}
    for s in layout.param_sections(instr, config):
        if s.name == "post":
            arrays[s.name] = np.zeros(1, layout.POST_RECORD)
        elif np.dtype(s.dtype).kind == "f":
            arrays[s.name] = rng.uniform(1e-3, 1e-2, s.count).astype(s.dtype)
        else:
            info = np.iinfo(s.dtype)
            arrays[s.name] = rng.integers(info.min, info.max, s.count, dtype=s.dtype,
                                          endpoint=True)
    return arrays


def sample_image(config: HwConfig, seed: int = 0, channels: int = 16,
                 size: int = 16) -> SampleImage:
    """Assemble, place and pack the sample program for ``config``."""
    rng = np.random.default_rng(seed)
    groups = _groups(channels, size)
    half = size // 2

    # Parameter section: each group's weights then its parameter block.
    params = bytearray()
    placed = []
    for instr in groups:
        blobs = {}
        if instr.conv != ConvKind.NONE:
            w = rng.integers(-128, 127, layout.weight_shape(instr), dtype=np.int8,
                             endpoint=True)
            blobs["weights"] = layout.pack_weights(w, instr, config)
        blobs["params"] = layout.pack_params(instr, config,
                                             **_random_params(instr, config, rng))
        offsets = {}
        for name, blob in blobs.items():
            offsets[name] = len(params)
            params += blob + bytes(-len(blob) % layout.param_align(config))
        placed.append(offsets)

    x = rng.integers(0, 255, (3, size, size), dtype=np.uint8, endpoint=True)
    lanes = config.lanes
    scratch = layout.tensor_bytes(channels, half, half, lanes)
    plan = image.plan(
        len(groups), len(params),
        inputs=[image.TensorDesc(3, size, size, signed=False, zero_point=128, scale=1 / 64)],
        outputs=[image.TensorDesc(channels, 1, 1, signed=True, zero_point=-128, scale=1 / 32)],
        scratch_bytes=scratch, lanes=lanes)

    base = plan.base(image.SectionKind.PARAMS)
    resolved = []
    for instr, offsets in zip(groups, placed):
        changes = {"params": dram(base + offsets["params"])}
        if "weights" in offsets:
            changes["weights"] = dram(base + offsets["weights"])
        resolved.append(instr.replace(**changes))
    scratch_at = dram(plan.base(image.SectionKind.SCRATCH))
    resolved[0] = resolved[0].replace(input=dram(plan.base(image.SectionKind.INPUT)),
                                      output=scratch_at)
    resolved[1] = resolved[1].replace(input=scratch_at)
    resolved[2] = resolved[2].replace(shortcut=scratch_at)
    resolved[3] = resolved[3].replace(output=dram(plan.base(image.SectionKind.OUTPUT)))

    blob = image.pack(plan, config, resolved, bytes(params), [x])
    return SampleImage(resolved, plan, blob, x)
