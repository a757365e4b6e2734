//! The target's side of the command protocol: serving a window and
//! answering commands until standard input closes.

use crate::bench::cli::Cli;
use crate::bench::error::BenchError;
use crate::bench::latency::{Polling, Side, pong};
use ringfence::Worker;
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use super::*;

/// `--role target`: prints the connection string, then serves commands from
/// standard input (see the module docs) until it closes. With tcp the
/// worker's core thread runs throughout.
///
/// # Errors
/// The worker or window cannot be set up, or standard output fails.
pub fn serve(cli: &Cli, worker: Worker) -> Result<(), BenchError> {
    let mut state = TargetState::new(worker, cli.window_len(), cli.corrupt_for_test)?;
    if cli.driver.target_executes() {
        state.start_core_thread()?;
    }
    let conn = state.connection()?.encode();
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{conn}")
            .and_then(|()| out.flush())
            .map_err(BenchError::io("writing the connection string"))?;
    }
    if !cli.spawned {
        eprintln!(
            "rfbench target: {} B window; run `rfbench --driver {} --role initiator --peer {conn}` \
             (with the same or smaller sizes); serving until standard input closes",
            state.window.len(),
            cli.driver.name()
        );
    }
    let (tx, commands) = mpsc::channel::<String>();
    std::thread::Builder::new()
        .name("rfbench-commands".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        })
        .map_err(BenchError::io("spawning the command reader"))?;
    serve_commands(&mut state, &commands, &mut |line| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").and_then(|()| out.flush())
    })
}

/// Where a target writes its answer lines.
pub type AnswerSink<'a> = dyn FnMut(&str) -> std::io::Result<()> + 'a;

/// Serves the commands that arrive on `commands` (see the module docs),
/// writing each answer through `out`, until the channel's sender goes away.
/// Between commands it takes notifications ([`TargetState::service`]).
///
/// # Errors
/// The target's CQ is corrupt.
pub fn serve_commands(
    state: &mut TargetState,
    commands: &mpsc::Receiver<String>,
    out: &mut AnswerSink<'_>,
) -> Result<(), BenchError> {
    let mut idle = 0u32;
    loop {
        let work = state.service()?;
        let next = if work > 0 || idle < 64 {
            idle = if work > 0 { 0 } else { idle + 1 };
            commands.try_recv().map_err(|e| match e {
                mpsc::TryRecvError::Empty => mpsc::RecvTimeoutError::Timeout,
                mpsc::TryRecvError::Disconnected => mpsc::RecvTimeoutError::Disconnected,
            })
        } else {
            // Idle: leave the CPU to the initiator while waiting for a
            // command; notifications wait in the CQ meanwhile.
            commands.recv_timeout(Duration::from_micros(50))
        };
        match next {
            Ok(line) => {
                let answer = handle(state, &line, out);
                // A peer that went away is noticed by the channel.
                let _ = out(&answer);
                idle = 0;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            Err(mpsc::RecvTimeoutError::Timeout) => std::hint::spin_loop(),
        }
    }
}

/// One command; the answer line.
fn handle(state: &mut TargetState, line: &str, out: &mut AnswerSink<'_>) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let result = match words.split_first() {
        Some((&"prepare", rest)) => match RowSpec::from_words(rest) {
            Some(spec) => state.prepare(spec),
            None => Err(BenchError::Target(format!("malformed command `{line}`"))),
        },
        Some((&"verify", rest)) => match RowSpec::from_words(rest) {
            Some(spec) => state.verify(spec),
            None => Err(BenchError::Target(format!("malformed command `{line}`"))),
        },
        Some((&"pong", rest)) => return pong_command(state, rest, out),
        _ => Err(BenchError::Target(format!("unknown command `{line}`"))),
    };
    match result {
        Ok(()) => "ok".into(),
        Err(BenchError::Inconsistent(m)) => format!("err-inconsistent {m}"),
        Err(e) => format!("err {e}"),
    }
}

/// `pong CONNECTION WARMUP ITERS SIZE...`: connects back to the
/// initiator's window, answers `ok`, runs the ping-pong, and returns `done`.
///
/// This thread progresses the worker while it polls its window: with a
/// core thread (tcp), the core thread stops for the ping-pong and this
/// thread progresses at every spin, so that two threads, not three, spin
/// on the two sides together.
fn pong_command(state: &mut TargetState, words: &[&str], out: &mut AnswerSink<'_>) -> String {
    let core_thread = state.core_thread;
    let polling = if core_thread {
        Polling::Inline(1)
    } else {
        Polling::Inline(crate::bench::latency::SPINS_PER_POLL)
    };
    let mut run = |state: &mut TargetState| -> Result<(), BenchError> {
        let [conn, warmup, iters, sizes @ ..] = words else {
            return Err(BenchError::Target("malformed pong command".into()));
        };
        let conn = Connection::decode(conn)?;
        let num = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| BenchError::Target(format!("`{s}` is not a number")))
        };
        let (warmup, iters) = (num(warmup)?, num(iters)?);
        let rounds = warmup
            .checked_add(iters)
            .ok_or_else(|| BenchError::Target("too many ping-pong rounds".into()))?;
        let sizes = sizes
            .iter()
            .map(|s| num(s))
            .collect::<Result<Vec<_>, _>>()?;
        if sizes.iter().any(|&s| s < 8) {
            return Err(BenchError::Target(
                "ping-pong sizes must be at least 8 bytes".into(),
            ));
        }
        let max = sizes.iter().copied().max().unwrap_or(8);
        let mut side = Side::connect(&state.worker, &conn, state.window.clone(), max, polling)?;
        // The endpoint may still be connecting: the initiator progresses
        // its side only once it has this answer, and PUTs queue meanwhile.
        out("ok").map_err(BenchError::io("answering pong"))?;
        pong(&mut side, &sizes, rounds)?;
        Ok(())
    };
    if core_thread {
        state.worker.stop_core_thread();
    }
    let result = run(state);
    if core_thread && let Err(e) = state.worker.start_core_thread(None) {
        return format!("err restarting the target's core thread: {e}");
    }
    match result {
        Ok(()) => "done".into(),
        Err(e) => format!("err {e}"),
    }
}
