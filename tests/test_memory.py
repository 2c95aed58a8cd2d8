"""Reuse-aware memory optimizer: block detection, buffer equations, the allocation checker and
programs with on-chip tensors run through the golden model, identical to onnxruntime."""

import dataclasses
import fcntl
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from sfnpu import isa, layout
from sfnpu.models import builders
from sfnpu.compiler.blocks import BlockKind, detect_blocks
from sfnpu.compiler.cutpoints import evaluate, evaluation_config
from sfnpu.compiler.memory import (WEIGHT_READS, AllocationError, Budget, Policy, Violation,
                                   allocate, apply_policy, check_program, dense_requirements,
                                   frame_weights, place, requirements, staging, traffic)
from sfnpu.compiler.pipeline import compile_model, run_onnxruntime
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.config import get_config
from sfnpu.limits import chunk_blocks, overflows, store_words, with_held_weights
from sfnpu.isa import MemSpace, Reuse
from sfnpu.sim.cycle import CycleModel
from sfnpu.sim.golden import GoldenModel
from netbuild import Net

KiB = 1024
TINY = get_config("tiny")
#: tiny's datapath with buffers large enough for 64×64 networks in frame mode.
ROOMY = TINY.replace(name="tiny-roomy", buffer_bytes=(256 * KiB,) * 3,
                     row_buffer_bytes=48 * KiB, psum_buffer_bytes=64 * KiB,
                     write_buffer_bytes=8 * KiB)


