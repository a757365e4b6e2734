//! The driver under the engine with two workers in one process (the
//! cross-process tests live in `tests/tests/shm_*.rs`).

use ringfence::{Cqe, EndpointId, QueuePair, RegisteredBuf, RkeyId, Status, Worker};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe};
use ringfence_shm::{KeyPath, Shm};
use std::time::{Duration, Instant};

fn worker() -> Worker {
    Worker::builder()
        .driver(Shm::new().unwrap())
        .notify_buffers(8, 256)
        .ignore_env()
        .build()
        .unwrap()
}

/// Submits `sqes`, runs both workers' progress until `expect` CQEs came.
fn run(w: &Worker, other: &Worker, qp: &mut QueuePair, sqes: &[Sqe], expect: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pushed = 0;
    let mut out = Vec::new();
    while out.len() < expect {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        w.progress();
        other.progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        out.extend_from_slice(&batch[..n]);
        assert!(Instant::now() < deadline, "hung: {} of {expect}", out.len());
    }
    out
}

/// The packed key's framing: `"RFKY"`, format, part count (6 bytes), the
/// part's `u32` length, then core's part header (29 bytes + name), the
/// driver's part, and at the end the 4-byte integrity check.
const KEY_HEADER: usize = 6 + 4;
const CHECK: usize = 4;

/// The shm driver's part of a packed key of one part.
fn driver_part(blob: &mut [u8]) -> &mut [u8] {
    let name_len = blob[KEY_HEADER + 5] as usize;
    let end = blob.len() - CHECK;
    &mut blob[KEY_HEADER + 29 + name_len..end]
}

fn key_path_of(blob: &[u8]) -> Option<KeyPath> {
    ringfence_shm::key_path(driver_part(&mut blob.to_vec()))
}

struct Pair {
    target: Worker,
    initiator: Worker,
    window: RegisteredBuf,
    ep: EndpointId,
    rkey: RkeyId,
}

fn pair(len: usize) -> Pair {
    let target = worker();
    let initiator = worker();
    let window = target.alloc_registered(len).unwrap();
    let ep = initiator.connect(target.address()).unwrap();
    let blob = target.pack_rkey(window.handle()).unwrap();
    assert_eq!(key_path_of(&blob), Some(KeyPath::Memfd));
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
    let p = pair(1 << 16);
    let src = p.initiator.alloc_registered(4096).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let mut tq = p.target.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let remote = |off: u64| RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr() + off,
    };
    src.write(0, b"hello, shm");
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
    assert_eq!(&out, b"hello, shm");
    src.read(1000, &mut out);
    assert_eq!(&out, b"hello, shm");
    assert_eq!(p.window.load_u64(8), 10);
    assert_eq!(src.load_u64(2048) + src.load_u64(2056), 5);
    // The notification reaches the target's CQ.
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
fn forged_and_foreign_keys_are_refused() {
    let p = pair(4096);
    let blob = p.target.pack_rkey(p.window.handle()).unwrap();
    // Flip one bit of the secret (driver part: the secret is at 24..32 of
    // it): refused at unpack by the integrity check; forged with a correct
    // check, by the target.
    let mut forged = blob.clone();
    driver_part(&mut forged)[24] ^= 1;
    let e = p.initiator.unpack_rkey(p.ep, &forged).unwrap_err();
    assert!(matches!(e, ringfence::Error::Malformed { .. }), "{e}");
    ringfence::reseal(&mut forged);
    let e = p.initiator.unpack_rkey(p.ep, &forged).unwrap_err();
    assert!(e.to_string().contains("refused"), "{e}");
    // Larger bounds in the driver part (a correct check): refused at
    // unpack, against the target's answer.
    let mut wider = blob.clone();
    driver_part(&mut wider)[47] = 0xff;
    ringfence::reseal(&mut wider);
    assert_eq!(
        p.initiator.unpack_rkey(p.ep, &wider).unwrap_err().status(),
        Status::InvalidRkey
    );
    // Garbage never panics.
    for n in 0..blob.len() {
        let _ = p.initiator.unpack_rkey(p.ep, &blob[..n]);
    }
    // A key of another target.
    let other = worker();
    let w2 = other.alloc_registered(64).unwrap();
    let foreign = other.pack_rkey(w2.handle()).unwrap();
    assert!(p.initiator.unpack_rkey(p.ep, &foreign).is_err());
    // Deregistered: refused at unpack and at access.
    let mut qp = p.initiator.create_queue().unwrap();
    let src = p.initiator.alloc_registered(64).unwrap();
    p.target.deregister(p.window.handle()).unwrap();
    assert!(p.initiator.unpack_rkey(p.ep, &blob).is_err());
    let remote = RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr(),
    };
    let cqes = run(
        &p.initiator,
        &p.target,
        &mut qp,
        &[Sqe::put(p.ep.as_raw(), src.local(0), remote, 8).with_user_data(9)],
        1,
    );
    assert_eq!(cqes[0].res, Status::AccessDenied.as_raw());
}

