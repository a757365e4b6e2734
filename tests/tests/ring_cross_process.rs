//! Rings shared between two real processes: the parent creates a memfd
//! region and two doorbells, passes them to a child (a re-run of this test
//! binary) over a unix socket, and both sides move entries through the
//! shared memory with no system call except doorbells for sleeping.

use ringfence_ring::{Cqe, Doorbell, Opcode, Region, RingError, Sqe};
use ringfence_tests::child::{self, ChildProcess};
use ringfence_tests::scribble::Scribbler;
use ringfence_tests::{Backoff, Deadline, fdpass};
use std::os::fd::AsFd;
use std::time::Duration;

const ENTRIES: u64 = 1_000_000;
/// Round trips in which the parent waits for the child to fall asleep
/// before submitting, so the doorbell path runs across processes every time.
const WAKE_ROUNDS: u64 = 200;
const HANG: Duration = Duration::from_secs(300);

/// The SQE the parent sends as number `i`: every field depends on `i`, so a
/// torn, stale or misplaced entry changes the checksum.
fn sqe(i: u64) -> Sqe {
    let mut sqe = Sqe::new(Opcode::PUT).with_user_data(i);
    sqe.endpoint = (i % 7) as u32;
    sqe.len = (i as u32).wrapping_mul(3);
    sqe.local_addr = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    sqe.remote_addr = !i;
    sqe.operand = i.rotate_left(17);
    sqe
}

/// The CQE the child answers SQE `sqe` with.
fn cqe_for(sqe: &Sqe) -> Cqe {
    Cqe::new(sqe.user_data, (sqe.len & 0x7fff_ffff) as i32, sqe.endpoint)
}

/// Folds every byte of an entry into a running checksum (order-sensitive).
fn fold(sum: u64, words: &[u64]) -> u64 {
    words.iter().fold(sum, |acc, w| {
        acc.rotate_left(5) ^ w.wrapping_mul(0x100_0000_01b3)
    })
}

fn sqe_words(s: &Sqe) -> [u64; 8] {
    [
        u64::from(s.opcode)
            | u64::from(s.flags) << 8
            | u64::from(s.subop) << 16
            | u64::from(s.endpoint) << 32,
        u64::from(s.len) | u64::from(s.local_mem) << 32,
        s.local_addr,
        s.remote_addr,
        u64::from(s.rkey) | u64::from(s.reserved1) << 32,
        s.operand,
        s.operand2,
        s.user_data,
    ]
}

fn cqe_words(c: &Cqe) -> [u64; 2] {
    [
        c.user_data,
        u64::from(c.res as u32) | u64::from(c.flags) << 32,
    ]
}

