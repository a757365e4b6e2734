//! Worker configuration: a builder, with environment overrides that a job
//! script can set without recompiling.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `RINGFENCE_DRIVERS` | comma-separated driver names to use, in priority order, from those the program provides | all provided, in order |
//! | `RINGFENCE_CORE_CPU` | CPU for the core thread when `start_core_thread(None)` is called | a CPU of the caller's allowed set other than the one it runs on (unpinned if it has only one) |
//! | `RINGFENCE_SQ_ENTRIES` | SQ entries of each queue pair (power of two, ≤ 65536) | 256 |
//! | `RINGFENCE_CQ_ENTRIES` | CQ entries of each queue pair (power of two, ≤ 65536) | 2 × SQ |
//! | `RINGFENCE_REQUESTS` | requests in flight per queue pair (≤ 2^20) | 1024 |
//! | `RINGFENCE_LANES` | lanes per endpoint (1–64, capped by the driver) | 1 |
//! | `RINGFENCE_NOTIFY_BUFFERS` | notification buffers (≤ 65536) | 64 |
//! | `RINGFENCE_NOTIFY_SIZE` | bytes per notification buffer | 4096 |
//! | `RINGFENCE_BW_THRESHOLD` | PUT/GET size from which bandwidth lanes are used | 8192 |
//!
//! A variable that is set but malformed is an error naming it; an environment
//! value wins over the builder's.

use crate::driver::MAX_LANES;
use crate::error::Error;
use crate::request::MAX_REQUESTS;
use crate::sys::notify::MAX_NOTIFY_BUFFERS;
use ringfence_ring::MAX_ENTRIES;

/// Everything a worker is built with, after environment overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Driver names to use, in priority order (`None`: all, as provided).
    pub drivers: Option<Vec<String>>,
    /// Default CPU of the core thread (`None`: a CPU other than the
    /// caller's, see [`Worker::start_core_thread`](crate::Worker::start_core_thread)).
    pub core_cpu: Option<usize>,
    /// SQ entries per queue pair.
    pub sq_entries: u32,
    /// CQ entries per queue pair.
    pub cq_entries: u32,
    /// Requests in flight per queue pair.
    pub requests: u32,
    /// Lanes per endpoint.
    pub lanes: u8,
    /// Notification buffers.
    pub notify_buffers: u32,
    /// Bytes per notification buffer.
    pub notify_size: u32,
    /// PUT/GET size from which bandwidth lanes are used.
    pub bw_threshold: u32,
    /// How long a worker being dropped asks drivers that answer
    /// [`Quiesced::Pending`](crate::Quiesced::Pending) again before it
    /// gives up and leaks its registered memory rather than free it.
    pub quiesce_timeout: std::time::Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            drivers: None,
            core_cpu: None,
            sq_entries: 256,
            cq_entries: 512,
            requests: 1024,
            lanes: 1,
            notify_buffers: 64,
            notify_size: 4096,
            bw_threshold: 8192,
            quiesce_timeout: std::time::Duration::from_secs(10),
        }
    }
}

fn parse<T: std::str::FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    check: impl Fn(&T) -> bool,
    expected: &'static str,
) -> Result<Option<T>, Error> {
    let Some(value) = get(var) else {
        return Ok(None);
    };
    match value.trim().parse::<T>() {
        Ok(v) if check(&v) => Ok(Some(v)),
        _ => Err(Error::Config {
            var,
            value,
            expected,
        }),
    }
}

