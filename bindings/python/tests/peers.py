"""Peer processes for the two-process tests, started with multiprocessing's
"spawn" method (a fresh interpreter: no worker crosses a fork).

Each peer runs one function with a link to the test: ``link.send(value)``
and ``link.recv()``; an exception in the peer is sent back as its traceback,
and the test fails with it.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback

import numpy as np

import ringfence as rf

# The limit of every wait: only catches hangs.
HANG = 120.0

CTX = multiprocessing.get_context("spawn")


def pattern(seed: int, n: int) -> np.ndarray:
    """`n` bytes that depend on `seed`."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class Link:
    def __init__(self, conn) -> None:
        self.conn = conn

    def send(self, value) -> None:
        self.conn.send(("ok", value))

    def recv(self):
        if not self.conn.poll(HANG):
            raise AssertionError("the other process sent nothing")
        kind, value = self.conn.recv()
        if kind == "error":
            raise AssertionError("the other process failed:\n" + value)
        return value


def _run(fn, conn, args) -> None:
    try:
        fn(Link(conn), *args)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1)


class Peer:
    """`fn(link, *args)` in a new process."""

    def __init__(self, fn, *args) -> None:
        self.conn, child = CTX.Pipe()
        self.proc = CTX.Process(target=_run, args=(fn, child, args), daemon=True)
        self.proc.start()
        child.close()
        self.link = Link(self.conn)

    def send(self, value) -> None:
        self.link.send(value)

    def recv(self):
        return self.link.recv()

    def join(self) -> None:
        self.proc.join(HANG)
        assert self.proc.exitcode == 0, f"peer exit code {self.proc.exitcode}"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(HANG)


def worker(**kw) -> rf.Worker:
    kw.setdefault("ignore_env", True)
    return rf.Worker(**kw)


# ---------------------------------------------------------------- targets


def window_target(link: Link, size: int, rounds: int, chunk: int, drivers: str) -> None:
    """A window others PUT into: each notification names a round whose
    chunk must already be there, byte for byte; the payload repeats the
    round's seed and the chunk's first 16 bytes."""
    with worker(drivers=drivers, core_thread=(drivers == "tcp")) as w:
        win = w.alloc(size)
        link.send((w.address, win.pack_key()))
        view = np.frombuffer(win, dtype=np.uint8)
        for expected in range(rounds):
            n = w.wait_notification(timeout=HANG)
            assert n.tag == expected, (n.tag, expected)
            payload = n.read()
            want = pattern(expected, chunk)
            assert payload == expected.to_bytes(8, "little") + want[:16].tobytes()
            got = view[expected * chunk:(expected + 1) * chunk]
            assert np.array_equal(got, want), f"round {expected}: chunk not there before its notification"
        link.send(int(view.astype(np.uint64).sum()))
        # The initiator GETs the window back; stay until it says so.
        assert link.recv() == "done"


def flag_target(link: Link, rounds: int, chunk: int) -> None:
    """Dependent writes: data, FENCE, flag. Sees each flag only after its
    data, polling its own memory (no notification)."""
    import time

    with worker() as w:
        data = w.alloc(rounds * chunk)
        flags = w.alloc(rounds * 8)
        link.send((w.address, data.pack_key(), flags.pack_key()))
        d = np.frombuffer(data, dtype=np.uint8)
        f = np.frombuffer(flags, dtype=np.uint64)
        deadline = time.monotonic() + HANG
        for r in range(rounds):
            spins = 0
            while f[r] != r + 1:
                spins += 1
                if spins % 64 == 0:
                    os.sched_yield()
                    assert time.monotonic() < deadline, f"flag {r} never came"
            assert np.array_equal(d[r * chunk:(r + 1) * chunk], pattern(1000 + r, chunk)), (
                f"round {r}: the flag came before its data")
        link.send(rounds)
        assert link.recv() == "done"


def registered_target(link: Link, size: int) -> None:
    """A window that is a numpy array registered where it lies (cross
    memory attach on shm): PUT and GET work, atomics are unsupported."""
    arr = np.zeros(size, dtype=np.uint8)
    with worker() as w:
        mem = w.register(arr)
        link.send((w.address, mem.pack_key()))
        assert link.recv() == "check"
        link.send(arr.tobytes())
        assert link.recv() == "done"
        mem.release()


def counter_target(link: Link) -> None:
    """A window with counters for atomics; reports them at the end."""
    with worker() as w:
        win = w.alloc(64)
        view = np.frombuffer(win, dtype=np.uint64)
        view[1] = 10
        link.send((w.address, win.pack_key()))
        assert link.recv() == "report"
        link.send(view.tolist())
        assert link.recv() == "done"


def dying_target(link: Link) -> None:
    """A window; the process exits when told, without closing anything."""
    w = worker()
    win = w.alloc(4096)
    link.send((w.address, win.pack_key()))
    assert link.recv() == "die"
    os._exit(0)


def notify_sink(link: Link, count: int, drivers: str, core_thread: bool) -> None:
    """Receives `count` notifications (asyncio), reading each into a buffer."""
    import asyncio

    async def main(w):
        buf = bytearray(64)
        tags = []
        for _ in range(count):
            n = await w.wait_notification_async(timeout=HANG)
            k = n.read_into(buf)
            assert bytes(buf[:k]) == b"note %d" % n.tag
            tags.append(n.tag)
        return tags

    with worker(drivers=drivers, core_thread=core_thread) as w:
        link.send(w.address)
        link.send(asyncio.run(main(w)))
        assert link.recv() == "done"


def idle_target(link: Link) -> None:
    """A window and a notification pool that nothing drains until told."""
    with worker(notify_buffers=4, notify_size=256) as w:
        win = w.alloc(4096)
        link.send((w.address, win.pack_key()))
        assert link.recv() == "drain"
        seen = 0
        want = link.recv()
        while seen < want:
            w.wait_notification(timeout=HANG).read()
            seen += 1
        link.send(seen)
        assert link.recv() == "done"