def qdq_model(tmp_path_factory, name: str, size: int) -> Path:
    """A paper architecture at a small input, quantised once per test session — also across
    pytest-xdist workers, which share the parent of their temporary folders (the pattern of
    the xdist documentation, with a POSIX lock instead of the filelock package)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / "memory_models"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}_{size}.qdq.onnx"
    with open(folder / f"{name}_{size}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            partial = path.with_name(f"{name}_{size}.partial.onnx")
            quantize_model(builders.build(name, size), partial, CalibrationSource.synthetic(2))
            partial.rename(path)
    return path


def modes_from(blocks, frame_from: int) -> Policy:
    """Single cut: blocks before ``frame_from`` row reuse, the rest frame reuse."""
    return Policy(tuple(Reuse.ROW if b < frame_from else Reuse.FRAME
                        for b in range(len(blocks))), f"L={frame_from}")


def identical_to_onnxruntime(compiled, program, path, size, config) -> bool:
    model = onnx.load(str(path))
    name = model.graph.input[0].name
    x = np.random.default_rng(3).uniform(0, 1, (1, 3, size, size)).astype(np.float32)
    want = run_onnxruntime(model, {name: x})
    compiled = dataclasses.replace(compiled, program=program)
    got = compiled.run({name: x}, GoldenModel(config).outputs)
    return all(np.array_equal(want[k], got[k]) for k in want)


# --------------------------------------------------------------------------------------------
# A residual network small enough to check every number by hand
# --------------------------------------------------------------------------------------------

def small_residual(path, side=16):
    """x(8×side×side) → conv a(16) → conv b1 → conv b2 → conv + add(a) y → 1×1 conv c(8).
    Groups: g0 x→a, g1 a→b1, g2 b1→b2, g3 b2(+a)→y, g4 y→c; on tiny, 16-channel maps are
    2 blocks × side² × 8 lanes (4096 B at 16), 8-channel maps half that."""
    n = Net((8, side, side), name="small_residual")
    a = n.op("Relu", [n.conv("x", 8, 16, 3)])
    b1 = n.op("Relu", [n.conv(a, 16, 16, 3)])
    b2 = n.op("Relu", [n.conv(b1, 16, 16, 3)])
    y = n.op("Relu", [n.op("Add", [n.conv(b2, 16, 16, 3), a])])
    c = n.conv(y, 16, 8, 1)
    quantize_model(n.model([c]), path, CalibrationSource.arrays(n.samples(8)))
    return path


@pytest.fixture(scope="module")
def small_path(tmp_path_factory):
    return small_residual(tmp_path_factory.mktemp("small") / "small.qdq.onnx")


@pytest.fixture(scope="module")
def small(small_path):
    compiled = compile_model(small_path, TINY)
    return compiled, detect_blocks(compiled.graph, compiled.groups)


def placed(compiled, blocks, policy):
    alloc = allocate(compiled.graph, compiled.groups, compiled.program, blocks, policy)
    return alloc, place(compiled.program, compiled.groups, alloc)


def test_small_network_blocks(small):
    compiled, blocks = small
    assert [[n.op for n in g.nodes] for g in compiled.groups] == \
        [["conv"], ["conv"], ["conv"], ["conv", "add"], ["conv"]]
    assert [(b.kind, b.groups) for b in blocks] == [
        (BlockKind.SINGLE, (0,)), (BlockKind.RESIDUAL, (1, 2, 3)), (BlockKind.SINGLE, (4,))]
    assert blocks[1].entry == compiled.groups[0].output and blocks.cut is None


def test_buffer_equations_all_frame(small):
    compiled, blocks = small
    alloc, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    where = [(i.input.space, i.output.space) for i in instrs]
    # a in buffer 0 (kept for the shortcut), b1 in 1, b2 in 2 (not 0: g3 reads a from 0),
    # y back in 1; the network input and output stay in DRAM.
    assert where == [(MemSpace.DRAM, MemSpace.BUF0), (MemSpace.BUF0, MemSpace.BUF1),
                     (MemSpace.BUF1, MemSpace.BUF2), (MemSpace.BUF2, MemSpace.BUF1),
                     (MemSpace.BUF1, MemSpace.DRAM)]
    assert instrs[3].shortcut.space == MemSpace.BUF0
    # g0 is a normal conv with 2 output blocks reading DRAM: its weights (2 × 9 words of
    # 64 B) are smaller than its input (2048 B), so it reads the input once with the whole
    # weights in the store instead of staging it — eq. 1 counts them.
    assert staging(instrs[0], TINY) is None
    assert frame_weights(instrs[0], TINY) == 1152
    r = requirements(instrs, TINY, alloc.extents)
    assert r.buffers == r.algorithm1 == (4096, 4096, 4096)
    assert r.weight_buff == 1152
    assert r.row_buff == 6 * 16 * 16               # eq. 3: 6 rows × W × C (16-channel input)
    # Eqs. 4–5 on our controller: it sums input-channel blocks one output row at a time and
    # drains the write buffer in row segments, in frame reuse too (the paper: a whole frame).
    assert r.out_buff == 16 * 8 * 4                # eq. 4: W × To × 4 B
    assert r.write_buff == 16 * 8                  # eq. 5: the final layer's To-channel row
    assert r.sram == 3 * 4096 + 1536 + 512 + 128   # eq. 6
    # The RTL keeps the weights in a store of their own, beside buffer 1's feature maps.
    assert r.hardware_sram == 3 * 4096 + 1152 + 1536 + 512 + 128
    # eq. 7: 64-bit wide buffers of depth 512 → 1 × ⌈64/18⌉ = 4 each (×3, row, write);
    # 256-bit partial sums of depth 16 → 1 × ⌈256/18⌉ = 15.
    assert r.bram18k == 4 * 5 + 15
    t = traffic(instrs, TINY, compiled.groups, compiled.graph)
    assert (t.fm, t.eq8_fm) == (2048 + 2048, 0)    # only the network input and output
    assert t.weights == 16 * 8 * 9 + 3 * 16 * 16 * 9 + 8 * 16   # To×Ti-padded, read once
    report = check_program(compiled.graph, compiled.groups, instrs, TINY)
    assert report.extents == alloc.extents and report.on_chip_tensors == 4


def test_buffer_equations_all_row(small):
    compiled, blocks = small
    alloc, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.ROW))
    assert all(i.input.space == i.output.space == MemSpace.DRAM for i in instrs)
    r = requirements(instrs, TINY, alloc.extents)
    assert r.weight_buff == 16 * 16 * 9            # eq. 1: largest layer's weights …
    assert r.buffers == (0, 2304, 0)               # … preloaded into buffer 1 (eq. 2)
    assert (r.out_buff, r.write_buff) == (16 * 8 * 4, 16 * 8)   # one row of To channels
    assert r.sram == 2304 + 1536 + 512 + 128
    assert r.hardware_sram == r.sram               # no feature map on chip: the store alone
    t = traffic(instrs, TINY, compiled.groups, compiled.graph)
    # eq. 8: in + out of every conv, plus the shortcut read: a, b1, b2 and y are written once
    # and read once each (a twice), x read once, c written once.
    assert t.fm == t.eq8_fm == t.eq8_fm_dense == 2048 + 4 * 4096 + 5 * 4096 + 2048


def test_dense_accounting_is_the_papers(small):
    """Eqs. 1–6 and Algorithm 1 as the paper writes them. tiny's 8 lanes pad nothing in this
    network, so only the paper's own choices differ from ours."""
    compiled, blocks = small
    alloc, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.ROW))
    d = dense_requirements(instrs, TINY)
    # Eq. 4 takes frame layers only: no partial sums in an all-row policy (ours: one row).
    assert (d.weight_buff, d.buffers, d.row_buff, d.out_buff, d.write_buff) == \
        (16 * 16 * 9, (0, 2304, 0), 1536, 0, 16 * 8)
    t = traffic(instrs, TINY, compiled.groups, compiled.graph)
    assert (t.fm_dense, t.weights_dense) == (t.fm, t.weights)
    alloc, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    d, r = dense_requirements(instrs, TINY), requirements(instrs, TINY, alloc.extents)
    assert d.buffers == r.algorithm1 == (4096, 4096, 4096)
    # The paper's eqs. 4–5: a frame of partial sums and a frame-sized write buffer for the
    # final layer; ours one row of each.
    assert (d.out_buff, d.write_buff) == (16 * 16 * 8 * 4, 16 * 16 * 8)
    assert d.sram - r.sram == (16 * 16 - 16) * 8 * 4 + (16 * 16 - 16) * 8


