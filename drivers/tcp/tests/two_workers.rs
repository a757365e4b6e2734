//! Two workers over loopback TCP in one process, both progressed by the
//! test: PUT, GET, atomics, notifications, flushes and fences.

use ringfence::{Cqe, EndpointId, EndpointState, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe};
use ringfence_tcp::Tcp;
use std::time::{Duration, Instant};

fn worker() -> Worker {
    Worker::builder()
        .driver(Tcp::builder().ignore_env().build().unwrap())
        .notify_buffers(8, 256)
        .ring_entries(1024, 4096)
        .requests(4096)
        .ignore_env()
        .build()
        .unwrap()
}

/// Submits `sqes`, runs both workers' progress until `expect` CQEs came.
fn run(w: &Worker, other: &Worker, qp: &mut QueuePair, sqes: &[Sqe], expect: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + Duration::from_secs(60);
    run_with(qp, sqes, expect, deadline, || {
        w.progress();
        other.progress();
    })
}

/// Submits `sqes`, runs `progress` until `expect` CQEs came, by
/// `deadline`.
fn run_with(
    qp: &mut QueuePair,
    sqes: &[Sqe],
    expect: usize,
    deadline: Instant,
    progress: impl Fn(),
) -> Vec<Cqe> {
    let mut pushed = 0;
    let mut out = Vec::new();
    while out.len() < expect {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        out.extend_from_slice(&batch[..n]);
        assert!(Instant::now() < deadline, "hung: {} of {expect}", out.len());
        if out.len() < expect {
            std::thread::yield_now();
        }
    }
    out
}

struct Pair {
    target: Worker,
    initiator: Worker,
    window: RegisteredBuf,
    ep: EndpointId,
    rkey: RkeyId,
}

fn pair(len: usize, lanes: u8) -> Pair {
    let target = worker();
    let initiator = worker();
    let window = target.alloc_registered(len).unwrap();
    let ep = initiator
        .connect_lanes(target.address(), &[("tcp", lanes)])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while initiator.endpoint_state(ep).unwrap() == EndpointState::Connecting {
        initiator.progress();
        target.progress();
        assert!(Instant::now() < deadline, "connect hung");
        std::thread::yield_now();
    }
    assert_eq!(
        initiator.endpoint_state(ep).unwrap(),
        EndpointState::Connected
    );
    let blob = target.pack_rkey(window.handle()).unwrap();
    let rkey = initiator.unpack_rkey(ep, &blob).unwrap();
    Pair {
        target,
        initiator,
        window,
        ep,
        rkey,
    }
}

#[test]
fn put_get_atomic_notify() {
    let p = pair(1 << 16, 1);
    let src = p.initiator.alloc_registered(4096).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let mut tq = p.target.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let remote = |off: u64| RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr() + off,
    };
    src.write(0, b"hello, tcp");
    let mut notify = Sqe::notify(ep, src.local(0), 5).with_user_data(6);
    notify.operand = 66;
    let sqes = [
        Sqe::put(ep, src.local(0), remote(100), 10).with_user_data(1),
        Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(2),
        Sqe::get(ep, src.local(1000), remote(100), 10).with_user_data(3),
        Sqe::atomic_fadd(ep, src.local(2048), remote(8), 5).with_user_data(4),
        Sqe::atomic_fadd(ep, src.local(2056), remote(8), 5).with_user_data(5),
        notify,
        Sqe::flush(ep).with_user_data(7),
    ];
    let cqes = run(&p.initiator, &p.target, &mut qp, &sqes, sqes.len());
    for c in &cqes {
        assert!(c.res >= 0, "{c:?}");
    }
    let mut out = [0u8; 10];
    p.window.read(100, &mut out);
    assert_eq!(&out, b"hello, tcp");
    src.read(1000, &mut out);
    assert_eq!(&out, b"hello, tcp");
    assert_eq!(p.window.load_u64(8), 10);
    assert_eq!(src.load_u64(2048) + src.load_u64(2056), 5);
    let deadline = Instant::now() + Duration::from_secs(10);
    let cqe = loop {
        p.target.progress();
        if let Some(c) = tq.pop().unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline);
    };
    assert_eq!(cqe.user_data, 66, "the tag");
    assert_eq!(&*tq.notification(&cqe).unwrap(), b"hello");
}

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

