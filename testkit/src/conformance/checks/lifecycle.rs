//! Refused accesses, memory that is withdrawn or in use, close, and the
//! peer's death.

use super::*;
use crate::rig::assert_exactly_once;
use ringfence_ring::{CloseMode, Sqe};

/// An unknown remote key, a range past the window's end and a misaligned
/// atomic each fail with their own status, alone: the endpoint stays up
/// and the next PUT succeeds.
pub fn invalid_accesses_fail_alone<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    let mut unknown = p.remote(0);
    unknown.rkey = unknown.rkey.wrapping_add(1000);
    let end = p.config.window as u64;
    let sqes = [
        Sqe::put(e, p.local.local(0), unknown, 8).with_user_data(1),
        Sqe::put(e, p.local.local(0), p.remote(end - 4), 8).with_user_data(2),
        Sqe::get(e, p.local.local(0), p.remote(end), 1).with_user_data(3),
        Sqe::atomic_add(e, p.remote(4), 1).with_user_data(4),
    ];
    let res = p.results(&sqes);
    assert_eq!(
        res,
        [
            status(Status::InvalidRkey),
            status(Status::OutOfBounds),
            status(Status::OutOfBounds),
            status(Status::Misaligned),
        ]
    );
    assert_connected(&p);
    p.local.write(0, b"still up");
    let sqes = [
        Sqe::put(e, p.local.local(0), p.remote(16), 8).with_user_data(5),
        Sqe::flush(e).with_user_data(6),
    ];
    assert_eq!(p.results(&sqes), [8, 0]);
    assert_eq!(read(&p.window, 16, 8), b"still up");
}

/// A window the target deregistered after the initiator unpacked its key:
/// a PUT, a GET and an atomic on it are refused with `AccessDenied` (no
/// remote access that starts after `deregister` returns succeeds, and it
/// is the target that refuses), before and after the target registers
/// other memory, and touch nothing; they fail alone: the endpoint stays
/// up and the live window still works.
pub fn a_deregistered_window_refuses_access<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    let gone = p.target().alloc_registered(4096).expect("a second window");
    let key = p.target().pack_rkey(gone.handle()).expect("pack");
    let rkey = p.initiator.unpack_rkey(p.ep, &key).expect("unpack");
    p.target().deregister(gone.handle()).expect("deregister");
    p.until("the window's release", |p| {
        p.target().unreleased_memory().pending == 0
    });
    let remote = ringfence_ring::RemoteBuf {
        rkey: rkey.as_raw(),
        addr: gone.addr(),
    };
    p.local.write(0, &pattern(64, 3));
    let sqes = [
        Sqe::put(e, p.local.local(0), remote, 64).with_user_data(1),
        Sqe::get(e, p.local.local(1024), remote, 64).with_user_data(2),
        Sqe::atomic_add(e, remote, 1).with_user_data(3),
    ];
    let res = p.results(&sqes);
    assert!(
        res.iter().all(|&r| r == status(Status::AccessDenied)),
        "PUT, GET, ADD on a deregistered window: {res:?} (AccessDenied is {})",
        status(Status::AccessDenied)
    );
    assert_eq!(read(&gone, 0, 64), vec![0; 64], "a refused access wrote");
    assert_connected(&p);
    // A registration made since (which may take the withdrawn one's place
    // in the target's tables) does not let the old key in either.
    let fresh = p.target().alloc_registered(4096).expect("a third window");
    let again: Vec<Sqe> = sqes
        .iter()
        .map(|s| s.with_user_data(s.user_data + 10))
        .collect();
    let res = p.results(&again);
    assert!(
        res.iter().all(|&r| r == status(Status::AccessDenied)),
        "the withdrawn key after another registration: {res:?}"
    );
    assert_eq!(
        read(&fresh, 0, 64),
        vec![0; 64],
        "the old key wrote the new window"
    );
    assert_connected(&p);
    let sqes = [
        Sqe::put(e, p.local.local(0), p.remote(0), 64).with_user_data(4),
        Sqe::flush(e).with_user_data(5),
    ];
    assert_eq!(p.results(&sqes), [64, 0]);
}

/// Local memory that requests use cannot be deregistered (`Busy`,
/// nothing changes); once they completed it can, after which SQEs naming
/// it fail with `InvalidMemHandle` and every driver releases it.
pub fn local_memory_in_use_is_kept_until_released<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    let src = p.initiator.alloc_registered(64 * 1024).expect("a buffer");
    src.write(0, &pattern(64 * 1024, 4));
    let sqes: Vec<Sqe> = (0..16u64)
        .map(|i| Sqe::put(e, src.local(i * 4096), p.remote(i * 4096), 4096).with_user_data(i))
        .collect();
    p.submit(&sqes);
    p.initiator.progress();
    // Busy while a request uses it; Ok if every one completed already
    // (inside the round, on a driver that finishes in the call).
    let released = match p.initiator.deregister(src.handle()) {
        Ok(()) => true,
        Err(ringfence::Error::Status {
            status: Status::Busy,
            ..
        }) => false,
        Err(other) => panic!("deregister with requests in flight: {other}"),
    };
    let cqes = p.reap(sqes.len());
    assert_exactly_once(&sqes, &cqes);
    assert!(cqes.iter().all(|c| c.res == 4096), "{cqes:?}");
    assert!(read(&p.window, 0, 64 * 1024) == read(&src, 0, 64 * 1024));
    if !released {
        p.initiator
            .deregister(src.handle())
            .expect("deregister, no longer in use");
    }
    let sqe = Sqe::put(e, src.local(0), p.remote(0), 8).with_user_data(100);
    assert_eq!(p.results(&[sqe]), [status(Status::InvalidMemHandle)]);
    p.until("the buffer's release", |p| {
        p.initiator.unreleased_memory().pending == 0
    });
    assert_eq!(p.initiator.unreleased_memory().leaked, 0);
    assert_connected(&p);
}