def test_budget_names_what_does_not_fit(small, small_path):
    _, blocks = small
    # A row buffer of 1008 B: six 16-pixel rows of the 16-channel maps need 1536 B (eq. 3),
    # set by group 1, the first to read one.
    short = TINY.replace(name="tiny-short-rows", row_buffer_bytes=21 * 48)
    compiled = compile_model(small_path, TINY)
    alloc, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    over = Budget.of(short).violations(requirements(instrs, short, alloc.extents))
    assert [(v.resource, v.need, v.have, v.group) for v in over] == \
        [("row_buff", 1536, 1008, 1)]
    # The code generator runs that group in column strips on that configuration, each
    # reading windows of rows that fit (compiler.tiling).
    tiled = compile_model(small_path, short).program
    assert compiled.groups[1].name in {g.name.split(" [")[0] for g in tiled.groups if g.part}
    assert all(i.windowed for g, i in zip(tiled.groups, tiled.instructions) if g.part)
    # A budget the program compiles for (the writer takes rows in pieces) but a policy
    # exceeds (eq. 5: a whole output row) is refused by the optimizer, naming the buffer.
    narrow = TINY.replace(name="tiny-narrow-writes", write_buffer_bytes=64)
    with pytest.raises(AllocationError, match=r"write_buff needs 128 B .*> 64 B"):
        apply_policy(compile_model(small_path, narrow), Policy.uniform(blocks, Reuse.FRAME),
                     blocks)


