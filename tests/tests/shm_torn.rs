//! A PUT of an aligned 1, 2, 4 or 8-byte word lands as one store, between
//! two real processes: the child polls a word of its window (reading it
//! with `RegisteredBuf::read`, the peer copy primitive, which loads an
//! aligned word atomically) while the parent PUTs all-zero and all-ones
//! values of that size into it, alternately; every value the child sees
//! must be one of the two, whole. The child never runs an engine round:
//! the parent's shm driver writes the child's memfd window directly.

use ringfence_ring::{FenceMode, RemoteBuf, Sqe};
use ringfence_tests::child::{self, ChildProcess};
use ringfence_tests::shm::{self, HANG, Link};
use ringfence_tests::{Backoff, Deadline};

/// PUTs per size, in batches of `BATCH` (odd, so consecutive batches end
/// on different values). After each batch the parent waits until the
/// child has read the word again, so the child sees both values whatever
/// the scheduler does; how many reads land in the middle of a batch is up
/// to the scheduler, and is reported, not asserted.
const ROUNDS: usize = 20_000;
const BATCH: usize = 257;
/// Where each size's word is (aligned to 64), the "done" word, and the
/// child's count of reads so far.
const WORD_AT: usize = 64;
const DONE_AT: usize = 1024;
const READS_AT: usize = 2048;

/// The child: polls the word of each size the parent names until the
/// parent's done marker for that size arrives, then reports
/// `[reads, zeros, ones, torn, last read was zeros]`.
fn poller() {
    let mut link = Link::new(child::parent_socket());
    let w = shm::worker(1);
    let window = w.alloc_registered(4096).unwrap();
    link.send_offer(&w, &window);
    loop {
        let m = link.recv_u64s();
        let &[size] = m.as_slice() else {
            assert!(m.is_empty(), "unexpected request {m:?}");
            return;
        };
        let size = size as usize;
        let at = WORD_AT * size;
        link.send(b"polling");
        let deadline = Deadline::after(HANG, "polling a word under PUTs");
        let (mut reads, mut zeros, mut ones, mut torn) = (0u64, 0u64, 0u64, 0u64);
        let mut backoff = Backoff::default();
        loop {
            // The done marker is read before the word, so the last read
            // below races with the PUTs too.
            let done = window.load_u64(DONE_AT) == size as u64;
            let mut out = [0x5au8; 8];
            window.read(at, &mut out[..size]);
            reads += 1;
            window.store_u64(READS_AT, reads);
            match &out[..size] {
                v if v.iter().all(|&b| b == 0) => zeros += 1,
                v if v.iter().all(|&b| b == 0xff) => ones += 1,
                _ => torn += 1,
            }
            if done {
                // The last PUT (zeros) came before the marker: it shows.
                let last_zero = out[..size].iter().all(|&b| b == 0);
                link.send_u64s(&[reads, zeros, ones, torn, u64::from(last_zero)]);
                break;
            }
            // Mostly spin (the point is to read during the PUTs), yielding
            // now and then so the writer runs on two shared cores.
            if reads % 256 == 0 {
                backoff.idle();
            } else {
                std::hint::spin_loop();
            }
            deadline.check(|| format!("{reads} reads of a {size}-byte word"));
        }
    }
}

#[test]
fn aligned_word_puts_are_never_seen_torn() {
    if child::role().is_some() {
        return poller();
    }
    let child = ChildProcess::spawn("aligned_word_puts_are_never_seen_torn", "poller");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let base = offer.base();
    let w = shm::worker(1);
    let (ep, rkey) = offer.connect(&w);
    let e = ep.as_raw();
    // Zeros at 0, ones at 64, the done marker's value at 128, the child's
    // read count (GET) at 192.
    let src = w.alloc_registered(256).unwrap();
    src.write(64, &[0xff; 64]);
    let mut qp = w.create_queue().unwrap();
    let remote = |offset: usize| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: base + offset as u64,
    };
    for size in [1usize, 2, 4, 8] {
        link.send_u64s(&[size as u64]);
        assert_eq!(link.recv(), b"polling");
        let word = remote(WORD_AT * size);
        let puts: Vec<Sqe> = (0..ROUNDS)
            .map(|i| {
                let from = if i % 2 == 0 { 64 } else { 0 };
                Sqe::put(e, src.local(from), word, size as u32).with_user_data(i as u64)
            })
            .collect();
        let child_reads = |qp: &mut ringfence::QueuePair| {
            let get = Sqe::get(e, src.local(192), remote(READS_AT), 8);
            assert_eq!(shm::complete(&w, qp, &[get], 1)[0].res, 8);
            src.load_u64(192)
        };
        for batch in puts.chunks(BATCH) {
            for c in shm::complete(&w, &mut qp, batch, batch.len()) {
                assert_eq!(c.res, size as i32, "{c:?}");
            }
            // Wait until the child has read the batch's last value.
            let (before, mut backoff) = (child_reads(&mut qp), Backoff::default());
            let deadline = Deadline::after(HANG, "the child reading again");
            while child_reads(&mut qp) <= before {
                backoff.idle();
                deadline.check(|| format!("{size}-byte word, {before} reads"));
            }
        }
        // The done marker, ordered after every PUT above.
        src.store_u64(128, size as u64);
        let tail = [
            Sqe::fence(e, FenceMode::COMPLETE).with_user_data(1),
            Sqe::put(e, src.local(128), remote(DONE_AT), 8).with_user_data(2),
        ];
        for c in shm::complete(&w, &mut qp, &tail, 2) {
            assert!(c.res >= 0, "{c:?}");
        }
        let report = link.recv_u64s();
        let &[reads, zeros, ones, torn, last_zero] = report.as_slice() else {
            panic!("report {report:?}")
        };
        eprintln!("{size}-byte word: {reads} reads, {zeros} zero, {ones} ones, {torn} torn");
        assert_eq!(torn, 0, "a {size}-byte aligned PUT was seen torn");
        assert_eq!(reads, zeros + ones);
        assert_eq!(last_zero, 1, "the last PUT (zeros) before the marker");
        assert!(zeros > 0 && ones > 0, "both values were seen: {report:?}");
    }
    link.send(&[]);
    child.join();
}