/// PUTs, then a graceful CLOSE: the PUTs all succeed and land, the
/// CLOSE's CQE comes last and succeeds, and the endpoint is closed:
/// later SQEs fail with `EndpointClosed`.
pub fn graceful_close_comes_last<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    let data = pattern(40 * 1024, 5);
    p.local.write(0, &data);
    let mut sqes: Vec<Sqe> = (0..32u64)
        .map(|i| {
            let len = if i % 4 == 0 { 8192 } else { 64 };
            Sqe::put(e, p.local.local(i * 1024), p.remote(i * 1024), len).with_user_data(i)
        })
        .collect();
    sqes.push(Sqe::close(e, CloseMode::GRACEFUL).with_user_data(999));
    let cqes = p.complete(&sqes);
    let last = cqes.last().expect("CQEs");
    assert_eq!(
        (last.user_data, last.res),
        (999, 0),
        "the CLOSE's CQE comes last"
    );
    assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
    // Each PUT's source is the same range of `data` as its destination
    // in the window, so overlapping ones agree.
    for i in 0..32u64 {
        let len = if i % 4 == 0 { 8192 } else { 64 };
        let at = (i * 1024) as usize;
        assert!(
            read(&p.window, i * 1024, len) == data[at..at + len],
            "PUT {i}"
        );
    }
    assert_closed(&mut p);
}

/// A forced CLOSE with operations in flight: PUTs, a GET and a FLUSH
/// the driver has had for a round (posted and committed), and as many
/// again submitted with the CLOSE (posted in its round): each completes
/// exactly once, done or `Canceled`; the CLOSE succeeds, and the endpoint
/// is closed.
pub fn forced_close_completes_everything_in_flight<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    let puts = |p: &Pair, first: u64| -> Vec<Sqe> {
        (first..first + 16)
            .map(|i| {
                let len = if i % 3 == 0 { 16 * 1024 } else { 64 };
                Sqe::put(
                    e,
                    p.local.local(i * 16 * 1024),
                    p.remote(i * 16 * 1024),
                    len,
                )
                .with_user_data(i)
            })
            .collect()
    };
    let mut first = puts(&p, 0);
    first.push(Sqe::get(e, p.local.local(1 << 20), p.remote(0), 4096).with_user_data(100));
    first.push(Sqe::flush(e).with_user_data(101));
    p.submit(&first);
    p.initiator.progress();
    let mut second = puts(&p, 16);
    second.push(Sqe::flush(e).with_user_data(102));
    second.push(Sqe::close(e, CloseMode::FORCE).with_user_data(999));
    p.submit(&second);
    let all: Vec<Sqe> = first.iter().chain(&second).copied().collect();
    let cqes = p.reap(all.len());
    assert_exactly_once(&all, &cqes);
    for c in &cqes {
        let done_or_canceled = c.res >= 0 || c.res == status(Status::Canceled);
        assert!(done_or_canceled, "after a forced close: {c:?}");
    }
    let close = cqes.iter().find(|c| c.user_data == 999).expect("the CLOSE");
    assert_eq!(close.res, 0, "the forced CLOSE");
    assert_closed(&mut p);
}

/// The target dies with PUTs and a FLUSH submitted: each completes
/// exactly once (done, or failed); after the death, nothing succeeds: a
/// PUT and a FLUSH fail.
pub fn peer_death_completes_everything<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    let mut sqes: Vec<Sqe> = (0..32u64)
        .map(|i| {
            let len = if i % 3 == 0 { 16 * 1024 } else { 64 };
            Sqe::put(
                e,
                p.local.local(i * 16 * 1024),
                p.remote(i * 16 * 1024),
                len,
            )
            .with_user_data(i)
        })
        .collect();
    sqes.push(Sqe::flush(e).with_user_data(100));
    p.submit(&sqes);
    // One round: the engine takes them, the driver has them in flight.
    p.initiator.progress();
    p.kill_target();
    let cqes = p.reap(sqes.len());
    assert_exactly_once(&sqes, &cqes);
    let sqes = [
        Sqe::put(e, p.local.local(0), p.remote(0), 8).with_user_data(200),
        Sqe::flush(e).with_user_data(201),
    ];
    let res = p.results(&sqes);
    assert!(
        res.iter().all(|&r| r < 0),
        "success reported after the peer's death: {res:?}"
    );
}

/// The endpoint is closed: its state says so, and a PUT on it fails with
/// `EndpointClosed`.
fn assert_closed(p: &mut Pair) {
    assert_eq!(
        p.initiator.endpoint_state(p.ep).expect("the endpoint"),
        EndpointState::Closed
    );
    let sqe = Sqe::put(p.e(), p.local.local(0), p.remote(0), 8).with_user_data(1000);
    assert_eq!(p.results(&[sqe]), [status(Status::EndpointClosed)]);
}
