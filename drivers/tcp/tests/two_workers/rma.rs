//! PUT, GET and atomics between the two workers: every operation once, every
//! size from 1 byte to 64 MiB on 1 and 4 lanes, and every atomic.

use crate::{pair, pattern, run};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe};
use std::time::{Duration, Instant};

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