#[test]
fn one_million_entries_each_way() {
    if child::role().as_deref() == Some("engine") {
        return engine_child();
    }
    let mut region = Region::builder()
        .sq_entries(256)
        .cq_entries(512)
        .build_memfd("xproc")
        .unwrap();
    let sq_bell = Doorbell::new().unwrap();
    let cq_bell = Doorbell::new().unwrap();
    let child = ChildProcess::spawn("one_million_entries_each_way", "engine");
    fdpass::send(
        &child.socket,
        &(ENTRIES + WAKE_ROUNDS).to_le_bytes(),
        &[region.as_fd().unwrap(), sq_bell.as_fd(), cq_bell.as_fd()],
    )
    .unwrap();

    let (mut sq, mut cq) = region.app_side().unwrap();
    let deadline = Deadline::after(HANG, "parent");
    let (mut sent, mut reaped) = (0u64, 0u64);
    let (mut sent_sum, mut reaped_sum, mut expect_sum) = (0u64, 0u64, 0u64);
    let mut batch = [Sqe::default(); 32];
    let mut done = [Cqe::default(); 64];
    let mut backoff = Backoff::default();
    let mut sleeps = 0u64;
    while reaped < ENTRIES {
        let mut progress = false;
        // Submit a batch of whatever fits.
        let want = (ENTRIES - sent).min(batch.len() as u64) as usize;
        for (k, slot) in batch[..want].iter_mut().enumerate() {
            *slot = sqe(sent + k as u64);
        }
        let n = sq.push_batch(&batch[..want]).unwrap();
        if n > 0 {
            for s in &batch[..n] {
                sent_sum = fold(sent_sum, &sqe_words(s));
                expect_sum = fold(expect_sum, &cqe_words(&cqe_for(s)));
            }
            sent += n as u64;
            sq.submit_and_wake(&sq_bell).unwrap();
            progress = true;
        }
        // Reap completions, which must come back in order.
        let got = cq.pop_batch(&mut done).unwrap();
        for c in &done[..got] {
            assert_eq!(c.user_data, reaped, "completions out of order");
            reaped_sum = fold(reaped_sum, &cqe_words(c));
            reaped += 1;
        }
        progress |= got > 0;
        if progress {
            backoff.reset();
        } else if backoff.idle() && sent == ENTRIES {
            // Everything is submitted: sleep until the child posts more.
            sleeps += 1;
            cq.wait(&cq_bell, Some(Duration::from_secs(1))).unwrap();
            backoff.reset();
        }
        deadline.check(|| format!("sent {sent}, reaped {reaped}"));
    }
    assert_eq!(reaped_sum, expect_sum, "CQE checksum");

    // Wake-up rounds: submit only once the child has set NEED_WAKEUP, so
    // every submission must ring the doorbell for the child to see it.
    let mut rang = 0;
    for _ in 0..WAKE_ROUNDS {
        let mut backoff = Backoff::default();
        while !sq.needs_wakeup() {
            backoff.idle();
            deadline.check(|| format!("child never slept (round {rang})"));
        }
        let s = sqe(sent);
        sq.push(s).unwrap();
        sent_sum = fold(sent_sum, &sqe_words(&s));
        sent += 1;
        sq.submit();
        if sq.needs_wakeup() {
            sq_bell.ring().unwrap();
            rang += 1;
        }
        let c = loop {
            if let Some(c) = cq.pop().unwrap() {
                break c;
            }
            cq.wait(&cq_bell, Some(Duration::from_secs(1))).unwrap();
            deadline.check(|| format!("no completion for {}", s.user_data));
        };
        assert_eq!(c, cqe_for(&s));
        reaped += 1;
    }
    assert_eq!(
        rang, WAKE_ROUNDS,
        "the child was asleep before every submission"
    );

    let mut reply = [0u8; 16];
    let (len, _) = fdpass::recv(&child.socket, &mut reply).unwrap();
    assert_eq!(len, 16);
    let child_sum = u64::from_le_bytes(reply[..8].try_into().unwrap());
    let child_count = u64::from_le_bytes(reply[8..].try_into().unwrap());
    assert_eq!(
        (child_count, child_sum),
        (sent, sent_sum),
        "the child saw other SQEs"
    );
    assert_eq!(reaped, ENTRIES + WAKE_ROUNDS);
    child.join();
    eprintln!("parent slept {sleeps} times waiting for completions");
}

