//! The command line of `rfbench`: options modelled on nixlbench's, their
//! checks, and the sweep they describe.

use crate::bench::error::BenchError;
use clap::{Parser, ValueEnum};
use serde::Serialize;
use std::net::SocketAddr;

/// A transport `rfbench` can be asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriverKind {
    /// Shared memory between two processes on this host (`ringfence-shm`).
    Shm,
    /// The engine's built-in loopback driver: both sides in this process.
    Loopback,
    /// TCP over io_uring (`ringfence-tcp`): a child process on this host
    /// over 127.0.0.1, or another host with `--listen` / `--connect`.
    Tcp,
    /// RDMA verbs (not built yet).
    Verbs,
    /// CUDA (not built yet).
    Cuda,
}

impl DriverKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DriverKind::Shm => "shm",
            DriverKind::Loopback => "loopback",
            DriverKind::Tcp => "tcp",
            DriverKind::Verbs => "verbs",
            DriverKind::Cuda => "cuda",
        }
    }

    /// Whether this build of `rfbench` has the driver.
    pub fn is_built(self) -> bool {
        matches!(
            self,
            DriverKind::Shm | DriverKind::Loopback | DriverKind::Tcp
        )
    }

    /// Whether the target's own progress carries out what it is sent (tcp:
    /// the target executes each request), rather than the transfer landing
    /// in its memory by itself (shm, loopback).
    pub fn target_executes(self) -> bool {
        matches!(self, DriverKind::Tcp)
    }
}

/// The operation each transfer of a batch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// PUT: local source to the target's window (nixlbench WRITE).
    Write,
    /// GET: the target's window to a local buffer (nixlbench READ).
    Read,
    /// An 8-byte atomic ADD on a word of the target's window; the block
    /// size is always 8.
    Atomic,
}

/// Fences inserted between the transfers of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FenceKind {
    /// No fence.
    None,
    /// `FENCE` with mode WEAK (ordering only).
    Weak,
    /// `FENCE` with mode STRONG (everything before remotely complete).
    Strong,
}

/// Who makes progress on the initiator's worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProgressKind {
    /// The worker's core thread (`Worker::start_core_thread`).
    CoreThread,
    /// The bench thread itself, after each submit and while it waits.
    Inline,
}

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Batches of transfers, one batch in flight (the nixlbench table).
    Bandwidth,
    /// Ping-pong of PUTs, each side polling its window (ucx_perftest
    /// `ucp_put_lat`).
    Latency,
}

/// The part this process plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Both sides from one command: with shm the target is spawned as a
    /// child process; with loopback it is a worker in this process.
    Standalone,
    /// Exposes a window, prints its connection string, and serves until
    /// its standard input closes.
    Target,
    /// Connects to a target's connection string given with `--peer`.
    Initiator,
}

