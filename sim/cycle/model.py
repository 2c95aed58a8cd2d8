"""The cycle model's top: the control FSM's states around each chunk's compute phase, whose
row loop composes the components (input reader, shortcut reader, weight stream, array, post
chain, output writer, command arbiter)."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil
from typing import Mapping, Sequence

from sfnpu import image, isa, layout
from sfnpu.config import HwConfig
from sfnpu.isa import Instruction, Reuse
from sfnpu.limits import (StoreSizes, chunk_blocks, group_shape, stages_input, staging_location,
                          streams_weights)

from .dram import CommandArbiter, DmaTiming
from .input_reader import InputReader
from .output_writer import OutputWriter
from .post_chain import PostChain, post_latency
from .shape import ChunkPlan, Shape
from .shortcut import ShortcutReader
from .weights import WeightStream

__all__ = ["CycleModel", "GroupTiming", "ModelRun"]


@dataclass(frozen=True)
class GroupTiming:
    """One group's modelled latency and DRAM traffic."""
    index: int
    cycles: int
    read_bytes: int
    write_bytes: int
    reuse: Reuse
    control: int            # fetch, decode, parameter and weight loading
    compute: int            # the compute phases (all chunks)
    bound: str              # what limits the compute phase: "mac" or "dram"


@dataclass
class ModelRun:
    """A whole program: per-group timings and totals."""
    config: HwConfig
    groups: list[GroupTiming] = field(default_factory=list)

    @property
    def cycles(self) -> int:
        return sum(g.cycles for g in self.groups)

    @property
    def read_bytes(self) -> int:
        return sum(g.read_bytes for g in self.groups)

    @property
    def write_bytes(self) -> int:
        return sum(g.write_bytes for g in self.groups)

    @property
    def seconds(self) -> float:
        return self.cycles / (self.config.clock_mhz * 1e6)


