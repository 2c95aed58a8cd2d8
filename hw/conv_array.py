"""Convolution kernel array: Ti·To products per cycle on shared MACs (ShortcutFusion Fig. 8).

Structure
---------
``To/2`` rows of ``Ti`` :class:`~sfnpu.hw.mac.SharedMac` each — one row per pair of output
channels, one column per input channel — followed by three adder trees per row and one int32
accumulator per output channel. Every cycle the array takes one *step*: a window step from the
row buffer (:mod:`sfnpu.hw.row_buffer`) and a weight step from the double weight-block buffer
(:mod:`sfnpu.hw.weight_buffer`), joined: a step fires when both streams are valid.

Normal convolution (one tap of ``Ti`` input channels per cycle). MAC ``(j, i)`` multiplies input
channel ``i`` of the tap by the weights of output channels ``2j`` and ``2j+1``: both products
share the input, which is what the packed multiplier needs. A step's weight is one ``To×Ti``
block of the hardware layout ``[O/To][I/Ti][kh][kw][To][Ti]`` (:mod:`sfnpu.layout`). Row ``j``
sums its ``p0`` over ``i`` for channel ``2j`` and its ``p1`` for channel ``2j+1``.

Depthwise convolution (``G = Ti/2`` taps of each of ``To`` channels per cycle). There is no
shared input, so each MAC yields one product: the first ``Ti/2`` MACs of row ``j`` compute
channel ``2j``, the other ``Ti/2`` channel ``2j+1``, each on taps ``t·G … t·G+G−1`` of the
kernel in raster order. Each half of the ``p0`` tree is one channel's sum. A step's weight is
``G`` consecutive ``L``-channel taps of the layout ``[C/L][kh][kw][L]`` (zero-filled past the
kernel). With the paper's Ti = 64 this is Fig. 8 exactly: 32 taps per channel, so a 1×1, 3×3 or
5×5 kernel per cycle and a 7×7 in two.

Operands are ``x − x_zp`` and ``w − w_zp`` (9-bit signed); window positions outside the image
and taps past the kernel carry ``x_zp``, so they contribute exactly zero. The accumulator is
cleared by the first step of a pixel and emitted by its last (``first``/``last`` in the window
step): one ``To``-lane int32 result per output pixel and *pass*.

Schedule
--------
A *pass* is one output row of one weight set: normal convolution runs ``OB·IB`` passes per output
row (``for ob: for ib``, ``OB = ⌈out_c/To⌉``, ``IB = ⌈in_c/Ti⌉``), a depthwise one ``CB =
⌈C/To⌉`` (one per channel block). Inside a pass, pixels ``ox = 0 … OW−1``, and per pixel
``P`` consecutive steps:

* normal: ``P = kh·kw`` (one tap per step, raster order);
* depthwise: ``P = ⌈kh·kw / (Ti/2)⌉``.

The row buffer builds each window from kernel columns: ``kh`` rows of one column per cycle from
its ``ROW_BUFFER_ROWS`` (6) row banks (a 7-row column takes two cycles: ``parts =
⌈kh/6⌉``), ``F₀ = parts·kw`` cycles for the first window of a pass and ``F = parts·min(sw,
kw)`` for the next ones (the rest slides). Fetching overlaps the previous pixel's steps, so a pixel costs ``max(P, F)`` cycles and
there is no bubble between pixels, passes or rows while input rows are present. Cycles per output
row, with ``OW`` output columns:

* normal: ``OB·IB·OW·kh·kw`` — the fetch is always hidden (``kh·kw ≥ parts·kw``);
* depthwise: ``CB·(max(P, F₀) + (OW−1)·max(P, F))``.

Per output pixel (all channels), in steady state:

* normal: ``kh·kw·⌈in_c/Ti⌉·⌈out_c/To⌉`` cycles (1 tap × Ti × To MACs per cycle);
* depthwise: ``⌈C/To⌉·max(⌈kh·kw/(Ti/2)⌉, ⌈kh/6⌉·min(sw, kw))`` cycles.

For example, per block of channels: Ti = To = 8, depthwise 3×3 / 5×5 / 7×7: 3 / 7 / 13 cycles
(14 for the first pixel of a 7×7 pass); Ti = To = 64: 1 / 1 / 2 (a stride-2 3×3 or 5×5 is
fetch-bound at 2; the first pixel of a pass costs ``parts·kw``).

The stride only changes which columns are fetched; padding only marks fetched positions as
``x_zp`` (no extra cycles); ``kh ≠ kw`` is handled by the same loops. :func:`steps_per_pixel`,
:func:`fetch_cycles` and :func:`row_cycles` are these formulas; :func:`sfnpu.hw.row_buffer.
window_schedule` adds the waits for input rows and the pipeline latencies, cycle for cycle.

Timing of the array itself: fully pipelined, no back-pressure; the result of a pixel whose last
step fires in cycle *k* is on ``o_stream`` in cycle *k* + :func:`array_latency` (operand
register, the MAC's two stages, one adder-tree register per three levels, the accumulator:
5 cycles for Ti ≤ 8, 6 for Ti = 64).

Only ``ti == to`` is supported (all reference configurations): then ``lanes = Ti = To`` and a
window word, a depthwise channel block and a weight block line up without lane offsets.
"""