/// `rfbench`: a nixlbench-style benchmark of ringfence.
///
/// With no arguments it spawns a target process, sweeps PUT block sizes
/// 8 B to 64 KiB and batch sizes 1 to 32 over the shm driver, and prints
/// the nixlbench table. `--driver tcp` does the same over TCP (127.0.0.1);
/// `--driver tcp --listen ADDR:PORT` on one host and `--driver tcp
/// --connect ADDR:PORT` on another run the two sides apart.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "rfbench", version, about, long_about = None)]
pub struct Cli {
    /// Transport (shm, loopback and tcp are built).
    #[arg(long, value_enum, default_value_t = DriverKind::Shm)]
    pub driver: DriverKind,
    /// Operation of each transfer.
    #[arg(long, value_enum, default_value_t = OpKind::Write)]
    pub op: OpKind,
    /// First block size in bytes (a power of two).
    #[arg(long, default_value_t = 8, value_parser = parse_size)]
    pub start_block_size: u64,
    /// Last block size in bytes (a power of two; doubling from the first).
    #[arg(long, default_value_t = 64 << 10, value_parser = parse_size)]
    pub max_block_size: u64,
    /// First batch size (transfers per batch; a power of two).
    #[arg(long, default_value_t = 1)]
    pub start_batch_size: u64,
    /// Last batch size (a power of two; doubling from the first).
    #[arg(long, default_value_t = 32)]
    pub max_batch_size: u64,
    /// Timed batches per row (latency mode: round trips). Given, it fixes
    /// the count; by default a bandwidth row runs as many as `--duration`
    /// takes (a latency row: 1000).
    #[arg(long)]
    pub num_iter: Option<u64>,
    /// Seconds each bandwidth row runs at least, when `--num-iter` is not
    /// given: iterations are scaled to it from the warmup's pace, so that
    /// short rows are not swamped by noise.
    #[arg(long, default_value_t = 0.05)]
    pub duration: f64,
    /// Passes over the bandwidth sweep: every row runs once per pass
    /// (`--duration` is shared out among its passes), and its figures are
    /// those of its median pass, so that a slow spell of the machine moves
    /// one pass of a row and not the row. Default 5, or 1 when `--num-iter`
    /// is given (nixlbench's one pass of exactly that many batches).
    #[arg(long)]
    pub passes: Option<u32>,
    /// Untimed batches before each row (latency mode: round trips).
    #[arg(long, default_value_t = 100)]
    pub warmup_iter: u64,
    /// Fence inserted between transfers.
    #[arg(long, value_enum, default_value_t = FenceKind::None)]
    pub fence: FenceKind,
    /// A fence after every N transfers of a batch (with `--fence`).
    #[arg(long, default_value_t = 1)]
    pub fence_every: u64,
    /// One NOTIFY at the end of every batch, as nixlbench does.
    #[arg(long)]
    pub notify: bool,
    /// Fill with patterns and verify the transferred bytes after each row.
    #[arg(long)]
    pub check_consistency: bool,
    /// Test only: the target corrupts its window so that the consistency
    /// check must fail.
    #[arg(long, hide = true)]
    pub corrupt_for_test: bool,
    /// Test only (`--bootstrap`): this rank kills itself with SIGKILL
    /// after N rows, as a crash would end it (no goodbye, no lease
    /// revoked).
    #[arg(long, hide = true, value_name = "N")]
    pub die_after_rows_for_test: Option<usize>,
    /// Who makes progress on the initiator's worker.
    #[arg(long, value_enum, default_value_t = ProgressKind::Inline)]
    pub progress: ProgressKind,
    /// CPU to pin the progress thread to (the core thread with
    /// `--progress core-thread`, else the bench thread).
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Lanes per endpoint (1-64, capped by the driver).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub lanes: u8,
    /// One JSON object per row (with the full configuration) instead of
    /// the table.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// CSV (a header, then one line per row) instead of the table.
    #[arg(long)]
    pub csv: bool,
    /// nixlbench's exact columns and units (latencies in microseconds with
    /// one decimal) for side-by-side tables; by default latencies are in
    /// nanoseconds, which resolve the library's sub-microsecond figures.
    #[arg(long)]
    pub nixl_format: bool,
    /// Bandwidth sweep, or ping-pong latency.
    #[arg(long, value_enum, default_value_t = Mode::Bandwidth)]
    pub mode: Mode,
    /// Write an SVG plot of bandwidth and latency against block size.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
    /// The part this process plays.
    #[arg(long, value_enum, default_value_t = Role::Standalone)]
    pub role: Role,
    /// tcp only: run just the target side, taking initiators on ADDR:PORT
    /// (port 0: any free port; the first line of standard output says
    /// which). Serves until an initiator's run is over, or until killed.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "connect")]
    pub listen: Option<SocketAddr>,
    /// tcp only: run just the initiator side, against a target started
    /// with `--listen` (here or on another host).
    #[arg(long, value_name = "ADDR:PORT")]
    pub connect: Option<String>,
    /// Run as one rank of N that find each other through etcd
    /// (`etcd://HOST:PORT?run=NAME&size=N`) or the MPI launcher that
    /// started this process (`mpi`, under `mpirun`), in nixlbench's
    /// pairwise scheme over the tcp driver; rank 0 prints every pair's
    /// rows and the aggregate.
    #[arg(long, value_name = "URI", conflicts_with_all = ["listen", "connect", "peer"])]
    pub bootstrap: Option<String>,
    /// Initiator: the connection string a `--role target` printed.
    #[arg(long, value_name = "ADDR")]
    pub peer: Option<String>,
    /// Internal: this target was spawned by a standalone rfbench and
    /// speaks the command protocol on its standard input and output.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub spawned: bool,
}

