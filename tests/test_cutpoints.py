"""Cut-point search: candidate policies (single, double, general), the cycle-model latency,
budgets with no feasible policy, YOLOv3's network cut run end to end, PANet- and BiFPN-shaped
graphs (3 and 2r + 1 segments) against brute force, and one Table II row."""

import itertools
import re
import zlib

import numpy as np
import pytest

from sfnpu import isa, layout
from sfnpu.compiler.blocks import detect_blocks
from sfnpu.compiler.cutpoints import (LATENCY_TIE, NoFeasiblePolicy, conv_macs, count_policies,
                                      cut_policies, double_cut_policies, evaluate,
                                      long_path_options, model_latency, search, select,
                                      single_cut_policies)
from sfnpu.compiler.memory import (Budget, Policy, allocate, apply_policy, check_program,
                                   long_path_tensors, place, traffic)
from sfnpu.studies.networks import minimum_sram, study_model
from sfnpu.studies.paper_reference import TABLE_II
from sfnpu.compiler.pipeline import compile_model
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.config import get_config
from sfnpu.isa import MemSpace, Reuse
from sfnpu.sim.cycle import CycleModel
from netbuild import Net
from test_memory import ROOMY, identical_to_onnxruntime, qdq_model

R, F = Reuse.ROW, Reuse.FRAME


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    compiled = compile_model(qdq_model(tmp_path_factory, "resnet18", 64), ROOMY)
    return compiled, detect_blocks(compiled.graph, compiled.groups)


@pytest.fixture(scope="module")
def yolov3(tmp_path_factory):
    path = qdq_model(tmp_path_factory, "yolov3", 64)
    compiled = compile_model(path, ROOMY)
    return path, compiled, detect_blocks(compiled.graph, compiled.groups)


# --------------------------------------------------------------------------------------------
# Candidate policies
# --------------------------------------------------------------------------------------------

def test_single_cut_policies(resnet18):
    _, blocks = resnet18
    policies = list(single_cut_policies(blocks))
    assert len(policies) == len(blocks) + 1
    for cut, p in enumerate(policies):
        assert p.modes == (R,) * cut + (F,) * (len(blocks) - cut) and p.label == f"L={cut}"


def test_double_and_general_cut_policies(resnet18):
    _, blocks = resnet18        # 10 blocks (stem, 8 residual, classifier): 4 + 6
    assert len(blocks) == 10
    policies = list(double_cut_policies(blocks, cut=4))
    assert len(policies) == 5 * 7
    for p in policies:
        l1, l2 = (int(v) for v in p.label[3:-1].split(", "))
        # Fig. 15: row reuse if i < L1 or i ≥ N1 + L2.
        assert p.modes == tuple(R if i < l1 or i >= 4 + l2 else F for i in range(10))
    three = list(cut_policies(blocks, (3, 3, 4)))
    assert len(three) == 4 * 4 * 5                                   # O(N^k)
    # Segments alternate: row first (falling scale), frame first (rising), row first.
    assert three[-1].label == "L=(3, 3, 4)"
    assert three[-1].modes == (R,) * 3 + (F,) * 3 + (R,) * 4
    assert next(p for p in three if p.label == "L=(1, 2, 0)").modes == \
        (R, F, F, F, F, R, F, F, F, F)
    with pytest.raises(ValueError, match="do not partition"):
        list(cut_policies(blocks, (3, 3)))


def test_default_latency_is_the_cycle_model():
    cfg = get_config("kcu1500")
    conv = isa.Instruction(conv=isa.ConvKind.NORMAL, kh=3, kw=3, pad_top=1, pad_left=1,
                           pad_bottom=1, pad_right=1, in_c=256, in_h=26, in_w=26, out_c=512,
                           out_h=26, out_w=26, reuse=F, input=isa.buffer(0),
                           output=isa.buffer(1), weights=isa.dram(0), params=isa.dram(0))
    macs = 512 * 256 * 9 * 26 * 26
    assert conv_macs(conv) == macs
    latency = model_latency(cfg)
    assert latency(conv, None) == CycleModel(cfg).group(conv).cycles
    # On chip the MAC array bounds it; streamed from DRAM it cannot beat the bus either.
    assert macs / cfg.macs <= latency(conv, None) <= 1.2 * macs / cfg.macs
    streamed = conv.replace(reuse=R, input=isa.dram(0), output=isa.dram(0))
    dram = sum(a.end - a.start for a in layout.accesses(streamed, cfg))
    assert latency(streamed, None) >= max(macs / cfg.macs, dram / float(cfg.dram_bytes_per_cycle))


