//! Peer death over the shm driver, between real processes: a target
//! killed with SIGKILL while the initiator has requests outstanding (every
//! one of them completes with an error, promptly, and the initiator can
//! connect a new peer), and an initiator killed while it streams to a
//! target that keeps serving another initiator.

use ringfence::Status;
use ringfence_ring::{CloseMode, Cqe, RemoteBuf, Sqe};
use ringfence_tests::child::{self, ChildProcess};
use ringfence_tests::shm::{self, Link, pattern};
use ringfence_tests::{Backoff, Deadline};
use std::time::{Duration, Instant};

/// A killed peer's requests must all have failed within this (generous on
/// two shared cores; detection itself is a socket hang-up, immediate).
const DETECTION_BOUND: Duration = Duration::from_secs(10);

/// A target that sets up a window and then never runs an engine round
/// again (so notifications pile up in its channel), until it is killed.
fn idle_target() {
    let mut link = Link::new(child::parent_socket());
    let w = shm::worker(1);
    let window = w.alloc_registered(1 << 20).unwrap();
    link.send_offer(&w, &window);
    // Blocks until the parent says so or kills us.
    let _ = link.recv();
}

#[test]
fn sigkill_of_the_target_fails_every_outstanding_request() {
    if child::role().is_some() {
        return idle_target();
    }
    let test = "sigkill_of_the_target_fails_every_outstanding_request";
    let mut child = ChildProcess::spawn(test, "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let base = offer.base();
    let w = shm::worker(1);
    let (ep, rkey) = offer.connect(&w);
    let src = w.alloc_registered(8192).unwrap();
    let mut qp = w.create_queue().unwrap();
    let e = ep.as_raw();

    // A stream of PUT + NOTIFY pairs, far more than the target's channel
    // (256 KiB, never drained) holds.
    const PAIRS: u64 = 1500;
    let mut sqes = Vec::new();
    for i in 0..PAIRS {
        let remote = RemoteBuf {
            rkey: rkey.as_raw(),
            addr: base + (i % 256) * 4096,
        };
        sqes.push(Sqe::put(e, src.local(0), remote, 4096).with_user_data(2 * i));
        sqes.push(Sqe::notify(e, src.local(4096), 1024).with_user_data(2 * i + 1));
    }
    let total = sqes.len();
    let mut cqes: Vec<Cqe> = Vec::new();
    let mut pushed = 0;
    let mut batch = [Cqe::default(); 64];
    let deadline = Deadline::after(shm::HANG, "initiator");
    // Run until the stream is stuck behind the full channel: nothing has
    // completed for many rounds while requests are outstanding (they cannot
    // complete: the target never drains).
    let mut stalled = 0;
    while stalled < 5000 {
        if pushed < total {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        w.progress();
        let n = qp.reap(&mut batch).unwrap();
        cqes.extend_from_slice(&batch[..n]);
        stalled = if n > 0 { 0 } else { stalled + 1 };
        if stalled > 16 {
            std::thread::yield_now();
        }
        deadline.check(|| format!("{} CQEs", cqes.len()));
    }
    let before = cqes.len();
    assert!(
        cqes.iter().all(|c| c.res >= 0),
        "all succeeded before the kill"
    );
    assert!(
        before > 100 && before < total / 2,
        "stuck mid-stream ({before} of {total})"
    );

    // SIGKILL, and the survivor completes everything outstanding with an
    // error, within a bound.
    child.process.kill().unwrap();
    child.process.wait().unwrap();
    let killed = Instant::now();
    let mut backoff = Backoff::default();
    while cqes.len() < total {
        if pushed < total {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        w.progress();
        let n = qp.reap(&mut batch).unwrap();
        cqes.extend_from_slice(&batch[..n]);
        if n > 0 {
            backoff.reset();
        } else {
            backoff.idle();
        }
        assert!(
            killed.elapsed() < DETECTION_BOUND,
            "{} of {total} CQEs {DETECTION_BOUND:?} after the kill",
            cqes.len()
        );
    }
    let elapsed = killed.elapsed();
    eprintln!("every outstanding request failed {elapsed:?} after SIGKILL");
    let mut seen = vec![0u32; total];
    for c in &cqes {
        seen[c.user_data as usize] += 1;
    }
    assert!(seen.iter().all(|&n| n == 1), "exactly one CQE per SQE");
    let failed: Vec<&Cqe> = cqes[before..].iter().filter(|c| c.res < 0).collect();
    assert!(!failed.is_empty());
    for c in &failed {
        assert!(
            c.res == Status::PeerUnreachable.as_raw() || c.res == Status::EndpointFailed.as_raw(),
            "{c:?}"
        );
    }
    // Later submissions fail at once.
    let res = shm::complete(&w, &mut qp, &[Sqe::flush(e).with_user_data(9)], 1)[0].res;
    assert!(res < 0);

    // And a new peer can be connected and used.
    let child = ChildProcess::spawn(test, "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let base = offer.base();
    let (ep, rkey) = offer.connect(&w);
    src.write(0, &pattern(64, 5));
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: base,
    };
    let sqes = [
        Sqe::put(ep.as_raw(), src.local(0), remote, 64).with_user_data(1),
        Sqe::get(ep.as_raw(), src.local(1024), remote, 64).with_user_data(2),
    ];
    for c in shm::complete(&w, &mut qp, &sqes, 2) {
        assert_eq!(c.res, 64);
    }
    let mut got = [0u8; 64];
    src.read(1024, &mut got);
    assert_eq!(got[..], pattern(64, 5)[..]);
    link.send(b"bye");
    child.join();
}

const SURVIVOR_PAIRS: u64 = 5000;
const SLOT: u64 = 64;

/// An initiator that streams PUT + NOTIFY pairs into its half of the
/// parent's window: the victim forever, the survivor `SURVIVOR_PAIRS`.
fn streaming_initiator(id: u64) {
    let mut link = Link::new(child::parent_socket());
    let offer = link.recv_offer();
    let base = offer.base() + id * SURVIVOR_PAIRS * SLOT;
    let w = shm::worker(1);
    let (ep, rkey) = offer.connect(&w);
    let src = w.alloc_registered(64 * 1024).unwrap();
    let mut qp = w.create_queue().unwrap();
    let e = ep.as_raw();
    let count = if id == 0 { u64::MAX } else { SURVIVOR_PAIRS };
    let mut i = 0;
    while i < count {
        let mut sqes = Vec::new();
        for k in 0..32 {
            if i >= count {
                break;
            }
            let at = k * 1024;
            src.write(at as usize, &pattern(SLOT as usize, id << 32 | i));
            let remote = RemoteBuf {
                rkey: rkey.as_raw(),
                addr: base + (i % SURVIVOR_PAIRS) * SLOT,
            };
            sqes.push(Sqe::put(e, src.local(at), remote, SLOT as u32));
            let mut n = Sqe::notify(e, src.local(at), 8);
            n.operand = id << 32 | i;
            sqes.push(n);
            i += 1;
        }
        for c in shm::complete(&w, &mut qp, &sqes, sqes.len()) {
            assert!(c.res >= 0, "{c:?}");
        }
    }
    link.send(b"done");
    let _ = link.recv();
}

#[test]
fn a_killed_initiator_leaves_the_target_serving_others() {
    match child::role().as_deref() {
        Some("victim") => return streaming_initiator(0),
        Some("survivor") => return streaming_initiator(1),
        _ => {}
    }
    let test = "a_killed_initiator_leaves_the_target_serving_others";
    let w = shm::worker(1);
    let window = w
        .alloc_registered((2 * SURVIVOR_PAIRS * SLOT) as usize)
        .unwrap();
    let key = w.pack_rkey(window.handle()).unwrap();
    let mut qp = w.create_queue().unwrap();
    let mut victim = ChildProcess::spawn(test, "victim");
    let survivor = ChildProcess::spawn(test, "survivor");
    let mut links = [
        Link::new(victim.socket.try_clone().unwrap()),
        Link::new(survivor.socket.try_clone().unwrap()),
    ];
    // The victim first; the survivor once the victim streams, so that the
    // victim dies mid-stream whatever the scheduling (no timing assumed).
    let offer = |link: &mut Link| {
        link.send(w.address());
        link.send(&key);
        link.send_u64s(&[window.addr()]);
    };
    offer(&mut links[0]);
    let mut survivor_started = false;
    let deadline = Deadline::after(shm::HANG, "target");
    let mut backoff = Backoff::default();
    let (mut from_victim, mut next) = (0u64, 0u64);
    let mut killed = false;
    let mut record = [0u8; SLOT as usize];
    while next < SURVIVOR_PAIRS {
        let mut work = w.progress();
        while let Some(cqe) = qp.pop().unwrap() {
            work += 1;
            let (id, i) = (cqe.user_data >> 32, cqe.user_data & 0xffff_ffff);
            let payload = qp.notification(&cqe).expect("a notification");
            assert_eq!(payload.len(), 8);
            if id == 0 {
                from_victim += 1;
                continue;
            }
            assert_eq!(i, next, "the survivor's notifications out of order");
            window.read(((SURVIVOR_PAIRS + i) * SLOT) as usize, &mut record);
            assert_eq!(
                record[..],
                pattern(SLOT as usize, 1 << 32 | i)[..],
                "record {i}"
            );
            next += 1;
        }
        if !survivor_started && from_victim > 0 {
            offer(&mut links[1]);
            survivor_started = true;
        }
        if !killed && (from_victim >= 100 || next >= SURVIVOR_PAIRS / 2) {
            victim.process.kill().unwrap();
            victim.process.wait().unwrap();
            killed = true;
        }
        if work > 0 {
            backoff.reset();
        } else {
            backoff.idle();
        }
        deadline.check(|| format!("survivor {next}, victim {from_victim}"));
    }
    assert!(killed, "the victim was killed mid-stream");
    assert_eq!(links[1].recv(), b"done");
    links[1].send(b"bye");
    survivor.join();
    eprintln!("{from_victim} notifications from the victim before and around its death");
}

/// Kill-and-reap rounds per scenario below.
const ROUNDS: usize = 100;
/// PUTs queued behind the kill in [`nothing_queued_before_the_reap_succeeds_after_it`].
const QUEUED: u64 = 204;

/// One round's target, killed and reaped by the parent: its address, key
/// and window base, then the parent's worker's endpoint and key to it.
struct Victim {
    child: ChildProcess,
    base: u64,
    ep: ringfence::EndpointId,
    rkey: ringfence::RkeyId,
}

impl Victim {
    fn spawn(test: &str, w: &ringfence::Worker) -> Victim {
        let child = ChildProcess::spawn(test, "target");
        let mut link = Link::new(child.socket.try_clone().unwrap());
        let offer = link.recv_offer();
        let (ep, rkey) = offer.connect(w);
        Victim {
            child,
            base: offer.base(),
            ep,
            rkey,
        }
    }

    /// SIGKILL, then `waitpid`: the process is gone for good.
    fn kill_and_reap(&mut self) {
        self.child.process.kill().unwrap();
        self.child.process.wait().unwrap();
    }

    fn put(&self, src: &ringfence::RegisteredBuf, i: u64) -> Sqe {
        let remote = RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.base + (i % 256) * 64,
        };
        Sqe::put(self.ep.as_raw(), src.local(0), remote, 64).with_user_data(i)
    }
}

/// Runs progress until every one of `expect` CQEs arrived; returns them.
fn collect(w: &ringfence::Worker, qp: &mut ringfence::QueuePair, expect: usize) -> Vec<Cqe> {
    let deadline = Deadline::after(shm::HANG, "collecting CQEs");
    let mut backoff = Backoff::default();
    let mut out = Vec::with_capacity(expect);
    let mut batch = [Cqe::default(); 64];
    while out.len() < expect {
        let work = w.progress();
        let n = qp.reap(&mut batch).unwrap();
        out.extend_from_slice(&batch[..n]);
        if work + n > 0 {
            backoff.reset();
        } else {
            backoff.idle();
        }
        deadline.check(|| format!("{} of {expect} CQEs", out.len()));
    }
    out
}

/// PUTs and a FLUSH behind them, queued while the target lives, with no
/// progress made until the target has been killed and reaped: every one
/// fails with PEER_UNREACHABLE (the shm driver reads the target's
/// liveness word, which the kernel marked before the reap), exactly once;
/// so do `try_now`, a later PUT and a later FLUSH; the CLOSE too (the
/// endpoint closes all the same). A hundred rounds.
#[test]
fn nothing_queued_before_the_reap_succeeds_after_it() {
    if child::role().is_some() {
        return idle_target();
    }
    let test = "nothing_queued_before_the_reap_succeeds_after_it";
    let w = shm::worker(1);
    let src = w.alloc_registered(4096).unwrap();
    let mut qp = w.create_queue().unwrap();
    let unreachable = Status::PeerUnreachable.as_raw();
    for round in 0..ROUNDS {
        let mut v = Victim::spawn(test, &w);
        let e = v.ep.as_raw();
        let mut sqes: Vec<Sqe> = (0..QUEUED).map(|i| v.put(&src, i)).collect();
        sqes.push(Sqe::flush(e).with_user_data(QUEUED));
        assert_eq!(qp.push_batch(&sqes).unwrap(), sqes.len());
        qp.submit();
        let (late_put, late_flush) = (v.put(&src, 1000), Sqe::flush(e).with_user_data(1001));
        v.kill_and_reap();

        let cqes = collect(&w, &mut qp, sqes.len());
        let mut seen = vec![0u32; sqes.len()];
        for c in &cqes {
            assert_eq!(c.res, unreachable, "round {round}: {c:?} after the reap");
            seen[c.user_data as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n == 1), "round {round}: one CQE each");
        assert_eq!(qp.try_now(&late_put), Some(Err(Status::PeerUnreachable)));
        let later = shm::complete(&w, &mut qp, &[late_put, late_flush], 2);
        assert!(later.iter().all(|c| c.res == unreachable), "{later:?}");
        let close = shm::complete(
            &w,
            &mut qp,
            &[Sqe::close(e, CloseMode::GRACEFUL).with_user_data(7)],
            1,
        );
        assert_eq!(close[0].res, unreachable, "a graceful close of a dead peer");
        assert!(qp.pop().unwrap().is_none(), "no CQE beyond one per SQE");
    }
}

/// PUTs that completed while the target lived, then the target killed and
/// reaped, then a FLUSH: the flush is what says the target was alive, so
/// it fails. A hundred rounds.
#[test]
fn a_flush_after_the_reap_fails_even_though_every_put_succeeded() {
    if child::role().is_some() {
        return idle_target();
    }
    let test = "a_flush_after_the_reap_fails_even_though_every_put_succeeded";
    let w = shm::worker(1);
    let src = w.alloc_registered(4096).unwrap();
    let mut qp = w.create_queue().unwrap();
    for round in 0..ROUNDS {
        let mut v = Victim::spawn(test, &w);
        let e = v.ep.as_raw();
        let puts: Vec<Sqe> = (0..16).map(|i| v.put(&src, i)).collect();
        for c in shm::complete(&w, &mut qp, &puts, puts.len()) {
            assert_eq!(c.res, 64, "round {round}: the target is alive");
        }
        let alive = shm::complete(&w, &mut qp, &[Sqe::flush(e).with_user_data(99)], 1);
        assert_eq!(alive[0].res, 0, "round {round}: a flush while it lives");
        v.kill_and_reap();
        let dead = shm::complete(&w, &mut qp, &[Sqe::flush(e).with_user_data(100)], 1);
        assert_eq!(
            dead[0].res,
            Status::PeerUnreachable.as_raw(),
            "round {round}: a flush after the reap"
        );
        let close = shm::complete(
            &w,
            &mut qp,
            &[Sqe::close(e, CloseMode::GRACEFUL).with_user_data(7)],
            1,
        );
        assert_eq!(close[0].res, Status::PeerUnreachable.as_raw());
    }
}

/// A core thread streams the application's PUTs (each FLUSHed every 64)
/// while the target is killed and reaped mid-stream: every operation
/// submitted after the reap fails with PEER_UNREACHABLE, and every one,
/// before or after, completes exactly once. A hundred rounds.
#[test]
fn streaming_with_the_core_thread_nothing_submitted_after_the_reap_succeeds() {
    if child::role().is_some() {
        return idle_target();
    }
    let test = "streaming_with_the_core_thread_nothing_submitted_after_the_reap_succeeds";
    let mut w = shm::worker(1);
    w.start_core_thread(None).unwrap();
    let src = w.alloc_registered(4096).unwrap();
    let mut qp = w.create_queue().unwrap();
    const AFTER: u64 = 512;
    for round in 0..ROUNDS {
        let mut v = Victim::spawn(test, &w);
        let e = v.ep.as_raw();
        let deadline = Deadline::after(shm::HANG, "streaming");
        let mut backoff = Backoff::default();
        let mut batch = [Cqe::default(); 64];
        let mut results: Vec<Option<i32>> = Vec::new();
        let (mut next, mut done, mut succeeded) = (0u64, 0usize, 0usize);
        let mut reaped_at: Option<u64> = None;
        loop {
            let end = reaped_at.map_or(u64::MAX, |r| r + AFTER);
            if next < end && results.len() - done < 256 {
                let s = if next % 64 == 63 {
                    Sqe::flush(e).with_user_data(next)
                } else {
                    v.put(&src, next)
                };
                if qp.push(s).is_ok() {
                    qp.submit();
                    results.push(None);
                    next += 1;
                }
            }
            let n = qp.reap(&mut batch).unwrap();
            for c in &batch[..n] {
                let slot = &mut results[c.user_data as usize];
                assert!(
                    slot.is_none(),
                    "round {round}: two CQEs for {}",
                    c.user_data
                );
                *slot = Some(c.res);
                done += 1;
                succeeded += usize::from(c.res >= 0);
            }
            if reaped_at.is_none() && succeeded >= 256 {
                v.kill_and_reap();
                reaped_at = Some(next);
            }
            if reaped_at.is_some() && next == end && done == results.len() {
                break;
            }
            if n > 0 {
                backoff.reset();
            } else {
                backoff.idle();
            }
            deadline.check(|| format!("round {round}: {done} of {next} done"));
        }
        let reaped_at = reaped_at.unwrap() as usize;
        for (i, r) in results.iter().enumerate().skip(reaped_at) {
            assert_eq!(
                *r,
                Some(Status::PeerUnreachable.as_raw()),
                "round {round}: operation {i}, submitted after the reap"
            );
        }
        let close = [Sqe::close(e, CloseMode::GRACEFUL).with_user_data(0)];
        assert_eq!(qp.push_batch(&close).unwrap(), 1);
        qp.submit();
        assert!(qp.wait_cqes(1, Some(shm::HANG)).unwrap() >= 1);
        let c = qp.pop().unwrap().unwrap();
        assert_eq!(c.res, Status::PeerUnreachable.as_raw());
    }
}