from __future__ import annotations

from math import ceil

from amaranth.hdl import Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu.config import ROW_BUFFER_ROWS, HwConfig, depthwise_taps

from .mac import OPERAND_BITS, PRODUCT_BITS, SharedMac

__all__ = [
    "ACC_BITS", "ConvArray", "depthwise_taps", "window_step_layout", "weight_step_layout",
    "steps_per_pixel", "fetch_parts", "fetch_cycles", "passes_per_row", "row_cycles",
    "tree_stages", "array_latency",
]

#: Accumulator width: the numeric contract's exact int32.
ACC_BITS = 32
#: Adder-tree levels between two pipeline registers.
_TREE_LEVELS_PER_STAGE = 3


def _check(config: HwConfig):
    if config.ti != config.to:
        raise ValueError(f"config {config.name!r}: the convolution datapath needs ti == to "
                         f"(got ti={config.ti}, to={config.to})")


def window_step_layout(config: HwConfig) -> data.StructLayout:
    """One step of a window: ``depthwise_taps`` taps of ``lanes`` raw 8-bit channels (a normal
    convolution uses tap 0 only); ``first``/``last`` mark the pixel's first and last step."""
    return data.StructLayout({
        "taps": data.ArrayLayout(data.ArrayLayout(unsigned(8), config.lanes),
                                 depthwise_taps(config)),
        "first": 1,
        "last": 1,
    })


def weight_step_layout(config: HwConfig) -> data.StructLayout:
    """One step of weights: a ``To×Ti`` block (normal; element ``o·Ti + i``) or ``Ti/2`` taps
    of ``To`` channels (depthwise; element ``tap·To + c``), and the weight zero point of each of
    the ``To`` output channels."""
    return data.StructLayout({
        "weights": data.ArrayLayout(signed(8), config.ti * config.to),
        "zero_points": data.ArrayLayout(signed(8), config.to),
    })


# -- the schedule as formulas (see the module docstring) ------------------------------------------

def steps_per_pixel(depthwise: bool, kh: int, kw: int, config: HwConfig) -> int:
    """``P``: cycles the array spends on one pixel of one pass."""
    return ceil(kh * kw / depthwise_taps(config)) if depthwise else kh * kw


def fetch_parts(kh: int) -> int:
    """Cycles to read one kernel column from the row banks (one row per bank per cycle)."""
    return ceil(kh / ROW_BUFFER_ROWS)


def fetch_cycles(kh: int, kw: int, sw: int, first: bool) -> int:
    """``F₀`` (first window of a pass: all columns) or ``F`` (the columns that slide in)."""
    return fetch_parts(kh) * (kw if first else min(sw, kw))


def passes_per_row(depthwise: bool, in_c: int, out_c: int, config: HwConfig) -> int:
    """Weight sets per output row: ``OB·IB`` (normal) or ``CB`` (depthwise)."""
    if depthwise:
        return ceil(in_c / config.to)
    return ceil(out_c / config.to) * ceil(in_c / config.ti)