def test_frame_weights_beyond_the_store_are_infeasible(tmp_path):
    """Frame reuse needs one output block's weights in the weight store (912 input channels of
    3×3: 114 blocks × 9 = 1026 words, tiny holds 1024); row reuse streams them. The policy
    is infeasible for the search and refused by apply_policy, as the controller would stop it
    with BUFFER_OVERFLOW."""
    n = Net((912, 4, 4), name="deep_input")
    path = tmp_path / "deep.qdq.onnx"
    quantize_model(n.model([n.conv("x", 912, 8, 3)]), path, CalibrationSource.arrays(n.samples(4)))
    compiled = compile_model(path, TINY)                 # row reuse: weights streamed per row
    blocks = detect_blocks(compiled.graph, compiled.groups)
    frame = Policy.uniform(blocks, Reuse.FRAME)
    message = "one output block's weights take 1026 words"
    with pytest.raises(AllocationError, match=message):
        apply_policy(compiled, frame, blocks)
    verdict = evaluate(compiled, blocks, frame, Budget.of(TINY))
    assert not verdict.feasible and message in verdict.error
    rows = Policy.uniform(blocks, Reuse.ROW)
    weights = layout.weight_bytes(compiled.program.instructions[0], TINY)
    # On tiny's weight store row reuse streams the weights once per output row: it runs, its
    # traffic counts every pass, and it breaks constraint 10 besides overflowing buffer 1.
    row = evaluate(compiled, blocks, rows, Budget.of(TINY))
    assert row.error is None and not row.feasible
    assert Violation(WEIGHT_READS, 4, 1, 0) in row.violations
    assert any(v.resource == "buffer 1" for v in row.violations)
    assert row.traffic.weights == 4 * weights
    # Unlimited buffers size the weight store by eq. 2: it holds the weights, read once.
    assert evaluation_config(compiled.program, blocks, rows, Budget.unlimited()) \
        .buffer_bytes[1] == weights
    row = evaluate(compiled, blocks, rows, Budget.unlimited())
    assert row.feasible and row.traffic.weights == weights
    assert row.requirements.buffers[1] == weights


# --------------------------------------------------------------------------------------------
# The checker refutes broken allocations
# --------------------------------------------------------------------------------------------

def relocate(groups, instrs, tensor, loc):
    """Move ``tensor`` (its writer and every reader) to ``loc``."""
    out = []
    for g, i in zip(groups, instrs):
        changes = {}
        if g.written == tensor:
            changes["output"] = loc
        if g.input == tensor:
            changes["input"] = loc
        if g.shortcut == tensor:
            changes["shortcut"] = loc
        out.append(i.replace(**changes))
    return out


def test_checker_accepts_the_allocation(small):
    compiled, blocks = small
    for cut in range(len(blocks) + 1):
        _, instrs = placed(compiled, blocks, modes_from(blocks, cut))
        check_program(compiled.graph, compiled.groups, instrs, TINY)


def test_checker_catches_overwriting_a_live_shortcut(small):
    compiled, blocks = small
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    g = compiled.groups
    # b1 written over a (buffer 0), which g3 still needs as its shortcut.
    broken = relocate(g, instrs, g[1].output, isa.buffer(0, 1024))
    with pytest.raises(AllocationError, match=r"group 1 .*overwrites '.*' .*group 3 still"):
        check_program(compiled.graph, g, broken, TINY)


def test_checker_catches_in_place_output(small):
    compiled, blocks = small
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    broken = list(instrs)
    broken[2] = instrs[2].replace(output=instrs[2].input)      # b2 over its own input b1
    with pytest.raises(AllocationError, match="group 2 .*overwrites .*group 2 still reads"):
        check_program(compiled.graph, compiled.groups, broken, TINY)


def test_checker_catches_reading_the_wrong_place(small):
    compiled, blocks = small
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    broken = list(instrs)
    broken[2] = instrs[2].replace(input=isa.buffer(1, 64))
    with pytest.raises(AllocationError, match=r"group 2 .*read from BUF1\+0x40 but was written "
                                              r"to BUF1\+0x0"):
        check_program(compiled.graph, compiled.groups, broken, TINY)
    stale = list(instrs)
    stale[2] = instrs[2].replace(input=compiled.program.locations[compiled.groups[2].input])
    with pytest.raises(AllocationError, match="read from DRAM.* written to BUF1"):
        check_program(compiled.graph, compiled.groups, stale, TINY)


def test_checker_catches_input_and_shortcut_in_one_buffer(small):
    compiled, blocks = small
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    g = compiled.groups
    # a moved next to b2 in buffer 2 (no overlap): g3 would read both through one port.
    broken = relocate(g, instrs, g[0].output, isa.buffer(2, 8192))
    with pytest.raises(AllocationError, match="group 3 .*'shortcut'.*one read port"):
        check_program(compiled.graph, g, broken, TINY)


