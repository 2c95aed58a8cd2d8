"""Convolution datapath (hw/row_buffer.py → hw/conv_array.py ← hw/weight_buffer.py) on Verilator
against sfnpu.numeric.conv_accumulate, and its cycle counts against the documented schedule.

A small engine wraps the three blocks with two simulation-only sources (memories loaded through
ports, then streamed after ``start``), so a whole convolution runs as one VectorHarness call with
no per-cycle Python. Every pass's int32 results (one output row × one weight set) are compared
with ``conv_accumulate`` on the pass's channel block, and their sum over input blocks with
``conv_accumulate`` on all channels; the cycle in which every result appears must equal
:func:`sfnpu.hw.row_buffer.window_schedule` plus the array latency, and, where input rows never
run late, the closed-form :func:`sfnpu.hw.conv_array.row_cycles`.

One Verilator build per (Ti = To, packing); the cases of one build run in one test.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu.config import ROW_BUFFER_ROWS, get_config
from sfnpu.hw.conv_array import array_latency, depthwise_taps, row_cycles, steps_per_pixel, \
    weight_step_layout
from sfnpu.hw.row_buffer import window_params, window_params_layout, window_schedule
from sfnpu.hw.datapath import ConvDatapath
from sfnpu.hw.weight_buffer import USES_BITS
from sfnpu.isa import ConvKind, Instruction
from sfnpu.layout import channel_blocks, conv_output_hw, pack_tensor, pack_weights
from sfnpu.numeric import conv_accumulate
from sfnpu.tb.verilator import REPO_ROOT, VectorHarness, simulate_vectors

SOURCE_DEPTH = 1024         # source memories of the test engine (input words / weight steps)
RANDOM_CASES = 40           # per build, after the table of CASES


# -- test engine ----------------------------------------------------------------------------------

class MemorySource(wiring.Component):
    """Simulation-only stream source: a memory written through a port, then, after ``start``,
    entries 0 … ``count − 1`` streamed ``repeat`` times over, one per cycle while ready."""

    def __init__(self, shape, depth: int):
        self.shape, self.depth = shape, depth
        super().__init__({
            "load_en": In(1), "load_addr": In(range(depth)), "load_data": In(shape),
            "count": In(range(depth + 1)), "repeat": In(16), "start": In(1),
            "o_stream": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = memory = Memory(shape=self.shape, depth=self.depth, init=[])
        write, read = memory.write_port(), memory.read_port()
        index = Signal(range(self.depth + 1))
        rounds = Signal(16)
        active = Signal()
        out = self.o_stream
        advance = ~out.valid | out.ready
        have = active & (rounds < self.repeat)
        m.d.comb += [
            write.en.eq(self.load_en), write.addr.eq(self.load_addr),
            write.data.eq(self.load_data),
            read.addr.eq(index), read.en.eq(advance), out.payload.eq(read.data),
        ]
        with m.If(self.start):
            m.d.sync += [index.eq(0), rounds.eq(0), active.eq(1), out.valid.eq(0)]
        with m.Elif(advance):
            m.d.sync += out.valid.eq(have)
            with m.If(have & (index + 1 == self.count)):
                m.d.sync += [index.eq(0), rounds.eq(rounds + 1)]
            with m.Elif(have):
                m.d.sync += index.eq(index + 1)
        return m


class ConvEngine(wiring.Component):
    """The exported datapath (:class:`sfnpu.hw.datapath.ConvDatapath`: row buffer → array ←
    weight buffer) fed by two sources, with flat ports for VectorHarness: ``p_*`` are the row
    buffer's parameters, ``acc`` the array's To-lane int32 result."""

    def __init__(self, config):
        self.config = config
        lanes = config.lanes
        self.param_fields = [name for name, _ in window_params_layout(config)]
        params = {f"p_{name}": In(field.shape) for name, field in window_params_layout(config)}
        super().__init__({
            "start": In(1),
            "in_load": In(1), "in_addr": In(range(SOURCE_DEPTH)), "in_data": In(8 * lanes),
            "in_words": In(range(SOURCE_DEPTH + 1)),
            "w_load": In(1), "w_addr": In(range(SOURCE_DEPTH)),
            "w_data": In(data.Layout.cast(weight_step_layout(config)).size),
            "w_steps": In(range(SOURCE_DEPTH + 1)),
            "uses": In(USES_BITS), "x_signed": In(1),
            **params,
            "busy": Out(1),
            "acc_valid": Out(1),
            "acc": Out(32 * config.to),
        })

    def elaborate(self, platform):
        m = Module()
        config = self.config
        m.submodules.inputs = inputs = MemorySource(unsigned(8 * config.lanes), SOURCE_DEPTH)
        m.submodules.weight_source = weight_source = MemorySource(
            weight_step_layout(config), SOURCE_DEPTH)
        m.submodules.datapath = datapath = ConvDatapath(config)
        m.d.comb += [
            inputs.load_en.eq(self.in_load), inputs.load_addr.eq(self.in_addr),
            inputs.load_data.eq(self.in_data), inputs.count.eq(self.in_words),
            inputs.repeat.eq(1), inputs.start.eq(self.start),
            weight_source.load_en.eq(self.w_load), weight_source.load_addr.eq(self.w_addr),
            weight_source.load_data.eq(self.w_data), weight_source.count.eq(self.w_steps),
            # Row-reuse order: every output row replays all weight sets.
            weight_source.repeat.eq(self.p_out_h), weight_source.start.eq(self.start),
            datapath.start.eq(self.start), datapath.uses.eq(self.uses),
            datapath.x_signed.eq(self.x_signed),
            datapath.i_stream.payload.as_value().eq(inputs.o_stream.payload),
            datapath.i_stream.valid.eq(inputs.o_stream.valid),
            inputs.o_stream.ready.eq(datapath.i_stream.ready),
            self.busy.eq(datapath.busy),
            self.acc_valid.eq(datapath.o_stream.valid),
            self.acc.eq(datapath.o_stream.payload.as_value()),
        ]
        for name in self.param_fields:
            m.d.comb += getattr(datapath.params, name).eq(getattr(self, f"p_{name}"))
        wiring.connect(m, weight_source.o_stream, datapath.w_stream)
        return m


# -- cases ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    depthwise: bool
    k: tuple[int, int]
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]      # top, left, bottom, right
    in_c: int
    out_c: int
    hw: tuple[int, int]
    signed: bool


CASES = [
    Case("1x1 s1", False, (1, 1), (1, 1), (0, 0, 0, 0), 12, 20, (7, 9), False),
    Case("1x1 s2", False, (1, 1), (2, 2), (0, 0, 0, 0), 16, 8, (9, 10), True),
    Case("3x3 s1 pad 1", False, (3, 3), (1, 1), (1, 1, 1, 1), 10, 12, (8, 9), True),
    Case("3x3 s2 asym pad", False, (3, 3), (2, 2), (0, 1, 1, 0), 8, 8, (11, 10), False),
    Case("5x5 s1 asym pad", False, (5, 5), (1, 1), (2, 1, 0, 3), 9, 7, (9, 8), True),
    Case("5x5 s2 pad 2", False, (5, 5), (2, 2), (2, 2, 2, 2), 16, 16, (12, 11), False),
    Case("7x7 s2 pad 3 (stem)", False, (7, 7), (2, 2), (3, 3, 3, 3), 3, 8, (16, 15), False),
    Case("7x7 s1 asym pad", False, (7, 7), (1, 1), (6, 0, 1, 5), 5, 4, (9, 8), True),
    Case("1x7 s1 pad 0,3", False, (1, 7), (1, 1), (0, 3, 0, 3), 8, 8, (5, 12), True),
    Case("7x1 s(2,1)", False, (7, 1), (2, 1), (3, 0, 3, 0), 4, 8, (14, 6), False),
    Case("3x3 s(1,2)", False, (3, 3), (1, 2), (1, 0, 1, 2), 8, 16, (7, 12), True),
    Case("dw 3x3 s1 pad 1", True, (3, 3), (1, 1), (1, 1, 1, 1), 16, 16, (9, 10), True),
    Case("dw 3x3 s2 asym pad", True, (3, 3), (2, 2), (1, 0, 0, 1), 12, 12, (11, 9), False),
    Case("dw 5x5 s1 pad 2", True, (5, 5), (1, 1), (2, 2, 2, 2), 8, 8, (10, 9), False),
    Case("dw 5x5 s2 asym pad", True, (5, 5), (2, 2), (2, 1, 1, 2), 8, 8, (12, 13), True),
    Case("dw 7x7 s1 pad 3", True, (7, 7), (1, 1), (3, 3, 3, 3), 8, 8, (10, 9), True),
    Case("dw 1x1 s2", True, (1, 1), (2, 2), (0, 0, 0, 0), 8, 8, (6, 8), False),
]


def random_cases(rng, config, count: int) -> list[Case]:
    """Seeded random convolutions (any kernel side 1..7, strides, pads below the kernel,
    channel counts that leave partial blocks) that fit the row buffer and the sources."""
    cases = []
    while len(cases) < count:
        depthwise = bool(rng.random() < 0.4)
        k = tuple(int(v) for v in rng.integers(1, 8, 2))
        stride = tuple(int(v) for v in rng.integers(1, 3, 2))
        pads = tuple(int(rng.integers(0, k[i % 2])) for i in range(4))
        in_c = int(rng.integers(1, 3 * config.lanes))
        out_c = in_c if depthwise else int(rng.integers(1, 3 * config.to))
        hw = tuple(int(v) for v in rng.integers(max(k) // 2 + 1, 14, 2))
        case = Case(f"random {len(cases)}: {'dw ' if depthwise else ''}{k[0]}x{k[1]} "
                    f"s{stride} pads {pads} {in_c}->{out_c} {hw}", depthwise, k, stride, pads,
                    in_c, out_c, hw, bool(rng.random() < 0.5))
        instr = instruction(case, 0)
        if min(conv_output_hw(instr)) < 1:
            continue
        try:
            params = window_params(instr, config)
        except ValueError:                  # rows too wide, or too few for the kernel
            continue
        steps = steps_per_pixel(depthwise, *k, config)
        sets = params["repeats"] * params["blocks"]
        if params["in_h"] * params["row_words"] <= SOURCE_DEPTH and sets * steps <= SOURCE_DEPTH:
            cases.append(case)
    return cases


def instruction(case: Case, x_zp: int) -> Instruction:
    instr = Instruction(
        conv=ConvKind.DEPTHWISE if case.depthwise else ConvKind.NORMAL,
        kh=case.k[0], kw=case.k[1], sh=case.stride[0], sw=case.stride[1],
        pad_top=case.pads[0], pad_left=case.pads[1], pad_bottom=case.pads[2],
        pad_right=case.pads[3], in_h=case.hw[0], in_w=case.hw[1], in_c=case.in_c,
        out_c=case.in_c if case.depthwise else case.out_c, in_signed=int(case.signed),
        in_zp=x_zp)
    out_h, out_w = conv_output_hw(instr)
    return instr.replace(out_h=out_h, out_w=out_w)


@dataclasses.dataclass
class Run:
    """One convolution: its data, port vectors, reference and schedule."""
    case: Case
    instr: Instruction
    x: np.ndarray
    x_zp: int
    w: np.ndarray
    w_zp: np.ndarray
    params: dict
    vectors: dict
    start: int          # vector index of the start pulse


def weight_sets(instr: Instruction, w: np.ndarray, w_zp: np.ndarray, config) -> np.ndarray:
    """The weight sets of one output row in pass order, as rows of 32-bit words of
    weight_step_layout: a step's weights, then the set's To weight zero points."""
    ti, to = config.ti, config.to
    depthwise = instr.conv == ConvKind.DEPTHWISE
    packed = np.frombuffer(pack_weights(w, instr, config), dtype=np.int8)
    steps = steps_per_pixel(depthwise, instr.kh, instr.kw, config)
    zp = np.zeros(channel_blocks(instr.out_c, to) * to, np.int8)
    zp[:w_zp.size] = w_zp
    zp = zp.reshape(-1, to)                               # one row per output block
    if depthwise:
        # [C/L][kh][kw][L]: Ti/2 consecutive taps per step, the last step zero-filled.
        per_step = depthwise_taps(config) * config.lanes
        kernels = packed.reshape(zp.shape[0], -1)
        taps = np.zeros((zp.shape[0], steps * per_step), np.int8)
        taps[:, :kernels.shape[1]] = kernels
        weights = np.zeros((zp.shape[0], steps, ti * to), np.int8)
        weights[:, :, :per_step] = taps.reshape(zp.shape[0], steps, per_step)
        set_zp = zp
    else:
        # [O/To][I/Ti][kh][kw][To][Ti]: one To×Ti block per step, sets in (ob, ib) order.
        weights = packed.reshape(-1, steps, to * ti)
        set_zp = np.repeat(zp, channel_blocks(instr.in_c, ti), axis=0)
    rows = np.concatenate(
        [weights, np.broadcast_to(set_zp[:, None, :], weights.shape[:2] + (to,))], axis=2)
    rows = rows.reshape(-1, ti * to + to)
    rows = np.pad(rows, ((0, 0), (0, -rows.shape[1] % 4)))
    return np.ascontiguousarray(rows).view(np.uint32)


def make_run(case: Case, config, rng) -> Run:
    lanes = config.lanes
    dtype = np.int8 if case.signed else np.uint8
    info = np.iinfo(dtype)
    x_zp = int(rng.integers(info.min, info.max + 1))
    instr = instruction(case, x_zp)
    x = rng.integers(info.min, info.max + 1, (case.in_c, *case.hw)).astype(dtype)
    out_c = instr.out_c
    w = rng.integers(-128, 128, (out_c, 1 if case.depthwise else case.in_c, *case.k)) \
        .astype(np.int8)
    w_zp = rng.integers(-128, 128, out_c).astype(np.int8)
    params = window_params(instr, config)

    # Input rows [y][cb][x] of the channel-blocked layout; padding channels hold x_zp.
    blocks = params["blocks"]
    packed = np.frombuffer(pack_tensor(x, lanes, fill=x_zp), dtype=np.uint8)
    rows = packed.reshape(blocks, case.hw[0], case.hw[1], lanes).transpose(1, 0, 2, 3)
    words = np.ascontiguousarray(rows).reshape(-1, lanes)
    in_words = np.zeros(words.shape[0], np.uint64)
    for lane in range(lanes):
        in_words |= words[:, lane].astype(np.uint64) << np.uint64(8 * lane)
    w_rows = weight_sets(instr, w, w_zp, config)
    assert in_words.size <= SOURCE_DEPTH and w_rows.shape[0] <= SOURCE_DEPTH

    load = max(in_words.size, w_rows.shape[0])
    total = load + 1 + run_budget(params, config, case)
    n_words = w_rows.shape[1]
    vectors = {
        "start": np.zeros(total, np.int64),
        "in_load": np.arange(total) < in_words.size,
        "in_addr": np.where(np.arange(total) < in_words.size, np.arange(total), 0),
        "in_data": np.zeros(total, np.uint64),
        "in_words": np.full(total, in_words.size),
        "w_load": np.arange(total) < w_rows.shape[0],
        "w_addr": np.where(np.arange(total) < w_rows.shape[0], np.arange(total), 0),
        "w_data": np.zeros((total, n_words), np.uint32),
        "w_steps": np.full(total, w_rows.shape[0]),
        "uses": np.full(total, params["out_w"]),
        "x_signed": np.full(total, int(case.signed)),
        **{f"p_{name}": np.full(total, value) for name, value in params.items()},
    }
    vectors["start"][load] = 1
    vectors["in_data"][:in_words.size] = in_words
    vectors["w_data"][:w_rows.shape[0]] = w_rows
    return Run(case, instr, x, x_zp, w, w_zp, params, vectors, load)


def run_budget(params: dict, config, case: Case) -> int:
    """Timeout: generous bound on the convolution's cycles."""
    steps = steps_per_pixel(bool(params["depthwise"]), params["kh"], params["kw"], config)
    passes = params["repeats"] * params["blocks"]
    per_window = max(steps, 2 * params["kw"]) + 2
    words = params["in_h"] * params["row_words"]
    return 2 * (params["out_h"] * passes * params["out_w"] * per_window + words) + 200


