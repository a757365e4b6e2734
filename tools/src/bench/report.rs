//! Output: the nixlbench table (with the configuration above it), one JSON
//! object per row, or CSV.

use crate::bench::cli::{Cli, Mode, ProgressKind};
use crate::bench::stats::{LatencyRow, Row};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

/// The nixlbench columns, in order, as nixlbench spells them
/// (`--nixl-format`).
pub const COLUMNS: [&str; 10] = [
    "Block Size (B)",
    "Batch Size",
    "B/W (GB/Sec)",
    "Avg Lat. (us)",
    "Avg Prep (us)",
    "P99 Prep (us)",
    "Avg Post (us)",
    "P99 Post (us)",
    "Avg Tx (us)",
    "P99 Tx (us)",
];

/// The same columns with latencies in nanoseconds (the default).
pub const COLUMNS_NS: [&str; 10] = [
    "Block Size (B)",
    "Batch Size",
    "B/W (GB/Sec)",
    "Avg Lat. (ns)",
    "Avg Prep (ns)",
    "P99 Prep (ns)",
    "Avg Post (ns)",
    "P99 Post (ns)",
    "Avg Tx (ns)",
    "P99 Tx (ns)",
];

/// The latency mode's columns (`--nixl-format`: microseconds).
pub const LATENCY_COLUMNS: [&str; 6] = [
    "Block Size (B)",
    "Iterations",
    "Typical Lat. (us)",
    "Avg Lat. (us)",
    "P99 Lat. (us)",
    "B/W (GB/Sec)",
];

/// The latency mode's columns in nanoseconds (the default).
pub const LATENCY_COLUMNS_NS: [&str; 6] = [
    "Block Size (B)",
    "Iterations",
    "Typical Lat. (ns)",
    "Avg Lat. (ns)",
    "P99 Lat. (ns)",
    "B/W (GB/Sec)",
];

/// A latency of `us` microseconds as a cell: nanoseconds with one
/// decimal, or nixlbench's microseconds with `nixl_decimals`.
fn latency(cli: &Cli, us: f64, nixl_decimals: usize) -> String {
    if cli.nixl_format {
        format!("{us:.nixl_decimals$}")
    } else {
        format!("{:.1}", us * 1e3)
    }
}

/// Column widths (nixlbench: 20 for the first, 15 for the rest), wider
/// for a longer name.
fn width(i: usize, name: &str) -> usize {
    if i == 0 { 20 } else { 15.max(name.len() + 2) }
}

/// The output format chosen on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The table.
    Table,
    /// JSON lines.
    Json,
    /// CSV.
    Csv,
}

impl Format {
    /// From `--json` / `--csv`.
    pub fn of(cli: &Cli) -> Format {
        if cli.json {
            Format::Json
        } else if cli.csv {
            Format::Csv
        } else {
            Format::Table
        }
    }
}

/// The `RINGFENCE_*` environment variables in force (they steer workers).
pub fn ringfence_env() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("RINGFENCE_"))
        .collect()
}

/// What a JSON line carries besides the row.
#[derive(Debug, Serialize)]
struct JsonLine<'a, R: Serialize> {
    #[serde(flatten)]
    row: &'a R,
    config: &'a Cli,
    env: &'a BTreeMap<String, String>,
    version: &'static str,
}

/// The columns of `cli`'s mode and units.
pub fn columns(cli: &Cli) -> &'static [&'static str] {
    match (cli.mode, cli.nixl_format) {
        (Mode::Bandwidth, true) => &COLUMNS,
        (Mode::Bandwidth, false) => &COLUMNS_NS,
        (Mode::Latency, true) => &LATENCY_COLUMNS,
        (Mode::Latency, false) => &LATENCY_COLUMNS_NS,
    }
}

/// Everything before the first row.
pub fn header(cli: &Cli, format: Format, driver_note: &str) -> String {
    let columns = columns(cli);
    match format {
        Format::Json => String::new(),
        Format::Csv => format!("{}\n", columns.join(",")),
        Format::Table => {
            let rule = "-".repeat(160);
            let mut s = format!("{rule}\n");
            let sizes = |v: Vec<u64>| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            let lines = [
                (
                    "Driver (--driver)",
                    format!("{}{driver_note}", cli.driver.name()),
                ),
                ("Mode (--mode)", format!("{:?}", cli.mode).to_lowercase()),
                ("Op type (--op)", format!("{:?}", cli.op).to_uppercase()),
                ("Block sizes (B)", sizes(cli.block_sizes())),
                ("Batch sizes", sizes(cli.batch_sizes())),
                (
                    "Num iter (--num-iter, --duration)",
                    match (cli.num_iter, cli.mode) {
                        (Some(n), _) => n.to_string(),
                        (None, Mode::Latency) => cli.latency_iters().to_string(),
                        (None, Mode::Bandwidth) => {
                            format!("as many as {} s per row takes", cli.duration)
                        }
                    },
                ),
                (
                    "Passes (--passes; each row: its median pass)",
                    match cli.mode {
                        Mode::Bandwidth => cli.passes().to_string(),
                        Mode::Latency => "1 (latency rows report their median)".into(),
                    },
                ),
                ("Warmup iter (--warmup-iter)", cli.warmup_iter.to_string()),
                (
                    "Fence (--fence, --fence-every)",
                    format!("{:?} every {}", cli.fence, cli.fence_every).to_lowercase(),
                ),
                ("Notify (--notify)", cli.notify.to_string()),
                ("Check consistency", cli.check_consistency.to_string()),
                (
                    "Progress (--progress, --cpu)",
                    format!(
                        "{} {}",
                        format!("{:?}", cli.progress).to_lowercase(),
                        match (cli.cpu, cli.progress) {
                            (Some(c), _) => format!("cpu {c}"),
                            // start_core_thread(None) picks its default CPU.
                            (None, ProgressKind::CoreThread) => "default cpu".into(),
                            (None, ProgressKind::Inline) => "unpinned".into(),
                        }
                    ),
                ),
                ("Lanes (--lanes)", cli.lanes.to_string()),
                ("Role (--role)", format!("{:?}", cli.role).to_lowercase()),
            ];
            for (k, v) in lines {
                s += &format!("{k:<60}: {v}\n");
            }
            for (k, v) in ringfence_env() {
                s += &format!("{:<60}: {v}\n", format!("Environment {k}"));
            }
            s += &format!("{rule}\n\n");
            for (i, c) in columns.iter().enumerate() {
                s += &format!("{c:<w$}", w = width(i, c));
            }
            s = s.trim_end().to_string();
            s += &format!("\n{rule}\n");
            s
        }
    }
}

