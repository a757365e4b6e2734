//! The bandwidth sweep's initiator: one worker, one queue pair, one
//! endpoint to the target's window, and the loop that times one row.
//!
//! One batch is in flight at a time, as in nixlbench: write the batch's
//! SQEs (prep), submit them (post), wait for every CQE of the batch (tx
//! ends at the last one), then the next batch. Transfer `i` of a batch uses
//! offset `i × block` of both the local buffer and the window.

use crate::bench::cli::{Cli, FenceKind, OpKind, ProgressKind};
use crate::bench::error::BenchError;
use crate::bench::stats::{Row, RowSamples};
use crate::bench::target::{Connection, RowSpec, Target, compare, pattern};
use ringfence::{Cqe, QueuePair, RegisteredBuf, Worker};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe, strerror};
use std::time::{Duration, Instant};

/// How long one batch may take before the run gives up.
const HANG: Duration = Duration::from_secs(60);
/// Bytes of the NOTIFY payload.
const NOTIFY_LEN: usize = 16;

/// The initiator of the bandwidth sweep.
#[derive(Debug)]
pub struct Initiator {
    worker: Worker,
    qp: QueuePair,
    /// PUT sources and GET destinations, then the NOTIFY payload.
    local: RegisteredBuf,
    ep: u32,
    remote: RemoteBuf,
    window_len: u64,
    inline: bool,
    sqes: Vec<Sqe>,
    cqes: Vec<Cqe>,
}

impl Initiator {
    /// Connects `worker` to the window `conn`, with a local buffer as large
    /// as the window, waits until the endpoint is up (tcp: every lane's
    /// connection), and starts the core thread if asked.
    ///
    /// # Errors
    /// Connecting, unpacking, allocating or the core thread failed.
    pub fn new(mut worker: Worker, conn: &Connection, cli: &Cli) -> Result<Initiator, BenchError> {
        let ep = worker
            .connect(&conn.address)
            .map_err(BenchError::engine("connecting to the target"))?;
        let rkey = worker
            .unpack_rkey(ep, &conn.rkey)
            .map_err(BenchError::engine("unpacking the target's key"))?;
        let local = worker
            .alloc_registered(conn.len as usize + NOTIFY_LEN)
            .map_err(BenchError::engine("allocating the local buffer"))?;
        let qp = worker
            .create_queue()
            .map_err(BenchError::engine("creating a queue pair"))?;
        // Outside every row's clock: the handshake (tcp) is not a transfer.
        crate::bench::wait_connected(&worker, ep, true)?;
        let inline = cli.progress == ProgressKind::Inline;
        if inline {
            if let Some(cpu) = cli.cpu {
                crate::bench::pin_this_thread(cpu)?;
            }
        } else {
            worker
                .start_core_thread(cli.cpu)
                .map_err(BenchError::engine("starting the core thread"))?;
        }
        Ok(Initiator {
            worker,
            qp,
            local,
            ep: ep.as_raw(),
            remote: RemoteBuf {
                rkey: rkey.as_raw(),
                addr: conn.base,
            },
            window_len: conn.len,
            inline,
            sqes: Vec::new(),
            cqes: vec![Cqe::default(); 256],
        })
    }

    /// The worker (for its address and windows in latency mode).
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// The SQEs of one batch.
    fn build_batch(&mut self, cli: &Cli, block: u64, batch: u64) {
        self.sqes.clear();
        for i in 0..batch {
            let off = i * block;
            let remote = RemoteBuf {
                rkey: self.remote.rkey,
                addr: self.remote.addr + off,
            };
            let local = self.local.local(off);
            self.sqes.push(match cli.op {
                OpKind::Write => Sqe::put(self.ep, local, remote, block as u32),
                OpKind::Read => Sqe::get(self.ep, local, remote, block as u32),
                OpKind::Atomic => Sqe::atomic_add(self.ep, remote, 1),
            });
            let mode = match cli.fence {
                FenceKind::None => None,
                FenceKind::Weak => Some(FenceMode::ORDER),
                FenceKind::Strong => Some(FenceMode::COMPLETE),
            };
            if let Some(mode) = mode
                && (i + 1) % cli.fence_every == 0
                && i + 1 < batch
            {
                self.sqes.push(Sqe::fence(self.ep, mode));
            }
        }
        if cli.notify {
            let payload = self.local.local(self.window_len);
            self.sqes
                .push(Sqe::notify(self.ep, payload, NOTIFY_LEN as u32));
        }
        for (k, sqe) in self.sqes.iter_mut().enumerate() {
            sqe.user_data = k as u64;
        }
    }