# --------------------------------------------------------------------------------------------
# Search
# --------------------------------------------------------------------------------------------

def test_search_minimises_the_given_latency(resnet18):
    compiled, blocks = resnet18
    result = search(compiled, blocks=blocks)
    assert result.best.feasible and len(result.evaluations) == len(blocks) + 1
    # The objective: the least DRAM traffic among the latencies within LATENCY_TIE of the
    # fastest.
    fastest = min(e.latency for e in result.feasible)
    ties = [e for e in result.feasible if e.latency <= fastest * (1 + LATENCY_TIE)]
    assert result.best.latency <= fastest * (1 + LATENCY_TIE)
    assert result.best.traffic.total == min(e.traffic.total for e in ties)
    # Any latency callable: one that prefers row reuse picks the most row-mode groups that fit.
    rowish = search(compiled, blocks=blocks,
                    latency=lambda i, _next, _window: 1.0 if i.reuse == Reuse.ROW else 2.0)
    most_row = max(sum(m == R for m in e.policy.group_modes(blocks)) for e in rowish.feasible)
    assert sum(m == R for m in rowish.best.policy.group_modes(blocks)) == most_row
    # The SRAM objective picks the smallest eq. 6 among the same candidates.
    small = search(compiled, blocks=blocks, objective="sram")
    assert small.best.sram == min(e.sram for e in small.feasible)


def test_no_feasible_policy_names_the_block_and_the_amount(resnet18):
    compiled, blocks = resnet18
    cramped = Budget((4096,) * 3, 48 * 1024, 64 * 1024, 8 * 1024, None)
    with pytest.raises(NoFeasiblePolicy, match=r"block \d+ \(layer\S+\) fits in neither mode: "
                                               r"row reuse needs buffer 1 \d+ B > 4096 B"):
        search(compiled, cramped, blocks=blocks)
    # Every block fits on its own, yet no whole policy does: the closest one is reported.
    no_brams = Budget(None, None, None, None, bram18k=10)
    with pytest.raises(NoFeasiblePolicy, match=r"closest policy L=\d+: BRAM18K needs \d+ "
                                               r"BRAM18K > 10"):
        search(compiled, no_brams, blocks=blocks)


# --------------------------------------------------------------------------------------------
# YOLOv3: network cut and a double cut-point policy end to end
# --------------------------------------------------------------------------------------------

def test_yolov3_blocks_and_network_cut(yolov3):
    _, compiled, blocks = yolov3
    residual = blocks.residual
    assert len(residual) == 23 and all(len(b.groups) == 2 for b in residual)   # Darknet-53
    assert len(blocks) == len(compiled.groups) - len(residual)
    # The cut falls after the smallest scale (input/32), before the first upsample.
    smallest = min(b.scale for b in blocks if not b.vector)
    assert smallest == (2, 2)
    before, after = blocks[blocks.cut - 1], blocks[blocks.cut]
    assert before.scale == smallest and after.scale == (4, 4)
    assert [n.op for n in compiled.groups[after.first].nodes] == ["resize"]
    assert all(b.scale >= smallest for b in blocks[:blocks.cut])
    assert blocks.segments == (blocks.cut, len(blocks) - blocks.cut)


def test_yolov3_double_cuts_pass_the_checker(yolov3):
    _, compiled, blocks = yolov3
    for policy in list(double_cut_policies(blocks))[::5]:
        alloc = allocate(compiled.graph, compiled.groups, compiled.program, blocks, policy)
        instrs = place(compiled.program, compiled.groups, alloc)
        check_program(compiled.graph, compiled.groups, instrs, ROOMY)