# -- reference, scoreboard and schedule ---------------------------------------------------------

def expected_results(run: Run, config) -> np.ndarray:
    """Every pass result in emission order, (results, To) int32, from conv_accumulate on the
    pass's channel block (lanes past the real channels are 0)."""
    c, ti, to = run.case, config.ti, config.to
    stride, pads = c.stride, c.pads
    p = run.params
    out_h, out_w = p["out_h"], p["out_w"]
    if c.depthwise:
        ref = conv_accumulate(run.x, run.x_zp, run.w, run.w_zp, None, stride, pads,
                              depthwise=True)
        cb = p["blocks"]
        lanes = np.zeros((cb * to, out_h, out_w), np.int32)
        lanes[:ref.shape[0]] = ref
        # [cb][lane][oy][ox] → [oy][cb][ox][lane]
        return lanes.reshape(cb, to, out_h, out_w).transpose(2, 0, 3, 1).reshape(-1, to)
    ob, ib = p["repeats"], p["blocks"]
    result = np.zeros((out_h, ob, ib, out_w, to), np.int32)
    for o in range(ob):
        for i in range(ib):
            outs = slice(o * to, min((o + 1) * to, c.out_c))
            ins = slice(i * ti, min((i + 1) * ti, c.in_c))
            part = conv_accumulate(run.x[ins], run.x_zp, run.w[outs, ins], run.w_zp[outs],
                                   None, stride, pads)
            result[:, o, i, :, :part.shape[0]] = part.transpose(1, 2, 0)
    return result.reshape(-1, to)