/// Data of `len` bytes, different for each `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u64)
                .wrapping_mul(31)
                .wrapping_add(seed.wrapping_mul(7)) as u8
        })
        .collect()
}

#[test]
fn put_and_get_from_1_byte_to_64_mib_on_1_and_4_lanes() {
    const MAX: usize = 64 << 20;
    for lanes in [1, 4] {
        let p = pair(MAX, lanes);
        let src = p.initiator.alloc_registered(MAX).unwrap();
        let back = p.initiator.alloc_registered(MAX).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        let remote = RemoteBuf {
            rkey: p.rkey.as_raw(),
            addr: p.window.addr(),
        };
        let sizes = [
            1,
            3,
            8,
            100,
            4095,
            4096,
            4097,
            65_536,
            65_537,
            1 << 20,
            (3 << 20) + 5,
            MAX,
        ];
        for (seed, len) in sizes.into_iter().enumerate() {
            let data = pattern(len, seed as u64 + u64::from(lanes) * 100);
            src.write(0, &data);
            let sqes = [
                Sqe::put(ep, src.local(0), remote, len as u32).with_user_data(1),
                Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(2),
                Sqe::get(ep, back.local(0), remote, len as u32).with_user_data(3),
            ];
            let cqes = run(&p.initiator, &p.target, &mut qp, &sqes, 3);
            for c in &cqes {
                assert_eq!(
                    c.res,
                    if c.user_data == 2 { 0 } else { len as i32 },
                    "{c:?}"
                );
            }
            let mut got = vec![0u8; len];
            p.window.read(0, &mut got);
            assert!(got == data, "PUT of {len} bytes over {lanes} lanes");
            back.read(0, &mut got);
            assert!(got == data, "GET of {len} bytes over {lanes} lanes");
        }
    }
}

#[test]
fn every_atomic() {
    let p = pair(4096, 2);
    let res = p.initiator.alloc_registered(4096).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let at = |off: u64| RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr() + off,
    };
    p.window.store_u64(0, 10);
    let sqes = [
        Sqe::atomic_add(ep, at(0), 5).with_user_data(1),
        Sqe::atomic_fadd(ep, res.local(0), at(0), 1).with_user_data(2),
        Sqe::atomic_swap(ep, res.local(8), at(0), 100).with_user_data(3),
        Sqe::atomic_cswap(ep, res.local(16), at(0), 100, 7).with_user_data(4),
        Sqe::atomic_cswap(ep, res.local(24), at(0), 100, 9).with_user_data(5),
    ];
    // One at a time: each depends on the one before.
    for sqe in sqes {
        let c = run(&p.initiator, &p.target, &mut qp, &[sqe], 1);
        assert_eq!(c[0].res, 8, "{:?}", c[0]);
    }
    assert_eq!(res.load_u64(0), 15, "FADD fetched after ADD");
    assert_eq!(res.load_u64(8), 16, "SWAP fetched after FADD");
    assert_eq!(res.load_u64(16), 100, "CSWAP that matched");
    assert_eq!(res.load_u64(24), 7, "CSWAP that did not match");
    assert_eq!(p.window.load_u64(0), 7);
    // Misaligned and out of bounds: the target refuses them, each with its
    // status, and nothing changes.
    let bad = [
        Sqe::atomic_add(ep, at(4), 1).with_user_data(6),
        Sqe::atomic_add(ep, at(4096), 1).with_user_data(7),
    ];
    let cqes = run(&p.initiator, &p.target, &mut qp, &bad, 2);
    for c in cqes {
        assert!(c.res < 0, "{c:?}");
    }
    assert_eq!(p.window.load_u64(0), 7);
}

