//! `rfbench`, the nixlbench-style benchmark: sweeps block and batch sizes of
//! PUT, GET or ATOMIC batches from an initiator worker into a target's
//! registered window and prints nixlbench's table; or measures one-way PUT
//! latency with a ping-pong (`--mode latency`).
//!
//! ```text
//!  standalone, shm/tcp: rfbench ──spawns──▶ rfbench --role target --spawned
//!                          │  ◀── connection string (stdout) ──┘
//!                          │  ── prepare / verify / pong (stdin) ──▶
//!                          └── PUT/GET/ATOMIC/NOTIFY over shm or tcp ──▶ window
//!  standalone, loopback:   initiator and target workers in this process
//!  tcp, two hosts:         rfbench --connect H:P ── bootstrap socket ──▶ rfbench --listen H:P
//!                          (HELLO, WINDOW, then the same commands in frames; DONE)
//!                          └── PUT/GET/ATOMIC/NOTIFY over tcp (the driver's own port) ──▶ window
//! ```
//!
//! - [`cli`]: the options and the sweep they describe.
//! - [`rig`]: the initiator and the timed loop of one row.
//! - [`target`]: the target's window, consistency checks, the child process
//!   and its line protocol, the connection string.
//! - [`bootstrap`]: `--listen` and `--connect`: the framed exchange on a
//!   plain TCP socket that hands the initiator the target's window.
//! - [`ranks`]: `--bootstrap`: N ranks through etcd or MPI, in pairs.
//! - [`latency`]: the ping-pong.
//! - [`stats`]: HDR histograms and rows; [`report`]: table, JSON, CSV;
//!   [`plot`]: the SVG.

pub mod bootstrap;
pub mod cli;
pub mod error;
pub mod latency;
pub mod plot;
pub mod ranks;
pub mod report;
pub mod rig;
pub mod stats;
pub mod target;

pub use cli::Cli;
pub use error::BenchError;

use cli::{DriverKind, Mode, ProgressKind, Role};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use latency::Polling;
use report::Format;
use ringfence::{EndpointId, EndpointState, Loopback, Worker};
use ringfence_shm::Shm;
use ringfence_tcp::Tcp;
use stats::{LatencyRow, Row};
use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use target::{ChildTarget, Commands, Connection, LocalTarget, RemoteTarget, Target, TargetState};

/// SQ entries of the workers: the largest batch (128), a fence after each
/// transfer, and a NOTIFY fit.
const SQ_ENTRIES: u32 = 512;

/// How long an endpoint may take to come up (tcp: every lane's
/// connection and greeting) before the run gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A worker for `kind`, with `cli`'s lanes (environment overrides apply).
/// A tcp driver listens on 127.0.0.1 (or where `RINGFENCE_TCP_ADDR` says).
///
/// # Errors
/// The driver or the worker cannot be built.
pub fn worker(kind: DriverKind, cli: &Cli) -> Result<Worker, BenchError> {
    worker_at(kind, cli, None)
}

/// As [`worker`]; a tcp driver listens on `ip` (any port) when given,
/// unless `RINGFENCE_TCP_ADDR` says otherwise.
///
/// # Errors
/// The driver or the worker cannot be built.
pub fn worker_at(kind: DriverKind, cli: &Cli, ip: Option<IpAddr>) -> Result<Worker, BenchError> {
    let mut b = Worker::builder();
    match kind {
        DriverKind::Shm => b.driver(Shm::new()?),
        DriverKind::Loopback => b.driver(Loopback::new()),
        DriverKind::Tcp => {
            let mut tcp = Tcp::builder();
            if let Some(ip) = ip
                && std::env::var_os("RINGFENCE_TCP_ADDR").is_none()
            {
                tcp = tcp.addr(SocketAddr::new(ip, 0));
            }
            b.driver(tcp.build().map_err(BenchError::Tcp)?)
        }
        other => {
            return Err(BenchError::Usage(format!(
                "driver `{}` is not built into this rfbench",
                other.name()
            )));
        }
    };
    b.lanes(cli.lanes)
        .ring_entries(SQ_ENTRIES, 2 * SQ_ENTRIES)
        .requests(2 * SQ_ENTRIES)
        .build()
        .map_err(BenchError::engine("building a worker"))
}

