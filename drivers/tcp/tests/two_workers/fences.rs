//! Fences and flushes: a worker flush completes after every PUT before it
//! landed, a strong fence orders writes across lanes, and a hundred thousand
//! mixed operations keep every fence.

use crate::{Pair, pair, pattern, run};
use ringfence::{Cqe, QueuePair, RegisteredBuf};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe};
use std::time::{Duration, Instant};

/// A worker flush (docs/fence.md R26) over 4 lanes: when it completes, every
/// PUT before it is acknowledged, so its data is in the window; the
/// endpoint's lanes are clean after it.
#[test]
fn a_worker_flush_completes_after_every_put_before_it_landed() {
    let p = pair(1 << 20, 4);
    let src = p.initiator.alloc_registered(1 << 20).unwrap();
    let data = pattern(1 << 20, 7);
    src.write(0, &data);
    let mut qp = p.initiator.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let mut sqes: Vec<Sqe> = (0..16u64)
        .map(|k| {
            let remote = RemoteBuf {
                rkey: p.rkey.as_raw(),
                addr: p.window.addr() + k * 65536,
            };
            Sqe::put(ep, src.local(k * 65536), remote, 65536).with_user_data(k)
        })
        .collect();
    sqes.push(Sqe::flush_worker().with_user_data(100));
    assert_eq!(qp.push_batch(&sqes).unwrap(), sqes.len());
    qp.submit();
    // Until the worker flush's CQE, and not a round more.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut cqes = Vec::new();
    while !cqes.iter().any(|c: &Cqe| c.user_data == 100) {
        p.initiator.progress();
        p.target.progress();
        while let Some(c) = qp.pop().unwrap() {
            cqes.push(c);
        }
        assert!(Instant::now() < deadline, "hung: {cqes:?}");
    }
    assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
    let mut landed = vec![0u8; 1 << 20];
    p.window.read(0, &mut landed);
    assert!(
        landed == data,
        "the worker flush completed before the data landed"
    );
    let state = p.initiator.fence_state(p.ep).unwrap();
    assert_eq!(
        (state.dirty_lanes, state.covered_lanes),
        (0, 0),
        "{state:?}"
    );
    let stats = p.initiator.endpoint_stats(p.ep).unwrap();
    assert_eq!((stats.worker_flushes, stats.flushes), (1, 1), "{stats:?}");
}

/// Writes `a` (8 MiB, a bandwidth lane) then `b` (8 KiB, the next
/// bandwidth lane) over the last 8 KiB of `a`'s range, with or without a
/// strong fence between; returns whether the window ended with `b`.
fn later_write_wins(
    p: &Pair,
    qp: &mut QueuePair,
    src: &RegisteredBuf,
    fence: bool,
    seed: u64,
) -> bool {
    const A: usize = 8 << 20;
    const B: usize = 8 << 10;
    let ep = p.ep.as_raw();
    let a = pattern(A, seed);
    let b = pattern(B, seed + 1000);
    src.write(0, &a);
    src.write(A, &b);
    let remote = |off: usize| RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr() + off as u64,
    };
    let mut sqes = vec![Sqe::put(ep, src.local(0), remote(0), A as u32).with_user_data(1)];
    if fence {
        sqes.push(Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(2));
    }
    sqes.push(Sqe::put(ep, src.local(A as u64), remote(A - B), B as u32).with_user_data(3));
    let n = sqes.len();
    let cqes = run(&p.initiator, &p.target, qp, &sqes, n);
    assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
    let mut tail = vec![0u8; B];
    p.window.read(A - B, &mut tail);
    if tail == b {
        true
    } else {
        assert!(tail == a[A - B..], "the tail is neither write");
        false
    }
}

