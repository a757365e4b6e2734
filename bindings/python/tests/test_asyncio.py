"""Waiting in asyncio: transfers and notifications awaited, the CQ's eventfd
registered with the event loop (with a core thread), timeouts, many waits at
once, a cancelled wait, and an asyncio wait beside a blocking one."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import ringfence as rf
from ringfence import _aio
from peers import HANG, pattern, worker


def setup(w):
    window = w.alloc(1 << 16)
    ep = w.connect(w.address)
    return window, ep, ep.unpack_key(window.pack_key())


def test_await_a_transfer_and_a_notification(any_w):
    w = any_w
    window, ep, remote = setup(w)
    src = w.register(pattern(3, 1 << 16))

    async def main():
        t = ep.post([rf.put(src, remote), rf.notify(b"landed", tag=5)])
        await t
        n = await w.wait_notification_async(timeout=HANG)
        return t, n.tag, n.read()

    t, tag, payload = asyncio.run(main())
    assert t.status == "done" and (tag, payload) == (5, b"landed")
    assert bytes(memoryview(window)) == bytes(src.obj)


def test_with_a_core_thread_the_loop_sleeps_on_the_cq_eventfd():
    with worker(core_thread=True) as w:
        window, ep, remote = setup(w)

        async def main():
            loop = asyncio.get_running_loop()
            waiting = asyncio.ensure_future(w.wait_notification_async(timeout=HANG))
            hub = None
            for _ in range(1000):
                await asyncio.sleep(0)
                hubs = _aio._hubs.get(loop, {})
                hub = next(iter(hubs.values()), None)
                if hub is not None and hub.watching_cq:
                    break
            assert hub is not None and hub.watching_cq, "the loop never watched the eventfd"
            cq_fd, _ = w._port().fds()
            assert hub.cq_fd == cq_fd
            ep.post([rf.notify(b"ring", tag=1)])
            n = await waiting
            return n.read(), dict(_aio._hubs.get(loop, {}))

        payload, hubs_after = asyncio.run(main())
        assert payload == b"ring"
        assert hubs_after == {}  # the hub went with its last waiter


def test_an_await_times_out():
    with worker(drivers="tcp") as target, worker(drivers="tcp") as w:
        ep = w.connect(target.address)   # never answered: the peer never progresses
        t = ep.post([rf.flush()])

        async def main():
            with pytest.raises(rf.TimeoutError) as e:
                await t.wait_async(timeout=0.05)
            assert e.value.status_name == "Timeout"
            with pytest.raises(rf.TimeoutError):
                await w.wait_notification_async(timeout=0)
            with pytest.raises(rf.InvalidArgumentError) as e:
                await t.wait_async(timeout=-1)
            assert e.value.status_name == "InvalidArgument"

        asyncio.run(main())
        assert t.status == "pending"  # the transfer goes on after a timeout


@pytest.mark.parametrize("core_thread", [False, True], ids=["inline-progress", "core-thread"])
def test_many_waits_at_once_on_one_loop(core_thread):
    with worker(core_thread=core_thread) as w:
        window, ep, remote = setup(w)
        src = w.alloc(1 << 16)
        np.frombuffer(src, dtype=np.uint8)[:] = pattern(8, 1 << 16)

        async def main():
            transfers = [ep.post([rf.put(src, remote, 1024, local_offset=1024 * i,
                                         remote_offset=1024 * i)]) for i in range(64)]
            notes = [asyncio.ensure_future(w.wait_notification_async(timeout=HANG))
                     for _ in range(8)]
            await asyncio.sleep(0)
            ep.post([rf.notify(b"%d" % i, tag=i) for i in range(8)])
            await asyncio.gather(*transfers)
            got = sorted([(await n).tag for n in notes])
            return got

        assert asyncio.run(main()) == list(range(8))
        assert bytes(memoryview(window)) == bytes(memoryview(src))


def test_a_cancelled_wait_leaves_the_worker_waitable():
    with worker(core_thread=True) as w:
        window, ep, remote = setup(w)

        async def main():
            task = asyncio.ensure_future(w.wait_notification_async(timeout=HANG))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert _aio._hubs.get(asyncio.get_running_loop(), {}) == {}
            ep.post([rf.notify(b"after", tag=2)])
            return (await w.wait_notification_async(timeout=HANG)).read()

        assert asyncio.run(main()) == b"after"
        # A blocking wait works after it too.
        ep.post([rf.notify(b"blocking", tag=3)])
        assert w.wait_notification(timeout=HANG).read() == b"blocking"


def test_an_asyncio_wait_beside_a_blocking_wait_in_a_thread():
    with worker(core_thread=True) as w:
        window, ep, remote = setup(w)
        gate = w.alloc(64)
        results = {}

        def blocking():
            results["thread"] = w.wait_notification(timeout=HANG).read()

        async def main():
            thread = threading.Thread(target=blocking)
            thread.start()
            task = asyncio.ensure_future(w.wait_notification_async(timeout=HANG))
            await asyncio.sleep(0)
            # Transfers awaited meanwhile: the thread and the loop take turns
            # at the CQ's eventfd, and each sees what the other collected.
            for i in range(50):
                await ep.post([rf.put(gate, remote, 64, remote_offset=64 * i)])
            ep.post([rf.notify(b"one", tag=1), rf.notify(b"two", tag=2)])
            got = (await task).read()
            await asyncio.get_running_loop().run_in_executor(None, thread.join, HANG)
            return got

        got = asyncio.run(main())
        assert sorted([got, results["thread"]]) == [b"one", b"two"]