def test_checker_catches_row_mode_weights_over_live_data(small):
    compiled, blocks = small
    g = compiled.groups
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    # g2 turned row mode (its operands to DRAM): its weights fill buffer 1 from offset 0,
    # where a — still needed by g3 — is moved.
    dram = compiled.program.locations
    broken = relocate(g, instrs, g[1].output, dram[g[1].output])
    broken = relocate(g, broken, g[2].output, dram[g[2].output])
    broken = relocate(g, broken, g[0].output, isa.buffer(1, 0))
    broken[2] = broken[2].replace(reuse=Reuse.ROW)
    with pytest.raises(AllocationError, match="group 2 .*row-mode weights .*overwrites"):
        check_program(compiled.graph, g, broken, TINY)
    on_chip_row = list(instrs)
    on_chip_row[1] = instrs[1].replace(reuse=Reuse.ROW)
    with pytest.raises(AllocationError, match="group 1 .*row-mode input is a 16x16 feature map"):
        check_program(compiled.graph, g, on_chip_row, TINY)


def test_checker_catches_staging_over_live_data(tmp_path):
    compiled = compile_model(small_residual(tmp_path / "small8.qdq.onnx", side=8), TINY)
    blocks = detect_blocks(compiled.graph, compiled.groups)
    g = compiled.groups
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    # b1 sent to DRAM: g2 (normal conv, 2 output blocks, 2304 B of weights against a 1024 B
    # input) stages it at offset 0 of the lowest buffer not holding its output (buffer 2) —
    # buffer 0, where a waits for g3.
    broken = relocate(g, instrs, g[1].output, compiled.program.locations[g[1].output])
    assert staging(broken[2], TINY) == (isa.buffer(0, 0), 1024)
    with pytest.raises(AllocationError, match="group 2 .*staged input .*overwrites"):
        check_program(compiled.graph, g, broken, TINY)


def test_checker_catches_capacity_and_lost_outputs(small):
    compiled, blocks = small
    g = compiled.groups
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    with pytest.raises(AllocationError, match="exceeds buffer 2"):
        check_program(compiled.graph, g, instrs, TINY, capacity=(8192, 8192, 2048))
    lost = list(instrs)
    lost[4] = instrs[4].replace(output=isa.buffer(0, 0))
    with pytest.raises(AllocationError, match="network output .* must be written to DRAM"):
        check_program(compiled.graph, g, lost, TINY)


# --------------------------------------------------------------------------------------------
# Block detection on the paper's networks
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    path = qdq_model(tmp_path_factory, "resnet18", 64)
    return path, compile_model(path, ROOMY)


@pytest.fixture(scope="module")
def mobilenet_v2(tmp_path_factory):
    path = qdq_model(tmp_path_factory, "mobilenet_v2", 64)
    return path, compile_model(path, ROOMY)


@pytest.fixture(scope="module")
def efficientnet_b1(tmp_path_factory):
    path = qdq_model(tmp_path_factory, "efficientnet_b1", 64)
    return path, compile_model(path, ROOMY)


def test_resnet18_blocks(resnet18):
    _, compiled = resnet18
    blocks = detect_blocks(compiled.graph, compiled.groups)
    # The stem as a stride-1 conv over the host's SpaceToDepth of the input (a single layer),
    # 8 basic blocks (3 with a projection shortcut: 3 groups), classifier.
    assert compiled.rewrites == ("space_to_depth", "space_to_depth_on_host")
    assert [len(b.groups) for b in blocks] == [1, 2, 2, 3, 2, 3, 2, 3, 2, 1]
    assert [b.kind for b in blocks].count(BlockKind.RESIDUAL) == 8
    assert blocks.cut is None and blocks.segments == (10,)