#[test]
fn notifications_arrive_after_the_data_before_them() {
    let p = pair(1 << 20, 4);
    let src = p.initiator.alloc_registered(1 << 20).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let mut tq = p.target.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let remote = RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr(),
    };
    for round in 0..20u64 {
        let data = pattern(1 << 20, round);
        src.write(0, &data);
        src.store_u64(0, round);
        let mut notify = Sqe::notify(ep, src.local(0), 8).with_user_data(2);
        notify.operand = round;
        // A large PUT (a bandwidth lane), then the notification (lane 0).
        let sqes = [
            Sqe::put(ep, src.local(0), remote, 1 << 20).with_user_data(1),
            notify,
        ];
        let mut initiated = 0;
        let mut pushed = false;
        let deadline = Instant::now() + Duration::from_secs(30);
        let cqe = loop {
            if !pushed {
                qp.push_batch(&sqes).unwrap();
                qp.submit();
                pushed = true;
            }
            p.initiator.progress();
            p.target.progress();
            let mut batch = [Cqe::default(); 8];
            initiated += qp.reap(&mut batch).unwrap();
            if let Some(c) = tq.pop().unwrap() {
                break c;
            }
            assert!(Instant::now() < deadline, "no notification");
        };
        // When the notification is seen, the data before it is there.
        assert_eq!(cqe.user_data, round);
        let mut got = vec![0u8; 1 << 20];
        p.window.read(0, &mut got);
        assert!(got[8..] == data[8..], "round {round}");
        drop(tq.notification(&cqe).unwrap());
        while initiated < 2 {
            p.initiator.progress();
            p.target.progress();
            let mut batch = [Cqe::default(); 8];
            initiated += qp.reap(&mut batch).unwrap();
            assert!(Instant::now() < deadline);
        }
    }
}

/// NOTIFYs of the largest length (64 KiB) to a target whose receive
/// buffers are 4 KiB: each payload arrives in at least 16 pieces, is put
/// together on the target, and reaches the application intact, round
/// after round (each round's bytes differ).
#[test]
fn a_notification_split_over_many_receive_buffers_arrives_intact() {
    const LEN: usize = 64 << 10;
    let build = |recv: u32| {
        Worker::builder()
            .driver(
                Tcp::builder()
                    .ignore_env()
                    .recv_buffers(64, recv)
                    .build()
                    .unwrap(),
            )
            .notify_buffers(2, LEN as u32)
            .ignore_env()
            .build()
            .unwrap()
    };
    let target = build(4096);
    let initiator = build(64 << 10);
    let ep = initiator.connect(target.address()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while initiator.endpoint_state(ep).unwrap() == EndpointState::Connecting {
        initiator.progress();
        target.progress();
        assert!(Instant::now() < deadline, "connect hung");
        std::thread::yield_now();
    }
    let src = initiator.alloc_registered(LEN).unwrap();
    let mut qp = initiator.create_queue().unwrap();
    let mut tq = target.create_queue().unwrap();
    for round in 0..20u64 {
        let data = pattern(LEN, round);
        src.write(0, &data);
        let mut notify = Sqe::notify(ep.as_raw(), src.local(0), LEN as u32).with_user_data(round);
        notify.operand = round;
        qp.push_batch(&[notify]).unwrap();
        qp.submit();
        let (mut sent, mut got) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(30);
        while sent.is_none() || got.is_none() {
            initiator.progress();
            target.progress();
            if let Some(c) = qp.pop().unwrap() {
                sent = Some(c);
            }
            if got.is_none() {
                if let Some(c) = tq.pop().unwrap() {
                    got = Some(c);
                }
            }
            assert!(Instant::now() < deadline, "round {round} hung");
            std::thread::yield_now();
        }
        let (sent, got) = (sent.unwrap(), got.unwrap());
        assert!(sent.res >= 0, "round {round}: {sent:?}");
        assert_eq!(got.user_data, round, "the tag");
        let payload = tq.notification(&got).unwrap();
        assert_eq!(payload.len(), LEN);
        assert!(*payload == data[..], "round {round}: the payload differs");
    }
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

#[test]
fn a_dead_target_fails_every_request_once_and_the_worker_serves_others() {
    let p = pair(1 << 20, 2);
    let other = pair(4096, 1);
    let src = p.initiator.alloc_registered(1 << 20).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let remote = RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr(),
    };
    // Requests in flight, some answered, when the target goes away.
    let sqes: Vec<Sqe> = (0..200u64)
        .map(|i| {
            let len = if i % 3 == 0 { 64 << 10 } else { 64 };
            Sqe::put(ep, src.local(0), remote, len).with_user_data(i)
        })
        .chain([Sqe::flush(ep).with_user_data(200)])
        .collect();
    qp.push_batch(&sqes).unwrap();
    qp.submit();
    p.initiator.progress();
    p.target.progress();
    let Pair {
        target, initiator, ..
    } = p;
    drop(target);
    let mut cqes = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while cqes.len() < sqes.len() {
        initiator.progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        cqes.extend_from_slice(&batch[..n]);
        assert!(
            Instant::now() < deadline,
            "{} of {} completed",
            cqes.len(),
            sqes.len()
        );
        std::thread::yield_now();
    }
    let mut seen = [false; 201];
    for c in &cqes {
        assert!(
            !std::mem::replace(&mut seen[c.user_data as usize], true),
            "twice: {c:?}"
        );
    }
    let flush = cqes.iter().find(|c| c.user_data == 200).unwrap();
    assert!(
        flush.res < 0,
        "a FLUSH over a dead peer succeeded: {flush:?}"
    );
    assert!(
        matches!(
            initiator.endpoint_state(p.ep).unwrap(),
            EndpointState::Failed(_)
        ),
        "{:?}",
        initiator.endpoint_state(p.ep)
    );
    // New requests fail at once.
    let c = run(
        &initiator,
        &other.target,
        &mut qp,
        &[Sqe::put(ep, src.local(0), remote, 8).with_user_data(7)],
        1,
    );
    assert!(c[0].res < 0);
    // The other endpoint (its own initiator and target) goes on; so does
    // a new endpoint of this initiator to a live target.
    let window = other.target.alloc_registered(4096).unwrap();
    let ep2 = initiator
        .connect_lanes(other.target.address(), &[("tcp", 1)])
        .unwrap();
    let rkey2 = initiator
        .unpack_rkey(ep2, &other.target.pack_rkey(window.handle()).unwrap())
        .unwrap();
    src.write(0, b"still here");
    let c = run(
        &initiator,
        &other.target,
        &mut qp,
        &[Sqe::put(
            ep2.as_raw(),
            src.local(0),
            RemoteBuf {
                rkey: rkey2.as_raw(),
                addr: window.addr(),
            },
            10,
        )
        .with_user_data(8)],
        1,
    );
    assert_eq!(c[0].res, 10, "{:?}", c[0]);
    let mut got = [0u8; 10];
    window.read(0, &mut got);
    assert_eq!(&got, b"still here");
}

/// A PUT of `i` from `src` into the window's first 8 bytes (user data 1),
/// then a FLUSH (user data 2).
fn put_then_flush(p: &Pair, src: &RegisteredBuf, i: u64) -> [Sqe; 2] {
    src.store_u64(0, i);
    let remote = RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr(),
    };
    [
        Sqe::put(p.ep.as_raw(), src.local(0), remote, 8).with_user_data(1),
        Sqe::flush(p.ep.as_raw()).with_user_data(2),
    ]
}

