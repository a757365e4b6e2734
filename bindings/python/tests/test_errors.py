"""Every exception class, raised for the input that earns it, with the
ringfence status on it; bad input never crashes."""

from __future__ import annotations

import builtins
import os

import numpy as np
import pytest

import ringfence as rf
from peers import HANG, worker

CLASSES = [
    rf.InvalidArgumentError,
    rf.InvalidHandleError,
    rf.AccessDeniedError,
    rf.EndpointError,
    rf.TimeoutError,
    rf.BusyError,
    rf.OutOfMemoryError,
    rf.UnsupportedError,
]


def test_every_class_is_a_ringfence_error_and_its_builtin():
    for cls in CLASSES:
        assert issubclass(cls, rf.RingfenceError)
    assert issubclass(rf.InvalidArgumentError, ValueError)
    assert issubclass(rf.TimeoutError, builtins.TimeoutError)
    assert issubclass(rf.EndpointError, ConnectionError)
    assert issubclass(rf.AccessDeniedError, PermissionError)
    assert issubclass(rf.OutOfMemoryError, MemoryError)


def raises(cls, name):
    """pytest.raises for `cls`, then checks the status name and value."""

    class Check:
        def __enter__(self):
            self.ctx = pytest.raises(cls)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            e = self.info.value
            assert isinstance(e, rf.RingfenceError)
            assert e.status_name == name, (e.status_name, name, str(e))
            assert isinstance(e.status, int) and e.status < 0
            assert str(e)
            return handled

    return Check()