class CycleModel(DmaTiming):
    """Latency and DRAM bytes of each group on one hardware configuration (the DMA's closed
    forms, :meth:`beats`, :meth:`bursts`, :meth:`control_read`, from :class:`DmaTiming`)."""

    def __init__(self, config: HwConfig):
        from sfnpu.hw.conv_array import array_latency
        from sfnpu.hw.requant import Requantizer
        from sfnpu.hw.controller.accumulator import Accumulator
        from sfnpu.hw.controller.sequencer import Sequencer

        super().__init__(config)
        self.L = config.lanes
        self.sizes = StoreSizes.of(config)
        self.weight_words = self.sizes.weight_words
        self.row_words_max = self.sizes.row_words
        self.write_words = self.sizes.write_words
        self.psum_words = self.sizes.psum_words
        # Array → accumulator (psum stage, sum register) → requantiser → result FIFO.
        self.result_latency = (array_latency(config) + Accumulator.LATENCY
                               + Requantizer.LATENCY + 1)
        # The last row's end → the compute phase's cycles when only the datapath is left:
        # the last step a cycle after the end, the row buffer's busy falls two cycles later,
        # the datapath's busy array_latency + 1 cycles after that (its in_flight shift
        # register), compute_done in that cycle (+ 1: the cycle count).
        self.drain_latency = 1 + 2 + array_latency(config) + 1 + 1
        # FETCH_ALIGN … DIVIDE, after the instruction's read.
        self.decode_cycles = Sequencer.decode_cycles(self.sizes)
        # The same from the cycle the row buffer holds the input's last row, when no window
        # reads it: its busy falls a cycle later.
        self.rows_drain_latency = 1 + array_latency(config) + 1 + 1

    # -- the group's derived parameters ---------------------------------------------------

    def shape(self, instr: Instruction) -> Shape:
        g = group_shape(instr, self.sizes)
        return Shape(g.depthwise, g.identity, g.in_blocks, g.out_blocks, g.ib, g.conv_h,
                     g.conv_w, g.steps, g.taps, g.row_words, g.places,
                     streams_weights(instr, self.config), chunk_blocks(instr, self.config))

    def _chunks(self, s: Shape) -> list[int]:
        if not s.chunk_obs:
            raise ValueError("one output block's weights do not fit the weight store (or half "
                             "of it with double_buffer): the controller stops the group with "
                             "BUFFER_OVERFLOW (sfnpu.limits.overflows)")
        full, rest = divmod(s.out_blocks, s.chunk_obs)
        return [s.chunk_obs] * full + ([rest] if rest else [])

    # -- one group ------------------------------------------------------------------------

    def group(self, instr: Instruction, index: int = 0, fetch_address: int = 0,
              section_count: int | None = None, base: int = 0,
              next_instr: Instruction | None = None,
              geometry: layout.Geometry | None = None) -> GroupTiming:
        """Model one group. ``fetch_address``: the instruction's byte offset in the image (its
        alignment decides the fetch's beats); ``section_count``: the image's sections, when
        the header and section table are read before this group; ``base``: the image's DRAM
        address (IMAGE_BASE): DRAM locations are offsets from it, and the DMA splits bursts
        at 4 KiB boundaries of the absolute addresses; ``next_instr``: the instruction after
        it, whose weights a group with ``prefetch`` loads; ``geometry``: its operands'
        pitches (:func:`sfnpu.layout.geometry`), which a windowed group's addresses need —
        the dense ones otherwise."""
        geo = self._geometry(instr, index, geometry)
        s = self.shape(instr)
        chunks = self._chunks(s)
        control, read = self._control(instr, s, fetch_address, section_count, base)
        write = compute = 0
        loads_weights = not (s.identity or s.streaming or instr.weights_held)
        bounds = []
        # A staged input (limits.stages_input) comes from DRAM in the first chunk and from
        # the staging buffer in the others.
        later = instr.replace(input=staging_location(instr)) \
            if stages_input(instr, self.config) else instr
        ob_base = 0
        for k, obs in enumerate(chunks):
            if loads_weights and not (k and instr.double_buffer):
                cycles, n = self._weight_read(instr, s, base, ob_base, obs)     # WEIGHT_CMD
                control += cycles
                read += n * self.B
            cycles, r, w, bound = self._compute(later if k else instr, s, obs, ob_base, base,
                                                geo)
            if instr.double_buffer and k + 1 < len(chunks):
                # the next chunk loads behind this one: CHUNK, PLACE, then its read
                load, n = self._weight_read(instr, s, base, ob_base + obs, chunks[k + 1])
                cycles = max(cycles, 2 + load + 1)
                r += n * self.B
            elif instr.prefetch and k + 1 == len(chunks):
                prefetch, n = self._prefetch(next_instr, base + fetch_address + isa.WORDS * 4,
                                             base)
                cycles = max(cycles, prefetch)
                r += n
            ob_base += obs
            compute += cycles + 1                              # + COMPUTE_START
            read += r
            write += w
            bounds.append(bound)
        cycles = control + compute + 1                          # + GROUP_END
        return GroupTiming(index, cycles, read, write, instr.reuse, control, compute,
                           max(set(bounds), key=bounds.count))

    def _geometry(self, instr: Instruction, index: int,
                  geometry: layout.Geometry | None) -> layout.Geometry:
        if geometry is not None:
            return geometry
        if instr.windowed:
            raise ValueError(f"group {index} is windowed: its operands' pitches are in its "
                             "parameter block's window record; pass its geometry "
                             "(sfnpu.layout.geometry), or model the image")
        return layout.Geometry.dense(instr, self.L)

    def _control(self, instr: Instruction, s: Shape, fetch_address: int,
                 section_count: int | None, base: int) -> tuple[int, int]:
        """(cycles, read bytes) of the control FSM's states before the first chunk's weights:
        the header and section table (``section_count``), FETCH … DIVIDE, CHUNK, PARAM."""
        B = self.B
        read = control = 0
        if section_count is not None:
            for address, length in ((base, image.HEADER.size),
                                    (base + image.HEADER.size,
                                     section_count * image.SECTION.size)):
                cycles, n = self.control_read(address, length)
                control += cycles + 1                         # + HEADER_CHECK / TABLE_CHECK
                read += n * B
        # FETCH, then FETCH_ALIGN … DIVIDE.
        cycles, n = self.control_read(base + fetch_address, isa.WORDS * 4)
        read += n * B
        control += cycles + self.decode_cycles
        if s.chunk_obs != s.out_blocks:                      # CHUNK: one block per cycle
            control += s.chunk_obs + 1
        # PARAM: every store takes a beat per cycle (the activation tables too).
        cycles, n = self.control_read(base + instr.params.offset,
                                      layout.param_bytes(instr, self.config))
        return control + cycles, read + n * B

    def _weight_read(self, instr: Instruction, s: Shape, base: int, first: int,
                     blocks: int) -> tuple[int, int]:
        """(cycles, beats) of the control FSM's read of the weights of ``blocks`` output blocks
        from ``first`` on (a depthwise layer's are all read at once)."""
        cfg = self.config
        block_bytes = s.ib * s.steps * cfg.ti * cfg.to
        length = s.in_blocks * s.taps * self.L if s.depthwise else blocks * block_bytes
        return self.control_read(base + instr.weights.offset + first * block_bytes, length)

    def _prefetch(self, nxt: Instruction | None, address: int, base: int) -> tuple[int, int]:
        """(cycles, read bytes) of a ``prefetch``: from the first cycle of COMPUTE to the one in
        which the controller's prefetch is done — the next instruction's read (``address``),
        ALIGN, BLOCKS, WORDS, CHECK and PLACE, and the read of its weights, each read issued at
        once.
        The compiler sets ``prefetch`` only where the compute phase has the bus to itself
        (:func:`sfnpu.limits.prefetch_pays`), so the reads are the control FSM's."""
        if nxt is None:
            raise ValueError("a group with prefetch set needs the next instruction")
        cfg = self.config
        cycles, n = self.control_read(address, isa.WORDS * 4)
        words = group_shape(nxt, self.sizes).weight_steps
        w_cycles, w_n = self.control_read(base + nxt.weights.offset, words * cfg.ti * cfg.to)
        return cycles + 5 + w_cycles + 1, (n + w_n) * self.B

    # -- the compute phase ------------------------------------------------------------------

    def _compute(self, instr: Instruction, s: Shape, obs: int, ob_base: int,
                 base: int, geo: layout.Geometry):
        """(cycles, read bytes, write bytes, bound) of one chunk of ``obs`` output blocks from
        block ``ob_base`` on, from the first cycle of COMPUTE to the cycle ``compute_done``
        rises. DRAM commands carry the controller's addresses (``base``: IMAGE_BASE; ``geo``:
        the operands' pitches).

        The array runs output row by output row (the cycle its last result is out), once the
        row's input rows are in the row buffer, and the post chain behind it: the writes of
        earlier rows share the bus with later rows' reads."""
        plan = ChunkPlan.of(instr, s, obs, ob_base, base, geo)
        dram = CommandArbiter(self)
        shortcut = ShortcutReader(self, plan, dram)
        reader = InputReader(self, plan, dram)
        writer = OutputWriter(self, plan, dram, shortcut, post_latency(instr))
        post = PostChain(self, plan, shortcut, writer)
        avg = post.avg
        weights = WeightStream(self, dram, base + instr.weights.offset, obs, s.ib, s.conv_h,
                               s.steps, s.conv_w, plan.pass_cycles,
                               shortcut if shortcut.segments else None) \
            if s.streaming else None
        end = 0
        for oy in range(s.conv_h):
            start = reader.row_start(oy, end)
            if avg is not None:
                start = avg.resume_row(oy, start)
            end = start + plan.row
            if avg is not None:
                end = avg.held_row(oy, start, end)
            if weights is not None:
                # the row's passes, each once its set can be replayed
                end = max(end, writer.streamed_row(oy, weights.passes(oy, start)))
            post.take_row(oy, start, end)
            if weights is not None:
                weights.advance()
        last_row_in = reader.finish(end)
        # The datapath must drain too (~dp.busy): rows no pooling window uses are still
        # computed, but only the array's pipeline, not the post chain, is waited for.
        cycles = max(writer.done(), end + self.drain_latency,
                     last_row_in + self.rows_drain_latency)
        read = reader.read_bytes + shortcut.read_bytes \
            + (weights.read_bytes if weights is not None else 0)
        bound = "dram" if dram.busy * 1.05 >= cycles else "mac"
        return ceil(cycles), read, writer.write_bytes, bound

    # -- programs ---------------------------------------------------------------------------

    def run(self, program: Sequence[Instruction] | bytes, *,
            instructions_offset: int | None = None, section_count: int | None = None,
            image_base: int = 0,
            geometries: Mapping[int, layout.Geometry] | None = None) -> ModelRun:
        """Model a whole program: a DRAM image (bytes) or a list of instructions (then the
        instruction section's offset and the section count default to a typical image's, and
        ``geometries`` gives the windowed groups' operand pitches by group index),
        loaded at DRAM address ``image_base`` (IMAGE_BASE: a multiple of ``SECTION_ALIGN``;
        :meth:`sfnpu.tb.system.SystemHarness.run`'s ``base``)."""
        geometries = dict(geometries or {})
        if isinstance(program, (bytes, bytearray)):
            img = image.unpack(bytes(program), self.config)
            instructions = list(img.program)
            instructions_offset = img.layout.of_kind(image.SectionKind.INSTRUCTIONS)[0].offset
            section_count = len(img.layout.sections)
            for k, instr in enumerate(instructions):
                if instr.windowed:      # the window record, from the parameter block
                    start = instr.params.offset
                    block = img.dram[start:start + layout.param_bytes(instr, self.config)]
                    geometries[k] = layout.geometry(instr, self.config, bytes(block))
        else:
            instructions = list(program)
            instructions_offset = image.SECTION_ALIGN if instructions_offset is None \
                else instructions_offset
            section_count = 5 if section_count is None else section_count
        if image_base % image.SECTION_ALIGN:
            raise ValueError(f"image base {image_base:#x} is not a multiple of "
                             f"{image.SECTION_ALIGN} (the controller refuses it)")
        run = ModelRun(self.config)
        for k, instr in enumerate(instructions):
            address = instructions_offset + k * isa.WORDS * 4
            nxt = instructions[k + 1] if k + 1 < len(instructions) else None
            run.groups.append(self.group(instr, k, address, section_count if k == 0 else None,
                                         image_base, nxt, geometries.get(k)))
        return run