/// Waits until endpoint `ep` of `worker` is up, running progress on this
/// thread when `progress` (else another thread does). The peer must be
/// progressing meanwhile.
///
/// # Errors
/// The endpoint failed, or was not up within 30 s.
pub fn wait_connected(worker: &Worker, ep: EndpointId, progress: bool) -> Result<(), BenchError> {
    let start = Instant::now();
    loop {
        match worker
            .endpoint_state(ep)
            .map_err(BenchError::engine("endpoint_state"))?
        {
            EndpointState::Connected => return Ok(()),
            EndpointState::Connecting => {}
            other => {
                return Err(BenchError::Target(format!(
                    "connecting to the peer worker: the endpoint is {other:?}"
                )));
            }
        }
        if start.elapsed() > CONNECT_TIMEOUT {
            return Err(BenchError::Hang(format!(
                "the endpoint to the peer worker was not up within {CONNECT_TIMEOUT:?}"
            )));
        }
        if progress {
            worker.progress();
        }
        std::thread::yield_now();
    }
}

/// Pins the calling thread to `cpu`.
///
/// # Errors
/// The CPU does not exist or cannot be used.
pub fn pin_this_thread(cpu: usize) -> Result<(), BenchError> {
    use nix::sched::{CpuSet, sched_setaffinity};
    let mut set = CpuSet::new();
    set.set(cpu)
        .map_err(|e| BenchError::Usage(format!("--cpu {cpu}: {e}")))?;
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| BenchError::Usage(format!("--cpu {cpu}: {e}")))
}

/// A progress bar over `rows` rows on standard error, only when standard
/// output is a terminal.
fn progress_bar(rows: u64) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(rows), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} rows {elapsed} {msg}") {
        bar.set_style(style);
    }
    bar
}

/// Runs `rfbench` as `cli` says.
///
/// # Errors
/// Any [`BenchError`]; [`BenchError::exit_code`] gives the exit status.
pub fn run(cli: &Cli) -> Result<(), BenchError> {
    cli.validate()?;
    if let Some(uri) = &cli.bootstrap {
        return ranks::run(cli, uri);
    }
    if let Some(addr) = cli.listen {
        return bootstrap::listen(cli, addr);
    }
    if let Some(peer) = &cli.connect {
        let mut session = bootstrap::SessionTarget::connect(cli, peer)?;
        let w = worker_at(DriverKind::Tcp, cli, Some(session.local_ip()?))?;
        let note = format!(" (target: --listen {})", session.peer_addr());
        return match cli.mode {
            Mode::Bandwidth => {
                let conn = session.connection().clone();
                let initiator = rig::Initiator::new(w, &conn, cli)?;
                bandwidth(cli, initiator, &mut session, &note)
            }
            Mode::Latency => latency_remote(cli, w, &mut session, &note),
        };
    }
    match cli.role {
        Role::Target => target::serve(cli, worker(cli.driver, cli)?),
        Role::Initiator => {
            let conn = Connection::decode(cli.peer.as_deref().unwrap_or_default())?;
            let initiator = rig::Initiator::new(worker(cli.driver, cli)?, &conn, cli)?;
            bandwidth(cli, initiator, &mut RemoteTarget, "")
        }
        Role::Standalone => match (cli.driver, cli.mode) {
            (DriverKind::Loopback, Mode::Bandwidth) => {
                let state = TargetState::new(
                    worker(DriverKind::Loopback, cli)?,
                    cli.window_len(),
                    cli.corrupt_for_test,
                )?;
                let conn = state.connection()?;
                let initiator =
                    rig::Initiator::new(worker(DriverKind::Loopback, cli)?, &conn, cli)?;
                bandwidth(
                    cli,
                    initiator,
                    &mut LocalTarget(state),
                    " (target: this process)",
                )
            }
            (DriverKind::Loopback, Mode::Latency) => latency_loopback(cli),
            (kind, Mode::Bandwidth) => {
                let mut child = ChildTarget::spawn(cli)?;
                let conn = child.connection.clone();
                let initiator = rig::Initiator::new(worker(kind, cli)?, &conn, cli)?;
                bandwidth(cli, initiator, &mut child, " (target: a child process)")
            }
            (kind, Mode::Latency) => {
                let mut child = ChildTarget::spawn(cli)?;
                latency_remote(
                    cli,
                    worker(kind, cli)?,
                    &mut child,
                    " (answering side: a child process)",
                )
            }
        },
    }
}

