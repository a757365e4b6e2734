"""Registering memory without copying, the buffer protocol, and memory
released while operations use it: kept alive or refused, never freed under
an operation."""

from __future__ import annotations

import gc
import mmap

import numpy as np
import pytest

import ringfence as rf
from peers import HANG, pattern, worker


def test_register_any_contiguous_buffer_where_it_lies(loop_w):
    w, ep, window, remote = loop_w
    view = np.frombuffer(window, dtype=np.uint8)
    objects = [
        bytearray(pattern(1, 100).tobytes()),
        pattern(2, 256).reshape(16, 16),                     # 2-D C order
        np.asfortranarray(pattern(3, 64).reshape(8, 8)),     # Fortran order
        memoryview(bytearray(pattern(4, 32).tobytes())),
        np.arange(32, dtype=np.float64),
        b"bytes are read-only",
    ]
    mm = mmap.mmap(-1, 4096)
    mm[:5] = b"mmap!"
    objects.append(mm)
    for obj in objects:
        mem = w.register(obj)
        assert mem.obj is obj
        raw = memoryview(obj).cast("B") if not isinstance(obj, np.ndarray) else None
        expected = obj.tobytes(order="A") if isinstance(obj, np.ndarray) else bytes(raw)
        n = min(len(expected), 4096)
        assert mem.length == len(expected)
        assert mem.address != 0
        ep.post([rf.put(mem, remote, n)]).wait(timeout=HANG)
        assert view[:n].tobytes() == expected[:n], type(obj)
        # A view of the Memory is a view of the object itself.
        assert memoryview(mem).tobytes(order="A")[:n] == expected[:n]
        mem.release()
        del raw
    mm.close()


def test_strided_and_empty_buffers_are_refused(w):
    a = np.arange(64, dtype=np.uint8)
    with pytest.raises(rf.InvalidArgumentError, match="contiguous"):
        w.register(a[::2])
    with pytest.raises(rf.InvalidArgumentError) as e:
        w.register(bytearray())
    assert e.value.status_name == "InvalidLength"
    with pytest.raises(rf.InvalidArgumentError, match="buffer"):
        w.register(12345)


def test_a_registered_object_is_pinned_until_released(w):
    ba = bytearray(64)
    mem = w.register(ba)
    with pytest.raises(BufferError):
        ba.extend(b"more")          # exported: cannot be resized
    mv = memoryview(bytearray(64))
    mem2 = w.register(mv)
    with pytest.raises(BufferError):
        mv.release()                # exported: cannot be released
    arr = np.zeros(16)
    mem3 = w.register(arr)
    with pytest.raises(ValueError):
        arr.resize(32)              # referenced: cannot be resized
    mem.release()
    ba.extend(b"more")
    with mem2:
        pass                        # the with block releases it
    assert mem2.released
    mv.release()
    del mem3
    gc.collect()
    arr.resize(32)


def test_allocated_memory_is_a_buffer_that_outlives_its_registration():
    w = worker()
    mem = w.alloc(1 << 16)
    a = np.frombuffer(mem, dtype=np.uint32)
    assert a.flags.writeable and len(a) == (1 << 14) and not a.any()
    a[:] = np.arange(1 << 14, dtype=np.uint32)
    mv = memoryview(mem)
    mem.release()
    with pytest.raises(BufferError):
        memoryview(mem)             # no new views once released
    w.close()
    # Existing views keep the memory mapped.
    assert a[12345] == 12345 and mv[4] == 1
    del mem
    gc.collect()
    assert a.sum() == sum(range(1 << 14))


def test_memory_dropped_under_a_queued_operation_is_kept_alive(loop_w):
    w, ep, window, remote = loop_w
    # Without a core thread nothing runs until progress: the batch waits in
    # the ring while every Python reference to its memory is dropped.
    src = bytearray(pattern(9, 1024).tobytes())
    t = ep.post([rf.put(w.register(src), remote, 1024), rf.fence(),
                 rf.get(w.register(dst := np.zeros(1024, dtype=np.uint8)), remote, 1024)])
    gc.collect()
    with pytest.raises(BufferError):
        src.extend(b"x")            # still registered: the batch uses it
    t.wait(timeout=HANG)
    assert dst.tobytes() == bytes(src)
    del t
    gc.collect()
    w.poll()
    src.extend(b"x")                # let go once the batch was done


def test_explicit_release_of_memory_a_queued_operation_names_fails_the_operation(loop_w):
    w, ep, window, remote = loop_w
    dst = bytearray(64)
    mem = w.register(dst)
    t = ep.post([rf.get(mem, remote, 64)])
    # Not taken by the engine yet: the release goes through, and the
    # operation, checked when the engine takes it, fails; nothing is
    # written into the buffer, which is free to be resized again.
    mem.release()
    dst.extend(b"!")
    with pytest.raises(rf.InvalidHandleError) as e:
        t.wait(timeout=HANG)
    assert e.value.status_name == "InvalidMemHandle"
    assert dst == bytearray(64) + b"!"
