"""ActivationTable (hw/act_table.py) against sfnpu.numeric.apply_table, through its streams.

Tables are loaded through the write port, then feature maps stream through with random
valid/ready stalls; every one of the 256 codes is looked up in every lane.
"""

import numpy as np
import pytest

from sfnpu import layout
from sfnpu.hw.act_table import ActivationTable
from sfnpu.numeric import apply_table, qrange, requant_table
from stream_bench import beats_of, run_streams, tensor_of


def load_tables(dut, tables: np.ndarray):
    """Setup coroutine: every table entry through the write port in the parameter section's
    byte order (:func:`sfnpu.layout.pack_channel_tables` for per-channel tables), the DUT's
    ``write_bytes`` entries per cycle."""
    tables = np.asarray(tables).astype(np.int64) & 0xFF
    raw = layout.pack_channel_tables(tables, dut.lanes) if dut.per_channel else tables
    words = raw.astype(np.uint8).reshape(-1, dut.write_bytes)

    async def setup(ctx):
        ctx.set(dut.write_en, 1)
        for k, word in enumerate(words):
            ctx.set(dut.write_addr, k * dut.write_bytes)
            ctx.set(dut.write_data, int.from_bytes(word.tobytes(), "little"))
            await ctx.tick()
        ctx.set(dut.write_en, 0)
    return setup


def random_map(rng, c, h, w, signed, cover_all_codes=True) -> np.ndarray:
    lo, hi = qrange(signed)
    x = rng.integers(lo, hi + 1, (c, h, w))
    if cover_all_codes:        # every code in every channel, wherever the map is large enough
        flat = x.reshape(c, -1)
        n = min(256, flat.shape[1])
        for ch in range(c):
            flat[ch, :n] = rng.permutation(np.arange(lo, hi + 1))[:n]
            rng.shuffle(flat[ch])
    return x.astype(np.int8 if signed else np.uint8)


def shared_table(rng, kind, in_signed, out_signed) -> np.ndarray:
    if kind == "requant":      # a real activation-style table: monotonic requantisation
        return requant_table(np.float32(rng.uniform(0.01, 0.1)), int(rng.integers(-10, 10)),
                             np.float32(rng.uniform(0.01, 0.1)), 3, in_signed, out_signed)
    lo, hi = qrange(out_signed)
    return rng.integers(lo, hi + 1, 256)


@pytest.mark.parametrize("lanes, c, h, w, in_signed, out_signed, kind, write_bytes", [
    (8, 16, 5, 7, True, True, "random", 1),
    (8, 8, 17, 16, False, True, "requant", 8),
    (4, 10, 9, 11, True, False, "random", 16),   # 10 channels: a padded last block
    (2, 2, 16, 16, False, False, "random", 4),
])
def test_shared_table(lanes, c, h, w, in_signed, out_signed, kind, write_bytes):
    """Every code of every lane looked up in one table, written ``write_bytes`` codes a
    cycle (a bus beat of the parameter block)."""
    rng = np.random.default_rng(lanes * 1000 + c)
    dut = ActivationTable(lanes, write_bytes=write_bytes)
    table = shared_table(rng, kind, in_signed, out_signed)
    x = random_map(rng, c, h, w, in_signed)
    beats = beats_of(x, lanes)
    run = run_streams(dut, {"i_stream": beats}, len(beats), config={"enable": 1},
                      setup=load_tables(dut, table), rng=rng)
    got = tensor_of(run.beats, c, h, w, lanes, out_signed)
    expected = apply_table(x, table, in_signed)
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]
    assert run.extra == 0