#[test]
fn a_strong_fence_orders_writes_across_lanes() {
    let p = pair(8 << 20, 4);
    let src = p.initiator.alloc_registered(9 << 20).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    // Without a fence the two writes travel on different connections and
    // the later one can land first: shown at least once in 20 tries.
    let mut reordered = 0;
    for seed in 0..20 {
        if !later_write_wins(&p, &mut qp, &src, false, seed) {
            reordered += 1;
        }
        if reordered > 0 {
            break;
        }
    }
    assert!(
        reordered > 0,
        "lanes never reordered: the test shows nothing"
    );
    // With the fence the later write always wins.
    for seed in 0..10 {
        assert!(
            later_write_wins(&p, &mut qp, &src, true, 100 + seed),
            "try {seed}"
        );
    }
}

#[test]
fn a_hundred_thousand_mixed_operations_with_fences_over_4_lanes() {
    const SLOTS: u64 = 64;
    const SLOT: u64 = 16 << 10;
    let p = pair((SLOTS * SLOT + 4096) as usize, 4);
    let src = p
        .initiator
        .alloc_registered((SLOTS * SLOT) as usize)
        .unwrap();
    let back = p
        .initiator
        .alloc_registered((SLOTS * SLOT + 4096) as usize)
        .unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let counter = SLOTS * SLOT;
    let remote = |off: u64| RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr() + off,
    };
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut ops = 0u64;
    let mut adds = 0u64;
    let mut round = 0u64;
    while ops < 100_000 {
        round += 1;
        // A round: PUTs to distinct slots (small ones on lane 0, large
        // ones on the bandwidth lanes), atomics, a fence (weak or strong),
        // then GETs of what this round wrote.
        let n = 1 + next() % 16;
        let first = next() % (SLOTS - n + 1);
        let mut sqes = Vec::new();
        let mut written = Vec::new();
        for k in 0..n {
            let slot = first + k;
            let len = if next() % 2 == 0 {
                8 + next() % 256
            } else {
                8192 + next() % (SLOT - 8192)
            };
            let value = round << 20 | slot;
            src.store_u64((slot * SLOT) as usize, value);
            sqes.push(Sqe::put(
                ep,
                src.local(slot * SLOT),
                remote(slot * SLOT),
                len as u32,
            ));
            written.push((slot, value));
            let add = 1 + next() % 5;
            adds += add;
            sqes.push(Sqe::atomic_add(ep, remote(counter), add));
        }
        let mode = if next() % 2 == 0 {
            FenceMode::COMPLETE
        } else {
            FenceMode::ORDER
        };
        sqes.push(Sqe::fence(ep, mode));
        if mode == FenceMode::ORDER {
            // A weak fence orders, it does not complete what came before:
            // only a strong one makes the GETs below see every PUT.
            sqes.push(Sqe::fence(ep, FenceMode::COMPLETE));
        }
        for &(slot, _) in &written {
            sqes.push(Sqe::get(
                ep,
                back.local(slot * SLOT),
                remote(slot * SLOT),
                8,
            ));
        }
        for (i, sqe) in sqes.iter_mut().enumerate() {
            *sqe = sqe.with_user_data(i as u64);
        }
        let cqes = run(&p.initiator, &p.target, &mut qp, &sqes, sqes.len());
        let mut seen = vec![false; sqes.len()];
        for c in &cqes {
            assert!(c.res >= 0, "round {round}: {c:?}");
            assert!(
                !std::mem::replace(&mut seen[c.user_data as usize], true),
                "twice: {c:?}"
            );
        }
        for &(slot, value) in &written {
            assert_eq!(
                back.load_u64((slot * SLOT) as usize),
                value,
                "round {round} slot {slot}"
            );
        }
        ops += sqes.len() as u64;
    }
    // Every ADD ran once.
    let c = run(
        &p.initiator,
        &p.target,
        &mut qp,
        &[Sqe::get(ep, back.local(counter), remote(counter), 8).with_user_data(9)],
        1,
    );
    assert_eq!(c[0].res, 8);
    assert_eq!(back.load_u64(counter as usize), adds);
}