def test_mobilenet_v2_blocks(mobilenet_v2):
    _, compiled = mobilenet_v2
    blocks = detect_blocks(compiled.graph, compiled.groups)
    residual = blocks.residual
    # inverted residuals with a shortcut: 1 + 2 + 3 + 2 + 2 (expand, depthwise, project+add)
    assert len(residual) == 10 and all(len(b.groups) == 3 for b in residual)
    assert len(blocks) == 33 and blocks.cut is None


def test_efficientnet_b1_blocks(efficientnet_b1):
    _, compiled = efficientnet_b1
    blocks = detect_blocks(compiled.graph, compiled.groups)
    residual = blocks.residual
    # depth 1.1: 2+3+3+4+4+5+2 MBConv blocks, all but the first of each stage residual.
    assert len(residual) == 16 and all(b.squeeze_excite for b in residual)
    # expand, depthwise, SE pooling, fc1, fc2, scale, project+add — except stage 1 (no expand)
    assert sorted({len(b.groups) for b in residual}) == [6, 7]
    assert len(blocks) == 67 and blocks.cut is None


# --------------------------------------------------------------------------------------------
# Fig. 13 patterns and whole networks with on-chip tensors
# --------------------------------------------------------------------------------------------

def test_residual_block_keeps_its_input_for_the_shortcut(resnet18):
    _, compiled = resnet18
    blocks = detect_blocks(compiled.graph, compiled.groups)
    program = apply_policy(compiled, Policy.uniform(blocks, Reuse.FRAME), blocks)
    instrs = program.instructions
    for b in blocks.residual:
        add = instrs[b.last]
        entry_readers = [instrs[g].input for g in b.groups if compiled.groups[g].input == b.entry]
        if compiled.groups[b.last].shortcut == b.entry:      # identity shortcut (Fig. 13b)
            assert add.shortcut == entry_readers[0]
        assert add.shortcut.space != MemSpace.DRAM and add.input.space != MemSpace.DRAM
        assert add.shortcut.space != add.input.space         # two read ports


def test_squeeze_excitation_in_row_mode_keeps_vectors_on_chip(efficientnet_b1):
    _, compiled = efficientnet_b1
    blocks = detect_blocks(compiled.graph, compiled.groups)
    g = compiled.groups
    # Fig. 13(c): row reuse everywhere — feature maps in DRAM, SE vectors on chip.
    alloc = allocate(compiled.graph, g, compiled.program, blocks,
                     Policy.uniform(blocks, Reuse.ROW))
    scale = next(x for x in g if any(n.op == "mul" for n in x.nodes))
    pool = next(x for x in g if x.input == scale.input
                and any(n.op == "globalavgpool" for n in x.nodes))
    assert alloc.locations[scale.input].space == MemSpace.DRAM
    assert alloc.locations[scale.shortcut].space != MemSpace.DRAM
    assert alloc.locations[pool.written].space != MemSpace.DRAM
    # Fig. 13(d): frame reuse — the depthwise output and the vectors all on chip.
    alloc = allocate(compiled.graph, g, compiled.program, blocks,
                     Policy.uniform(blocks, Reuse.FRAME))
    for t in (scale.input, scale.shortcut, scale.output):
        assert alloc.locations[t].space != MemSpace.DRAM


@pytest.mark.parametrize("net", ["resnet18", "mobilenet_v2", "efficientnet_b1"])
def test_every_single_cut_allocation_passes_the_checker(net, request):
    _, compiled = request.getfixturevalue(net)
    blocks = detect_blocks(compiled.graph, compiled.groups)
    for cut in range(len(blocks) + 1):
        alloc = allocate(compiled.graph, compiled.groups, compiled.program, blocks,
                         modes_from(blocks, cut))
        instrs = place(compiled.program, compiled.groups, alloc)
        report = check_program(compiled.graph, compiled.groups, instrs, ROOMY)
        assert report.extents == alloc.extents


@pytest.mark.parametrize("net, frame_from", [("resnet18", 3), ("mobilenet_v2", 12),
                                             ("efficientnet_b1", 20)])
