//! SPSC ring throughput: ringfence's ring beside rtrb and crossbeam's
//! `ArrayQueue`, 64-byte entries, producer and consumer on two threads.
//!
//! Each measurement spawns a consumer thread, lines both threads up on a
//! `Barrier`, moves `iters` entries and stops the clock when the consumer has
//! taken the last one (the rtrb benchmark's method). Throughput is in
//! elements. Run: `cargo bench -p ringfence-benches --bench ring`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use crossbeam_queue::ArrayQueue;
use ringfence_ring::{Consumer, Producer, RingError, Sqe, channel};
use std::hint::{black_box, spin_loop};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const CAPACITY: u32 = 1024;
const BATCH: usize = 32;

fn entry(i: u64) -> Sqe {
    Sqe::nop().with_user_data(i)
}

/// Runs `produce` here and `consume` on a new thread, timing from the
/// barrier to the consumer's end. `consume` returns the sum of user_data.
fn time_pair<P, C>(produce: P, consume: C) -> (Duration, u64)
where
    P: FnOnce(),
    C: FnOnce() -> u64 + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(2));
    let consumer = {
        let barrier = barrier.clone();
        thread::spawn(move || {
            barrier.wait();
            let start = Instant::now();
            let sum = consume();
            (start.elapsed(), sum)
        })
    };
    barrier.wait();
    produce();
    consumer.join().expect("consumer thread panicked")
}

fn ringfence_single(iters: u64) -> (Duration, u64) {
    let (mut tx, mut rx): (Producer<Sqe>, Consumer<Sqe>) = channel(CAPACITY);
    time_pair(
        move || {
            for i in 0..iters {
                loop {
                    match tx.push(entry(i)) {
                        Ok(()) => break,
                        Err(RingError::Full) => spin_loop(),
                        Err(e) => panic!("{e}"),
                    }
                }
                tx.submit();
            }
        },
        move || {
            let mut sum = 0u64;
            let mut n = 0;
            while n < iters {
                match rx.pop().expect("ring corrupt") {
                    Some(sqe) => {
                        sum = sum.wrapping_add(black_box(sqe).user_data);
                        n += 1;
                    }
                    None => spin_loop(),
                }
            }
            sum
        },
    )
}

fn ringfence_batch(iters: u64) -> (Duration, u64) {
    let (mut tx, mut rx): (Producer<Sqe>, Consumer<Sqe>) = channel(CAPACITY);
    time_pair(
        move || {
            let mut batch = [Sqe::default(); BATCH];
            let mut i = 0;
            while i < iters {
                let len = (iters - i).min(BATCH as u64) as usize;
                for (k, slot) in batch[..len].iter_mut().enumerate() {
                    *slot = entry(i + k as u64);
                }
                let mut done = 0;
                while done < len {
                    let n = tx.push_batch(&batch[done..len]).expect("ring corrupt");
                    if n == 0 {
                        spin_loop();
                    } else {
                        tx.submit();
                        done += n;
                    }
                }
                i += len as u64;
            }
        },
        move || {
            let mut out = [Sqe::default(); BATCH];
            let mut sum = 0u64;
            let mut n = 0u64;
            while n < iters {
                let got = rx.pop_batch(&mut out).expect("ring corrupt");
                if got == 0 {
                    spin_loop();
                    continue;
                }
                for sqe in black_box(&out[..got]) {
                    sum = sum.wrapping_add(sqe.user_data);
                }
                n += got as u64;
            }
            sum
        },
    )
}

fn rtrb_single(iters: u64) -> (Duration, u64) {
    let (mut tx, mut rx) = rtrb::RingBuffer::<Sqe>::new(CAPACITY as usize);
    time_pair(
        move || {
            for i in 0..iters {
                while tx.push(entry(i)).is_err() {
                    spin_loop();
                }
            }
        },
        move || {
            let mut sum = 0u64;
            let mut n = 0;
            while n < iters {
                match rx.pop() {
                    Ok(sqe) => {
                        sum = sum.wrapping_add(black_box(sqe).user_data);
                        n += 1;
                    }
                    Err(_) => spin_loop(),
                }
            }
            sum
        },
    )
}

fn rtrb_batch(iters: u64) -> (Duration, u64) {
    let (mut tx, mut rx) = rtrb::RingBuffer::<Sqe>::new(CAPACITY as usize);
    time_pair(
        move || {
            let mut i = 0;
            while i < iters {
                let want = (iters - i).min(BATCH as u64) as usize;
                let n = tx.slots().min(want);
                if n == 0 {
                    spin_loop();
                    continue;
                }
                let chunk = tx.write_chunk_uninit(n).expect("slots() said so");
                let start = i;
                let written = chunk.fill_from_iter((start..start + n as u64).map(entry));
                i += written as u64;
            }
        },
        move || {
            let mut out = [Sqe::default(); BATCH];
            let mut sum = 0u64;
            let mut n = 0u64;
            while n < iters {
                let avail = rx.slots().min(BATCH);
                if avail == 0 {
                    spin_loop();
                    continue;
                }
                let chunk = rx.read_chunk(avail).expect("slots() said so");
                let mut got = 0;
                for (slot, sqe) in out.iter_mut().zip(chunk) {
                    *slot = sqe;
                    got += 1;
                }
                for sqe in black_box(&out[..got]) {
                    sum = sum.wrapping_add(sqe.user_data);
                }
                n += got as u64;
            }
            sum
        },
    )
}

fn crossbeam_single(iters: u64) -> (Duration, u64) {
    let queue = Arc::new(ArrayQueue::<Sqe>::new(CAPACITY as usize));
    let rx = queue.clone();
    time_pair(
        move || {
            for i in 0..iters {
                let mut value = entry(i);
                while let Err(back) = queue.push(value) {
                    value = back;
                    spin_loop();
                }
            }
        },
        move || {
            let mut sum = 0u64;
            let mut n = 0;
            while n < iters {
                match rx.pop() {
                    Some(sqe) => {
                        sum = sum.wrapping_add(black_box(sqe).user_data);
                        n += 1;
                    }
                    None => spin_loop(),
                }
            }
            sum
        },
    )
}

fn spsc_64b(c: &mut Criterion) {
    type Run = fn(u64) -> (Duration, u64);
    let contenders: [(&str, Run); 5] = [
        ("ringfence/single", ringfence_single),
        ("ringfence/batch32", ringfence_batch),
        ("rtrb/single", rtrb_single),
        ("rtrb/batch32", rtrb_batch),
        ("crossbeam/single", crossbeam_single),
    ];
    // Correctness once, before any timing: every entry arrives exactly once.
    let n = 10_000u64;
    for (name, run) in contenders {
        assert_eq!(
            run(n).1,
            n * (n - 1) / 2,
            "{name} lost or duplicated entries"
        );
    }

    let mut group = c.benchmark_group("spsc_64B");
    group.throughput(Throughput::Elements(1));
    for (name, run) in contenders {
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| run(iters).0)
        });
    }
    group.finish();
}

criterion_group!(benches, spsc_64b);
criterion_main!(benches);