def test_yolov3_double_cut_identical_to_onnxruntime(yolov3):
    path, compiled, blocks = yolov3
    result = search(compiled, blocks=blocks)
    assert long_path_options(compiled, blocks) == (False, True)
    assert len(result.evaluations) == 2 * (blocks.cut + 1) * (len(blocks) - blocks.cut + 1)
    # The objective: the least DRAM traffic among the latencies within LATENCY_TIE of the
    # fastest.
    fastest = min(e.latency for e in result.feasible)
    ties = [e for e in result.feasible if e.latency <= fastest * (1 + LATENCY_TIE)]
    assert result.best.latency <= fastest * (1 + LATENCY_TIE)
    assert result.best.traffic.total == min(e.traffic.total for e in ties)
    # The fastest policy that switches modes (on ROOMY the fastest overall may be all frame):
    # rows and frames, on-chip tensors, long paths held, bit-exact on the golden model.
    mixed = select([e for e in result.evaluations
                    if {R, F} <= set(e.policy.modes) and e.policy.hold_long_paths])
    program = apply_policy(compiled, mixed.policy, blocks)
    assert any(i.input.space != MemSpace.DRAM for i in program.instructions)
    assert identical_to_onnxruntime(compiled, program, path, 64, ROOMY)


def test_long_paths_held_on_chip(yolov3):
    """Holding long-path tensors (concat destinations included) on chip changes only where
    they live: each saves its DRAM writes and one DRAM read per reading group, the checker
    proves the allocation."""
    _, compiled, blocks = yolov3
    held = long_path_tensors(compiled.graph, compiled.groups, blocks)
    modes = Policy.uniform(blocks, F).modes
    placed = {}
    for hold in (False, True):
        alloc = allocate(compiled.graph, compiled.groups, compiled.program, blocks,
                         Policy(modes, hold_long_paths=hold))
        instrs = place(compiled.program, compiled.groups, alloc)
        check_program(compiled.graph, compiled.groups, instrs, ROOMY)
        placed[hold] = alloc, traffic(instrs, ROOMY)
    (off, t_off), (on, t_on) = placed[False], placed[True]
    assert held and held <= set(off.off_chip) and not held & set(on.off_chip)
    assert held & {g.dest for g in compiled.groups if g.dest}     # route data among them
    assert on.on_chip == off.on_chip | held
    readers = blocks.graph.readers
    size = lambda t: layout.tensor_bytes(*compiled.graph.tensors[t].shape, ROOMY.lanes)
    assert t_off.fm - t_on.fm == sum(size(t) * (1 + len(set(readers[t]))) for t in held)
    assert t_off.weights == t_on.weights


# --------------------------------------------------------------------------------------------
# PANet (3 cut-points) and BiFPN (2r + 1): segments found automatically, search vs brute force
# --------------------------------------------------------------------------------------------

C = 16


