//! `--bootstrap`: a run of N ranks that find each other through etcd or an
//! MPI launcher (`ringfence-bootstrap`), in nixlbench's pairwise scheme:
//! rank `i < N/2` initiates to rank `i + N/2`, every pair at once.
//!
//! Each target rank makes a tcp worker and window (a [`TargetState`] with
//! a core thread; with `--notify` a service thread takes the
//! notifications) and
//! publishes its connection string under `conn`; each initiator fetches
//! its target's and connects. Then every rank walks the same grid of
//! rows, with a barrier before and after each: before it the targets have
//! prepared their windows, after it they verify them
//! (`--check-consistency`), so the pairs' rows run at the same time and
//! the aggregate is a sum of bandwidths measured over the same interval.
//! Initiators publish their rows (JSON) under `rows`; rank 0 prints every
//! pair's rows and the aggregate (`--json`: one object per pair, then one
//! for the aggregate).
//!
//! A rank that dies is named: a target whose initiator is gone fails at
//! the next barrier with the dead rank's number (etcd: its lease ended;
//! MPI: the launcher ends the job), and an initiator whose target is gone
//! fails its row with the endpoint's error and names its peer.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringfence_bootstrap::Bootstrap;

use crate::bench::cli::{Cli, DriverKind, OpKind};
use crate::bench::error::BenchError;
use crate::bench::report::{self, Format};
use crate::bench::rig::Initiator;
use crate::bench::stats::{self, Row};
use crate::bench::target::{Connection, RemoteTarget, RowSpec, TargetState};

/// The longest a rank waits at a barrier or for a peer's value: long
/// enough for the slowest row of a sweep on a loaded machine.
const WAIT: Duration = Duration::from_secs(600);

/// This rank's part in the pairwise scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Writes into a target's window.
    Initiator {
        /// The target's rank.
        target: u32,
    },
    /// Serves an initiator.
    Target {
        /// The initiator's rank.
        initiator: u32,
    },
    /// The middle rank of an odd-sized run: only takes part in barriers.
    Idle,
}

/// Rank `rank`'s part in a pairwise run of `size` ranks.
pub fn pairwise(rank: u32, size: u32) -> Part {
    let half = size / 2;
    if rank < half {
        Part::Initiator {
            target: rank + half,
        }
    } else if rank < 2 * half {
        Part::Target {
            initiator: rank - half,
        }
    } else {
        Part::Idle
    }
}

fn boot(e: ringfence_bootstrap::Error) -> BenchError {
    BenchError::Bootstrap(e.to_string())
}

/// Runs `cli` as one rank of the run `uri` names.
///
/// # Errors
/// Any [`BenchError`]; a peer's failure names the peer's rank.
pub fn run(cli: &Cli, uri: &str) -> Result<(), BenchError> {
    if cli.driver != DriverKind::Tcp {
        return Err(BenchError::Usage(format!(
            "--bootstrap runs over the tcp driver (--driver tcp), not {}",
            cli.driver.name()
        )));
    }
    let spec = ringfence_bootstrap::Spec::parse(uri).map_err(boot)?;
    let ip = own_ip(&spec)?;
    let mut b = ringfence_bootstrap::connect(uri).map_err(boot)?;
    let (rank, size) = (b.rank(), b.size());
    if size < 2 {
        return Err(BenchError::Usage(format!(
            "--bootstrap: a run of {size} rank; pairs need 2 or more"
        )));
    }
    let part = pairwise(rank, size);
    let grid = grid(cli);
    match part {
        Part::Target { initiator } => serve(cli, &mut *b, ip, initiator, &grid)?,
        Part::Initiator { target } => initiate(cli, &mut *b, ip, target, &grid)?,
        Part::Idle => {
            b.barrier(WAIT).map_err(boot)?;
            for _ in 0..grid.len() * 2 {
                b.barrier(WAIT).map_err(boot)?;
            }
        }
    }
    // Everyone's rows are published: rank 0 reports.
    b.barrier(WAIT).map_err(boot)?;
    if rank == 0 {
        report_all(cli, &mut *b, size)?;
    }
    b.barrier(WAIT).map_err(boot)
}

