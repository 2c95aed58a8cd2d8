"""The feature-map stream beat shared by the post-processing blocks.

One beat carries one pixel of one channel block: ``lanes`` raw 8-bit codes, in the order of the
channel-blocked layout ``[C/L][H][W][L]`` (:mod:`sfnpu.layout`).
"""

from amaranth.lib import data, stream

__all__ = ["code_beat", "pass_through"]


def code_beat(lanes: int) -> stream.Signature:
    """Stream signature of ``lanes`` 8-bit codes per beat."""
    return stream.Signature(data.ArrayLayout(8, lanes))


def pass_through(i_stream, o_stream) -> list:
    """The assignments of a disabled stage: input beats go to the output unchanged, and the
    output's back-pressure to the input."""
    return [
        o_stream.payload.eq(i_stream.payload),
        o_stream.valid.eq(i_stream.valid),
        i_stream.ready.eq(o_stream.ready),
    ]