def _up2(n, x):
    return n.op("Resize", [x, "", n.const(np.array([1, 1, 2, 2], np.float32), "s")],
                mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _fuse(n, x, other, stride=1):
    """A feature-network node: 3×3 conv of ``x`` plus ``other`` (one conv + add group)."""
    return n.op("Relu", [n.op("Add", [n.conv(x, C, C, 3, stride=stride), other])])


def _backbone(n):
    """32 → 16 → 8 → 4: C3, C4, C5."""
    c3 = n.op("Relu", [n.conv("x", 8, C, 3, stride=2)])
    c4 = n.op("Relu", [n.conv(c3, C, C, 3, stride=2)])
    return c3, c4, n.op("Relu", [n.conv(c4, C, C, 3, stride=2)])


def panet_net():
    """Backbone down, FPN top-down (up), PANet bottom-up (down again): Fig. 12(b)."""
    n = Net((8, 32, 32), name="panet")
    c3, c4, c5 = _backbone(n)
    p5 = n.op("Relu", [n.conv(c5, C, C, 1)])
    p4 = _fuse(n, _up2(n, p5), c4)
    p3 = _fuse(n, _up2(n, p4), c3)
    n4 = _fuse(n, p3, p4, stride=2)
    return n, [p3, n4, _fuse(n, n4, p5, stride=2)]


def bifpn_net(repeats=2):
    """Backbone, then ``repeats`` BiFPN layers of a top-down and a bottom-up path: Fig. 12(c)."""
    n = Net((8, 32, 32), name="bifpn")
    p3, p4, p5 = _backbone(n)
    for _ in range(repeats):
        td4 = _fuse(n, _up2(n, p5), p4)
        o3 = _fuse(n, _up2(n, td4), p3)
        o4 = _fuse(n, o3, td4, stride=2)
        p3, p4, p5 = o3, o4, _fuse(n, o4, p5, stride=2)
    return n, [p3, p4, p5]


@pytest.fixture(scope="module")
def feature_networks(tmp_path_factory):
    out = {}
    for name, build in (("panet", panet_net), ("bifpn", bifpn_net)):
        n, outputs = build()
        path = tmp_path_factory.mktemp(name) / f"{name}.qdq.onnx"
        quantize_model(n.model(outputs), path, CalibrationSource.arrays(n.samples(4)))
        compiled = compile_model(path, ROOMY)
        out[name] = compiled, detect_blocks(compiled.graph, compiled.groups)
    return out


def _resize_blocks(compiled, blocks):
    return [b.index for b in blocks
            if any(n.op == "resize" for g in b.groups for n in compiled.groups[g].nodes)]


def test_panet_has_three_segments(feature_networks):
    compiled, blocks = feature_networks["panet"]
    assert len(blocks.segments) == 3 and sum(blocks.segments) == len(blocks)
    b1, b2 = blocks.bounds
    # Segment 0 runs down to the smallest scale (C5 and its lateral), segment 1 holds the
    # top-down upsampling, segment 2 the bottom-up stride-2 path.
    assert all(b.scale == (4, 4) for b in blocks[b1 - 2:b1])
    assert all(b1 <= r < b2 for r in _resize_blocks(compiled, blocks))
    assert [b.scale for b in blocks[b2:]] == [(8, 8), (4, 4)]
    assert count_policies(blocks) == (b1 + 1) * (b2 - b1 + 1) * (len(blocks) - b2 + 1)


def test_bifpn_has_two_r_plus_one_segments(feature_networks):
    compiled, blocks = feature_networks["bifpn"]
    assert len(blocks.segments) == 2 * 2 + 1
    # Each BiFPN layer's two upsamplings sit in its top-down (odd) segment.
    edges = (0, *blocks.bounds, len(blocks))
    segment_of = {b: j for j in range(5) for b in range(edges[j], edges[j + 1])}
    assert [segment_of[r] for r in _resize_blocks(compiled, blocks)] == [1, 1, 3, 3]


def _quasi_random_latency(instr, _next, _window) -> float:
    """A deterministic latency with no structure to exploit, so ties are unlikely."""
    key = (instr.in_c, instr.in_h, instr.out_h, instr.conv.value, instr.reuse.value,
           instr.input.space.value, instr.output.space.value)
    return 1000 + zlib.crc32(repr(key).encode()) % 9973


def _in_relaxation(modes, segments) -> bool:
    """One switch at most per segment: row→frame in even segments, frame→row in odd ones."""
    start = 0
    for j, n in enumerate(segments):
        part = modes[start:start + n]
        start += n
        first = Reuse.ROW if j % 2 == 0 else Reuse.FRAME
        switch = next((k for k, m in enumerate(part) if m != first), n)
        if any(m == first for m in part[switch:]):
            return False
    return True


@pytest.mark.parametrize("net", ["panet", "bifpn"])
def test_search_finds_the_brute_force_optimum(feature_networks, net):
    compiled, blocks = feature_networks[net]
    # Tight enough that some candidates do not fit: a 16-channel 16×16 map is 4 KiB, and the
    # third buffer holds only half of one.
    budget = Budget((4096, 4096, 2048), 48 * 1024, 4096, 8 * 1024, None)
    result = search(compiled, budget, latency=_quasi_random_latency, blocks=blocks,
                    long_paths=(False,))
    key = lambda e: (e.latency, e.traffic.total, e.sram)   # the "latency" objective
    # Brute force: every one of the 2^N mode vectors, kept if it obeys the relaxation.
    kept = [m for m in itertools.product((Reuse.ROW, Reuse.FRAME), repeat=len(blocks))
            if _in_relaxation(m, blocks.segments)]
    assert {e.policy.modes for e in result.evaluations} == set(kept)
    assert len(kept) == len(result.evaluations) == count_policies(blocks)
    brute = [evaluate(compiled, blocks, Policy(m), budget, _quasi_random_latency) for m in kept]
    feasible = [e for e in brute if e.feasible]
    assert 0 < len(feasible) < len(brute)
    assert key(result.best) == min(map(key, feasible))
    assert result.best.feasible


def test_panet_relaxation_against_every_policy(feature_networks):
    """All 2^10 policies of the PANet graph: the relaxation's optimum is never better than the
    unrestricted one, and every relaxed policy is one of them with identical numbers."""
    compiled, blocks = feature_networks["panet"]
    assert len(blocks) <= 12
    budget = Budget.unlimited()
    every = {m: evaluate(compiled, blocks, Policy(m), budget)
             for m in itertools.product((Reuse.ROW, Reuse.FRAME), repeat=len(blocks))}
    result = search(compiled, budget, objective="sram", blocks=blocks, long_paths=(False,))
    assert result.best.sram >= min(e.sram for e in every.values() if e.feasible)
    for e in result.evaluations:
        assert (e.sram, e.traffic.total) == (every[e.policy.modes].sram,
                                            every[e.policy.modes].traffic.total)
    # Every policy allocates — staging areas a first placement had covered are reserved and
    # the placement redone — and the checker accepts each one.
    assert all(e.error is None for e in every.values())
    for e in result.evaluations:
        alloc = allocate(compiled.graph, compiled.groups, compiled.program, blocks, e.policy)
        instrs = place(compiled.program, compiled.groups, alloc)
        report = check_program(compiled.graph, compiled.groups, instrs, ROOMY)
        assert report.extents == alloc.extents


def test_no_feasible_policy_on_a_feature_network(feature_networks):
    compiled, blocks = feature_networks["bifpn"]
    tiny = Budget((2048,) * 3, 48 * 1024, 64 * 1024, 8 * 1024, None)
    with pytest.raises(NoFeasiblePolicy) as err:
        search(compiled, tiny, blocks=blocks)
    msg = str(err.value)
    options = long_path_options(compiled, blocks)
    assert f"out of {count_policies(blocks, long_paths=options)} fits" in msg
    assert re.search(r"block \d+ \(\S+\) fits in neither mode: row reuse needs buffer 1 \d+ B "
                     r"> 2048 B \(group \d+ \S+\); frame reuse needs .*\d+ B > 2048 B", msg)


# --------------------------------------------------------------------------------------------
# Table II: one row, at full size
# --------------------------------------------------------------------------------------------

def test_table_ii_resnet50(tmp_path_factory):
    """ResNet-50 at 224 on kcu1500. The value depends only on layer shapes and our buffer
    accounting, so it is pinned exactly; the paper reports 1.039 MB (memory_report explains
    the differences)."""
    ref = next(r for r in TABLE_II if r.network == "resnet50")
    compiled = compile_model(study_model(ref, tmp_path_factory.mktemp("table2")),
                             get_config("kcu1500"))
    blocks = detect_blocks(compiled.graph, compiled.groups)
    assert len(blocks.residual) == 16 and blocks.cut is None
    best = minimum_sram(compiled, blocks).best
    # Row reuse up to layer2, frame reuse from layer3.0 (28×28 in, 14×14 out) on. layer3.0
    # reads layer2's output from DRAM: its downsample (512→1024, 524 KB of weights) stages it
    # in buffer 0 (512×28×28), its first 1×1 (131 KB of weights) reads it once with the whole
    # weights in the store. Buffer 1 holds the 1024×14×14 block outputs and the largest
    # weights the store must hold whole: layer2's 3×3 convolutions (9 taps × 2×2 blocks of
    # 64×64). The 7×7 stem runs as SpaceToDepth and a 4×1 convolution over the rows' taps
    # (4 taps × 64×64).
    first_frame = best.policy.modes.index(Reuse.FRAME)
    assert blocks[first_frame].name.startswith("layer3.0.")
    assert compiled.rewrites == ("space_to_depth", "space_to_depth_on_host", "fold_input_taps")
    q = best.requirements
    assert q.weight_buff == 9 * 2 * 2 * 64 * 64
    assert q.buffers == (512 * 28 * 28, 1024 * 14 * 14, 0)
    assert q.row_buff == 6 * 56 * 4 * 64        # layer1's 256-channel rows of 56 pixels
    # One row of partial sums in either mode, the stem's 112-pixel row; the write buffer
    # takes the widest output row, the stem's after its max pool: 56 pixels of 64 channels
    # (the host hands over the image as SpaceToDepth: no 112-pixel SpaceToDepth group).
    assert (q.out_buff, q.write_buff) == (112 * 64 * 4, 56 * 64)
    assert q.sram == 720_384
    assert best.traffic.weights == sum(layout.weight_bytes(i, compiled.program.config)
                                       for i in compiled.program.instructions)