def test_frame_policy_output_identical_to_onnxruntime(net, frame_from, request):
    path, compiled = request.getfixturevalue(net)
    blocks = detect_blocks(compiled.graph, compiled.groups)
    program = apply_policy(compiled, modes_from(blocks, frame_from), blocks)
    frame = [i for i in program.instructions if i.reuse == Reuse.FRAME]
    on_chip = [i for i in frame if i.input.space != MemSpace.DRAM]
    assert frame and 2 * len(on_chip) > len(frame)
    # Only reuse and locations change: same image layout and parameters.
    assert (program.layout, program.params) == (compiled.program.layout,
                                                compiled.program.params)
    assert identical_to_onnxruntime(compiled, program, path, 64, ROOMY)


def test_held_weights_follow_the_weight_store(small):
    """``weights_held`` is set exactly where the controller's weight store still holds the
    group's weights: loaded whole by the last group that loaded any — a row-reuse layer that
    streams its weights leaves the store alone, frame-reuse chunks leave it partial."""
    compiled, _ = small
    a = compiled.program.instructions[1]              # 16 → 16, 3×3: fits the store
    other = a.replace(weights=isa.dram(a.weights.offset + 4096))
    big = a.replace(in_c=512, out_c=512)              # 36864 weight words > the store's 1024
    streamed = big.replace(reuse=Reuse.ROW, weights=isa.dram(1 << 20))
    chunked = big.replace(reuse=Reuse.FRAME, weights=isa.dram(1 << 20))

    def held(*instrs):
        return [i.weights_held for i in with_held_weights(instrs, TINY)]
    assert held(a, a, a) == [0, 1, 1]
    assert held(a, other, a) == [0, 0, 0]
    assert held(a, streamed, a) == [0, 0, 1]
    assert held(a, chunked, a) == [0, 0, 0]
    assert held(a, a.replace(kh=1, kw=1, pad_top=0, pad_left=0, pad_bottom=0,
                             pad_right=0)) == [0, 0]   # same offset, another layout


def test_prefetch_where_the_bus_is_free_and_the_store_has_room(small):
    """``prefetch`` is set where the group computes with every operand on chip (the bus is
    free for the next group's weights) and both groups' weights fit the store; the next group
    then finds its weights held, and the store holds them as if it had loaded them."""
    compiled, _ = small
    a = compiled.program.instructions[1]              # 16 → 16, 3×3: 36 of tiny's 1024 words
    on_chip = a.replace(reuse=Reuse.FRAME, input=isa.buffer(0), output=isa.buffer(1))
    other = a.replace(weights=isa.dram(a.weights.offset + 4096))
    crowded = other.replace(in_c=88, out_c=80)        # 990 words: alone it fits, beside a not
    chunked = a.replace(in_c=512, out_c=512, reuse=Reuse.FRAME, weights=isa.dram(1 << 20))
    depthwise = other.replace(conv=isa.ConvKind.DEPTHWISE)

    def flags(*instrs):
        out = with_held_weights(instrs, TINY)
        return [i.prefetch for i in out], [i.weights_held for i in out]
    assert flags(on_chip, other) == ([1, 0], [0, 1])
    assert flags(on_chip, other, a) == ([1, 0, 0], [0, 1, 0])
    third = a.replace(weights=isa.dram(a.weights.offset + 8192))
    assert flags(on_chip, on_chip.replace(weights=other.weights), third) == \
        ([1, 1, 0], [0, 1, 1])
    assert flags(a, other) == ([0, 0], [0, 0])                    # a's input is in DRAM
    assert flags(on_chip, on_chip) == ([0, 0], [0, 1])            # held already
    assert flags(on_chip, other, other) == ([1, 0, 0], [0, 1, 1])  # held after the prefetch
    assert flags(on_chip, crowded) == ([0, 0], [0, 0])
    assert flags(on_chip, chunked) == ([0, 0], [0, 0])
    assert flags(on_chip, depthwise) == ([0, 0], [0, 0])
    assert flags(on_chip.replace(last=1), other) == ([0, 0], [0, 0])