/// Parses a size: digits, optionally followed by `K`, `M` or `G` (powers
/// of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a size (digits, optionally with K, M or G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// The largest block size (1 GiB: the shm driver's largest PUT).
pub const MAX_BLOCK: u64 = 1 << 30;
/// The largest batch size (stays inside the default rings: SQ 256).
pub const MAX_BATCH: u64 = 128;
/// Round trips per latency row when `--num-iter` is not given.
pub const DEFAULT_LATENCY_ITERS: u64 = 1000;
/// Bounds of the timed batches a `--duration` row runs (per pass).
pub const DURATION_ITERS: (u64, u64) = (100, 10_000_000);
/// Passes over a bandwidth sweep when `--num-iter` is not given.
pub const DEFAULT_PASSES: u32 = 5;
/// The most passes `--passes` takes.
pub const MAX_PASSES: u32 = 101;
/// Bytes of the window: every transfer of the largest batch at its own
/// offset, for the largest block.
pub fn window_len(op: OpKind, max_block: u64, max_batch: u64) -> usize {
    let block = if op == OpKind::Atomic { 8 } else { max_block };
    (block * max_batch).max(4096) as usize
}

impl Cli {
    /// Round trips per latency row: `--num-iter`, or 1000.
    pub fn latency_iters(&self) -> u64 {
        self.num_iter.unwrap_or(DEFAULT_LATENCY_ITERS)
    }

    /// Passes over the bandwidth sweep: `--passes`, else 5 without
    /// `--num-iter` and 1 with it.
    pub fn passes(&self) -> u32 {
        self.passes.unwrap_or(if self.num_iter.is_some() {
            1
        } else {
            DEFAULT_PASSES
        })
    }

    /// Checks what clap cannot: powers of two, ranges, and combinations.
    ///
    /// # Errors
    /// [`BenchError::Usage`] naming the option.
    pub fn validate(&self) -> Result<(), BenchError> {
        let usage = |m: String| Err(BenchError::Usage(m));
        if !self.driver.is_built() {
            return usage(format!(
                "driver `{}` is not built into this rfbench (built: shm, loopback, tcp)",
                self.driver.name()
            ));
        }
        for (name, v, max) in [
            ("--start-block-size", self.start_block_size, MAX_BLOCK),
            ("--max-block-size", self.max_block_size, MAX_BLOCK),
            ("--start-batch-size", self.start_batch_size, MAX_BATCH),
            ("--max-batch-size", self.max_batch_size, MAX_BATCH),
        ] {
            if v == 0 || !v.is_power_of_two() || v > max {
                return usage(format!(
                    "{name} must be a power of two from 1 to {max}, not {v}"
                ));
            }
        }
        if self.start_block_size > self.max_block_size {
            return usage("--start-block-size is larger than --max-block-size".into());
        }
        if self.start_batch_size > self.max_batch_size {
            return usage("--start-batch-size is larger than --max-batch-size".into());
        }
        if self.num_iter == Some(0) {
            return usage("--num-iter must be at least 1".into());
        }
        if !(self.duration.is_finite() && self.duration > 0.0 && self.duration <= 3600.0) {
            return usage(format!(
                "--duration must be more than 0 and at most 3600 seconds, not {}",
                self.duration
            ));
        }
        if self.passes.is_some_and(|p| p == 0 || p > MAX_PASSES) {
            return usage(format!(
                "--passes must be from 1 to {MAX_PASSES}, not {}",
                self.passes.unwrap_or_default()
            ));
        }
        if self.fence_every == 0 {
            return usage("--fence-every must be at least 1".into());
        }
        if self.mode == Mode::Latency {
            if self.start_block_size < 8 {
                return usage("--mode latency needs blocks of at least 8 bytes".into());
            }
            if self.op != OpKind::Write {
                return usage("--mode latency measures PUTs: use --op write".into());
            }
        }
        let alone = if self.listen.is_some() {
            Some("--listen")
        } else if self.connect.is_some() {
            Some("--connect")
        } else {
            None
        };
        if let Some(flag) = alone {
            if self.driver != DriverKind::Tcp {
                return usage(format!(
                    "{flag} is only for --driver tcp; driver `{}` runs its two sides by hand \
                     with --role target and --role initiator --peer",
                    self.driver.name()
                ));
            }
            if self.role != Role::Standalone {
                return usage(format!("{flag} runs one side by itself: leave out --role"));
            }
        }
        if let Some(target) = &self.connect
            && !has_port(target)
        {
            return usage(format!(
                "--connect `{target}`: expected ADDR:PORT (the port the target's --listen printed)"
            ));
        }
        match self.role {
            Role::Initiator => {
                if self.peer.is_none() {
                    return usage(
                        "--role initiator needs --peer (the string the target printed)".into(),
                    );
                }
                if !matches!(self.driver, DriverKind::Shm | DriverKind::Tcp) {
                    return usage("--role initiator needs --driver shm or tcp".into());
                }
                if self.mode == Mode::Latency || self.check_consistency {
                    return usage(
                        "--mode latency and --check-consistency need the target's cooperation: run without --role (standalone, or tcp's --listen/--connect)".into(),
                    );
                }
            }
            Role::Target if !matches!(self.driver, DriverKind::Shm | DriverKind::Tcp) => {
                return usage("--role target needs --driver shm or tcp".into());
            }
            _ if self.peer.is_some() => {
                return usage("--peer is for --role initiator".into());
            }
            _ => {}
        }
        Ok(())
    }