/// The completions of a `put_then_flush` in round `round`: both
/// successful, in order.
fn assert_put_then_flush(got: &[Cqe], round: u64) {
    assert_eq!(
        got.iter().map(|c| (c.user_data, c.res)).collect::<Vec<_>>(),
        [(1, 8), (2, 0)],
        "round {round}"
    );
}

/// The target's ACKs wait one round (the round that lands a PUT returns
/// at once): a target whose core thread falls asleep right after that
/// round must still send them. 300 times: the target's core thread asleep,
/// then a PUT and a FLUSH from the initiator, which must both complete
/// (the timeout only catches a hang), with the bytes in place.
#[test]
fn a_sleeping_target_core_thread_still_acknowledges_every_put() {
    let mut p = pair(4096, 1);
    p.target.start_core_thread(None).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let src = p.initiator.alloc_registered(4096).unwrap();
    for i in 0..300u64 {
        // Until the core thread has gone to sleep (bounded, yielding).
        let deadline = Instant::now() + Duration::from_secs(60);
        while !p.target.is_core_thread_asleep() {
            assert!(Instant::now() < deadline, "the core thread never slept");
            p.initiator.progress();
            std::thread::yield_now();
        }
        let sqes = put_then_flush(&p, &src, i);
        let got = run_with(&mut qp, &sqes, 2, deadline, || {
            p.initiator.progress();
        });
        assert_put_then_flush(&got, i);
        assert_eq!(p.window.load_u64(0), i, "round {i}");
    }
    assert!(p.target.core_thread_sleeps() >= 300);
}

