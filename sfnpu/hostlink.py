"""The board's host link protocol: one definition for the UART bridge gateware
(:mod:`sfnpu.hw.uart_bridge`) and the host tool (:mod:`sfnpu.tools.board`).

Every request is a command byte followed by a fixed header (little-endian fields); every
request gets a reply that ends with one :class:`Status` byte:

=============  ====================================  ==========================================
command        header                                 reply
=============  ====================================  ==========================================
``IDENT``      —                                      ``version:u8 memory_bytes:u32 word_bytes:u8``
                                                      status
``CSR_WRITE``  ``offset:u16 value:u32``               status (the AXI4-Lite response)
``CSR_READ``   ``offset:u16``                         ``value:u32`` status (AXI4-Lite response)
``MEM_WRITE``  ``word:u32 count:u16``, then ``count``  status (DECERR if a word was outside the
               words of ``word_bytes`` bytes          memory; those words are dropped)
``MEM_READ``   ``word:u32 count:u16``                 ``count`` words, status (DECERR as above;
                                                      such words read as zero)
=============  ====================================  ==========================================

Memory addresses count bus words of the board's memory (``word_bytes`` each, from ``IDENT``).
An unknown command byte is answered with the single byte ``Status.UNKNOWN_COMMAND``.
"""

from __future__ import annotations

from amaranth.lib import enum

from .bus import Resp

__all__ = ["LINK_VERSION", "Command", "Status", "HEADER_BYTES", "MAX_COUNT"]

LINK_VERSION = 1
#: Largest word count of one MEM_WRITE or MEM_READ (a u16 field).
MAX_COUNT = 0xFFFF


class Command(enum.Enum, shape=8):
    IDENT = 0x01
    CSR_WRITE = 0x02
    CSR_READ = 0x03
    MEM_WRITE = 0x04
    MEM_READ = 0x05


class Status(enum.Enum, shape=8):
    """Reply status: the AXI response codes, plus one for a byte that is no command."""
    OKAY = Resp.OKAY.value
    SLVERR = Resp.SLVERR.value
    DECERR = Resp.DECERR.value
    UNKNOWN_COMMAND = 0xEE


#: Header bytes after each command byte.
HEADER_BYTES = {
    Command.IDENT: 0,
    Command.CSR_WRITE: 6,
    Command.CSR_READ: 2,
    Command.MEM_WRITE: 6,
    Command.MEM_READ: 6,
}