def test_double_buffer_where_frame_chunks_have_the_bus(small):
    """``double_buffer`` is set on a frame-reuse convolution whose weights take chunks, one
    output block of which fits half the store, where its compute phase has the bus to itself;
    its chunks are then half the store, and the last one leaves room for the next group's
    weights (``prefetch``)."""
    compiled, _ = small
    a = compiled.program.instructions[1]              # 16 → 16, 3×3: 36 of tiny's 1024 words
    on_chip = dict(reuse=Reuse.FRAME, input=isa.buffer(0), output=isa.buffer(1))
    big = a.replace(in_c=128, out_c=128, weights=isa.dram(1 << 20), **on_chip)  # 2304 words
    after = a.replace(**on_chip)
    out = with_held_weights([big, after], TINY)
    assert [i.double_buffer for i in out] == [1, 0]
    assert chunk_blocks(out[0], TINY) == 3 and chunk_blocks(big, TINY) == 7   # 432 of 1024
    assert store_words(out[0], TINY) == 144 * (16 % 3)      # the last chunk: one block
    assert [i.prefetch for i in out] == [1, 0] and out[1].weights_held
    in_dram = with_held_weights([big.replace(output=isa.dram(0)), after], TINY)
    assert [i.double_buffer for i in in_dram] == [0, 0]
    fits = with_held_weights([a.replace(**on_chip), after], TINY)     # one chunk: nothing to do
    assert [i.double_buffer for i in fits] == [0, 0]
    too_wide = big.replace(in_c=512)                  # one block: 64·9 = 576 > 512 words
    assert not with_held_weights([too_wide, after], TINY)[0].double_buffer
    # Set by hand, the controller would stop it: the compiler's store check says so.
    plain = overflows(too_wide, TINY, buffers=False)
    hand = overflows(too_wide.replace(double_buffer=1), TINY, buffers=False)
    assert [p for p in hand if p not in plain] == [
        "one output block's weights take 576 words; frame reuse needs them in the weight "
        "store (512, half of it with double_buffer)"]
    with pytest.raises(ValueError, match="BUFFER_OVERFLOW"):
        CycleModel(TINY).group(too_wide.replace(double_buffer=1))
    with pytest.raises(isa.InstructionError, match="double_buffer"):
        isa.validate(a.replace(double_buffer=1))      # row reuse


def test_checker_catches_a_prefetch_that_does_not_fit(small):
    compiled, blocks = small
    g = compiled.groups
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    assert any(i.prefetch for i in instrs)
    check_program(compiled.graph, g, instrs, TINY)
    broken = list(instrs)
    broken[-1] = instrs[-1].replace(prefetch=1)
    with pytest.raises(AllocationError, match=f"group {len(g) - 1} .*prefetch .*no group follows"):
        check_program(compiled.graph, g, broken, TINY)
    k = next(k for k, i in enumerate(instrs) if i.prefetch)
    broken = list(instrs)
    broken[k + 1] = instrs[k + 1].replace(in_c=1024, out_c=1024)
    with pytest.raises(AllocationError, match=f"group {k} .*prefetch .*weight store"):
        check_program(compiled.graph, g, broken, TINY)


def test_checker_catches_weights_not_held(small):
    compiled, blocks = small
    g = compiled.groups
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.ROW))
    broken = list(instrs)
    broken[2] = instrs[2].replace(weights_held=1)     # the store holds group 1's weights
    with pytest.raises(AllocationError, match="group 2 .*weights_held"):
        check_program(compiled.graph, g, broken, TINY)


def test_checker_catches_a_store_too_small_for_unstaged_weights(small):
    """g0 reads its DRAM input once with its whole weights (1152 B) in the weight store; on a
    store of 1 KiB the controller would take two chunks and stage the input into an area the
    allocation never reserved."""
    compiled, blocks = small
    _, instrs = placed(compiled, blocks, Policy.uniform(blocks, Reuse.FRAME))
    check_program(compiled.graph, compiled.groups, instrs, TINY)
    small_store = TINY.replace(name="tiny-small-store", buffer_bytes=(65536, 1024, 65536))
    with pytest.raises(AllocationError, match="group 0 .*stages the DRAM input"):
        check_program(compiled.graph, compiled.groups, instrs, small_store)