impl Config {
    /// Applies the `RINGFENCE_*` variables found by `get` (the process
    /// environment in production; a map in tests).
    ///
    /// # Errors
    /// [`Error::Config`] naming the first malformed variable.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), Error> {
        let entries = |n: &u32| n.is_power_of_two() && *n <= MAX_ENTRIES;
        if let Some(list) = get("RINGFENCE_DRIVERS") {
            let names: Vec<String> = list
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            if names.is_empty() {
                return Err(Error::Config {
                    var: "RINGFENCE_DRIVERS",
                    value: list,
                    expected: "a comma-separated list of driver names",
                });
            }
            self.drivers = Some(names);
        }
        if let Some(cpu) = parse(&get, "RINGFENCE_CORE_CPU", |_: &usize| true, "a CPU number")? {
            self.core_cpu = Some(cpu);
        }
        let pow2 = "a power of two up to 65536";
        if let Some(n) = parse(&get, "RINGFENCE_SQ_ENTRIES", entries, pow2)? {
            self.sq_entries = n;
            self.cq_entries = (n * 2).min(MAX_ENTRIES);
        }
        if let Some(n) = parse(&get, "RINGFENCE_CQ_ENTRIES", entries, pow2)? {
            self.cq_entries = n;
        }
        let requests = |n: &u32| (1..=MAX_REQUESTS).contains(n);
        if let Some(n) = parse(
            &get,
            "RINGFENCE_REQUESTS",
            requests,
            "a number from 1 to 1048576",
        )? {
            self.requests = n;
        }
        let lanes = |n: &u8| (1..=MAX_LANES).contains(n);
        if let Some(n) = parse(&get, "RINGFENCE_LANES", lanes, "a number from 1 to 64")? {
            self.lanes = n;
        }
        let buffers = |n: &u32| *n <= MAX_NOTIFY_BUFFERS;
        if let Some(n) = parse(
            &get,
            "RINGFENCE_NOTIFY_BUFFERS",
            buffers,
            "a number up to 65536",
        )? {
            self.notify_buffers = n;
        }
        if let Some(n) = parse(
            &get,
            "RINGFENCE_NOTIFY_SIZE",
            |_: &u32| true,
            "a byte count",
        )? {
            self.notify_size = n;
        }
        if let Some(n) = parse(
            &get,
            "RINGFENCE_BW_THRESHOLD",
            |_: &u32| true,
            "a byte count",
        )? {
            self.bw_threshold = n;
        }
        Ok(())
    }

    /// Checks values set through the builder.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |what: &'static str| Err(Error::InvalidConfig(what));
        if !self.sq_entries.is_power_of_two() || self.sq_entries > MAX_ENTRIES {
            return bad("sq_entries must be a power of two up to 65536");
        }
        if !self.cq_entries.is_power_of_two() || self.cq_entries > MAX_ENTRIES {
            return bad("cq_entries must be a power of two up to 65536");
        }
        if !(1..=MAX_REQUESTS).contains(&self.requests) {
            return bad("requests must be from 1 to 1048576");
        }
        if !(1..=MAX_LANES).contains(&self.lanes) {
            return bad("lanes must be from 1 to 64");
        }
        if self.notify_buffers > MAX_NOTIFY_BUFFERS {
            return bad("notify_buffers must be at most 65536");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn overrides_apply() {
        let mut c = Config::default();
        c.apply_env(env(&[
            ("RINGFENCE_DRIVERS", "shm, loopback"),
            ("RINGFENCE_CORE_CPU", "1"),
            ("RINGFENCE_SQ_ENTRIES", "64"),
            ("RINGFENCE_REQUESTS", "128"),
            ("RINGFENCE_LANES", "4"),
            ("RINGFENCE_NOTIFY_BUFFERS", "8"),
            ("RINGFENCE_NOTIFY_SIZE", "256"),
            ("RINGFENCE_BW_THRESHOLD", "65536"),
        ]))
        .unwrap();
        assert_eq!(
            c.drivers,
            Some(vec!["shm".to_string(), "loopback".to_string()])
        );
        assert_eq!(
            (c.core_cpu, c.sq_entries, c.cq_entries, c.requests, c.lanes),
            (Some(1), 64, 128, 128, 4)
        );
        assert_eq!(
            (c.notify_buffers, c.notify_size, c.bw_threshold),
            (8, 256, 65536)
        );
        c.apply_env(env(&[("RINGFENCE_CQ_ENTRIES", "1024")]))
            .unwrap();
        assert_eq!(c.cq_entries, 1024);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("RINGFENCE_SQ_ENTRIES", "100"),
            ("RINGFENCE_CQ_ENTRIES", "0"),
            ("RINGFENCE_LANES", "65"),
            ("RINGFENCE_LANES", "zero"),
            ("RINGFENCE_REQUESTS", "0"),
            ("RINGFENCE_CORE_CPU", "-1"),
            ("RINGFENCE_NOTIFY_BUFFERS", "70000"),
            ("RINGFENCE_DRIVERS", " , "),
        ] {
            let err = Config::default()
                .apply_env(env(&[(var, value)]))
                .unwrap_err();
            let text = err.to_string();
            assert!(text.contains(var) && text.contains(value.trim()), "{text}");
        }
    }

    #[test]
    fn builder_values_are_validated() {
        let mut c = Config {
            sq_entries: 3,
            ..Config::default()
        };
        assert!(c.validate().is_err());
        c = Config {
            lanes: 0,
            ..Config::default()
        };
        assert!(c.validate().is_err());
        c = Config {
            requests: MAX_REQUESTS + 1,
            ..Config::default()
        };
        assert!(c.validate().is_err());
        c = Config {
            cq_entries: 6,
            ..Config::default()
        };
        assert!(c.validate().is_err());
        c = Config {
            notify_buffers: MAX_NOTIFY_BUFFERS + 1,
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
