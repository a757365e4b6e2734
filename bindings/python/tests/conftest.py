"""Fixtures shared by the tests: workers that ignore RINGFENCE_* variables
(the environment must not steer a test), and a worker connected to itself."""

from __future__ import annotations

import pytest

import ringfence as rf
from peers import worker


@pytest.fixture
def w():
    with worker() as w:
        yield w


@pytest.fixture
def loop_w():
    """A worker over shm connected to itself: ep, and a 4 KiB window's key."""
    with worker() as w:
        window = w.alloc(4096)
        ep = w.connect(w.address)
        yield w, ep, window, ep.unpack_key(window.pack_key())


@pytest.fixture(params=[False, True], ids=["inline-progress", "core-thread"])
def any_w(request):
    """Both ways a worker progresses."""
    with worker(core_thread=request.param) as w:
        yield w

