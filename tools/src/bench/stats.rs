//! Samples and the rows they become: HDR histograms of nanoseconds, and
//! the nixlbench row and the latency row computed from them.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Durations recorded in nanoseconds, 3 significant digits, 1 ns to an
/// hour (values beyond are clamped to the top).
#[derive(Debug, Clone)]
pub struct Samples {
    histogram: Histogram<u64>,
}

/// Largest value recorded: one hour in nanoseconds.
const HIGHEST_NS: u64 = 3_600_000_000_000;

impl Default for Samples {
    fn default() -> Self {
        Samples {
            histogram: Histogram::new_with_bounds(1, HIGHEST_NS, 3)
                .expect("constant, valid histogram bounds"),
        }
    }
}

impl Samples {
    /// Records one duration.
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos())
            .unwrap_or(HIGHEST_NS)
            .clamp(1, HIGHEST_NS);
        self.histogram.saturating_record(ns);
    }

    /// How many were recorded.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The mean, in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        if self.histogram.is_empty() {
            0.0
        } else {
            self.histogram.mean() / 1e3
        }
    }

    /// The value at quantile `q` (0 to 1), in microseconds (0 when empty).
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.histogram.is_empty() {
            0.0
        } else {
            self.histogram.value_at_quantile(q) as f64 / 1e3
        }
    }

    /// Mean and percentiles in microseconds.
    pub fn summary(&self) -> Summary {
        Summary {
            avg_us: self.mean_us(),
            p50_us: self.quantile_us(0.50),
            p99_us: self.quantile_us(0.99),
            p999_us: self.quantile_us(0.999),
        }
    }
}

/// A distribution in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Mean.
    pub avg_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

/// One row of the bandwidth sweep: a block size and a batch size.
///
/// As nixlbench: `bw_gb_per_sec` is bytes of all timed batches over the
/// wall time of the timed loop, in 10^9 bytes per second, and
/// `avg_lat_us` is that wall time over the transfers (`num_iter` ×
/// batch size). `prep`, `post` and `tx` are per batch (see tools/README.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Bytes per transfer.
    pub block_size: u64,
    /// Transfers per batch.
    pub batch_size: u64,
    /// Timed batches (of the median pass).
    pub iterations: u64,
    /// Passes the row ran; its figures are those of the median pass.
    pub passes: u32,
    /// Bandwidth, GB/s (10^9 bytes per second).
    pub bw_gb_per_sec: f64,
    /// Wall time per transfer, microseconds.
    pub avg_lat_us: f64,
    /// Wall time of the timed loop, seconds.
    pub elapsed_s: f64,
    /// Writing the batch's SQEs into the ring.
    pub prep: Summary,
    /// Submitting them (and, inline, one progress round).
    pub post: Summary,
    /// From submit to the batch's last CQE.
    pub tx: Summary,
}

impl Row {
    /// A row from the samples of `iterations` timed batches that took
    /// `elapsed` in all.
    pub fn new(
        block_size: u64,
        batch_size: u64,
        iterations: u64,
        elapsed: Duration,
        samples: &RowSamples,
    ) -> Row {
        let secs = elapsed.as_secs_f64().max(1e-12);
        let transfers = (iterations * batch_size) as f64;
        Row {
            block_size,
            batch_size,
            iterations,
            passes: 1,
            bw_gb_per_sec: block_size as f64 * transfers / secs / 1e9,
            avg_lat_us: secs * 1e6 / transfers.max(1.0),
            elapsed_s: secs,
            prep: samples.prep.summary(),
            post: samples.post.summary(),
            tx: samples.tx.summary(),
        }
    }
}

/// The pass of a row with the median bandwidth (of an even count, the
/// lower middle one): every figure of the row comes from that one pass.
///
/// # Panics
/// If `passes` is empty (a sweep runs every row at least once).
pub fn median_pass(mut passes: Vec<Row>) -> Row {
    assert!(!passes.is_empty(), "a row runs at least one pass");
    passes.sort_by(|a, b| a.bw_gb_per_sec.total_cmp(&b.bw_gb_per_sec));
    let count = passes.len();
    let mut row = passes.swap_remove((count - 1) / 2);
    row.passes = u32::try_from(count).unwrap_or(u32::MAX);
    row
}