fn engine_child() {
    let socket = child::parent_socket();
    let mut count = [0u8; 8];
    let (_, fds) = fdpass::recv(&socket, &mut count).unwrap();
    let total = u64::from_le_bytes(count);
    let [region_fd, sq_bell, cq_bell]: [_; 3] = fds.try_into().expect("three descriptors");
    let mut region = Region::attach(region_fd).unwrap();
    let (sq_bell, cq_bell) = (Doorbell::from_fd(sq_bell), Doorbell::from_fd(cq_bell));
    let (mut sq, mut cq) = region.engine_side().unwrap();

    let deadline = Deadline::after(HANG, "child");
    let mut batch = [Sqe::default(); 64];
    let (mut seen, mut sum) = (0u64, 0u64);
    let mut backoff = Backoff::default();
    while seen < total {
        let n = sq.pop_batch(&mut batch).unwrap();
        for s in &batch[..n] {
            assert_eq!(*s, sqe(seen), "SQE {seen} arrived damaged or out of order");
            sum = fold(sum, &sqe_words(s));
            seen += 1;
            let c = cqe_for(s);
            loop {
                match cq.push(c) {
                    Ok(()) => break,
                    Err(RingError::Full) => {
                        // Publish what we have so the parent can make room.
                        cq.submit_and_wake(&cq_bell).unwrap();
                        std::thread::yield_now();
                        deadline.check(|| format!("CQ full at {seen}"));
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        if n > 0 {
            cq.submit_and_wake(&cq_bell).unwrap();
            backoff.reset();
        } else if backoff.idle() {
            sq.wait(&sq_bell, Some(Duration::from_secs(1))).unwrap();
            backoff.reset();
        }
        deadline.check(|| format!("seen {seen} of {total}"));
    }
    let mut reply = [0u8; 16];
    reply[..8].copy_from_slice(&sum.to_le_bytes());
    reply[8..].copy_from_slice(&seen.to_le_bytes());
    fdpass::send(&socket, &reply, &[]).unwrap();
}

/// Another process writes garbage into the shared indices and header: this
/// side gets errors, never a crash, and a fresh attach refuses the header.
#[test]
fn garbage_from_another_process_is_an_error() {
    if child::role().as_deref() == Some("vandal") {
        return vandal_child();
    }
    let mut region = Region::builder()
        .sq_entries(8)
        .cq_entries(8)
        .build_memfd("vandal")
        .unwrap();
    let (mut sq, mut cq) = region.app_side().unwrap();
    sq.push(Sqe::nop()).unwrap();
    sq.submit();
    let child = ChildProcess::spawn("garbage_from_another_process_is_an_error", "vandal");
    fdpass::send(
        &child.socket,
        &region.size().to_le_bytes(),
        &[region.as_fd().unwrap()],
    )
    .unwrap();
    // The child says when it is done scribbling.
    let mut done = [0u8; 1];
    fdpass::recv(&child.socket, &mut done).unwrap();
    child.join();

    // The CQ tail is now far ahead of our head: every reap is an error.
    let err = cq.pop().unwrap_err();
    assert_eq!(err.tail, 0xdead_beef);
    assert!(cq.pop_batch(&mut [Cqe::default(); 4]).is_err());
    // The SQ head moved past our tail: once the cached space runs out, the
    // producer reports corruption instead of overwriting unread entries.
    let mut result = Ok(());
    for _ in 0..9 {
        result = sq.push(Sqe::nop());
        if result.is_err() {
            break;
        }
    }
    assert!(matches!(result, Err(RingError::Corrupt(_))), "{result:?}");
    // The header was rewritten: attaching again is refused.
    let fd = region.as_fd().unwrap().try_clone_to_owned().unwrap();
    let err = Region::attach(fd).unwrap_err();
    assert!(
        err.to_string().contains("not a ringfence ring region"),
        "{err}"
    );
}

fn vandal_child() {
    let socket = child::parent_socket();
    let mut size = [0u8; 8];
    let (_, mut fds) = fdpass::recv(&socket, &mut size).unwrap();
    let fd = fds.pop().expect("the region's memfd");
    let len = u64::from_le_bytes(size) as usize;
    // Attach properly first, to learn the layout from a validated header.
    let region = Region::attach(fd.try_clone().unwrap()).unwrap();
    let layout = ringfence_ring::Layout::new(region.sq_entries(), region.cq_entries()).unwrap();
    let scribbler = Scribbler::new(fd.as_fd(), len).unwrap();
    scribbler.write(layout.cq.producer as usize, &0xdead_beefu32.to_le_bytes());
    scribbler.write(layout.sq.consumer as usize, &0x7777_7777u32.to_le_bytes());
    scribbler.write(0, b"GARBAGE!");
    fdpass::send(&socket, &[1], &[]).unwrap();
}
