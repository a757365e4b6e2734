//! Choosing a bootstrap by a string, as command lines give it:
//! `etcd://HOST:PORT[,HOST:PORT...][?run=NAME&size=N&rank=R&ttl=SECONDS]`
//! or `mpi`.

use std::time::Duration;

use crate::{Bootstrap, Error, Result};

/// A parsed bootstrap string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// An etcd cluster.
    Etcd {
        /// `HOST:PORT` of each member.
        endpoints: Vec<String>,
        /// The run's name (its keys' prefix); `RINGFENCE_RUN` or
        /// `default`.
        run: String,
        /// The number of ranks, if given (it must be, to connect).
        size: Option<u32>,
        /// This process's rank, if given; otherwise it takes the lowest
        /// free one.
        rank: Option<u32>,
        /// The lease's time to live.
        ttl: Duration,
    },
    /// The MPI launcher this process runs under.
    Mpi,
}

/// The lease time to live when the string gives none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);

impl Spec {
    /// Parses `s` (see the module docs).
    ///
    /// # Errors
    /// [`Error::Invalid`], naming the part that is wrong.
    pub fn parse(s: &str) -> Result<Spec> {
        if s == "mpi" {
            return Ok(Spec::Mpi);
        }
        let Some(rest) = s.strip_prefix("etcd://") else {
            return Err(Error::Invalid(format!(
                "bootstrap {s:?}: expected etcd://HOST:PORT[?run=..&size=N&rank=R&ttl=S] or mpi"
            )));
        };
        let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
        let hosts = hosts.trim_end_matches('/');
        let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
        for e in &endpoints {
            let ok = e
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(Error::Invalid(format!(
                    "etcd endpoint {e:?}: expected HOST:PORT"
                )));
            }
        }
        let mut spec = Spec::Etcd {
            endpoints,
            run: std::env::var("RINGFENCE_RUN").unwrap_or_else(|_| "default".to_owned()),
            size: None,
            rank: None,
            ttl: DEFAULT_TTL,
        };
        let Spec::Etcd {
            run,
            size,
            rank,
            ttl,
            ..
        } = &mut spec
        else {
            unreachable!()
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let num = |what: &str| {
                v.parse::<u32>()
                    .map_err(|_| Error::Invalid(format!("{what}={v:?}: expected a number")))
            };
            match k {
                "run" => {
                    crate::check_key(v).map_err(|_| {
                        Error::Invalid(format!("run={v:?}: 1 to 128 of A-Z a-z 0-9 - _ ."))
                    })?;
                    *run = v.to_owned();
                }
                "size" => *size = Some(num("size")?).filter(|&n| n > 0),
                "rank" => *rank = Some(num("rank")?),
                "ttl" => *ttl = Duration::from_secs(u64::from(num("ttl")?.max(1))),
                _ => return Err(Error::Invalid(format!("unknown etcd option {k:?}"))),
            }
        }
        if size.is_none() && query.contains("size=") {
            return Err(Error::Invalid("size=0: a run has at least one rank".into()));
        }
        Ok(spec)
    }
}

/// Joins the run `s` names (see [`Spec::parse`]).
///
/// # Errors
/// As [`Spec::parse`]; [`Error::Invalid`] for etcd without `size`;
/// the chosen implementation's errors when it connects;
/// [`Error::NotBuilt`] if it is not compiled in.
pub fn connect(s: &str) -> Result<Box<dyn Bootstrap>> {
    match Spec::parse(s)? {
        #[cfg(feature = "etcd")]
        Spec::Etcd {
            endpoints,
            run,
            size,
            rank,
            ttl,
        } => {
            let size = size.ok_or_else(|| {
                Error::Invalid("etcd bootstrap needs the run's size (?size=N)".into())
            })?;
            let mut cfg = crate::EtcdConfig::new(endpoints, &run, size);
            cfg.rank = rank;
            cfg.ttl = ttl;
            Ok(Box::new(crate::Etcd::connect(cfg)?))
        }
        #[cfg(not(feature = "etcd"))]
        Spec::Etcd { .. } => Err(Error::NotBuilt("etcd")),
        #[cfg(feature = "mpi")]
        Spec::Mpi => Ok(Box::new(crate::Mpi::init()?)),
        #[cfg(not(feature = "mpi"))]
        Spec::Mpi => Err(Error::NotBuilt("mpi")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_etcd_and_mpi() {
        assert_eq!(Spec::parse("mpi").unwrap(), Spec::Mpi);
        let s = Spec::parse("etcd://10.0.0.1:2379,h2:2380/?run=r1&size=4&rank=2&ttl=3").unwrap();
        assert_eq!(
            s,
            Spec::Etcd {
                endpoints: vec!["10.0.0.1:2379".into(), "h2:2380".into()],
                run: "r1".into(),
                size: Some(4),
                rank: Some(2),
                ttl: Duration::from_secs(3),
            }
        );
    }

    #[test]
    fn refuses_what_it_cannot_use() {
        for bad in [
            "",
            "etcd",
            "http://h:1",
            "etcd://",
            "etcd://host",
            "etcd://host:0",
            "etcd://host:99999",
            "etcd://:2379",
            "etcd://h:1?size=x",
            "etcd://h:1?size=0",
            "etcd://h:1?run=a/b",
            "etcd://h:1?colour=red",
        ] {
            assert!(
                matches!(Spec::parse(bad), Err(Error::Invalid(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(connect("etcd://h:1"), Err(Error::Invalid(_))));
    }
}