/// The initiator's side of the same: a connection that awaits an answer
/// busy-receives (no receive armed) for a while, then goes back to its
/// multishot receive; a core thread that sleeps must be woken by an answer
/// that comes after that. 100 times: the PUT and FLUSH are submitted, the
/// target is left unprogressed until the initiator's core thread has gone
/// to sleep with them in flight, then progressed until both complete.
#[test]
fn a_sleeping_initiator_core_thread_wakes_for_late_answers() {
    let mut p = pair(4096, 1);
    p.initiator.start_core_thread(None).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let src = p.initiator.alloc_registered(4096).unwrap();
    let asleep = |w: &Worker, deadline: Instant, what: &str| {
        while !w.is_core_thread_asleep() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::yield_now();
        }
    };
    for i in 0..100u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        asleep(&p.initiator, deadline, "the core thread never slept");
        let naps = p.initiator.core_thread_sleeps();
        let sqes = put_then_flush(&p, &src, i);
        let mut pushed = 0;
        while pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        // Asleep again, with the PUT unanswered (the target does not run).
        while p.initiator.core_thread_sleeps() == naps || !p.initiator.is_core_thread_asleep() {
            assert!(
                Instant::now() < deadline,
                "round {i}: the core thread never slept again"
            );
            std::thread::yield_now();
        }
        // Both pushed already: the target's progress alone answers them.
        let got = run_with(&mut qp, &[], 2, deadline, || {
            p.target.progress();
        });
        assert_put_then_flush(&got, i);
        assert_eq!(p.window.load_u64(0), i, "round {i}");
    }
}

/// A target dropped right after the round that executed a PUT (its ACK
/// still held for the next round) sends that ACK as it goes: the PUT
/// completes successfully at the initiator, 20 times over.
#[test]
fn a_target_dropped_right_after_a_put_still_acknowledges_it() {
    for round in 0..20u64 {
        let p = pair(4096, 1);
        let mut qp = p.initiator.create_queue().unwrap();
        let src = p.initiator.alloc_registered(64).unwrap();
        src.store_u64(0, round + 1);
        let remote = RemoteBuf {
            rkey: p.rkey.as_raw(),
            addr: p.window.addr(),
        };
        qp.push(Sqe::put(p.ep.as_raw(), src.local(0), remote, 8).with_user_data(1))
            .unwrap();
        qp.submit();
        // Until the target's round has executed it (bounded).
        let deadline = Instant::now() + Duration::from_secs(60);
        while p.window.load_u64(0) != round + 1 {
            p.initiator.progress();
            p.target.progress();
            assert!(Instant::now() < deadline, "the PUT never landed");
            std::thread::yield_now();
        }
        let Pair {
            target, initiator, ..
        } = p;
        drop(target);
        let mut got = None;
        while got.is_none() {
            initiator.progress();
            got = qp.pop().unwrap();
            assert!(Instant::now() < deadline, "no completion for the PUT");
            std::thread::yield_now();
        }
        let c = got.unwrap();
        assert_eq!((c.user_data, c.res), (1, 8), "round {round}: {c:?}");
    }
}