/// One bandwidth row in `format`.
pub fn row(cli: &Cli, format: Format, r: &Row) -> String {
    let cells = [
        r.block_size.to_string(),
        r.batch_size.to_string(),
        format!("{:.6}", r.bw_gb_per_sec),
        latency(cli, r.avg_lat_us, 1),
        latency(cli, r.prep.avg_us, 1),
        latency(cli, r.prep.p99_us, 1),
        latency(cli, r.post.avg_us, 1),
        latency(cli, r.post.p99_us, 1),
        latency(cli, r.tx.avg_us, 1),
        latency(cli, r.tx.p99_us, 1),
    ];
    cells_in(cli, format, r, &cells, columns(cli))
}

/// One latency row in `format`.
pub fn latency_row(cli: &Cli, format: Format, r: &LatencyRow) -> String {
    let cells = [
        r.block_size.to_string(),
        r.iterations.to_string(),
        latency(cli, r.typical_lat_us, 3),
        latency(cli, r.avg_lat_us, 3),
        latency(cli, r.p99_lat_us, 3),
        format!("{:.6}", r.bw_gb_per_sec),
    ];
    cells_in(cli, format, r, &cells, columns(cli))
}

fn cells_in<R: Serialize>(
    cli: &Cli,
    format: Format,
    r: &R,
    cells: &[String],
    columns: &[&str],
) -> String {
    match format {
        Format::Table => {
            let mut s = String::new();
            for (i, (c, name)) in cells.iter().zip(columns).enumerate() {
                s += &format!("{c:<w$}", w = width(i, name));
            }
            s.trim_end().to_string()
        }
        Format::Csv => cells.join(","),
        Format::Json => serde_json::to_string(&JsonLine {
            row: r,
            config: cli,
            env: &ringfence_env(),
            version: env!("CARGO_PKG_VERSION"),
        })
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")),
    }
}

/// Writes a line to standard output and flushes it (rows appear as they
/// finish).
pub fn emit(line: &str) -> std::io::Result<()> {
    if line.is_empty() {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    if line.ends_with('\n') {
        write!(out, "{line}")?;
    } else {
        writeln!(out, "{line}")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::RowSamples;
    use clap::Parser;
    use std::time::Duration;

    #[test]
    fn every_format_carries_the_row() {
        let cli = Cli::try_parse_from(["rfbench", "--driver", "loopback"]).unwrap();
        let r = Row::new(64, 2, 10, Duration::from_micros(20), &RowSamples::default());
        let table = header(&cli, Format::Table, "");
        for c in COLUMNS_NS {
            assert!(table.contains(c), "{c}");
        }
        assert!(row(&cli, Format::Table, &r).starts_with("64 "));
        assert_eq!(
            header(&cli, Format::Csv, "").lines().next().unwrap(),
            COLUMNS_NS.join(",")
        );
        // 10 batches of 2 in 20 us: 1 us per transfer, 1000.0 ns.
        assert_eq!(row(&cli, Format::Csv, &r).split(',').nth(3), Some("1000.0"));
        let nixl =
            Cli::try_parse_from(["rfbench", "--driver", "loopback", "--nixl-format"]).unwrap();
        assert_eq!(
            header(&nixl, Format::Csv, "").lines().next().unwrap(),
            COLUMNS.join(",")
        );
        assert_eq!(row(&nixl, Format::Csv, &r).split(',').nth(3), Some("1.0"));
        assert_eq!(row(&cli, Format::Csv, &r).split(',').count(), 10);
        let v: serde_json::Value = serde_json::from_str(&row(&cli, Format::Json, &r)).unwrap();
        assert_eq!(v["block_size"], 64);
        assert_eq!(v["config"]["driver"], "loopback");
        assert!(v["tx"]["p99_us"].is_number());
    }
}