def full_accumulators(results: np.ndarray, run: Run, config) -> np.ndarray:
    """Normal convolution: the pass results summed over input blocks, as (O, OH, OW)."""
    p = run.params
    per = results.reshape(p["out_h"], p["repeats"], p["blocks"], p["out_w"], config.to)
    summed = per.astype(np.int64).sum(axis=2)                     # [oy][ob][ox][lane]
    acc = summed.transpose(1, 3, 0, 2).reshape(-1, p["out_h"], p["out_w"])
    return acc[:run.case.out_c]


def result_cycles(run: Run, config, latency: int) -> np.ndarray:
    """Vector index of every pass result under the documented schedule."""
    p = run.params
    steps = steps_per_pixel(bool(p["depthwise"]), p["kh"], p["kw"], config)
    # Cycle 0 is the one after start; the sources offer their first entry in cycle 1; the
    # first weight set is loaded by cycle steps, readable from steps + 1.
    emitted = np.array(window_schedule(p, config, first_word=1, weights_ready=steps + 2))
    # A window's step s fires in cycle emitted + 1 + s; its result follows the last step.
    return run.start + 1 + emitted + steps + latency


#: Table cases whose input rows arrive slower than the array consumes them (a stride-2 kernel
#: with few taps needs two new rows per output row, or only one slot is free to prefetch them),
#: by Ti. The other table cases must follow the closed-form row_cycles() on every output row;
#: for random cases it must be a lower bound.
INPUT_BOUND = {
    8: {"1x1 s2", "dw 3x3 s2 asym pad", "dw 1x1 s2"},
    4: {"1x1 s2", "5x5 s2 pad 2", "dw 5x5 s2 asym pad", "dw 1x1 s2"},
}