    /// The block sizes of the sweep, in order (atomics: only 8).
    pub fn block_sizes(&self) -> Vec<u64> {
        if self.op == OpKind::Atomic {
            return vec![8];
        }
        doubling(self.start_block_size, self.max_block_size)
    }

    /// The batch sizes of the sweep (latency mode: one, for one round trip).
    pub fn batch_sizes(&self) -> Vec<u64> {
        if self.mode == Mode::Latency {
            return vec![1];
        }
        doubling(self.start_batch_size, self.max_batch_size)
    }

    /// Bytes of the target's window for this sweep.
    pub fn window_len(&self) -> usize {
        window_len(self.op, self.max_block_size, self.max_batch_size)
    }
}

/// Whether `s` ends in `:PORT` (a number), as `HOST:PORT`, `IP:PORT` and
/// `[IPv6]:PORT` do.
fn has_port(s: &str) -> bool {
    s.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

fn doubling(start: u64, max: u64) -> Vec<u64> {
    std::iter::successors(Some(start), |&v| v.checked_mul(2))
        .take_while(|&v| v <= max)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("rfbench").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("8"), Ok(8));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn the_default_sweep() {
        let c = cli(&[]);
        c.validate().unwrap();
        assert_eq!(c.block_sizes().len(), 14);
        assert_eq!(c.batch_sizes(), vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(c.window_len(), (64 << 10) * 32);
    }

    #[test]
    fn bad_combinations_are_usage_errors() {
        for args in [
            &["--start-block-size", "3"][..],
            &["--start-block-size", "128", "--max-block-size", "64"],
            &["--driver", "verbs"],
            &["--num-iter", "0"],
            &["--listen", "127.0.0.1:0"],
            &["--driver", "loopback", "--connect", "127.0.0.1:1"],
            &["--driver", "tcp", "--connect", "127.0.0.1"],
            &[
                "--driver",
                "tcp",
                "--listen",
                "127.0.0.1:0",
                "--role",
                "target",
            ],
            &["--role", "initiator"],
            &["--peer", "x"],
            &["--mode", "latency", "--start-block-size", "4"],
        ] {
            let e = cli(args).validate().unwrap_err();
            assert!(matches!(e, BenchError::Usage(_)), "{args:?}: {e}");
        }
    }

    #[test]
    fn tcp_is_built_and_its_sides_validate() {
        assert!(DriverKind::Tcp.is_built());
        for args in [
            &["--driver", "tcp"][..],
            &["--driver", "tcp", "--listen", "127.0.0.1:0"],
            &["--driver", "tcp", "--listen", "[::1]:7000"],
            &["--driver", "tcp", "--connect", "localhost:7000"],
            &["--driver", "tcp", "--connect", "[fd00::1]:7000"],
            &["--driver", "tcp", "--mode", "latency"],
        ] {
            cli(args).validate().unwrap();
        }
        let both = Cli::try_parse_from([
            "rfbench",
            "--driver",
            "tcp",
            "--listen",
            "127.0.0.1:0",
            "--connect",
            "127.0.0.1:1",
        ]);
        assert!(both.is_err());
    }

    #[test]
    fn atomics_have_one_block_size() {
        let c = cli(&["--op", "atomic", "--max-batch-size", "4"]);
        assert_eq!(c.block_sizes(), vec![8]);
        assert_eq!(c.window_len(), 4096);
    }
}
