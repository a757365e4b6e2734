"""Waiting in asyncio: the worker's CQ eventfd registered with the event loop.

One hub per (worker, event loop) multiplexes every coroutine that awaits that
worker. While one of them waits, the hub either leads (it watches the CQ's
eventfd, which the engine rings when it posts completions) or follows (a
thread in a blocking wait leads, and the hub watches the relay eventfd, rung
whenever completions are routed or that thread gives up the lead). When a
descriptor wakes the loop, the hub collects the completions and wakes every
waiting coroutine; each looks at its own condition again.

Without a core thread nothing makes progress while the loop sleeps, so the
coroutines progress the worker themselves, yielding to the loop between
rounds (``await asyncio.sleep(0)``): start the worker with
``core_thread=True`` to wait on the eventfd instead.
"""

from __future__ import annotations

import asyncio
import weakref

from . import _errors

# What Worker._async_arm answers.
_READY, _LEAD, _FOLLOW, _POLL = 0, 1, 2, 3


class _Hub:
    def __init__(self, port, loop: asyncio.AbstractEventLoop) -> None:
        self.port = port
        self.loop = loop
        self.cq_fd, self.relay_fd = port.fds()
        self.sleepers: set[asyncio.Future] = set()
        self.watching_cq = False
        self.watching_relay = False
        self.waiters = 0

    def _wake_all(self) -> None:
        sleepers, self.sleepers = self.sleepers, set()
        for f in sleepers:
            if not f.done():
                f.set_result(None)

    def _on_cq(self) -> None:
        self._unwatch_cq()
        try:
            self.port.wake()
        finally:
            self._wake_all()

    def _on_relay(self) -> None:
        self.port.relay_clear()
        self._wake_all()

    def _unwatch_cq(self) -> None:
        if self.watching_cq:
            self.loop.remove_reader(self.cq_fd)
            self.watching_cq = False

    def begin(self) -> None:
        self.port.begin(id(self.loop))
        self.waiters += 1
        if not self.watching_relay:
            self.loop.add_reader(self.relay_fd, self._on_relay)
            self.watching_relay = True

    def end(self) -> None:
        self.waiters -= 1
        if self.waiters == 0:
            self._unwatch_cq()
            if self.watching_relay:
                self.loop.remove_reader(self.relay_fd)
                self.watching_relay = False
        self.port.end()

    def sleeper(self, lead: bool) -> asyncio.Future:
        """A future the next wake of the loop resolves. Made in the same
        step as the look at the caller's condition (no await between), so
        no wake can come between the two and be missed."""
        if lead and not self.watching_cq:
            self.loop.add_reader(self.cq_fd, self._on_cq)
            self.watching_cq = True
        f = self.loop.create_future()
        self.sleepers.add(f)
        return f


def _error(cls, status: int, name: str, message: str) -> _errors.RingfenceError:
    e = cls(message)
    e.status, e.status_name = status, name
    return e


def _resolve(f: asyncio.Future) -> None:
    if not f.done():
        f.set_result(None)


# Per event loop, the hubs of the workers awaited there (by port key); a
# hub goes when its last waiter does, so it keeps no closed worker alive.
_hubs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _hub(port, loop) -> tuple[dict, _Hub]:
    per_loop = _hubs.get(loop)
    if per_loop is None:
        per_loop = {}
        _hubs[loop] = per_loop
    hub = per_loop.get(port.key)
    if hub is None:
        hub = _Hub(port, loop)
        per_loop[port.key] = hub
    return per_loop, hub


async def _wait(port, ready, timeout: float | None):
    """Awaits until ``ready()`` returns something other than None."""
    if timeout is not None and not timeout >= 0:
        raise _error(_errors.InvalidArgumentError, -22, "InvalidArgument",
                     f"timeout is a number of seconds, 0 or more, or None; not {timeout}")
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    per_loop, hub = _hub(port, loop)
    hub.begin()
    try:
        while True:
            try:
                state = port.arm()
            except _errors.InvalidHandleError:
                # A closed worker settled its transfers first.
                result = ready()
                if result is not None:
                    return result
                raise
            result = ready()
            if result is not None:
                return result
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise _error(_errors.TimeoutError, -62, "Timeout", f"timed out after {timeout} s")
            if state == _READY:
                continue
            if state == _POLL:
                await asyncio.sleep(0)
                continue
            f = hub.sleeper(state == _LEAD)
            timer = None if left is None else loop.call_later(left, _resolve, f)
            try:
                await f
            finally:
                hub.sleepers.discard(f)
                if timer is not None:
                    timer.cancel()
    finally:
        hub.end()
        if hub.waiters == 0 and per_loop.get(port.key) is hub:
            del per_loop[port.key]


async def wait_transfer(transfer, timeout: float | None = None) -> None:
    """Awaits every completion of ``transfer``; raises as ``Transfer.wait``."""
    await _wait(transfer._port(), lambda: True if transfer._settled() else None, timeout)
    transfer.check()


async def wait_notification(worker, timeout: float | None = None):
    """Awaits the worker's next notification."""
    port = worker._port()
    return await _wait(port, port.take_notification, timeout)