def closed_form_kind(case: Case, config) -> str:
    if case.name.startswith("random"):
        return "bound"
    return "bound, input-bound" if case.name in INPUT_BOUND[config.ti] else "exact"


def scoreboard(run: Run, outputs: dict, config, latency: int) -> dict:
    c, p = run.case, run.params
    expected = expected_results(run, config)
    valid = np.flatnonzero(outputs["acc_valid"])
    got = outputs["acc"][valid].view(np.int32)
    report = {"results": valid.size - expected.shape[0]}
    if valid.size == expected.shape[0]:
        report["mismatching results"] = int(np.count_nonzero((got != expected).any(axis=1)))
        if not c.depthwise:
            full = conv_accumulate(run.x, run.x_zp, run.w, run.w_zp, None, c.stride, c.pads)
            report["accumulators"] = int(np.count_nonzero(
                full_accumulators(got, run, config) != full))
        report["cycle differences"] = int(np.count_nonzero(
            valid - result_cycles(run, config, latency)))
        # Output-row durations (first result to first result) against the closed form.
        closed_form = row_cycles(c.depthwise, c.k[0], c.k[1], c.stride[1], p["out_w"],
                                 c.in_c, run.instr.out_c, config)
        durations = np.diff(valid[::p["repeats"] * p["blocks"] * p["out_w"]])
        kind = closed_form_kind(c, config)
        if kind == "exact":
            report["rows off the closed form"] = int(np.sum(durations != closed_form))
        else:
            report["rows faster than the closed form"] = int(np.sum(durations < closed_form))
        if kind == "bound, input-bound":
            report["input-bound"] = bool(np.any(durations > closed_form))
    report["busy at the end"] = int(outputs["busy"][-1])
    return report