/// A packed key or a worker address damaged on its way (any one bit
/// flipped, cut short, a byte added) is refused as it is decoded, with
/// `Error::Malformed` (`InvalidArgument`), before the shm driver sees it:
/// nothing is sent to the target. The undamaged ones still work.
#[test]
fn every_damaged_key_and_address_is_refused_at_unpack_and_connect() {
    let p = pair(4096);
    let blob = p.target.pack_rkey(p.window.handle()).unwrap();
    let refused = |what: &str, e: ringfence::Error| {
        assert!(
            matches!(e, ringfence::Error::Malformed { .. }),
            "{what}: {e}"
        );
        assert_eq!(e.status(), Status::InvalidArgument, "{what}");
    };
    for bit in 0..blob.len() * 8 {
        let mut bad = blob.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        refused(
            &format!("key bit {bit}"),
            p.initiator.unpack_rkey(p.ep, &bad).unwrap_err(),
        );
    }
    for cut in 0..blob.len() {
        refused(
            &format!("key cut at {cut}"),
            p.initiator.unpack_rkey(p.ep, &blob[..cut]).unwrap_err(),
        );
    }
    let mut long = blob.clone();
    long.push(0);
    refused(
        "key + 1 byte",
        p.initiator.unpack_rkey(p.ep, &long).unwrap_err(),
    );
    // The shm part's reserved bytes, with a correct check: the driver
    // refuses its part before it sends anything.
    let mut reserved = blob.clone();
    driver_part(&mut reserved)[6] = 1;
    ringfence::reseal(&mut reserved);
    let e = p.initiator.unpack_rkey(p.ep, &reserved).unwrap_err();
    assert!(e.to_string().contains("malformed shm key"), "{e}");

    let address = p.target.address().to_vec();
    for bit in 0..address.len() * 8 {
        let mut bad = address.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        refused(
            &format!("address bit {bit}"),
            p.initiator.connect(&bad).unwrap_err(),
        );
    }
    for cut in 0..address.len() {
        refused(
            &format!("address cut at {cut}"),
            p.initiator.connect(&address[..cut]).unwrap_err(),
        );
    }
    let mut long = address.clone();
    long.push(0);
    let e = p.initiator.connect(&long).unwrap_err();
    assert!(e.to_string().contains("integrity"), "{e}");
    refused("address + 1 byte", e);

    // The undamaged ones: a second key id and a second endpoint that work.
    let rkey = p.initiator.unpack_rkey(p.ep, &blob).unwrap();
    let ep = p.initiator.connect(&address).unwrap();
    let rkey2 = p.initiator.unpack_rkey(ep, &blob).unwrap();
    let src = p.initiator.alloc_registered(64).unwrap();
    src.write(0, b"intact!!");
    let mut qp = p.initiator.create_queue().unwrap();
    let at = |rkey: RkeyId| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: p.window.addr(),
    };
    let cqes = run(
        &p.initiator,
        &p.target,
        &mut qp,
        &[
            Sqe::put(p.ep.as_raw(), src.local(0), at(rkey), 8).with_user_data(1),
            Sqe::put(ep.as_raw(), src.local(0), at(rkey2), 8).with_user_data(2),
        ],
        2,
    );
    assert!(cqes.iter().all(|c| c.res == 8), "{cqes:?}");
    let mut out = [0u8; 8];
    p.window.read(0, &mut out);
    assert_eq!(&out, b"intact!!");
}

