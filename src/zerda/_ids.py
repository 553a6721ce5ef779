"""Message ids: time-ordered UUIDs (version 7), strictly increasing within a process."""

from __future__ import annotations

import random
import threading
import time

__all__ = ["new_message_id", "new_message_ids"]

_id_lock = threading.Lock()
_last_id = 0
_LOW_62 = (1 << 62) - 1
_LOW_48 = (1 << 48) - 1
# The 48 high bits of the last block formatted, and the format of its ids (new_message_ids).
_format: tuple[int, str] = (-1, "")


def new_message_id() -> str:
    """A new message id: a UUID version 7 (RFC 9562), as text.

    Ids sort by creation time as strings, and within one process each is greater than the
    one before, even within a millisecond. 74 random bits keep ids from different processes
    and machines apart.
    """
    return _uuid7(_id_block(1))


def new_message_ids(count: int) -> list[str]:
    """``count`` new message ids, in increasing order (one clock reading)."""
    first = _id_block(count)
    low = first & _LOW_48
    if low + count > _LOW_48:  # the block carries past the last 12 digits (once in 2**48 / count)
        return [_uuid7(first + i) for i in range(count)]
    # Only the last 12 hex digits differ within the block: the rest is formatted once, into the
    # format of each id, and kept while blocks share it (within a millisecond they do).
    global _format
    high, each = _format
    if high != first >> 48:
        high, each = _format = first >> 48, _uuid7(first)[:24] + "%012x"
    return [each % n for n in range(low, low + count)]


def _id_block(count: int) -> int:
    """The first of ``count`` fresh 122-bit values: milliseconds, then 74 bits; each greater
    than every value given before in this process.

    A new millisecond starts from 74 random bits; within one, values count on from the last
    (RFC 9562's monotonic random method, section 6.2): ids of a process stay in order, and the
    random start keeps those of other processes and machines apart.
    """
    global _last_id
    ms = time.time_ns() // 1_000_000
    with _id_lock:
        # A new millisecond: Mersenne Twister bits, unique enough beside the time, reseeded
        # in forked children, several times faster than os.urandom. The same millisecond
        # (or a clock that went back): count on.
        value = ms << 74 | random.getrandbits(74) if ms > _last_id >> 74 else _last_id + 1
        _last_id = value + count - 1
    return value


def _uuid7(value: int) -> str:
    """The UUID text of a 122-bit value: 48 bits of milliseconds, the version (7), 12 bits,
    the variant (0b10), 62 bits."""
    ms, low = value >> 74, value & _LOW_62
    return "%08x-%04x-7%03x-%04x-%012x" % (  # noqa: UP031 - the fastest way, on a hot path
        ms >> 16,
        ms & 0xFFFF,
        value >> 62 & 0xFFF,
        0x8000 | low >> 48,
        low & 0xFFFFFFFFFFFF,
    )