def clean(run: Run, config) -> dict:
    report = {"results": 0, "mismatching results": 0, "cycle differences": 0}
    if not run.case.depthwise:
        report["accumulators"] = 0
    kind = closed_form_kind(run.case, config)
    if kind == "exact":
        report["rows off the closed form"] = 0
    else:
        report["rows faster than the closed form"] = 0
    if kind == "bound, input-bound":
        report["input-bound"] = True
    return {**report, "busy at the end": 0}


# -- tests --------------------------------------------------------------------------------------

def small_row_buffer(config, row_words: int):
    """``config`` with banks of ``row_words`` words: most cases then keep one to three rows per
    bank, so the ring wraps, rows are overwritten and the writer waits for released rows."""
    return config.replace(row_buffer_bytes=ROW_BUFFER_ROWS * config.lanes * row_words)


TINY = get_config("tiny")
BUILDS = {
    "ti8-separate": small_row_buffer(TINY, 32),
    "ti8-packed": small_row_buffer(TINY.replace(dsp_packing=True), 32),
    "ti4-packed": small_row_buffer(TINY.replace(ti=4, to=4, dsp_packing=True), 48),
    "ti4-separate": small_row_buffer(TINY.replace(ti=4, to=4), 48),
}


def build(name: str) -> VectorHarness:
    config = BUILDS[name]
    return VectorHarness(ConvEngine(config), "conv_engine",
                         REPO_ROOT / "build" / "test_hw_conv" / name,
                         # Runs are short: compile time dominates, so no C++ optimisation.
                         verilator_args=("-O1", "--x-assign", "fast", "--x-initial", "fast",
                                         "-MAKEFLAGS", "OPT_FAST=-O0", "-MAKEFLAGS", "OPT_SLOW=-O0"))