    /// One batch: (prep, post, tx).
    fn one_batch(&mut self) -> Result<(Duration, Duration, Duration), BenchError> {
        let t0 = Instant::now();
        let mut pushed = 0;
        while pushed < self.sqes.len() {
            pushed += self
                .qp
                .push_batch(&self.sqes[pushed..])
                .map_err(|e| BenchError::Target(format!("SQ: {e}")))?;
            if pushed < self.sqes.len() {
                // Only when the batch is larger than the SQ.
                self.qp.submit();
                self.worker.progress();
            }
        }
        let t1 = Instant::now();
        self.qp.submit();
        if self.inline {
            self.qp
                .progress()
                .map_err(|e| BenchError::Target(format!("queue pair: {e}")))?;
        }
        let t2 = Instant::now();
        let expected = self.sqes.len();
        let mut got = 0;
        let mut idle = 0u32;
        while got < expected {
            let n = self
                .qp
                .reap(&mut self.cqes)
                .map_err(|e| BenchError::Target(format!("CQ: {e}")))?;
            for c in &self.cqes[..n] {
                if c.res < 0 {
                    let op = self
                        .sqes
                        .get(c.user_data as usize)
                        .and_then(|s| s.opcode().ok())
                        .map_or("an operation", |o| o.name());
                    return Err(BenchError::Completion {
                        op,
                        status: format!("{} ({})", strerror(c.res), c.res),
                    });
                }
            }
            got += n;
            if got < expected {
                if self.inline {
                    self.qp
                        .progress()
                        .map_err(|e| BenchError::Target(format!("queue pair: {e}")))?;
                }
                if n == 0 {
                    idle = idle.wrapping_add(1);
                    if idle.is_multiple_of(4096) && t1.elapsed() > HANG {
                        return Err(BenchError::Hang(format!(
                            "{got} of {expected} completions of a batch after {HANG:?}"
                        )));
                    }
                    std::hint::spin_loop();
                }
            }
        }
        let t3 = Instant::now();
        Ok((t1 - t0, t2 - t1, t3 - t1))
    }

    /// Runs one pass of a row: `warmup_iter` untimed batches, then
    /// `num_iter` timed ones (by default, as many as the pass's share of
    /// `--duration` takes); with `--check-consistency`, prepares and
    /// verifies through `target`.
    ///
    /// # Errors
    /// A completion failed, the check failed, or a hang.
    pub fn row(
        &mut self,
        cli: &Cli,
        target: &mut dyn Target,
        block: u64,
        batch: u64,
    ) -> Result<Row, BenchError> {
        let spec = RowSpec {
            op: cli.op,
            block,
            batch,
            count: cli.warmup_iter + cli.num_iter.unwrap_or(0),
        };
        if (spec.span() as u64) > self.window_len {
            return Err(BenchError::Usage(format!(
                "a row of {batch} x {block} B does not fit the target's {} B window",
                self.window_len
            )));
        }
        if cli.check_consistency {
            target.prepare(spec)?;
            match cli.op {
                OpKind::Write => self.local.write(0, &pattern(spec, spec.span())),
                OpKind::Read => self.local.write(0, &vec![0u8; spec.span()]),
                OpKind::Atomic => {}
            }
        }
        self.build_batch(cli, block, batch);
        let warmup = Instant::now();
        for _ in 0..cli.warmup_iter {
            self.one_batch()?;
            target.service()?;
        }
        let iters = cli
            .num_iter
            .unwrap_or_else(|| scaled_iters(cli, warmup.elapsed()));
        // The atomics' check counts every batch, the timed ones included.
        let spec = RowSpec {
            count: cli.warmup_iter + iters,
            ..spec
        };
        let mut samples = RowSamples::default();
        let mut busy = Duration::ZERO;
        for _ in 0..iters {
            let start = Instant::now();
            let (prep, post, tx) = self.one_batch()?;
            busy += start.elapsed();
            samples.prep.record(prep);
            samples.post.record(post);
            samples.tx.record(tx);
            // Outside the clock: an in-process target takes its
            // notifications.
            target.service()?;
        }
        if cli.check_consistency {
            if cli.op == OpKind::Read {
                let mut got = vec![0u8; spec.span()];
                self.local.read(0, &mut got);
                compare(spec, &got, "data read from the target window:")?;
            }
            target.verify(spec)?;
        }
        Ok(Row::new(block, batch, iters, busy, &samples))
    }
}

/// The timed batches one pass of a row runs for its share of
/// `--duration`, from the warmup's pace (`warmup_iter` batches in `took`;
/// with no warmup, the least).
fn scaled_iters(cli: &Cli, took: Duration) -> u64 {
    let (least, most) = crate::bench::cli::DURATION_ITERS;
    if cli.warmup_iter == 0 || took.is_zero() {
        return least;
    }
    let per_batch = took.as_secs_f64() / cli.warmup_iter as f64;
    let share = cli.duration / f64::from(cli.passes());
    ((share / per_batch) as u64).clamp(least, most)
}