/// The address this rank's tcp driver listens on, unless
/// `RINGFENCE_TCP_ADDR` says: the one this host reaches the etcd server
/// from (a connected UDP socket's local address; no packet is sent), so
/// that the ranks' addresses are routable wherever etcd is; with MPI,
/// loopback (set `RINGFENCE_TCP_ADDR` for ranks on several hosts).
fn own_ip(spec: &ringfence_bootstrap::Spec) -> Result<Option<IpAddr>, BenchError> {
    let ringfence_bootstrap::Spec::Etcd { endpoints, .. } = spec else {
        return Ok(None);
    };
    let Some(first) = endpoints.first() else {
        return Ok(None);
    };
    let resolved = first
        .to_socket_addrs()
        .map_err(|e| BenchError::Bootstrap(format!("resolving {first}: {e}")))?
        .next()
        .ok_or_else(|| BenchError::Bootstrap(format!("{first} resolves to nothing")))?;
    let any: SocketAddr = if resolved.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let probe =
        UdpSocket::bind(any).and_then(|s| s.connect(resolved).and_then(|()| s.local_addr()));
    probe
        .map(|a| Some(a.ip()))
        .map_err(|e| BenchError::Bootstrap(format!("no route to etcd at {resolved}: {e}")))
}

/// Kills this process as a crash would (`--die-after-rows-for-test`).
fn die_if_asked(cli: &Cli, rows_done: usize) {
    if cli.die_after_rows_for_test == Some(rows_done) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// Every row each rank walks, pass by pass, in the same order.
fn grid(cli: &Cli) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for _ in 0..cli.passes() {
        for &block in &cli.block_sizes() {
            for &batch in &cli.batch_sizes() {
                out.push((block, batch));
            }
        }
    }
    out
}

/// The row's spec, as the initiator's rig makes it.
fn spec(cli: &Cli, block: u64, batch: u64) -> RowSpec {
    RowSpec {
        op: cli.op,
        block,
        batch,
        count: cli.warmup_iter + cli.num_iter.unwrap_or(0),
    }
}

/// The target's side: window, connection, then the rows' barriers, with
/// the notifications taken meanwhile by a second thread.
fn serve(
    cli: &Cli,
    b: &mut dyn Bootstrap,
    ip: Option<IpAddr>,
    initiator: u32,
    grid: &[(u64, u64)],
) -> Result<(), BenchError> {
    let w = crate::bench::worker_at(DriverKind::Tcp, cli, ip)?;
    // A core thread serves the initiator (and sleeps when idle); a
    // service thread takes the notifications, only when there are any
    // (`--notify`): a thread spinning on an empty CQ would take CPU time
    // from the pairs on a machine with fewer CPUs than busy threads.
    let mut state = TargetState::new(w, cli.window_len(), cli.corrupt_for_test)?;
    state.start_core_thread()?;
    b.publish("conn", state.connection()?.encode().as_bytes())
        .map_err(boot)?;
    b.barrier(WAIT).map_err(boot)?;
    let state = Arc::new(Mutex::new(state));
    let stop = Arc::new(AtomicBool::new(false));
    let servicer = {
        let (state, stop, cli_notify) = (state.clone(), stop.clone(), cli.notify);
        std::thread::Builder::new()
            .name("rfbench-service".into())
            .spawn(move || -> Result<(), BenchError> {
                while cli_notify && !stop.load(Ordering::Acquire) {
                    let n = state.lock().unwrap_or_else(|p| p.into_inner()).service()?;
                    if n == 0 {
                        std::thread::yield_now();
                    }
                }
                Ok(())
            })
            .map_err(BenchError::io("spawning the service thread"))?
    };
    let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
    let named = |e: ringfence_bootstrap::Error| {
        BenchError::Bootstrap(format!("serving rank {initiator}: {e}"))
    };
    let result = (|| {
        for (i, &(block, batch)) in grid.iter().enumerate() {
            die_if_asked(cli, i);
            let s = spec(cli, block, batch);
            if cli.check_consistency {
                lock().prepare(s)?;
            }
            b.barrier(WAIT).map_err(named)?;
            b.barrier(WAIT).map_err(named)?;
            if cli.check_consistency && s.op != OpKind::Read {
                lock().verify(s).map_err(|e| {
                    BenchError::Inconsistent(format!("rank {initiator} -> this rank: {e}"))
                })?;
            }
        }
        Ok(())
    })();
    stop.store(true, Ordering::Release);
    let serviced = servicer
        .join()
        .map_err(|_| BenchError::Target("the service thread panicked".into()))?;
    result.and(serviced)
}

