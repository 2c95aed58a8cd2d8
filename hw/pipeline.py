"""Pipeline registers and rounding shared by the float32-exact arithmetic blocks.

:func:`stage` and :func:`delay` build the reset-less datapath registers of the requantiser, the
SE channel scale and the QLinearAdd unit; :func:`round_half_even` is the one round-to-nearest,
ties-to-even step they (and the average pool) apply to significands and fixed-point values.
"""

from __future__ import annotations

from amaranth.hdl import Const, Signal

__all__ = ["stage", "delay", "round_half_even"]


def stage(m, value, name: str, shape=None):
    """One pipeline register holding ``value``; datapath registers need no reset."""
    reg = Signal(shape if shape is not None else value.shape(), name=name, reset_less=True)
    m.d.sync += reg.eq(value)
    return reg


def delay(m, value, cycles: int, name: str):
    """``value`` through ``cycles`` pipeline registers."""
    for i in range(cycles):
        value = stage(m, value, f"{name}_{i + 1}")
    return value


def round_half_even(value, drop: int):
    """``value`` shifted right by ``drop`` bits, rounded to nearest, ties to even.
    The result is one bit wider than ``value[drop:]`` (the rounding may carry out)."""
    kept = value[drop:]
    guard = value[drop - 1]
    sticky = value[:drop - 1].any() if drop > 1 else Const(0)
    return kept + (guard & (sticky | kept[0]))