fn emit(line: &str) -> Result<(), BenchError> {
    report::emit(line).map_err(BenchError::io("writing to standard output"))
}

/// The bandwidth sweep.
fn bandwidth(
    cli: &Cli,
    mut initiator: rig::Initiator,
    target: &mut dyn Target,
    note: &str,
) -> Result<(), BenchError> {
    let format = Format::of(cli);
    emit(&report::header(cli, format, note))?;
    let (blocks, batches) = (cli.block_sizes(), cli.batch_sizes());
    let grid: Vec<(u64, u64)> = blocks
        .iter()
        .flat_map(|&block| batches.iter().map(move |&batch| (block, batch)))
        .collect();
    let passes = cli.passes() as usize;
    let bar = progress_bar((grid.len() * passes) as u64);
    // Each row's passes, and the rows as they are final (after the last
    // pass, which prints them one by one as it goes).
    let mut tried: Vec<Vec<Row>> = grid.iter().map(|_| Vec::with_capacity(passes)).collect();
    let mut rows: Vec<Row> = Vec::with_capacity(grid.len());
    for pass in 1..=passes {
        for (&(block, batch), tries) in grid.iter().zip(&mut tried) {
            bar.set_message(format!("{block} B x {batch}, pass {pass}/{passes}"));
            tries.push(initiator.row(cli, target, block, batch)?);
            bar.inc(1);
            if pass == passes {
                let r = stats::median_pass(std::mem::take(tries));
                bar.suspend(|| emit(&report::row(cli, format, &r)))?;
                rows.push(r);
            }
        }
    }
    bar.finish_and_clear();
    if let Some(path) = &cli.plot {
        let by_batch = |value: fn(&Row) -> f64| -> Vec<plot::Series> {
            batches
                .iter()
                .map(|&b| plot::Series {
                    label: format!("batch {b}"),
                    points: rows
                        .iter()
                        .filter(|r| r.batch_size == b)
                        .map(|r| (r.block_size, value(r)))
                        .collect(),
                })
                .collect()
        };
        plot::write(
            path,
            &format!("rfbench {} {:?}", cli.driver.name(), cli.op).to_lowercase(),
            &by_batch(|r| r.bw_gb_per_sec),
            &by_batch(|r| r.tx.avg_us),
            "Avg Tx (us) per batch",
        )?;
    }
    Ok(())
}

fn latency_output(cli: &Cli, rows: &[LatencyRow]) -> Result<(), BenchError> {
    if let Some(path) = &cli.plot {
        let series = |label: &str, value: fn(&LatencyRow) -> f64| {
            vec![plot::Series {
                label: label.into(),
                points: rows.iter().map(|r| (r.block_size, value(r))).collect(),
            }]
        };
        plot::write(
            path,
            &format!("rfbench {} put latency", cli.driver.name()),
            &series("one way, from the median", |r| r.bw_gb_per_sec),
            &series("typical (median) one way", |r| r.typical_lat_us),
            "one-way latency (us)",
        )?;
    }
    Ok(())
}

/// Prints the header and returns the row printer for latency mode.
fn latency_printer(cli: &Cli, note: &str) -> Result<impl FnMut(&LatencyRow), BenchError> {
    let format = Format::of(cli);
    emit(&report::header(cli, format, note))?;
    let cli = cli.clone();
    Ok(move |r: &LatencyRow| {
        let _ = report::emit(&report::latency_row(&cli, format, r));
    })
}

