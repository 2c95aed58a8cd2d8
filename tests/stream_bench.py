"""Drive Amaranth ``lib.stream`` components in Amaranth's simulator with random stalls.

Used by the post-processing block tests (``tests/test_hw_*.py``). A beat of ``lanes`` 8-bit
codes is one integer (lane *l* in bits ``8l … 8l+7``), so a testbench sets and samples one value
per beat. Roles:

* a *driver* per input stream offers its beats in order and drops ``valid`` for a random number
  of cycles before each beat;
* the *monitor* on the output stream drops ``ready`` at random (back-pressure) and records every
  beat transferred (``valid`` and ``ready`` at a clock edge);
* the caller's reference model (``sfnpu.numeric``) and an equality check are the scoreboard.

A block that hangs fails on a cycle limit instead of running forever, and beats beyond the
expected count are reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Value
from amaranth.sim import Simulator

__all__ = ["pack_beats", "unpack_beats", "StreamRun", "run_streams", "beats_of", "tensor_of",
           "interleaved_beats_of", "interleaved_tensor_of"]


def pack_beats(codes) -> list[int]:
    """``(beats, lanes)`` codes (any signedness) → one integer per beat."""
    raw = np.asarray(codes).astype(np.int64) & 0xFF
    return [int.from_bytes(row.astype(np.uint8).tobytes(), "little") for row in raw]


def unpack_beats(values, lanes: int) -> np.ndarray:
    """Inverse of :func:`pack_beats`: ``(beats, lanes)`` raw bytes (uint8)."""
    blob = b"".join(int(v).to_bytes(lanes, "little") for v in values)
    return np.frombuffer(blob, dtype=np.uint8).reshape(-1, lanes)


def beats_of(x: np.ndarray, lanes: int) -> list[int]:
    """A ``(C, H, W)`` feature map as its stream of beats: channel block by channel block, rows
    in raster order (the channel-blocked layout of :func:`sfnpu.layout.pack_tensor`)."""
    from sfnpu.layout import pack_tensor
    raw = np.frombuffer(pack_tensor(x, lanes), dtype=np.uint8).reshape(-1, lanes)
    return pack_beats(raw)


def tensor_of(values, c: int, h: int, w: int, lanes: int, signed: bool) -> np.ndarray:
    """Output beats read back as a ``(C, H, W)`` int32 tensor of codes."""
    from sfnpu.layout import unpack_tensor
    raw = unpack_beats(values, lanes).tobytes()
    return unpack_tensor(raw, c, h, w, lanes, signed).astype(np.int32)


def interleaved_beats_of(x: np.ndarray, lanes: int) -> list[int]:
    """A ``(C, H, W)`` feature map as a row-interleaved stream (row-based weight reuse): for
    each row *y*, for each channel block *b*, the ``W`` pixels of that row of that block —
    order ``(y, b, x)``; padding channels hold 0."""
    c, h, w = x.shape
    blocks = -(-c // lanes)
    padded = np.zeros((blocks * lanes, h, w), dtype=x.dtype)
    padded[:c] = x
    return pack_beats(padded.reshape(blocks, lanes, h, w).transpose(2, 0, 3, 1)
                      .reshape(-1, lanes))


def interleaved_tensor_of(values, c: int, h: int, w: int, lanes: int,
                          signed: bool) -> np.ndarray:
    """Output beats in ``(y, b, x)`` order read back as a ``(C, H, W)`` int32 tensor."""
    blocks = -(-c // lanes)
    raw = unpack_beats(values, lanes)
    if len(raw) != h * blocks * w:
        raise ValueError(f"{len(raw)} beats for {h} rows of {blocks} × {w} pixels")
    codes = raw.view(np.int8) if signed else raw
    x = codes.reshape(h, blocks, w, lanes).transpose(1, 3, 0, 2).reshape(-1, h, w)
    return x[:c].astype(np.int32)


def _count(spec) -> int:
    return len(spec[0] if isinstance(spec, tuple) else spec)


@dataclass
class StreamRun:
    beats: list[int]        # payloads transferred on the output stream, in order
    cycles: int             # cycles until the last output beat (drivers start in cycle 0 or 1)
    extra: int              # beats offered after the expected count (must be 0)


def run_streams(dut, sources: dict, expect: int, *, config: dict | None = None,
                sink: str = "o_stream", setup=None, rng=None, stall: float = 0.3,
                ready_stall: float | None = None, max_cycles: int | None = None,
                drain: int = 16) -> StreamRun:
    """Simulate ``dut`` until ``expect`` beats have left ``sink``.

    ``sources``: stream name → payload integers, or → ``(payloads, {port: values})`` to set
    sideband inputs together with every beat. ``config``: port name → value, applied before the
    first cycle. ``setup``: ``async def setup(ctx)`` run after ``config`` and before any beat
    (e.g. loading a table through a write port). ``stall``/``ready_stall``: probability that a
    driver idles before a beat / that the monitor is not ready in a cycle.
    """
    rng = np.random.default_rng(0) if rng is None else rng
    ready_stall = stall if ready_stall is None else ready_stall
    total_in = sum(_count(s) for s in sources.values())
    max_cycles = max_cycles or 20 * (total_in + expect) + 1000
    started = [False]
    sent = {name: 0 for name in sources}
    result = StreamRun([], 0, 0)

    def driver(name, spec):
        payloads, sideband = spec if isinstance(spec, tuple) else (spec, {})
        port = getattr(dut, name)
        payload = Value.cast(port.payload)
        # Pre-draw the idle cycles: one random number per beat, not per cycle.
        idles = rng.geometric(1 - stall, len(payloads)) - 1 if stall else np.zeros(len(payloads))

        async def process(ctx):
            while not started[0]:
                await ctx.tick()
            for k, value in enumerate(payloads):
                for _ in range(int(idles[k])):
                    await ctx.tick()
                ctx.set(port.valid, 1)
                ctx.set(payload, value)
                for signal, values in sideband.items():
                    ctx.set(getattr(dut, signal), values[k])
                await ctx.tick().until(port.ready)
                ctx.set(port.valid, 0)
                sent[name] += 1
        return process

    async def monitor(ctx):
        for signal, value in (config or {}).items():
            ctx.set(getattr(dut, signal), value)
        if setup is not None:
            await setup(ctx)
        started[0] = True
        port = getattr(dut, sink)
        payload = Value.cast(port.payload)
        ready_draws = rng.random(max_cycles) >= ready_stall
        cycles = 0
        while len(result.beats) < expect:
            if cycles >= max_cycles:
                raise AssertionError(
                    f"hang: {len(result.beats)} of {expect} beats after {cycles} cycles; "
                    f"sent {sent} of {[_count(s) for s in sources.values()]}")
            ready = bool(ready_draws[cycles])
            ctx.set(port.ready, ready)
            _, _, valid, value = await ctx.tick().sample(port.valid, payload)
            cycles += 1
            if valid and ready:
                result.beats.append(value)
        result.cycles = cycles
        # Inputs no output depends on (e.g. rows past the last pooling window) still have to be
        # consumed; then nothing more may come out.
        ctx.set(port.ready, 1)
        idle = 0
        while idle < drain:
            if cycles >= max_cycles:
                raise AssertionError(f"hang: inputs not consumed after {cycles} cycles: {sent}")
            _, _, valid = await ctx.tick().sample(port.valid)
            cycles += 1
            result.extra += valid
            idle = idle + 1 if all(sent[n] == _count(s) for n, s in sources.items()) else 0

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for name, spec in sources.items():
        sim.add_testbench(driver(name, spec), background=True)
    sim.add_testbench(monitor)
    sim.run()
    unsent = {name: _count(spec) - sent[name]
              for name, spec in sources.items()}
    assert not any(unsent.values()), f"beats never accepted: {unsent}"
    return result
