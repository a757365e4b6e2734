"""Batches and transfers: one result per operation, exactly once; prepared
batches posted again and again; more operations than the rings hold; a
worker closed under pending work."""

from __future__ import annotations

import numpy as np
import pytest

import ringfence as rf
from peers import HANG, pattern, worker


def test_every_operation_gets_exactly_one_result(any_w):
    w = any_w
    window = w.alloc(1 << 16)
    ep = w.connect(w.address)
    remote = ep.unpack_key(window.pack_key())
    src = w.register(pattern(5, 1 << 16))
    res = w.alloc(8)
    ops = [rf.put(src, remote, 4096, local_offset=i * 4096, remote_offset=i * 4096)
           for i in range(16)]
    ops += [rf.fence("complete"), rf.fetch_add(res, remote, 1), rf.flush(),
            rf.notify(b"n", tag=1), rf.atomic_add(remote, 2, remote_offset=8)]
    t = ep.post(ops)
    assert len(t) == len(ops)
    t.wait(timeout=HANG)
    assert t.status == "done"
    assert t.results == [4096] * 16 + [0, 8, 0, 1, 8]
    assert w.outstanding == 0
    assert w.wait_notification(timeout=HANG).read() == b"n"
    assert t.done()


def test_a_prepared_batch_posts_many_times(loop_w):
    w, ep, window, remote = loop_w
    src = w.alloc(64)
    view = np.frombuffer(src, dtype=np.uint64)
    batch = ep.prepare([rf.put(src, remote, 64), rf.notify(b"tick", tag=9)])
    assert len(batch) == 2
    for i in range(300):
        view[0] = i
        batch.post().wait(timeout=HANG)
        assert np.frombuffer(window, dtype=np.uint64)[0] == i
    notes = []
    while len(notes) < 300:
        notes += [n.read() for n in w.notifications()]
    assert notes == [b"tick"] * 300


def test_more_operations_than_the_rings_hold():
    with worker(sq_entries=16, cq_entries=32, requests=64) as w:
        window = w.alloc(1 << 20)
        ep = w.connect(w.address)
        remote = ep.unpack_key(window.pack_key())
        src = w.register(pattern(11, 1 << 20))
        ops = [rf.put(src, remote, 256, local_offset=256 * i, remote_offset=256 * i)
               for i in range(4096)]
        t = ep.post(ops)            # waits for room, the GIL released
        t.wait(timeout=HANG)
        assert t.results == [256] * 4096
        assert bytes(memoryview(window)) == bytes(src.obj)
        # Many transfers outstanding at once, reaped in any order.
        ts = [ep.post([rf.put(src, remote, 64)]) for _ in range(500)]
        for t in reversed(ts):
            t.wait(timeout=HANG)
        assert w.outstanding == 0


def test_polling_until_done(loop_w):
    w, ep, window, remote = loop_w
    t = ep.post([rf.put(w.alloc(128), remote, 128)])
    assert t.status in ("pending", "done")
    rounds = 0
    while not t.done():
        rounds += 1
        assert rounds < 10_000_000
    assert t.status == "done" and t.results == [128]
    t.check()


def test_close_completes_what_is_pending_with_canceled():
    # Over tcp an endpoint is connecting until the peer's worker answers;
    # this peer never progresses, so what is posted waits in the engine.
    with worker(drivers="tcp") as target:
        w = worker(drivers="tcp")
        ep = w.connect(target.address)
        t = ep.post([rf.flush(), rf.notify(b"never", tag=1)])
        for _ in range(100):
            w.poll()
        assert ep.state == "connecting" and t.status == "pending"
        assert w.outstanding == 2
        w.close()
        assert t.done() and t.status == "failed"
        with pytest.raises(rf.EndpointError) as e:
            t.wait()
        assert e.value.status_name == "Canceled"
        assert t.results == [e.value.status] * 2


def test_worker_flush_covers_every_endpoint(w):
    window = w.alloc(4096)
    eps = [w.connect(w.address) for _ in range(3)]
    src = w.alloc(64)
    for i, ep in enumerate(eps):
        ep.post([rf.put(src, ep.unpack_key(window.pack_key()), 64, remote_offset=64 * i)])
    f = w.flush()
    f.wait(timeout=HANG)
    assert f.results == [0]


def test_a_blocking_wait_lets_other_threads_run(any_w):
    import threading

    w = any_w
    ep = w.connect(w.address)
    got = []
    waiter = threading.Thread(target=lambda: got.append(w.wait_notification(timeout=HANG).read()))
    waiter.start()
    # This thread runs Python while the other waits (it holds no GIL: were
    # it held, nothing here would run until the wait timed out), then
    # sends what the waiter waits for.
    n = 0
    while n < 200_000:
        n += 1
    ep.post([rf.notify(b"go", tag=1)]).wait(timeout=HANG)
    waiter.join(HANG)
    assert got == [b"go"]
