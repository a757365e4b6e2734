//! Loom models of the SPSC ring protocol.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p ringfence-ring --release --test loom`
//!
//! Each slot is a loom cell, so loom reports any slot access that the index
//! protocol does not order (a torn or early read), besides checking the
//! values that arrive.

#[cfg(loom)]
mod tests {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::thread;
    use ringfence_ring::{Cqe, RingError, channel};

    fn cqe(i: u64) -> Cqe {
        Cqe::new(i, i as i32, 0)
    }

    /// Single pushes and pops through a ring of two, so the producer wraps
    /// and must see the consumer's frees.
    #[test]
    fn push_pop_wraps_around() {
        loom::model(|| {
            let (mut tx, mut rx) = channel::<Cqe>(2);
            const N: u64 = 3;
            let producer = thread::spawn(move || {
                let mut i = 0;
                while i < N {
                    match tx.push(cqe(i)) {
                        Ok(()) => {
                            tx.submit();
                            i += 1;
                        }
                        Err(RingError::Full) => thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                }
            });
            let mut next = 0;
            while next < N {
                match rx.pop().unwrap() {
                    Some(c) => {
                        assert_eq!(c, cqe(next));
                        next += 1;
                    }
                    None => thread::yield_now(),
                }
            }
            producer.join().unwrap();
        });
    }

    /// Batches published with one store and taken with one store.
    #[test]
    fn batches_are_published_whole() {
        loom::model(|| {
            let (mut tx, mut rx) = channel::<Cqe>(4);
            let producer = thread::spawn(move || {
                assert_eq!(tx.push_batch(&[cqe(0), cqe(1), cqe(2)]).unwrap(), 3);
                tx.submit();
                // Two more: they fit only once the consumer frees slots.
                let mut sent = 0;
                while sent < 2 {
                    sent += tx.push_batch(&[cqe(3), cqe(4)][sent..]).unwrap();
                    tx.submit();
                    if sent < 2 {
                        thread::yield_now();
                    }
                }
            });
            let mut out = [Cqe::default(); 4];
            let mut next = 0;
            while next < 5 {
                let n = rx.pop_batch(&mut out).unwrap();
                // A batch is published whole: the first read sees 0 or 3.
                if next == 0 {
                    assert!(n == 0 || n >= 3, "saw {n} of a 3-entry batch");
                }
                for c in &out[..n] {
                    assert_eq!(*c, cqe(next));
                    next += 1;
                }
                if n == 0 {
                    thread::yield_now();
                }
            }
            producer.join().unwrap();
        });
    }

    /// No lost wake-up: if the consumer decides to sleep, the producer sees
    /// `NEED_WAKEUP` after publishing (and would ring the doorbell).
    #[test]
    fn need_wakeup_is_never_missed() {
        loom::model(|| {
            let (mut tx, mut rx) = channel::<Cqe>(2);
            let rang = Arc::new(AtomicBool::new(false));
            let producer = {
                let rang = rang.clone();
                thread::spawn(move || {
                    tx.push(cqe(7)).unwrap();
                    tx.submit();
                    if tx.needs_wakeup() {
                        rang.store(true, Ordering::Release);
                    }
                })
            };
            let sleeps = rx.prepare_wait().unwrap();
            producer.join().unwrap();
            if sleeps {
                // The consumer went to sleep on an empty ring: the producer
                // must have rung the doorbell.
                assert!(rang.load(Ordering::Acquire), "lost wake-up");
                rx.finish_wait();
            }
            assert_eq!(rx.pop().unwrap(), Some(cqe(7)));
        });
    }

    /// The CQ overflow flag: a consumer that sees it cleared sees the entries
    /// published before the clear.
    #[test]
    fn overflow_flag_publishes_entries() {
        loom::model(|| {
            let (mut tx, mut rx) = channel::<Cqe>(2);
            tx.set_overflow(true);
            let producer = thread::spawn(move || {
                tx.push(cqe(1)).unwrap();
                tx.submit();
                tx.set_overflow(false);
            });
            if !rx.is_overflowed() {
                assert_eq!(rx.pop().unwrap(), Some(cqe(1)));
            }
            producer.join().unwrap();
        });
    }
    /// A producer that gives the ring up after publishing: the consumer
    /// reads every entry published before the flag, then only errors
    /// (`Producer::fail`'s Release store, `refresh_tail`'s Acquire load and
    /// second tail load).
    #[test]
    fn entries_published_before_fail_are_read_first() {
        loom::model(|| {
            let (mut tx, mut rx) = channel::<Cqe>(2);
            let producer = thread::spawn(move || {
                tx.push(cqe(0)).unwrap();
                tx.submit();
                tx.push(cqe(1)).unwrap();
                // Publishes the second entry, then sets FAILED.
                tx.fail();
            });
            let mut next = 0;
            loop {
                match rx.pop() {
                    Ok(Some(c)) => {
                        assert_eq!(c, cqe(next));
                        next += 1;
                    }
                    Ok(None) => thread::yield_now(),
                    Err(e) => {
                        assert!(e.marked_failed(), "{e}");
                        break;
                    }
                }
            }
            assert_eq!(next, 2, "an entry published before FAILED was lost");
            producer.join().unwrap();
        });
    }
}
