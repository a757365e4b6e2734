"""ringfence: one-sided communication (put, get, atomics, fences, flushes,
notifications) between processes, over ringfence's engine.

A worker per process; memory registered without copying (any buffer-protocol
object, or memory the worker allocates); the worker's address and memory keys
as bytes, exchanged by the application's own means; batches of operations
posted in one call on an endpoint; completions polled, waited on with a
timeout, or awaited in asyncio; notifications read as bytes or into a buffer.

    import numpy as np, ringfence as rf

    with rf.Worker() as w:                       # the "shm" driver
        window = w.alloc(1 << 20)                # registered, zeroed
        ...send w.address and window.pack_key() to the peer...

    # in the peer:
    with rf.Worker() as w:
        ep = w.connect(address)
        dst = ep.unpack_key(key)
        src = w.register(np.arange(1 << 17, dtype=np.uint64))
        ep.post([rf.put(src, dst), rf.notify(b"done", tag=1)]).wait(timeout=10)

See bindings/python/README.md for the whole API.
"""

from ._errors import (
    AccessDeniedError,
    BusyError,
    EndpointError,
    InvalidArgumentError,
    InvalidHandleError,
    OutOfMemoryError,
    RingfenceError,
    TimeoutError,
    UnsupportedError,
)
from ._ringfence import (
    DRIVERS,
    Batch,
    Endpoint,
    Memory,
    Notification,
    Op,
    RemoteMemory,
    Transfer,
    Worker,
    __version__,
    atomic_add,
    compare_swap,
    fence,
    fetch_add,
    flush,
    get,
    notify,
    put,
    swap,
)

__all__ = [
    "DRIVERS",
    "AccessDeniedError",
    "Batch",
    "BusyError",
    "Endpoint",
    "EndpointError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "Memory",
    "Notification",
    "Op",
    "OutOfMemoryError",
    "RemoteMemory",
    "RingfenceError",
    "TimeoutError",
    "Transfer",
    "UnsupportedError",
    "Worker",
    "__version__",
    "atomic_add",
    "compare_swap",
    "fence",
    "fetch_add",
    "flush",
    "get",
    "notify",
    "put",
    "swap",
]