/// A packed key or a worker address damaged on its way (any one bit
/// flipped, cut short, a byte added) is refused as it is decoded
/// (`Error::Malformed`, `InvalidArgument`), before the tcp driver sees it;
/// the undamaged ones still work.
#[test]
fn every_damaged_key_and_address_is_refused_at_unpack_and_connect() {
    let p = pair(4096, 1);
    let blob = p.target.pack_rkey(p.window.handle()).unwrap();
    let address = p.target.address().to_vec();
    let refused = |what: &str, e: ringfence::Error| {
        assert!(
            matches!(e, ringfence::Error::Malformed { .. }),
            "{what}: {e}"
        );
        assert_eq!(e.status(), ringfence::Status::InvalidArgument, "{what}");
    };
    let flip = |b: &[u8], bit: usize| {
        let mut bad = b.to_vec();
        bad[bit / 8] ^= 1 << (bit % 8);
        bad
    };
    for bit in 0..blob.len() * 8 {
        let e = p
            .initiator
            .unpack_rkey(p.ep, &flip(&blob, bit))
            .unwrap_err();
        refused(&format!("key bit {bit}"), e);
    }
    for bit in 0..address.len() * 8 {
        let e = p.initiator.connect(&flip(&address, bit)).unwrap_err();
        refused(&format!("address bit {bit}"), e);
    }
    for cut in 0..blob.len() {
        let e = p.initiator.unpack_rkey(p.ep, &blob[..cut]).unwrap_err();
        refused(&format!("key cut at {cut}"), e);
    }
    for cut in 0..address.len() {
        let e = p.initiator.connect(&address[..cut]).unwrap_err();
        refused(&format!("address cut at {cut}"), e);
    }
    let (mut long_key, mut long_address) = (blob.clone(), address.clone());
    long_key.push(0);
    long_address.push(0);
    refused(
        "key + 1",
        p.initiator.unpack_rkey(p.ep, &long_key).unwrap_err(),
    );
    refused(
        "address + 1",
        p.initiator.connect(&long_address).unwrap_err(),
    );
    // The tcp part's version, with a correct check: the driver refuses it.
    let mut old = blob.clone();
    let at = old
        .windows(4)
        .position(|w| w == b"RFTK")
        .expect("the tcp part");
    old[at + 4] = 1;
    ringfence::reseal(&mut old);
    let e = p.initiator.unpack_rkey(p.ep, &old).unwrap_err();
    assert!(e.to_string().contains("malformed tcp key"), "{e}");

    // The undamaged key still unpacks, and its id works.
    let rkey = p.initiator.unpack_rkey(p.ep, &blob).unwrap();
    let src = p.initiator.alloc_registered(64).unwrap();
    src.write(0, b"intact!!");
    let mut qp = p.initiator.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: p.window.addr(),
    };
    let cqes = run(
        &p.initiator,
        &p.target,
        &mut qp,
        &[Sqe::put(p.ep.as_raw(), src.local(0), remote, 8).with_user_data(1)],
        1,
    );
    assert_eq!(cqes[0].res, 8);
    let mut out = [0u8; 8];
    p.window.read(0, &mut out);
    assert_eq!(&out, b"intact!!");
}

/// An 8-byte PUT and then a NOTIFY, both on lane 0: the tcp stream
/// delivers the NOTIFY after the PUT (`notify_ordered`), so the boundary
/// is a weak fence, no flush (docs/fence.md R8), and the data is there when
/// the notification is seen.
#[test]
fn a_notification_behind_a_put_on_its_lane_needs_no_flush() {
    let p = pair(4096, 4);
    let src = p.initiator.alloc_registered(4096).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let mut tq = p.target.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let remote = RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr(),
    };
    for round in 1..=10u64 {
        src.store_u64(0, round);
        let sqes = [
            Sqe::put(ep, src.local(0), remote, 8).with_user_data(1),
            Sqe::notify(ep, src.local(0), 8).with_user_data(2),
        ];
        let cqes = run(&p.initiator, &p.target, &mut qp, &sqes, 2);
        assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let cqe = loop {
            p.target.progress();
            if let Some(c) = tq.pop().unwrap() {
                break c;
            }
            assert!(Instant::now() < deadline, "no notification");
            std::thread::yield_now();
        };
        assert_eq!(p.window.load_u64(0), round, "the PUT landed first");
        let payload = tq.notification(&cqe).unwrap();
        assert_eq!(*payload, round.to_le_bytes());
    }
    let stats = p.initiator.stats();
    assert_eq!(stats.notify_flushes, 0, "{stats:?}");
    assert_eq!(stats.weak_fences, 10, "{stats:?}");
}

/// The target's notification buffers hold 256 bytes and its HELLO_ACK
/// says so: a NOTIFY of 257 bytes fails with `InvalidLength` at
/// submission, with only the initiator progressing (it is never sent to
/// be refused by the target); one of 256 is delivered.
#[test]
fn a_notification_longer_than_the_target_takes_fails_at_submission() {
    let p = pair(4096, 1);
    let src = p.initiator.alloc_registered(4096).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let deadline = Instant::now() + Duration::from_secs(30);
    let cqes = run_with(
        &mut qp,
        &[Sqe::notify(ep, src.local(0), 257)],
        1,
        deadline,
        || {
            p.initiator.progress();
        },
    );
    assert_eq!(
        cqes[0].res,
        ringfence::Status::InvalidLength.as_raw(),
        "{}",
        ringfence_ring::strerror(cqes[0].res)
    );
    let cqes = run(
        &p.initiator,
        &p.target,
        &mut qp,
        &[Sqe::notify(ep, src.local(0), 256)],
        1,
    );
    assert!(cqes[0].res >= 0, "{cqes:?}");
}