def row_cycles(depthwise: bool, kh: int, kw: int, sw: int, out_w: int, in_c: int, out_c: int,
               config: HwConfig) -> int:
    """Cycles of one output row (all passes) while input rows are present."""
    p = steps_per_pixel(depthwise, kh, kw, config)
    per_pass = (max(p, fetch_cycles(kh, kw, sw, True))
                + (out_w - 1) * max(p, fetch_cycles(kh, kw, sw, False)))
    return passes_per_row(depthwise, in_c, out_c, config) * per_pass


def tree_stages(config: HwConfig) -> int:
    """Pipeline registers of the adder trees: log2(Ti) levels (the p1 tree; each p0 half has
    one fewer), a register every few levels and at the end."""
    return max(1, ceil((config.ti.bit_length() - 1) / _TREE_LEVELS_PER_STAGE))


def array_latency(config: HwConfig) -> int:
    """Cycles from the firing of a pixel's last step to its result on ``o_stream``: operand
    register, the shared MAC's two stages, the adder trees, the accumulator."""
    return 1 + SharedMac.LATENCY + tree_stages(config) + 1


# -- the array ----------------------------------------------------------------------------------

class ConvArray(wiring.Component):
    """``Ti × To`` products per cycle for normal and depthwise convolution, int32 results.

    Parameters
    ----------
    config : HwConfig
        ``ti``/``to`` (equal) size the array; ``dsp_packing`` selects the packed multiplier of
        :class:`~sfnpu.hw.mac.SharedMac` (same results and latency either way).

    Signature
    ---------
    windows : In(stream.Signature(window_step_layout(config)))
        Window steps from the row buffer.
    weights : In(stream.Signature(weight_step_layout(config)))
        Weight steps from the weight buffer. A step fires when both streams are valid; the
        array never stalls (each ``ready`` is the other stream's ``valid``).
    depthwise : In(1)
        Depthwise mapping (see the module docstring); held for the whole convolution.
    x_signed : In(1)
        The input feature map is int8 (1) or uint8 (0).
    x_zero_point : In(8)
        Input zero point, raw 8 bits read with ``x_signed``.
    o_stream : Out(stream.Signature(ArrayLayout(signed(32), To), always_ready=True))
        Per pixel and pass: ``Σ (x − x_zp)(w − w_zp)`` over the pass's taps and channels,
        lane ``o`` = output channel ``o`` of the weight set (normal) or channel ``o`` of the
        channel block (depthwise).
    """

    def __init__(self, config: HwConfig):
        _check(config)
        self.config = config
        self.packing = config.dsp_packing
        self.tree_stages = tree_stages(config)
        super().__init__({
            "windows": In(stream.Signature(window_step_layout(config))),
            "weights": In(stream.Signature(weight_step_layout(config))),
            "depthwise": In(1),
            "x_signed": In(1),
            "x_zero_point": In(8),
            "o_stream": Out(stream.Signature(data.ArrayLayout(signed(ACC_BITS), config.to),
                                             always_ready=True)),
        })

    @property
    def latency(self) -> int:
        """Cycles from the firing of a pixel's last step to its result on ``o_stream``."""
        return array_latency(self.config)

    def elaborate(self, platform):
        m = Module()
        ti, to = self.config.ti, self.config.to
        half = ti // 2
        taps = self.windows.payload.taps
        weights = self.weights.payload.weights
        zero_points = self.weights.payload.zero_points
        depthwise = self.depthwise

        # Join of the two input streams; the array itself never applies back-pressure.
        fire = self.windows.valid & self.weights.valid
        m.d.comb += [
            self.windows.ready.eq(self.weights.valid),
            self.weights.ready.eq(self.windows.valid),
        ]

        def delayed(value, cycles, name):
            for k in range(cycles):
                reg = Signal.like(value, name=f"{name}_d{k + 1}")
                m.d.sync += reg.eq(value)
                value = reg
            return value

        def extend(byte):
            """Raw 8-bit value as int8 or uint8."""
            return Mux(self.x_signed, byte.as_signed(), byte)

        x_zero_point = extend(self.x_zero_point)

        # -- operand stage: pick each MAC's operands for the mode, subtract zero points ----------
        macs = [[None] * ti for _ in range(to // 2)]
        for j in range(to // 2):
            for i in range(ti):
                mac = macs[j][i] = SharedMac(self.packing)
                m.submodules[f"mac_{j}_{i}"] = mac
                # Depthwise: channel c of the pair, tap slot s of the step.
                c, s = 2 * j + (i >= half), i % half
                x_raw = Mux(depthwise, taps[s][c], taps[0][i])
                w0 = Mux(depthwise, weights[s * to + c], weights[2 * j * ti + i])
                z0 = Mux(depthwise, zero_points[c], zero_points[2 * j])
                w1 = weights[(2 * j + 1) * ti + i]
                z1 = zero_points[2 * j + 1]
                x = Signal(signed(OPERAND_BITS), name=f"x_{j}_{i}", reset_less=True)
                wa = Signal(signed(OPERAND_BITS), name=f"w0_{j}_{i}", reset_less=True)
                wb = Signal(signed(OPERAND_BITS), name=f"w1_{j}_{i}", reset_less=True)
                # |x − x_zp| and |w − w_zp| are at most 255: 9 bits hold the exact difference.
                m.d.sync += [
                    x.eq(extend(x_raw) - x_zero_point),
                    wa.eq(w0 - z0),
                    wb.eq(w1 - z1),
                ]
                m.d.comb += [
                    mac.x.eq(x), mac.w0.eq(wa), mac.w1.eq(wb),
                    mac.depthwise.eq(depthwise),
                ]
        operand_valid = Signal()
        m.d.sync += operand_valid.eq(fire)
        for row in macs:
            for mac in row:
                m.d.comb += mac.valid.eq(operand_valid)
        first = delayed(self.windows.payload.first, 1, "first")
        last = delayed(self.windows.payload.last, 1, "last")

        # -- adder trees: per MAC row, the two halves of p0 and all of p1 -----------------------
        def tree(values, name):
            """Balanced sum, registered every _TREE_LEVELS_PER_STAGE levels and at the end, then
            padded with delay registers to exactly ``tree_stages`` registers."""
            values, level, stages = list(values), 0, 0
            while True:
                if len(values) > 1:
                    values = [values[k] + values[k + 1] if k + 1 < len(values) else values[k]
                              for k in range(0, len(values), 2)]
                    level += 1
                if len(values) == 1 or level % _TREE_LEVELS_PER_STAGE == 0:
                    registered = []
                    for k, v in enumerate(values):
                        reg = Signal(signed(PRODUCT_BITS + level), reset_less=True,
                                     name=f"{name}_s{stages}_{k}")
                        m.d.sync += reg.eq(v)
                        registered.append(reg)
                    values, stages = registered, stages + 1
                if len(values) == 1:
                    break
            return delayed(values[0], self.tree_stages - stages, name)

        sums = []
        for j, row in enumerate(macs):
            top = tree([mac.p0 for mac in row[:half]], f"top_{j}")
            bottom = tree([mac.p0 for mac in row[half:]], f"bottom_{j}")
            odd = tree([mac.p1 for mac in row], f"odd_{j}")
            sums.append((top, bottom, odd))
        pipe = SharedMac.LATENCY + self.tree_stages
        step_valid = delayed(operand_valid, pipe, "step_valid")
        step_first = delayed(first, pipe, "step_first")
        step_last = delayed(last, pipe, "step_last")

        # -- accumulators: clear on a pixel's first step, emit on its last -----------------------
        for j, (top, bottom, odd) in enumerate(sums):
            lanes = ((2 * j, Mux(depthwise, top, top + bottom)),
                     (2 * j + 1, Mux(depthwise, bottom, odd)))
            for o, step_sum in lanes:
                acc = Signal(signed(ACC_BITS), name=f"acc_{o}", reset_less=True)
                total = Mux(step_first, 0, acc) + step_sum
                with m.If(step_valid):
                    m.d.sync += acc.eq(total)         # wraps like int32: exact when in range
                with m.If(step_valid & step_last):
                    m.d.sync += self.o_stream.payload[o].eq(total)
        m.d.sync += self.o_stream.valid.eq(step_valid & step_last)
        return m
