#!/usr/bin/env python3
"""nixlbench's WRITE row from Python: ringfence beside NIXL, in one run.

Two processes, block sizes 64 KiB and 1 MiB (``--sizes``), batch size 1, a
notification with each write. The initiator posts one WRITE (a PUT and a
NOTIFY, one ``Batch.post()``; NIXL: one ``agent.transfer(handle)`` of a
transfer made with a notification message) and waits until it is done, again
and again; the target drains the notifications as they come. Each system
runs ``--rounds`` rounds of ``--iters`` writes per size, and the table gives
the median round. Each target collects its notifications in a loop that
sleeps 100 us when it found none (``--target-spin``: it never sleeps; on a
two-CPU machine a spinning target leaves the initiator's copies less of
the memory system, which shows at 1 MiB):

- B/W (GB/Sec): bytes written / the round's wall time (10^9 bytes a second,
  as nixlbench);
- Avg Post (us): the time inside the post call, per write (Python's post
  overhead: what the caller waits before it can go on);
- memcpy (GB/Sec): numpy.copyto of the same block in one process, the bound
  a shared-memory write cannot beat.

NIXL is its Python API (``pip install nixl-cu12``, ``import nixl`` or
``nixl_cu12``) with the UCX backend and its default agent configuration. If
it cannot be imported, or cannot make a UCX agent here, the table says so
and gives ringfence's figures alone.

    python bindings/python/bench/write_bench.py [--sizes 64K,1M] [--iters N] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import statistics
import sys
import time

# numpy's OpenBLAS starts a thread per CPU that busy-waits for work it
# never gets here; on a two-CPU machine they take the CPU from the copies
# being measured (a third of the samples in `perf record`). Nothing here
# multiplies matrices: one BLAS thread, in this process and the peers it
# spawns (they inherit the environment).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402 - after the environment it reads

CTX = multiprocessing.get_context("spawn")
HANG = 300.0


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def recv(conn):
    if not conn.poll(HANG):
        raise RuntimeError("the other process sent nothing")
    kind, value = conn.recv()
    if kind == "error":
        raise RuntimeError("the other process failed:\n" + value)
    return value


def run_peer(fn, conn, *args):
    import traceback

    try:
        fn(conn, *args)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1)


# ---------------------------------------------------------------- ringfence


# How long an idle target sleeps between looks (a pace, not a wait for
# anything: the notifications stay queued meanwhile).
IDLE_NAP = 100e-6


def rf_target(conn, size: int, total: int, spin: bool) -> None:
    import ringfence as rf

    with rf.Worker(ignore_env=True) as w:
        window = w.alloc(size)
        conn.send(("ok", (w.address, window.pack_key())))
        seen = 0
        while seen < total:
            got = len(w.notifications())
            seen += got
            if not got and not spin:
                time.sleep(IDLE_NAP)
        conn.send(("ok", seen))


def rf_initiator(size: int, iters: int, rounds: int, spin: bool) -> list[tuple[float, float]]:
    import ringfence as rf

    a, b = CTX.Pipe()
    peer = CTX.Process(target=run_peer, args=(rf_target, b, size, iters * rounds + 1, spin),
                       daemon=True)
    peer.start()
    address, key = recv(a)
    out = []
    with rf.Worker(ignore_env=True) as w:
        ep = w.connect(address)
        window = ep.unpack_key(key)
        src = np.full(size, 0x5A, dtype=np.uint8)
        batch = ep.prepare([rf.put(w.register(src), window, size), rf.notify(b"w", tag=1)])
        batch.post().wait(timeout=HANG)  # warm: first touch of the pages
        clock = time.perf_counter_ns
        for _ in range(rounds):
            post_ns = 0
            start = clock()
            for _ in range(iters):
                t0 = clock()
                t = batch.post()
                post_ns += clock() - t0
                t.wait()
            wall = clock() - start
            out.append((size * iters / wall, post_ns / iters / 1000))
    # The warm-up's notification is one more (the target waits for it too:
    # leaving early would make the last write's NOTIFY find it gone).
    assert recv(a) >= iters * rounds + 1
    peer.join(HANG)
    return out


# ---------------------------------------------------------------- NIXL


def nixl_module():
    """The NIXL package, or the reason it is not there."""
    for name in ("nixl", "nixl_cu12", "nixl_cu13"):
        try:
            return importlib.import_module(name + "._api"), None
        except Exception as e:  # noqa: BLE001 - any import failure is reported
            why = f"import {name}: {type(e).__name__}: {e}"
    return None, why


def nixl_target(conn, size: int, total: int, spin: bool) -> None:
    api, why = nixl_module()
    if api is None:
        raise RuntimeError(why)
    agent = api.nixl_agent("target", api.nixl_agent_config(backends=["UCX"]))
    buf = np.zeros(size, dtype=np.uint8)
    addr = buf.ctypes.data
    agent.register_memory([(addr, size, 0, "")], "DRAM")
    descs = agent.get_xfer_descs([(addr, size, 0)], "DRAM")
    conn.send(("ok", (agent.get_agent_metadata(), agent.get_serialized_descs(descs))))
    seen = 0
    while seen < total:
        got = sum(len(msgs) for msgs in agent.get_new_notifs().values())
        seen += got
        if not got and not spin:
            time.sleep(IDLE_NAP)
    conn.send(("ok", seen))
    assert recv(conn) == "done"


def nixl_initiator(size: int, iters: int, rounds: int, spin: bool) -> list[tuple[float, float]]:
    api, why = nixl_module()
    if api is None:
        raise RuntimeError(why)
    a, b = CTX.Pipe()
    peer = CTX.Process(target=run_peer, args=(nixl_target, b, size, iters * rounds + 1, spin),
                       daemon=True)
    peer.start()
    meta, remote = recv(a)
    agent = api.nixl_agent("initiator", api.nixl_agent_config(backends=["UCX"]))
    src = np.full(size, 0x5A, dtype=np.uint8)
    addr = src.ctypes.data
    agent.register_memory([(addr, size, 0, "")], "DRAM")
    local = agent.get_xfer_descs([(addr, size, 0)], "DRAM")
    name = agent.add_remote_agent(meta)
    remote = agent.deserialize_descs(remote)
    handle = agent.initialize_xfer("WRITE", local, remote, name, b"w")
    deadline = time.monotonic() + HANG
    while True:  # the first post also connects
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        if state == "DONE":
            break
        if time.monotonic() > deadline:
            raise RuntimeError("NIXL never connected")
    out = []
    clock = time.perf_counter_ns
    for _ in range(rounds):
        post_ns = 0
        start = clock()
        for _ in range(iters):
            t0 = clock()
            state = agent.transfer(handle)
            post_ns += clock() - t0
            while state == "PROC":
                state = agent.check_xfer_state(handle)
            if state != "DONE":
                raise RuntimeError(f"NIXL transfer state {state}")
        wall = clock() - start
        out.append((size * iters / wall, post_ns / iters / 1000))
    recv(a)
    a.send(("ok", "done"))
    peer.join(HANG)
    handle.release()
    return out


# ---------------------------------------------------------------- memcpy


def memcpy(size: int, iters: int, rounds: int) -> list[float]:
    src = np.full(size, 0x5A, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    np.copyto(dst, src)
    out = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(iters):
            np.copyto(dst, src)
        out.append(size * iters / (time.perf_counter_ns() - start))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64K,1M")
    p.add_argument("--iters", type=int, default=0,
                   help="writes per round (default: 256 MiB worth, at least 200)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--nixl", choices=("auto", "off"), default="auto")
    p.add_argument("--target-spin", action="store_true",
                   help="targets look for notifications without ever sleeping")
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    nixl_note = None
    if args.nixl == "off":
        nixl_note = "NIXL: not run (--nixl off)"
    else:
        api, why = nixl_module()
        if api is None:
            nixl_note = f"NIXL: not run here ({why})"

    target = "spinning" if args.target_spin else f"napping {IDLE_NAP * 1e6:.0f} us when idle"
    print(f"# WRITE, batch size 1, a notification each; two processes (targets {target}); "
          f"median of {args.rounds} rounds; CPUs: {os.cpu_count()}")
    head = f"{'System':<10} {'Block Size (B)':>14} {'Batch Size':>10} {'B/W (GB/Sec)':>13} " \
           f"{'Avg Post (us)':>13} {'memcpy (GB/Sec)':>15}"
    print(head)
    rows = {}
    for size in sizes:
        iters = args.iters or max(200, (256 << 20) // size)
        mc = statistics.median(memcpy(size, iters, args.rounds))
        systems = [("ringfence", rf_initiator)]
        if nixl_note is None:
            systems.append(("NIXL", nixl_initiator))
        for label, fn in systems:
            try:
                res = fn(size, iters, args.rounds, args.target_spin)
            except Exception as e:  # noqa: BLE001 - reported, the run goes on
                if label == "NIXL":
                    nixl_note = f"NIXL: failed here ({type(e).__name__}: {str(e).strip()[-300:]})"
                    continue
                raise
            bw = statistics.median(r[0] for r in res)
            post = statistics.median(r[1] for r in res)
            rows[(label, size)] = (bw, post)
            print(f"{label:<10} {size:>14} {1:>10} {bw:>13.3f} {post:>13.3f} {mc:>15.3f}",
                  flush=True)
    for size in sizes:
        r, n = rows.get(("ringfence", size)), rows.get(("NIXL", size))
        if r and n:
            print(f"# {size} B: ringfence/NIXL bandwidth {r[0] / n[0]:.2f}x, "
                  f"post time {r[1] / n[1]:.2f}x NIXL's")
    if nixl_note:
        print("# " + nixl_note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
