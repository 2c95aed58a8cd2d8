"""The cycle model's own contracts (the RTL comparison is in test_system.py).

DRAM bytes follow from the commands the controller issues, so they are checked against the
layouts every other executor uses; latency follows from the hardware's schedule, so it is
checked against the row buffer's cycle-exact contract and against the directions in which
the hardware parameters move it.
"""

import pytest

from netbuild import Net
from sfnpu import image, isa, layout
from sfnpu.compiler.blocks import detect_blocks
from sfnpu.compiler.memory import Policy, apply_policy, traffic
from sfnpu.config import get_config
from sfnpu.hw.conv_array import row_cycles
from sfnpu.hw.row_buffer import window_params, window_schedule
from sfnpu.isa import ConvKind, Reuse
from sfnpu.sim.cycle import (GROUP_SLACK, GROUP_TOLERANCE, RUN_TOLERANCE, CycleModel,
                             GroupTiming, ModelRun, compare)
from test_system import compiled_image, conv_stack, residual_net, se_net, wide_net


@pytest.fixture(scope="module", params=[conv_stack, residual_net, se_net, wide_net],
                ids=lambda b: b.__name__)
def compiled(request, tmp_path_factory):
    net, outputs = request.param()
    return compiled_image(tmp_path_factory.mktemp(net.name), net, outputs, get_config("tiny"))


@pytest.mark.parametrize("reuse", [None, Reuse.FRAME])
def test_dram_bytes_are_the_exact_traffic(compiled, reuse):
    """Each group moves exactly the bytes :func:`memory.traffic` counts (every operand's
    layout range once, streamed weights once per conv output row, the next group's weights
    in a prefetching group), plus its own instruction fetch (and the image header before the
    first group; a prefetching group also reads the next instruction), in whole bus words.
    ``reuse``: the compiled program, or the all-frame policy with its on-chip tensors."""
    config = get_config("tiny")
    comp, blob = compiled
    program = comp.program
    if reuse is not None:
        blocks = detect_blocks(comp.graph, comp.groups)
        program = apply_policy(comp, Policy.uniform(blocks, reuse), blocks)
        given = image.unpack(blob, config)
        blob = program.pack([given.tensor(image.SectionKind.INPUT, k, config.lanes)
                             for k in range(len(program.inputs))])
    model = CycleModel(config)
    run = model.run(blob)
    img = image.unpack(blob, config)
    first = img.layout.of_kind(image.SectionKind.INSTRUCTIONS)[0].offset
    header = (model.beats(0, image.HEADER.size)
              + model.beats(image.HEADER.size, len(img.layout.sections) * image.SECTION.size))
    exact = traffic(program.instructions, config)

    def fetch(k):
        return model.beats(first + k * isa.WORDS * 4, isa.WORDS * 4)
    for k, (instr, g, t) in enumerate(zip(program.instructions, run.groups, exact.groups)):
        beats = fetch(k) + (header if k == 0 else 0) + (fetch(k + 1) if instr.prefetch else 0)
        assert g.write_bytes == t.fm_write
        assert g.read_bytes == t.fm_read + t.weights + t.params + beats * config.dram_bus_bytes
        assert g.read_bytes % config.dram_bus_bytes == 0


def test_frame_reuse_reads_weights_once():
    """wide_net's 3×3 layer streams its weights once per output row in row reuse and reads
    them once in frame reuse: the model's bytes say so."""
    import tempfile
    from pathlib import Path

    config = get_config("tiny")
    net, outputs = wide_net()
    comp, blob = compiled_image(Path(tempfile.mkdtemp()), net, outputs, config)
    blocks = detect_blocks(comp.graph, comp.groups)
    frame = apply_policy(comp, Policy.uniform(blocks, Reuse.FRAME), blocks)
    model = CycleModel(config)
    row_group = model.run(blob).groups[-1]
    frame_group = model.run(frame.instructions).groups[-1]
    weights = layout.weight_bytes(comp.program.instructions[-1], config)
    rows = comp.program.instructions[-1].out_h
    assert row_group.read_bytes >= weights * rows
    assert frame_group.read_bytes < 2 * weights
    assert traffic(comp.program.instructions, config).groups[-1].weights == weights * rows
    assert traffic(frame.instructions, config).groups[-1].weights == weights


@pytest.mark.parametrize("kernel, stride, group", [(3, 1, 1), (3, 2, 1), (5, 2, 16),
                                                   (1, 1, 1), (7, 1, 1)])
def test_array_rows_follow_the_row_buffer_schedule(kernel, stride, group):
    """With the input present, the row buffer emits a window every max(P, F) cycles: the
    row time the model uses is the spacing of the cycle-exact window schedule."""
    config = get_config("tiny")
    net = Net((16, 12, 14), seed=1, name="one")
    pad = kernel // 2
    y = net.conv("x", 16, 16, kernel, stride=stride, group=group, pads=[pad] * 4)
    import tempfile
    from pathlib import Path
    comp, _ = compiled_image(Path(tempfile.mkdtemp()), net, [y], config)
    instr = comp.program.instructions[0]
    params = window_params(instr, config)
    times = window_schedule(params, config, first_word=0, weights_ready=0)
    per_row = len(times) // params["out_h"]
    # Steady state: rows after the first, whose input rows are all present by then.
    last = params["out_h"] - 1
    spacing = times[last * per_row + per_row - 1] - times[(last - 1) * per_row + per_row - 1]
    depthwise = instr.conv == ConvKind.DEPTHWISE
    assert spacing == row_cycles(depthwise, instr.kh, instr.kw, instr.sw, params["out_w"],
                                 instr.in_c, instr.out_c, config)


