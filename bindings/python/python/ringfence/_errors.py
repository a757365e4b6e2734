"""The exceptions ringfence raises.

Every one is a :class:`RingfenceError` carrying the ringfence status: ``status``
(the negative value, as in a C caller's return code or a completion's result)
and ``status_name`` (``"OutOfBounds"``, ``"PeerUnreachable"``, ...). The class
follows from the status; each also derives from the builtin exception a Python
caller would expect (``ValueError``, ``TimeoutError``, ``ConnectionError``,
...). An operation's failure raised by ``Transfer.wait`` or ``Transfer.check``
also has ``op_index``: the failed operation's index in its batch.
"""

from __future__ import annotations

import builtins


class RingfenceError(Exception):
    """A ringfence call or operation failed; ``status`` says why."""

    status: int | None = None
    status_name: str | None = None
    op_index: int | None = None


class InvalidArgumentError(RingfenceError, ValueError):
    """Bad input: a malformed address or key, a zero length, a range outside
    its memory, a misaligned atomic word, a read-only buffer where one is
    written, a notification longer than the buffer it is read into
    (``Truncated``)."""


class InvalidHandleError(RingfenceError):
    """Something named is not there (any more): a released ``Memory`` or
    ``RemoteMemory``, a key unpacked for another endpoint, a closed worker,
    a parent's worker used in a forked child, a notification read twice."""


class AccessDeniedError(RingfenceError, PermissionError):
    """The peer refused: its memory was released, or the key is not valid
    there any more."""


class EndpointError(RingfenceError, ConnectionError):
    """The endpoint failed or closed (the peer died: ``PeerUnreachable``), or
    the operation was canceled (``Canceled``)."""


class TimeoutError(RingfenceError, builtins.TimeoutError):  # noqa: A001
    """A wait ran out of time; what it waited for goes on."""


class BusyError(RingfenceError):
    """In use: memory that operations in flight use, or a worker awaited
    from another event loop."""


class OutOfMemoryError(RingfenceError, MemoryError):
    """Memory could not be had (beyond the process's memory limit)."""


class UnsupportedError(RingfenceError):
    """No driver of this worker does it (device memory in this build, atomics
    on memory a peer reaches by cross memory attach)."""


__all__ = [
    "RingfenceError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "AccessDeniedError",
    "EndpointError",
    "TimeoutError",
    "BusyError",
    "OutOfMemoryError",
    "UnsupportedError",
]