#[test]
fn cross_memory_attach_for_other_memory() {
    let target = worker();
    let initiator = worker();
    let window = target.alloc_registered(8192).unwrap();
    // A sub-range of an allocation is not exported on the memfd path.
    // SAFETY: inside `window`, which outlives the registration; read only
    // through `window` after the operations completed.
    let sub = unsafe {
        target.register(
            (window.addr() + 4096) as usize as *mut u8,
            100,
            ringfence::MemKind::Host,
        )
    }
    .unwrap();
    let blob = target.pack_rkey(sub).unwrap();
    assert_eq!(key_path_of(&blob), Some(KeyPath::CrossMemoryAttach));
    let ep = initiator.connect(target.address()).unwrap();
    let rkey = initiator.unpack_rkey(ep, &blob).unwrap();
    let src = initiator.alloc_registered(256).unwrap();
    src.write(0, b"via process_vm_writev");
    let mut qp = initiator.create_queue().unwrap();
    let remote = |off: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr() + 4096 + off,
    };
    let e = ep.as_raw();
    let sqes = [
        Sqe::put(e, src.local(0), remote(10), 21).with_user_data(1),
        Sqe::fence(e, FenceMode::COMPLETE).with_user_data(2),
        Sqe::get(e, src.local(100), remote(10), 21).with_user_data(3),
        Sqe::atomic_add(e, remote(16), 1).with_user_data(4),
        Sqe::put(e, src.local(0), remote(90), 21).with_user_data(5),
    ];
    let mut cqes = run(&initiator, &target, &mut qp, &sqes, sqes.len());
    cqes.sort_by_key(|c| c.user_data);
    let res: Vec<i32> = cqes.iter().map(|c| c.res).collect();
    assert_eq!(
        res,
        vec![
            21,
            0,
            21,
            Status::Unsupported.as_raw(),
            Status::OutOfBounds.as_raw()
        ]
    );
    let mut out = [0u8; 21];
    window.read(4096 + 10, &mut out);
    assert_eq!(&out, b"via process_vm_writev");
    src.read(100, &mut out);
    assert_eq!(&out, b"via process_vm_writev");
    target.deregister(sub).unwrap();
}

#[test]
fn a_worker_can_connect_to_itself_and_peers_that_go_away_fail_endpoints() {
    let w = worker();
    let window = w.alloc_registered(64).unwrap();
    let ep = w.connect(w.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &w.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let mut qp = w.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr(),
    };
    let cqes = run(
        &w,
        &w,
        &mut qp,
        &[Sqe::atomic_add(ep.as_raw(), remote, 3).with_user_data(1)],
        1,
    );
    assert_eq!(cqes[0].res, 8);
    assert_eq!(window.load_u64(0), 3);

    // A peer worker dropped: its endpoint fails with PEER_UNREACHABLE.
    let p = pair(64);
    let src = p.initiator.alloc_registered(64).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let Pair {
        target,
        initiator,
        window,
        ep,
        rkey,
    } = p;
    let addr = window.addr();
    drop(window);
    drop(target);
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = run(
            &initiator,
            &initiator,
            &mut qp,
            &[Sqe::put(ep.as_raw(), src.local(0), remote, 8).with_user_data(1)],
            1,
        );
        if c[0].res < 0 {
            assert!(
                c[0].res == Status::PeerUnreachable.as_raw()
                    || c[0].res == Status::AccessDenied.as_raw()
                    || c[0].res == Status::EndpointFailed.as_raw(),
                "{:?}",
                c[0]
            );
            break;
        }
        assert!(Instant::now() < deadline, "the peer's death was never seen");
        std::thread::yield_now();
    }
}

/// Memory beyond the limit fails before any memfd is made, with the
/// limit in the message; memory within it is there (allocated in full)
/// and zeroed.
#[test]
fn allocations_beyond_the_memory_limit_fail_with_no_memory() {
    let w = worker();
    let limit = ringfence::limits::memory_limit().bytes();
    let over = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_add(1);
    for len in [over, 1 << 40] {
        if len as u64 <= limit {
            continue; // a machine that backs a TiB
        }
        let e = w.alloc_registered(len).unwrap_err();
        assert_eq!(e.status(), Status::NoMemory, "{e}");
        assert!(e.to_string().contains("memory limit"), "{e}");
    }
    assert_eq!(
        w.alloc_registered(usize::MAX).unwrap_err().status(),
        Status::InvalidLength
    );
    let buf = w.alloc_registered(4 << 20).unwrap();
    assert_eq!(buf.load_u64((4 << 20) - 8), 0);
    w.deregister(buf.handle()).unwrap();
}