def test_slower_dram_is_never_faster(compiled):
    comp, _ = compiled
    tiny = get_config("tiny")                      # DRAM at the bus peak
    half = tiny.replace(dram_bandwidth_gbps=tiny.dram_bandwidth_gbps / 2)
    base = CycleModel(tiny).run(comp.program.instructions)
    for a, b in zip(base.groups, CycleModel(half).run(comp.program.instructions).groups):
        assert b.cycles >= a.cycles
    for latency in (4, 64):
        other = CycleModel(tiny.replace(dram_latency=latency)).run(comp.program.instructions)
        assert (other.cycles > base.cycles) == (latency > tiny.dram_latency)


def test_comparison_reports_disagreements(compiled):
    comp, blob = compiled
    run = CycleModel(get_config("tiny")).run(blob)
    cycles = [g.cycles for g in run.groups]
    reads = [g.read_bytes for g in run.groups]
    writes = [g.write_bytes for g in run.groups]
    assert compare(run, cycles, reads, writes).problems() == []
    assert compare(run, cycles, reads, writes).exact == len(cycles)
    off = list(cycles)
    off[0] = int(off[0] * 1.5)
    assert any("group 0" in p for p in compare(run, off, reads, writes).problems())
    wrong = list(reads)
    wrong[-1] += 8
    assert any("DRAM bytes" in p for p in compare(run, cycles, wrong, writes).problems())


def test_tolerances_relative_or_a_few_cycles():
    """By default the model must be exact: one cycle off in a group fails. Looser limits
    pass a group within ``group_tolerance`` of the RTL's cycles or ``group_slack`` cycles,
    the run within ``run_tolerance``; one cycle beyond either fails."""
    def run_of(*cycles):
        return ModelRun(get_config("tiny"), [GroupTiming(k, c, 0, 0, Reuse.ROW, 0, c, "mac")
                                             for k, c in enumerate(cycles)])

    def problems(model, measured, **limits):
        return compare(run_of(*model), measured, [0] * len(measured),
                       [0] * len(measured)).problems(**limits)

    assert GROUP_TOLERANCE == GROUP_SLACK == RUN_TOLERANCE == 0
    big = 100_000
    assert problems([200, big], [200, big]) == []
    assert "group 0" in problems([201, big], [200, big])[0]
    assert "group 1" in problems([200, big - 1], [200, big])[0]
    assert [p for p in problems([200, big + 1], [200, big]) if p.startswith("run")]

    limits = dict(group_tolerance=0.005, group_slack=4, run_tolerance=0.0025)
    small = 200                                    # the slack is above its relative limit
    assert problems([small + 4, big], [small, big], **limits) == []
    assert "group 0" in problems([small + 5, big], [small, big], **limits)[0]
    large = 10_000                                 # its relative limit is above the slack
    limit = int(large * 0.005)
    assert problems([large - limit, big * 10], [large, big * 10], **limits) == []
    assert "group 0" in problems([large - limit - 1, big * 10], [large, big * 10],
                                 **limits)[0]
    # the run: every group within its own limit, the sum beyond run_tolerance
    n = 40
    off = int(large * 0.0025) + 1
    assert [p for p in problems([large + off] * n, [large] * n, **limits)
            if p.startswith("run")]
    assert problems([large + off - 1] * n, [large] * n, **limits) == []


@pytest.mark.parametrize("name", ["tiny", "ecp5", "kcu1500"])
def test_bursts_split_as_the_dma_splits_them(name):
    """Every DRAM command is split into the DMA's bursts (≤ dram_max_burst beats, never across
    a 4 KiB boundary): the reference the DMA's own tests hold the RTL to."""
    import numpy as np
    from test_hw_dma import READ, expected_bursts

    config = get_config(name)
    model = CycleModel(config)
    rng = np.random.default_rng(3)
    for _ in range(300):
        address = int(rng.integers(0, 3 * 4096)) // config.lanes * config.lanes
        length = int(rng.integers(1, 40)) * config.lanes
        expect = [beats for _, beats in expected_bursts([(address, length, READ)], config, READ)]
        assert model.bursts(address, model.beats(address, length)) == expect


def test_image_base_moves_the_4kib_boundaries(compiled):
    """Absolute addresses are the image base plus the image's offsets: a base a multiple of
    4 KiB away changes nothing, the bytes never change, and the controller's alignment rule
    (SECTION_ALIGN) is enforced."""
    config = get_config("tiny")
    _, blob = compiled
    model = CycleModel(config)
    at0 = model.run(blob)
    assert model.run(blob, image_base=3 * 4096).groups == at0.groups
    for base in (64, 4096 - 64, 2048 + 512):
        moved = model.run(blob, image_base=base)
        assert [(g.read_bytes, g.write_bytes) for g in moved.groups] == \
            [(g.read_bytes, g.write_bytes) for g in at0.groups]
    with pytest.raises(ValueError):
        model.run(blob, image_base=32)


def test_a_short_burst_between_full_ones_delays_a_control_read():
    """ecp5 (4-byte beats every 2 cycles, latency 20, two bursts outstanding): 512 bytes from
    4 KiB − 136 split into bursts of 16, 16, 2, 16, … beats. Burst 3's address waits for
    burst 1's last beat (cycle 84) + REISSUE_LATENCY: its data is due in cycle 106, where the
    unsplit stream would have reached it in cycle 90 — 16 cycles more (the DMA in simulation
    against the DRAM model: last beat in cycle 292 instead of 276). Starting on the boundary,
    the split is the max_burst one and costs nothing."""
    model = CycleModel(get_config("ecp5"))
    assert model.bursts(4096 - 136, 128)[:4] == [16, 16, 2, 16]
    assert model.control_read(4096 - 136, 512) == (model.read_transfer(128) + 16, 128)
    assert model.control_read(4096, 512) == (model.read_transfer(128), 128)