def test_invalid_arguments(loop_w):
    w, ep, window, remote = loop_w
    src = w.alloc(64)
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        w.connect(b"not an address")
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        w.connect(w.address[:-1] + bytes([w.address[-1] ^ 1]))  # one bit off
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        ep.unpack_key(b"\x00" * 40)
    key = bytearray(window.pack_key())
    key[len(key) // 2] ^= 0x10
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        ep.unpack_key(bytes(key))
    with raises(rf.InvalidArgumentError, "InvalidLength"):
        rf.put(src, remote, 0)
    with raises(rf.InvalidArgumentError, "OutOfBounds"):
        rf.put(src, remote, 64, remote_offset=4096 - 32)
    with raises(rf.InvalidArgumentError, "OutOfBounds"):
        rf.get(src, remote, 65)
    with raises(rf.InvalidArgumentError, "Misaligned"):
        rf.fetch_add(src, remote, 1, remote_offset=4)
    with raises(rf.InvalidArgumentError, "Misaligned"):
        rf.compare_swap(src, remote, 0, 1, result_offset=12)
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        rf.fence("sometimes")
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        ep.post([])
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        ep.post([rf.flush(), "put this"])
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        w.wait_notification(timeout=-1)
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        rf.Worker(drivers="carrier-pigeon")
    with raises(rf.InvalidArgumentError, "InvalidLength"):
        w.alloc(0)
    with raises(rf.InvalidArgumentError, "InvalidLength"):
        ep.post([rf.notify(b"x" * 5000)])  # more than the notification buffers


def test_read_only_buffers_are_refused_where_they_would_be_written(loop_w):
    w, ep, window, remote = loop_w
    ro = w.register(b"read-only bytes!")
    assert ro.readonly
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        rf.get(ro, remote, 8)
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        rf.fetch_add(ro, remote, 1)
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        ro.pack_key()  # a peer could write it
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        w.register(b"read-only", writable=True)
    frozen = np.arange(8, dtype=np.uint64)
    frozen.flags.writeable = False
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        rf.get(w.register(frozen), remote, 8)
    # As a PUT source it is fine.
    ep.post([rf.put(ro, remote, 16)]).wait(timeout=HANG)
    assert bytes(memoryview(window)[:16]) == b"read-only bytes!"


def test_a_notification_longer_than_the_buffer_is_truncated_and_kept(loop_w):
    w, ep, _, _ = loop_w
    ep.post([rf.notify(b"0123456789", tag=3)]).wait(timeout=HANG)
    n = w.wait_notification(timeout=HANG)
    small = bytearray(4)
    with raises(rf.InvalidArgumentError, "Truncated"):
        n.read_into(small)
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        n.read_into(b"immutable bytes buffer")
    assert n.read() == b"0123456789"  # nothing was consumed
    with raises(rf.InvalidHandleError, "StaleHandle"):
        n.read()


def test_released_and_foreign_handles(loop_w):
    w, ep, window, remote = loop_w
    src = w.alloc(64)
    op = rf.put(src, remote, 64)
    batch = ep.prepare([op])
    src.release()
    assert src.released
    with raises(rf.InvalidHandleError, "InvalidMemHandle"):
        ep.post([op])
    with raises(rf.InvalidHandleError, "InvalidMemHandle"):
        batch.post()
    with raises(rf.InvalidHandleError, "InvalidMemHandle"):
        rf.put(src, remote)
    with raises(rf.InvalidHandleError, "InvalidMemHandle"):
        src.pack_key()
    src.release()  # a second release does nothing
    # A key unpacked for another endpoint, and memory of another worker.
    ep2 = w.connect(w.address)
    with raises(rf.InvalidHandleError, "InvalidRkey"):
        ep2.post([rf.put(w.alloc(8), remote, 8)])
    with worker() as other:
        with raises(rf.InvalidHandleError, "InvalidMemHandle"):
            ep.post([rf.put(other.alloc(8), remote, 8)])
    remote2 = ep.unpack_key(window.pack_key())
    remote2.release()
    with raises(rf.InvalidHandleError, "InvalidRkey"):
        rf.put(w.alloc(8), remote2, 8)


def test_a_closed_worker_refuses_everything():
    w = worker()
    mem = w.alloc(64)
    ep = w.connect(w.address)
    remote = ep.unpack_key(mem.pack_key())
    w.close()
    assert w.closed
    for call in (lambda: w.alloc(8), lambda: w.connect(w.address), w.poll,
                 lambda: ep.post([rf.flush()]), lambda: rf.put(mem, remote),
                 lambda: mem.pack_key(), lambda: w.register(bytearray(8))):
        with raises(rf.InvalidHandleError, "StaleHandle"):
            call()
    w.close()  # a second close does nothing
    mem.release()


def test_access_denied_for_a_released_window():
    with worker() as target, worker() as initiator:
        win = target.alloc(4096)
        key = win.pack_key()
        ep = initiator.connect(target.address)
        remote = ep.unpack_key(key)
        win.release()
        with raises(rf.AccessDeniedError, "AccessDenied"):
            ep.unpack_key(key)  # the target refuses it
        t = ep.post([rf.put(initiator.alloc(64), remote, 64)])
        with raises(rf.AccessDeniedError, "AccessDenied") as info:
            t.wait(timeout=HANG)
        assert t.status == "failed"
        assert t.results == [info.value.status] and info.value.op_index == 0


def test_endpoint_errors_after_close(loop_w):
    w, ep, _, remote = loop_w
    ep.close()
    assert ep.state == "closed"
    with raises(rf.EndpointError, "EndpointClosed"):
        ep.post([rf.flush()])
    with raises(rf.EndpointError, "EndpointClosed"):
        ep.unpack_key(b"whatever")
    ep.close()  # a second close does nothing


def test_timeouts(w):
    with raises(rf.TimeoutError, "Timeout"):
        w.wait_notification(timeout=0)
    with raises(rf.TimeoutError, "Timeout"):
        w.wait_notification(timeout=0.05)


def test_busy_and_out_of_memory_and_unsupported(w):
    with raises(rf.OutOfMemoryError, "NoMemory"):
        w.alloc(1 << 56)
    with raises(rf.UnsupportedError, "Unsupported"):
        w.register_device(0x7F00_0000_0000, 1 << 20, device=0)
    with raises(rf.InvalidArgumentError, "InvalidArgument"):
        w.register_device(0, 1 << 20)
    # Atomics on a window a peer reaches by cross memory attach (a
    # registered object, not memory the worker allocated).
    arr = np.zeros(8, dtype=np.uint64)
    with worker() as target:
        win = target.register(arr)
        ep = w.connect(target.address)
        t = ep.post([rf.fetch_add(w.alloc(8), ep.unpack_key(win.pack_key()), 1)])
        with raises(rf.UnsupportedError, "Unsupported"):
            t.wait(timeout=HANG)
    # Busy: a second event loop awaiting a worker a first one awaits.
    import asyncio

    def from_another_loop():
        try:
            asyncio.run(w.wait_notification_async(timeout=0))
        except rf.BusyError as e:
            return e
        return None

    async def main():
        ep = w.connect(w.address)
        first = asyncio.ensure_future(w.wait_notification_async(timeout=HANG))
        await asyncio.sleep(0)  # it runs until it waits: it has begun
        e = await asyncio.get_running_loop().run_in_executor(None, from_another_loop)
        ep.post([rf.notify(b"wake")])
        return e, (await first).read()

    e, woke = asyncio.run(main())
    assert isinstance(e, rf.BusyError) and e.status_name == "Busy"
    assert woke == b"wake"


def test_a_parents_worker_is_stale_in_a_forked_child(w):
    mem = w.alloc(64)
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only if every check holds
        code = 1
        try:
            try:
                w.poll()
            except rf.InvalidHandleError as e:
                if e.status_name == "StaleHandle" and "fork" in str(e):
                    try:
                        mem.pack_key()
                    except rf.InvalidHandleError:
                        with worker() as own:  # a worker of its own works
                            own.alloc(64).pack_key()
                            code = 0
        finally:
            os._exit(code)
    import time

    deadline = time.monotonic() + HANG
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        os.sched_yield()
    assert os.waitstatus_to_exitcode(status) == 0
    assert w.poll() >= 0  # the parent's worker is unharmed
    mem.pack_key()


def test_garbage_addresses_and_keys_raise_and_never_crash(loop_w):
    w, ep, window, remote = loop_w
    rng = np.random.default_rng(34)
    key = window.pack_key()
    blobs = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes()
             for n in rng.integers(0, 700, 300)]
    # Every single-bit flip and every cut of a real key and address.
    for good in (key, w.address):
        blobs += [good[:i] for i in range(len(good))]
        for i in range(len(good)):
            damaged = bytearray(good)
            damaged[i] ^= 1 << (i % 8)
            blobs.append(bytes(damaged))
        blobs.append(good + b"\0")
    for blob in blobs:
        for call in (w.connect, ep.unpack_key):
            try:
                call(blob)
            except rf.RingfenceError as e:
                assert e.status < 0 and e.status_name
            else:
                assert blob in (w.address, key), "a damaged blob was taken"
    # The worker works after all of it.
    ep.post([rf.put(w.alloc(64), remote, 64)]).wait(timeout=HANG)
