"""The cycle model: per-group latency and exact DRAM bytes of the accelerator's schedule.

It models the microarchitecture :mod:`sfnpu.hw.controller` implements, from the same
constants the RTL is built from (the hardware configuration, the DMA's issue latency, the
conv array's and requantiser's pipeline depths, the row buffer's fetch rules) — nothing is
fitted to measurements. The RTL is checked against it group by group (``tests/test_cycle.py``,
``sfnpu sim``).

DRAM bytes are exact: they are the bus beats of the DMA commands the controller issues — the
image header and section table (first group), the instruction, the parameter block, the
weights (once per output-channel chunk, or once per output row when a row-reuse layer's
weights do not fit the weight store, or not at all when ``weights_held``), the input (once per
chunk, or once when staged), the shortcut operand, and the output (write strobes: exactly the
output's bytes).

Latency, per group (the controller's states in order)::

    FETCH → FETCH_ALIGN → DECODE → DECODE2 → DIVIDE → [CHUNK] → PARAM → [WEIGHT]
          → (COMPUTE_START → COMPUTE → [WEIGHT of the next chunk]) … → GROUP_END

Control transfers use the DRAM model's closed form (:mod:`sfnpu.hw.axi_mem`): a read of *N*
beats takes ``ISSUE_LATENCY + latency + floor((N − 1) · B/bpc) + 1`` cycles from its command
state to its last beat, inclusive (the next state starts in the cycle after), unless short
bursts at a 4 KiB boundary let the outstanding limit delay a burst's address past the stream
(then burst by burst, :meth:`.DmaTiming.control_read`); beats of the activation table are
taken one byte per cycle. The compute phase is a row-level
schedule: input rows arrive through the DMA engine's bursts (a command accepted once the
previous one has issued its bursts, addresses ``ISSUE_LATENCY`` cycles after acceptance, at
most ``outstanding`` bursts in flight, data ``latency`` cycles after the address); the input
and shortcut readers command a segment once their FIFO has room for it counting the words in
flight, and the command arbiter takes the shortcut's first when both are requested; the row
buffer holds ``6 · places`` rows, each output row takes :func:`~sfnpu.hw.conv_array.row_cycles`
once its input rows are present, the post-processing chain passes one word per cycle (a max
pool spends a cycle more per row segment on each window after the first that ends at the
segment's last pixel: stride 1 with padding; the average pool sums window by window and
holds the array when the result FIFO fills, as does an ADD whose shortcut falls behind
streamed weights), the
output writer takes a chunk once all its words are in the write buffer, and the group ends
when the last output chunk's write response is back (its last word, for an on-chip output).
The output rows' writes are commanded as the rows leave the post-processing chain, and the
two directions' beats share the DRAM model's one bandwidth credit with its arbitration (a read
beat first unless the write side's turn has come: under load they alternate), simulated in
time order so that earlier rows' writes hold up later rows' reads. Every DRAM command
carries the controller's address (IMAGE_BASE, ``CycleModel.run``'s ``image_base``, plus the
location and the layout offset of its segment), and is split into bursts as the DMA splits it:
at most ``dram_max_burst`` beats, never across a 4 KiB boundary. Weights that do not fit the
store stream set by set at the top read priority, each set commanded once the weight FIFO has
room for it (:class:`.WeightStream`). Not modelled: the write buffer filling up and stalling
the datapath when the writes fall behind.

A group with ``prefetch`` ends no earlier than its prefetch: the next instruction's read, four
cycles of sizing and checks, and the read of the next group's weights, from the first cycle
of COMPUTE, timed as the control FSM's reads — the compiler sets it only where the compute
phase has the bus to itself (:func:`sfnpu.limits.prefetch_pays`); the next group then
finds its weights held.

One module per controller component it times, composed by :class:`CycleModel`'s row loop
(``model.py``): ``dram`` (the DMA's closed forms, :class:`~.dram.DmaTiming`; the command
arbiter and the bus, :class:`~.dram.CommandArbiter`), ``input_reader``, ``shortcut``,
``weights`` (the weight stream), ``post_chain`` with ``avg_pool`` and ``upsample``,
``output_writer``; ``shape`` holds the group's derived parameters and a chunk's array pace,
``compare`` the comparison with the RTL's group log. ``tests/test_cycle_components.py`` checks
components against their RTL blocks alone.
"""

from .compare import GROUP_SLACK, GROUP_TOLERANCE, RUN_TOLERANCE, Comparison, compare
from .model import CycleModel, GroupTiming, ModelRun

__all__ = ["CycleModel", "GroupTiming", "ModelRun", "Comparison", "compare",
           "GROUP_TOLERANCE", "GROUP_SLACK", "RUN_TOLERANCE"]