/// The initiator's side: connect to the target, then each row between
/// its two barriers; the rows are published for rank 0.
fn initiate(
    cli: &Cli,
    b: &mut dyn Bootstrap,
    ip: Option<IpAddr>,
    target: u32,
    grid: &[(u64, u64)],
) -> Result<(), BenchError> {
    let w = crate::bench::worker_at(DriverKind::Tcp, cli, ip)?;
    // After the barrier the target's value is there (MPI: the barrier is
    // the exchange).
    b.barrier(WAIT).map_err(boot)?;
    let conn = b.fetch(target, "conn", WAIT).map_err(boot)?;
    let conn = Connection::decode(&String::from_utf8_lossy(&conn))?;
    let named =
        |e: BenchError| BenchError::Target(format!("rank {target} (this rank's target): {e}"));
    // The target's core thread serves by now.
    let mut initiator = Initiator::new(w, &conn, cli).map_err(named)?;
    let passes = cli.passes() as usize;
    let rows_per_pass = grid.len() / passes.max(1);
    let mut tried: Vec<Vec<Row>> = vec![Vec::new(); rows_per_pass];
    for (i, &(block, batch)) in grid.iter().enumerate() {
        die_if_asked(cli, i);
        b.barrier(WAIT).map_err(boot)?;
        let row = initiator
            .row(cli, &mut RemoteTarget, block, batch)
            .map_err(named)?;
        tried[i % rows_per_pass].push(row);
        b.barrier(WAIT).map_err(boot)?;
    }
    let rows: Vec<Row> = tried.into_iter().map(stats::median_pass).collect();
    let json =
        serde_json::to_vec(&rows).map_err(|e| BenchError::Target(format!("rows as JSON: {e}")))?;
    b.publish("rows", &json).map_err(boot)
}

/// Rank 0: every pair's rows, then the aggregate of each row (bandwidths
/// summed; latencies as the pairs' mean).
fn report_all(cli: &Cli, b: &mut dyn Bootstrap, size: u32) -> Result<(), BenchError> {
    let format = Format::of(cli);
    let mut pairs = Vec::new();
    for i in 0..size / 2 {
        let json = b.fetch(i, "rows", WAIT).map_err(boot)?;
        let rows: Vec<Row> = serde_json::from_slice(&json)
            .map_err(|e| BenchError::Bootstrap(format!("rank {i}'s rows: {e}")))?;
        pairs.push((i, i + size / 2, rows));
    }
    let emit = |s: &str| report::emit(s).map_err(BenchError::io("writing to standard output"));
    for (i, t, rows) in &pairs {
        match format {
            Format::Json => {
                let obj = serde_json::json!({ "pair": [i, t], "rows": rows });
                emit(&format!("{obj}\n"))?;
            }
            _ => {
                emit(&report::header(
                    cli,
                    format,
                    &format!(" (pairwise: rank {i} -> rank {t} of {size})"),
                ))?;
                for r in rows {
                    emit(&report::row(cli, format, r))?;
                }
            }
        }
    }
    let Some((_, _, first)) = pairs.first() else {
        return Ok(());
    };
    let aggregate: Vec<Row> = (0..first.len())
        .map(|k| {
            let mut sum = first[k].clone();
            sum.bw_gb_per_sec = pairs.iter().map(|(_, _, r)| r[k].bw_gb_per_sec).sum();
            sum.avg_lat_us =
                pairs.iter().map(|(_, _, r)| r[k].avg_lat_us).sum::<f64>() / pairs.len() as f64;
            sum
        })
        .collect();
    match format {
        Format::Json => {
            let obj = serde_json::json!({ "aggregate": pairs.len(), "rows": aggregate });
            emit(&format!("{obj}\n"))?;
        }
        _ => {
            emit(&report::header(
                cli,
                format,
                &format!(" (aggregate of {} pairs: bandwidth summed)", pairs.len()),
            ))?;
            for r in &aggregate {
                emit(&report::row(cli, format, r))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_pairs_each_rank_once() {
        assert_eq!(pairwise(0, 2), Part::Initiator { target: 1 });
        assert_eq!(pairwise(1, 2), Part::Target { initiator: 0 });
        let four: Vec<Part> = (0..4).map(|r| pairwise(r, 4)).collect();
        assert_eq!(
            four,
            [
                Part::Initiator { target: 2 },
                Part::Initiator { target: 3 },
                Part::Target { initiator: 0 },
                Part::Target { initiator: 1 },
            ]
        );
        assert_eq!(pairwise(2, 5), Part::Target { initiator: 0 });
        assert_eq!(pairwise(4, 5), Part::Idle);
    }
}
