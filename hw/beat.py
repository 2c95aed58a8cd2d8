"""The feature-map stream beat shared by the post-processing blocks.

One beat carries one pixel of one channel block: ``lanes`` raw 8-bit codes, in the order of the
channel-blocked layout ``[C/L][H][W][L]`` (:mod:`sfnpu.layout`).
"""

from amaranth.lib import data, stream

__all__ = ["code_beat"]


def code_beat(lanes: int) -> stream.Signature:
    """Stream signature of ``lanes`` 8-bit codes per beat."""
    return stream.Signature(data.ArrayLayout(8, lanes))