@pytest.mark.parametrize("name", list(BUILDS))
def test_conv_engine_on_verilator(name):
    config = BUILDS[name]
    harness = build(name)
    latency = array_latency(config)
    rng = np.random.default_rng(sum(map(ord, name)))
    failures = {}
    for case in CASES + random_cases(rng, config, RANDOM_CASES):
        run = make_run(case, config, rng)
        outputs = harness.run(run.vectors)
        report = scoreboard(run, outputs, config, latency)
        if report != clean(run, config):
            failures[case.name] = report
    assert failures == {}


def test_scoreboard_catches_a_wrong_zero_point_and_late_results():
    """Correct hardware, wrong expectations: an input zero point one off the reference's must
    change every result, and a schedule one cycle late must move every result."""
    config = BUILDS["ti4-packed"]
    harness = build("ti4-packed")
    latency = array_latency(config)
    run = make_run(CASES[2], config, np.random.default_rng(5))      # 3x3 s1 pad 1
    results = len(expected_results(run, config))
    shifted = dict(run.vectors, p_zero_point=(run.vectors["p_zero_point"] + 1) & 0xFF)
    report = scoreboard(run, harness.run(shifted), config, latency)
    assert report["mismatching results"] == results and report["cycle differences"] == 0

    report = scoreboard(run, harness.run(run.vectors), config, latency + 1)
    assert report["mismatching results"] == 0 and report["cycle differences"] == results


@pytest.mark.parametrize("case", [
    Case("small 3x3 s(2,1)", False, (3, 3), (2, 1), (1, 1, 0, 1), 6, 5, (5, 4), False),
    Case("small dw 7x7", True, (7, 7), (1, 2), (3, 2, 3, 3), 5, 5, (3, 4), True),
], ids=lambda c: c.name)
def test_amaranth_simulator_agrees(case):
    """The same engine in Amaranth's simulator (slow: small cases), same scoreboard."""
    config = BUILDS["ti4-packed"]
    run = make_run(case, config, np.random.default_rng(11))
    outputs = simulate_vectors(ConvEngine(config), run.vectors)
    assert scoreboard(run, outputs, config, array_latency(config)) == clean(run, config)