/// Latency over loopback: the answering side runs on a second thread.
fn latency_loopback(cli: &Cli) -> Result<(), BenchError> {
    let sizes = cli.block_sizes();
    let max = *sizes.last().unwrap_or(&8);
    let mut ping_worker = worker(DriverKind::Loopback, cli)?;
    let pong_worker = worker(DriverKind::Loopback, cli)?;
    let alloc = |w: &Worker| {
        w.alloc_registered(max as usize)
            .map_err(BenchError::engine("allocating a window"))
    };
    let (ping_window, pong_window) = (alloc(&ping_worker)?, alloc(&pong_worker)?);
    let ping_conn = Connection::of(&ping_worker, &ping_window)?;
    let pong_conn = Connection::of(&pong_worker, &pong_window)?;
    let rounds = cli.warmup_iter + cli.latency_iters();
    let pong_sizes = sizes.clone();
    let answering = std::thread::Builder::new()
        .name("rfbench-pong".into())
        .spawn(move || {
            let mut side = latency::Side::connect(
                &pong_worker,
                &ping_conn,
                pong_window,
                max,
                Polling::of(DriverKind::Loopback, true),
            )?;
            latency::pong(&mut side, &pong_sizes, rounds)
        })
        .map_err(BenchError::io("spawning the answering thread"))?;
    let inline = cli.progress == ProgressKind::Inline;
    if inline {
        if let Some(cpu) = cli.cpu {
            pin_this_thread(cpu)?;
        }
    } else {
        ping_worker
            .start_core_thread(cli.cpu)
            .map_err(BenchError::engine("starting the core thread"))?;
    }
    let result = (|| {
        let mut side = latency::Side::connect(
            &ping_worker,
            &pong_conn,
            ping_window,
            max,
            Polling::of(DriverKind::Loopback, inline),
        )?;
        let printer = latency_printer(cli, " (answering side: a second thread)")?;
        latency::ping(
            &mut side,
            &sizes,
            cli.warmup_iter,
            cli.latency_iters(),
            printer,
        )
    })();
    let answered = answering
        .join()
        .map_err(|_| BenchError::Target("the answering thread panicked".into()))?;
    let rows = result?;
    answered?;
    latency_output(cli, &rows)
}

/// Latency against a target in another process (a child over shm or tcp,
/// or a `--listen` process): it answers the ping-pong.
fn latency_remote(
    cli: &Cli,
    mut w: Worker,
    target: &mut dyn Commands,
    note: &str,
) -> Result<(), BenchError> {
    let sizes = cli.block_sizes();
    let max = *sizes.last().unwrap_or(&8);
    let window = w
        .alloc_registered(max as usize)
        .map_err(BenchError::engine("allocating a window"))?;
    let own = Connection::of(&w, &window)?;
    let words: Vec<String> = sizes.iter().map(u64::to_string).collect();
    target.send(&format!(
        "pong {} {} {} {}",
        own.encode(),
        cli.warmup_iter,
        cli.latency_iters(),
        words.join(" ")
    ))?;
    target.expect_ok()?;
    let inline = cli.progress == ProgressKind::Inline;
    if inline {
        if let Some(cpu) = cli.cpu {
            pin_this_thread(cpu)?;
        }
    } else {
        w.start_core_thread(cli.cpu)
            .map_err(BenchError::engine("starting the core thread"))?;
    }
    let conn = target.connection().clone();
    let mut side = latency::Side::connect(&w, &conn, window, max, Polling::of(cli.driver, inline))?;
    // The answering side progresses by now (it polls its window), so the
    // handshake finishes; outside the clock.
    side.wait_connected()?;
    let printer = latency_printer(cli, note)?;
    let rows = latency::ping(
        &mut side,
        &sizes,
        cli.warmup_iter,
        cli.latency_iters(),
        printer,
    )?;
    target.expect_ok()?;
    latency_output(cli, &rows)
}