/// The per-batch samples of one row.
#[derive(Debug, Clone, Default)]
pub struct RowSamples {
    /// Writing SQEs.
    pub prep: Samples,
    /// Submit (+ inline progress).
    pub post: Samples,
    /// Submit to last CQE.
    pub tx: Samples,
}

/// One row of the latency mode: one-way latency of a PUT ping-pong.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    /// Bytes per PUT.
    pub block_size: u64,
    /// Timed round trips.
    pub iterations: u64,
    /// Median one-way latency (half a round trip), microseconds.
    pub typical_lat_us: f64,
    /// Mean one-way latency, microseconds.
    pub avg_lat_us: f64,
    /// 99th percentile one-way latency, microseconds.
    pub p99_lat_us: f64,
    /// 99.9th percentile one-way latency, microseconds.
    pub p999_lat_us: f64,
    /// One-way bandwidth implied by the median, GB/s.
    pub bw_gb_per_sec: f64,
}

impl LatencyRow {
    /// A row from the one-way samples.
    pub fn new(block_size: u64, one_way: &Samples) -> LatencyRow {
        let s = one_way.summary();
        LatencyRow {
            block_size,
            iterations: one_way.count(),
            typical_lat_us: s.p50_us,
            avg_lat_us: s.avg_us,
            p99_lat_us: s.p99_us,
            p999_lat_us: s.p999_us,
            bw_gb_per_sec: if s.p50_us > 0.0 {
                block_size as f64 / (s.p50_us * 1e3)
            } else {
                0.0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_histogram() {
        let mut s = Samples::default();
        for us in 1..=100u64 {
            s.record(Duration::from_micros(us));
        }
        assert_eq!(s.count(), 100);
        assert!((s.mean_us() - 50.5).abs() < 0.1, "{}", s.mean_us());
        assert!((s.quantile_us(0.99) - 99.0).abs() < 0.1);
        assert!((s.quantile_us(0.5) - 50.0).abs() < 0.1);
        assert_eq!(Samples::default().summary().p99_us, 0.0);
    }

    #[test]
    fn bandwidth_and_latency_as_nixlbench() {
        let row = Row::new(
            1000,
            4,
            250,
            Duration::from_millis(1),
            &RowSamples::default(),
        );
        // 1000 B x 4 x 250 = 1 MB in 1 ms = 1 GB/s; 1 ms / 1000 transfers.
        assert!((row.bw_gb_per_sec - 1.0).abs() < 1e-9);
        assert!((row.avg_lat_us - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_row_is_its_median_pass_whole() {
        // Passes of 1000 x 1 B in 1, 4, 2, 8 and 3 ms: the median pass is
        // the 3 ms one, and its iterations come with it.
        let pass = |ms: u64, iterations: u64| {
            let mut r = Row::new(
                1000,
                1,
                1,
                Duration::from_millis(ms),
                &RowSamples::default(),
            );
            r.iterations = iterations;
            r
        };
        let passes = vec![
            pass(1, 10),
            pass(4, 40),
            pass(2, 20),
            pass(8, 80),
            pass(3, 30),
        ];
        let row = median_pass(passes);
        assert_eq!(row.iterations, 30);
        assert_eq!(row.passes, 5);
        assert!((row.elapsed_s - 0.003).abs() < 1e-12);
        // Of an even count, the lower middle: 1 and 2 ms of 4 and 8 ms.
        let row = median_pass(vec![pass(1, 10), pass(8, 80), pass(2, 20), pass(4, 40)]);
        assert_eq!(row.iterations, 40);
        assert_eq!(median_pass(vec![pass(5, 50)]).iterations, 50);
    }
}
