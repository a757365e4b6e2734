"""Two processes over shared memory (and tcp): numpy arrays moved with PUT
and GET, fences between dependent writes, notifications after them, atomics,
and a peer that dies; everything checked byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

import ringfence as rf
from peers import HANG, Peer, pattern, worker
import peers


@pytest.mark.parametrize("drivers", ["shm", "tcp"])
def test_numpy_puts_fenced_and_notified_then_read_back(drivers):
    rounds, chunk = 24, 64 << 10
    peer = Peer(peers.window_target, rounds * chunk, rounds, chunk, drivers)
    address, key = peer.recv()
    with worker(drivers=drivers) as w:
        ep = w.connect(address)
        window = ep.unpack_key(key)
        assert window.length == rounds * chunk
        src = np.zeros(chunk, dtype=np.uint8)
        mem = w.register(src)
        for r in range(rounds):
            src[:] = pattern(r, chunk)
            note = r.to_bytes(8, "little") + src[:16].tobytes()
            t = ep.post([
                rf.put(mem, window, remote_offset=r * chunk),
                rf.fence(),
                rf.notify(note, tag=r),
            ])
            t.wait(timeout=HANG)
            assert t.results == [chunk, 0, len(note)]
            # The source may be reused once the PUT completed.
        expected = np.concatenate([pattern(r, chunk) for r in range(rounds)])
        assert peer.recv() == int(expected.astype(np.uint64).sum())

        # Read the whole window back, in one GET per chunk, into a
        # registered numpy array of another shape and dtype.
        back = np.zeros((rounds, chunk // 8), dtype=np.uint64)
        dst = w.register(back)
        t = ep.post([rf.get(dst, window, chunk, local_offset=r * chunk, remote_offset=r * chunk)
                     for r in range(rounds)])
        t.wait(timeout=HANG)
        assert t.results == [chunk] * rounds
        assert back.view(np.uint8).reshape(-1).tobytes() == expected.tobytes()
        peer.send("done")
    peer.join()


def test_fence_orders_a_flag_after_its_data():
    rounds, chunk = 200, 4096
    peer = Peer(peers.flag_target, rounds, chunk)
    address, data_key, flags_key = peer.recv()
    with worker() as w:
        ep = w.connect(address)
        data, flags = ep.unpack_key(data_key), ep.unpack_key(flags_key)
        src = w.alloc(chunk)
        flag = w.alloc(8)
        src_view = np.frombuffer(src, dtype=np.uint8)
        flag_view = np.frombuffer(flag, dtype=np.uint64)
        for r in range(rounds):
            src_view[:] = pattern(1000 + r, chunk)
            flag_view[0] = r + 1
            ep.post([
                rf.put(src, data, remote_offset=r * chunk),
                rf.fence("order"),
                rf.put(flag, flags, 8, remote_offset=r * 8),
            ]).wait(timeout=HANG)
        assert peer.recv() == rounds
        peer.send("done")
    peer.join()


def test_a_registered_numpy_window_takes_puts_and_gets_but_no_atomics():
    size = 1 << 20
    peer = Peer(peers.registered_target, size)
    address, key = peer.recv()
    with worker() as w:
        ep = w.connect(address)
        window = ep.unpack_key(key)
        src = pattern(7, size)
        ep.post([rf.put(w.register(src), window)]).wait(timeout=HANG)
        back = np.zeros(size // 4, dtype=np.float32)
        ep.post([rf.get(w.register(back), window)]).wait(timeout=HANG)
        assert back.tobytes() == src.tobytes()
        result = w.alloc(8)
        t = ep.post([rf.fetch_add(result, window, 1)])
        with pytest.raises(rf.UnsupportedError) as e:
            t.wait(timeout=HANG)
        assert e.value.status_name == "Unsupported" and e.value.op_index == 0
        peer.send("check")
        assert peer.recv() == src.tobytes()
        peer.send("done")
    peer.join()


def test_atomics_fetch_add_and_compare_swap():
    peer = Peer(peers.counter_target)
    address, key = peer.recv()
    with worker() as w:
        ep = w.connect(address)
        counters = ep.unpack_key(key)
        results = w.alloc(8 * 16)
        old = np.frombuffer(results, dtype=np.uint64)
        # Ten fetch-adds of word 0 in one batch: each sees the one before.
        t = ep.post([rf.fetch_add(results, counters, 3, result_offset=8 * i)
                     for i in range(10)])
        t.wait(timeout=HANG)
        assert old[:10].tolist() == [3 * i for i in range(10)]
        # Word 1 holds 10: a compare-swap that fails, then one that succeeds.
        ep.post([
            rf.compare_swap(results, counters, 11, 99, result_offset=80, remote_offset=8),
            rf.compare_swap(results, counters, 10, 42, result_offset=88, remote_offset=8),
            rf.swap(results, counters, 7, result_offset=96, remote_offset=16),
            rf.atomic_add(counters, 5, remote_offset=24),
            rf.flush(),
        ]).wait(timeout=HANG)
        assert old[10:13].tolist() == [10, 10, 0]
        peer.send("report")
        assert peer.recv()[:4] == [30, 42, 7, 5]
        peer.send("done")
    peer.join()


def test_a_dead_peer_fails_operations_with_endpoint_error():
    peer = Peer(peers.dying_target)
    address, key = peer.recv()
    with worker() as w:
        ep = w.connect(address)
        window = ep.unpack_key(key)
        src = w.alloc(4096)
        ep.post([rf.put(src, window), rf.flush()]).wait(timeout=HANG)
        peer.send("die")
        peer.proc.join(HANG)
        t = ep.post([rf.put(src, window), rf.flush()])
        with pytest.raises(rf.EndpointError) as e:
            t.wait(timeout=HANG)
        assert e.value.status_name == "PeerUnreachable"
        assert len(t.results) == 2 and all(r < 0 for r in t.results)
        assert ep.state == "failed" and ep.error == "PeerUnreachable"
        assert w.outstanding == 0


@pytest.mark.parametrize("core_thread", [False, True], ids=["inline-progress", "core-thread"])
def test_notifications_awaited_in_asyncio_by_a_peer(core_thread):
    count = 50
    peer = Peer(peers.notify_sink, count, "shm", core_thread)
    address = peer.recv()
    with worker() as w:
        ep = w.connect(address)
        for i in range(count):
            ep.post([rf.notify(b"note %d" % i, tag=i)]).wait(timeout=HANG)
        assert peer.recv() == list(range(count))
        peer.send("done")
    peer.join()


def test_a_payload_buffer_deleted_while_its_notify_waits_is_kept_alive():
    peer = Peer(peers.idle_target)
    address, _ = peer.recv()
    with worker() as w:
        ep = w.connect(address)
        payload = bytearray(b"p" * 200)
        mem = w.register(payload)
        # Nothing drains the peer: its pool (4 buffers) and its channel
        # fill, and then a NOTIFY waits in the engine, holding the payload.
        posted = []
        for _ in range(100_000):
            t = ep.post([rf.notify(mem, tag=len(posted))])
            posted.append(t)
            w.poll()
            if not t.done():
                break
        else:
            pytest.fail("every notification went through: the peer's pool never filled")
        waiting = posted[-1]
        with pytest.raises(rf.BusyError):
            mem.release()        # refused: an operation uses it
        del mem                  # dropped: kept alive until it is done
        with pytest.raises(BufferError):
            payload.extend(b"x")  # still exported: cannot be resized
        peer.send("drain")
        peer.send(len(posted))
        waiting.wait(timeout=HANG)
        assert all(t.status == "done" for t in posted)
        assert peer.recv() == len(posted)
        w.poll()                 # the parked registration is let go
        payload.extend(b"x")     # exported no more
        peer.send("done")
    peer.join()
