"""Group controller: runs a DRAM image group by group on the convolution datapath.

The controller is a package of components composed by :class:`GroupController`
(:mod:`.top`); the run and the compute phase are described there.
"""

from .common import INSTRUCTION_BYTES, POST_WORDS, result_fifo_depth, results_in_flight
from .top import GroupController

__all__ = ["GroupController", "INSTRUCTION_BYTES", "POST_WORDS", "result_fifo_depth",
           "results_in_flight"]
