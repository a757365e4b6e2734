//! Pushes NOP operations through a ring region, SQE to CQE and back, with an
//! application thread and an engine thread, and prints the rate.
//!
//! `cargo run --release -p ringfence-ring --example throughput [-- --ops N]`
//!
//! The engine thread plays the polling core: it drains the SQ in batches,
//! decodes each entry, and posts one CQE per SQE. When idle it sleeps on a
//! doorbell through `NEED_WAKEUP`, as the core thread will.

use ringfence_ring::{Cqe, Doorbell, Opcode, Region, Sqe, Status};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn usage() -> ExitCode {
    eprintln!("usage: throughput [--ops N]   (N: operations per batch size, default 2000000)");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ops = match args.as_slice() {
        [] => 2_000_000,
        [flag, n] if flag == "--ops" => match n.parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("--ops: expected a positive integer, got {n:?}");
                return usage();
            }
        },
        _ => return usage(),
    };
    println!("ringfence ring demo: {ops} NOPs per row, SQE -> engine thread -> CQE\n");
    println!(
        "{:>6} {:>14} {:>12} {:>14}",
        "batch", "ops/s", "ns/op", "engine sleeps"
    );
    for batch in [1usize, 8, 32] {
        match run(ops, batch) {
            Ok((elapsed, sleeps)) => {
                let rate = ops as f64 / elapsed.as_secs_f64();
                println!(
                    "{batch:>6} {:>14.0} {:>12.1} {sleeps:>14}",
                    rate,
                    1e9 / rate
                );
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

fn run(ops: u64, batch: usize) -> Result<(Duration, u64), Box<dyn std::error::Error>> {
    let mut region = Region::builder()
        .sq_entries(256)
        .cq_entries(512)
        .build_anonymous()?;
    let (mut sq, mut cq) = region.app_side()?;
    let (mut engine_sq, mut engine_cq) = region.engine_side()?;
    let bell = Arc::new(Doorbell::new()?);

    let engine = {
        let bell = bell.clone();
        std::thread::spawn(move || -> Result<u64, String> {
            let mut sqes = [Sqe::default(); 64];
            let (mut done, mut idle, mut sleeps) = (0u64, 0u32, 0u64);
            while done < ops {
                let n = engine_sq.pop_batch(&mut sqes).map_err(|e| e.to_string())?;
                for sqe in &sqes[..n] {
                    let res = match sqe.opcode() {
                        Ok(Opcode::NOP) => 0,
                        Ok(_) => Status::Unsupported.as_raw(),
                        Err(e) => e.status().as_raw(),
                    };
                    // The CQ has twice the SQ's room and the application
                    // keeps at most one SQ of operations in flight.
                    engine_cq
                        .push(Cqe::new(sqe.user_data, res, 0))
                        .map_err(|e| e.to_string())?;
                }
                if n > 0 {
                    engine_cq.submit();
                    done += n as u64;
                    idle = 0;
                } else {
                    idle += 1;
                    if idle < 64 {
                        std::hint::spin_loop();
                    } else if engine_sq
                        .wait(&bell, Some(Duration::from_millis(100)))
                        .map_err(|e| e.to_string())?
                    {
                        sleeps += 1;
                        idle = 0;
                    }
                }
            }
            Ok(sleeps)
        })
    };

    let start = Instant::now();
    let (mut submitted, mut completed) = (0u64, 0u64);
    let mut cqes = [Cqe::default(); 64];
    let entries: Vec<Sqe> = (0..batch as u64)
        .map(|i| Sqe::nop().with_user_data(i))
        .collect();
    while completed < ops {
        let in_flight = submitted - completed;
        if submitted < ops && in_flight + batch as u64 <= 256 {
            let want = (ops - submitted).min(batch as u64) as usize;
            let n = sq.push_batch(&entries[..want])?;
            submitted += n as u64;
            sq.submit_and_wake(&bell)?;
        }
        let n = cq.pop_batch(&mut cqes)?;
        for c in &cqes[..n] {
            if c.res != 0 {
                return Err(format!(
                    "operation {} failed: {}",
                    c.user_data,
                    ringfence_ring::strerror(c.res)
                )
                .into());
            }
        }
        completed += n as u64;
        if n == 0 && matches!(sq.free(), Ok(0)) {
            std::hint::spin_loop();
        }
    }
    let elapsed = start.elapsed();
    let sleeps = engine.join().map_err(|_| "engine thread panicked")??;
    Ok((elapsed, sleeps))
}