@pytest.mark.parametrize("lanes, max_channels, c, h, w, in_signed, out_signed, write_bytes", [
    (8, 32, 32, 4, 9, True, False, 8),
    (8, 32, 20, 3, 4, False, False, 4),
    (4, 16, 14, 6, 5, False, True, 1),
])
def test_per_channel_tables(lanes, max_channels, c, h, w, in_signed, out_signed, write_bytes):
    """InputTransform.CHANNEL_TABLE: lane l of channel block b looks up channel b·lanes + l;
    the tables are written ``write_bytes`` lanes at a time."""
    rng = np.random.default_rng(max_channels + c)
    dut = ActivationTable(lanes, per_channel=True, max_channels=max_channels,
                          write_bytes=write_bytes)
    lo, hi = qrange(out_signed)
    tables = rng.integers(lo, hi + 1, (max_channels, 256))
    x = random_map(rng, c, h, w, in_signed)
    beats = beats_of(x, lanes)
    block_of_beat = np.arange(len(beats)) // (h * w)
    # Channel blocks in a shuffled order, so a stale block index cannot pass.
    order = rng.permutation(block_of_beat.max() + 1)
    beats = [beats[b * h * w + k] for b in order for k in range(h * w)]
    blocks = [int(b) for b in order for _ in range(h * w)]
    run = run_streams(dut, {"i_stream": (beats, {"channel_block": blocks})}, len(beats),
                      setup=load_tables(dut, tables), config={"enable": 1}, rng=rng)
    inverse = np.argsort(order)
    hw = h * w
    restored = [run.beats[i * hw + k] for i in inverse for k in range(hw)]
    got = tensor_of(restored, c, h, w, lanes, out_signed)
    expected = apply_table(x, tables[:c], in_signed)
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]


def test_bypass_passes_codes_unchanged():
    rng = np.random.default_rng(5)
    dut = ActivationTable(8)
    x = random_map(rng, 8, 8, 8, True)
    beats = beats_of(x, 8)
    run = run_streams(dut, {"i_stream": beats}, len(beats), config={"enable": 0},
                      setup=load_tables(dut, rng.integers(-128, 128, 256)), rng=rng)
    assert run.beats == beats and run.extra == 0


def test_full_throughput_without_stalls():
    """One beat per cycle when neither side stalls (plus the one-cycle latency)."""
    rng = np.random.default_rng(6)
    dut = ActivationTable(8)
    beats = beats_of(random_map(rng, 8, 16, 16, False), 8)
    run = run_streams(dut, {"i_stream": beats}, len(beats), config={"enable": 1},
                      setup=load_tables(dut, np.arange(256)), rng=rng, stall=0)
    assert run.beats == beats
    assert run.cycles <= len(beats) + ActivationTable.LATENCY + 1


@pytest.mark.parametrize("seed", range(12))
def test_random_groups(seed):
    """Random lane counts, shapes, types, tables, stall rates; shared or per-channel."""
    rng = np.random.default_rng(200 + seed)
    lanes = int(rng.choice([2, 4, 8]))
    c = int(rng.integers(1, 3 * lanes + 1))
    h, w = (int(v) for v in rng.integers(1, 12, 2))
    in_signed, out_signed = (bool(v) for v in rng.integers(0, 2, 2))
    lo, hi = qrange(out_signed)
    per_channel = bool(seed % 2)
    x = random_map(rng, c, h, w, in_signed)
    beats = beats_of(x, lanes)
    if per_channel:
        blocks = -(-c // lanes)
        dut = ActivationTable(lanes, per_channel=True, max_channels=blocks * lanes,
                              write_bytes=int(rng.choice([1, 2, lanes])))
        tables = rng.integers(lo, hi + 1, (blocks * lanes, 256))
        source = (beats, {"channel_block": [k // (h * w) for k in range(len(beats))]})
        expected = apply_table(x, tables[:c], in_signed)
    else:
        dut = ActivationTable(lanes, write_bytes=int(rng.choice([1, 4, 16])))
        tables = rng.integers(lo, hi + 1, 256)
        source = beats
        expected = apply_table(x, tables, in_signed)
    run = run_streams(dut, {"i_stream": source}, len(beats), config={"enable": 1},
                      setup=load_tables(dut, tables), rng=rng,
                      stall=float(rng.choice([0.0, 0.3, 0.7])))
    assert np.array_equal(tensor_of(run.beats, c, h, w, lanes, out_signed), expected)
    assert run.extra == 0
