//! The etcd bootstrap: keys under `ringfence/<run>/`, a lease per rank so
//! a dead rank's keys expire, barriers counted from the keys' events.
//!
//! Keys of a run (`R` a rank, `G` a barrier's number):
//! - `members/R`: the rank's claim, on its lease (its value says who
//!   holds it: host and process id). When the lease expires (the
//!   process died, or lost etcd for a whole time to live) the key goes,
//!   and ranks waiting on it fail with [`Error::RankGone`] naming it.
//! - `data/R/KEY`: what the rank published, on its lease too.
//! - `barrier/G/R`: the rank reached barrier `G`. These are on a second,
//!   lingering lease (ten times as long, at least a minute) and outlive a
//!   rank that leaves cleanly: a rank that passes the last barrier and
//!   exits at once must still count for the slower ones that see the
//!   barrier's keys after it left.
//!
//! The client is async (`etcd-client`, on tonic); this module runs it on a
//! small tokio runtime of its own (one worker thread, which also keeps the
//! leases alive while the application busy-polls), so the interface stays
//! blocking, as launchers and benchmarks want it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::{Bootstrap, Error, Result, check_key, check_rank};

/// How to join a run through etcd.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// `HOST:PORT` of each cluster member.
    pub endpoints: Vec<String>,
    /// The run's name: ranks of one run use the same one, and a new run
    /// should use a new one (keys of a run that ended expire with its
    /// leases).
    pub run: String,
    /// The number of ranks.
    pub size: u32,
    /// This process's rank; `None`: the lowest one nobody holds.
    pub rank: Option<u32>,
    /// The leases' time to live: how long after a rank dies the others
    /// learn of it (at least 1 s; etcd's minimum may be higher).
    pub ttl: Duration,
    /// The longest the first contact may take before the endpoint counts
    /// as unreachable.
    pub connect_timeout: Duration,
}

impl EtcdConfig {
    /// A run of `size` ranks named `run` at `endpoints`, the rank taken
    /// from what is free, a 5 s lease and a 5 s connect timeout.
    pub fn new(endpoints: Vec<String>, run: &str, size: u32) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            run: run.to_owned(),
            size,
            rank: None,
            ttl: crate::uri::DEFAULT_TTL,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// A rank of a run bootstrapped through etcd (see the module docs).
/// Dropping it revokes its lease: its membership and data go at once.
pub struct Etcd {
    client: Client,
    /// `ringfence/<run>/`.
    root: String,
    rank: u32,
    size: u32,
    lease: i64,
    linger: i64,
    /// Set by the keeper when a lease could not be renewed in time.
    lost: Arc<AtomicBool>,
    keeper: JoinHandle<()>,
    /// Barriers passed so far.
    barriers: u64,
    endpoints: String,
    /// Last: the client and the keeper go before their runtime.
    rt: Runtime,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .field("root", &self.root)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// The client's error as ours.
fn etcd(e: etcd_client::Error) -> Error {
    Error::Etcd(e.to_string())
}

impl Etcd {
    /// Connects, takes out the leases and claims a rank.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an empty endpoint list, a size of 0 or a
    /// rank past it, or a call from inside a tokio runtime;
    /// [`Error::Unreachable`] if the cluster does not answer within
    /// `connect_timeout`; [`Error::Join`] if the rank asked for is held,
    /// or every rank is.
    pub fn connect(cfg: EtcdConfig) -> Result<Etcd> {
        if cfg.endpoints.is_empty() || cfg.size == 0 {
            return Err(Error::Invalid(
                "etcd: no endpoints, or a run of 0 ranks".into(),
            ));
        }
        check_key(&cfg.run).map_err(|_| Error::Invalid(format!("run name {:?}", cfg.run)))?;
        if let Some(r) = cfg.rank {
            check_rank(r, cfg.size)?;
        }
        not_in_runtime()?;
        let endpoints = cfg.endpoints.join(",");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ringfence-etcd")
            .enable_all()
            .build()
            .map_err(|e| Error::Etcd(format!("tokio runtime: {e}")))?;
        let root = format!("ringfence/{}/", cfg.run);
        let ttl = cfg.ttl.as_secs().max(1);
        let linger_ttl = (ttl * 10).max(60);
        let unreachable = |reason: String| Error::Unreachable {
            endpoints: endpoints.clone(),
            reason,
        };
        let joined = rt.block_on(async {
            let opts = ConnectOptions::new()
                .with_connect_timeout(cfg.connect_timeout)
                .with_timeout(cfg.connect_timeout);
            let first = async {
                let mut client = Client::connect(&cfg.endpoints, Some(opts)).await?;
                let lease = client.lease_grant(ttl as i64, None).await?.id();
                let linger = client.lease_grant(linger_ttl as i64, None).await?.id();
                Ok::<_, etcd_client::Error>((client, lease, linger))
            };
            let (mut client, lease, linger) =
                match tokio::time::timeout(cfg.connect_timeout, first).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => return Err(unreachable(e.to_string())),
                    Err(_) => {
                        return Err(unreachable(format!(
                            "no answer within {:?}",
                            cfg.connect_timeout
                        )));
                    }
                };
            let who = format!("{} pid {}", hostname(), std::process::id());
            let candidates: Vec<u32> = match cfg.rank {
                Some(r) => vec![r],
                None => (0..cfg.size).collect(),
            };
            for r in candidates {
                let key = format!("{root}members/{r}");
                let txn = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key,
                        who.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    )]);
                if client.txn(txn).await.map_err(etcd)?.succeeded() {
                    return Ok((client, lease, linger, r));
                }
            }
            let _ = client.lease_revoke(lease).await;
            let _ = client.lease_revoke(linger).await;
            Err(Error::Join(match cfg.rank {
                Some(r) => format!("rank {r} of run {:?} is held by another process", cfg.run),
                None => format!("all {} ranks of run {:?} are held", cfg.size, cfg.run),
            }))
        })?;
        let (client, lease, linger, rank) = joined;
        let lost = Arc::new(AtomicBool::new(false));
        let keeper = rt.spawn(keep_alive(
            client.clone(),
            [lease, linger],
            Duration::from_secs(ttl),
            lost.clone(),
        ));
        tracing::debug!(rank, size = cfg.size, %root, "joined through etcd");
        Ok(Etcd {
            rt,
            client,
            root,
            rank,
            size: cfg.size,
            lease,
            linger,
            lost,
            keeper,
            barriers: 0,
            endpoints,
        })
    }

    /// Fails if this rank's lease could not be kept.
    fn alive(&self) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            Err(Error::LeaseLost { lease: self.lease })
        } else {
            Ok(())
        }
    }

    /// The ranks holding a membership now.
    pub fn members(&mut self) -> Result<BTreeSet<u32>> {
        self.alive()?;
        let prefix = format!("{}members/", self.root);
        let mut client = self.client.clone();
        let resp = self
            .rt
            .block_on(client.get(
                prefix.clone(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ))
            .map_err(etcd)?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| rank_after(kv.key(), &prefix))
            .collect())
    }
}

/// The rank that ends `key` right after `prefix`.
fn rank_after(key: &[u8], prefix: &str) -> Option<u32> {
    std::str::from_utf8(key.strip_prefix(prefix.as_bytes())?)
        .ok()?
        .parse()
        .ok()
}

/// This host's name, for the membership's value (diagnostics only).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".to_owned())
}

/// A blocking call from a thread that runs a tokio runtime would panic in
/// `block_on`: refuse it instead.
fn not_in_runtime() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::Invalid(
            "the etcd bootstrap blocks: call it outside async code (spawn_blocking)".into(),
        ));
    }
    Ok(())
}

/// Renews `leases` every third of `ttl`; if a whole `ttl` passes without a
/// renewal, sets `lost` and stops (etcd has let the keys go by then).
async fn keep_alive(mut client: Client, leases: [i64; 2], ttl: Duration, lost: Arc<AtomicBool>) {
    let period = ttl / 3;
    let mut last_ok = Instant::now();
    let mut streams = Vec::new();
    loop {
        if streams.is_empty() {
            for id in leases {
                match client.lease_keep_alive(id).await {
                    Ok(s) => streams.push(s),
                    Err(_) => {
                        streams.clear();
                        break;
                    }
                }
            }
        }
        let mut ok = !streams.is_empty();
        for (keeper, stream) in &mut streams {
            let renewed = keeper.keep_alive().await.is_ok()
                && matches!(stream.message().await, Ok(Some(r)) if r.ttl() > 0);
            ok &= renewed;
        }
        if ok {
            last_ok = Instant::now();
        } else {
            streams.clear();
            if last_ok.elapsed() >= ttl {
                tracing::warn!("etcd lease not renewed within {ttl:?}: this rank counts as gone");
                lost.store(true, Ordering::Release);
                return;
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// What one watch event means to a waiter.
enum Seen {
    Nothing,
    Done(Vec<u8>),
    Gone(u32),
}

impl Etcd {
    /// Runs `wait` (which looks, then watches from the revision it looked
    /// at) until it answers or `deadline` passes; `what` names the wait
    /// in the timeout error.
    fn wait<F>(&self, timeout: Duration, what: impl FnOnce() -> String, wait: F) -> Result<Vec<u8>>
    where
        F: Future<Output = Result<Vec<u8>>>,
    {
        self.alive()?;
        not_in_runtime()?;
        match self
            .rt
            .block_on(async { tokio::time::timeout(timeout, wait).await })
        {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                what: what(),
                after: timeout,
            }),
        }
    }
}

/// Watches everything under `root` from `rev + 1`, handing each event's
/// type and key and value to `on` until it answers.
async fn watch_from(
    client: &mut Client,
    root: &str,
    rev: i64,
    mut on: impl FnMut(EventType, &[u8], &[u8]) -> Seen,
) -> Result<Vec<u8>> {
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(rev + 1);
    let mut stream = client.watch(root, Some(opts)).await.map_err(etcd)?;
    loop {
        let Some(resp) = stream.message().await.map_err(etcd)? else {
            return Err(Error::Etcd("the watch stream ended".into()));
        };
        if resp.canceled() {
            return Err(Error::Etcd(format!(
                "watch canceled: {}",
                resp.cancel_reason()
            )));
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            match on(ev.event_type(), kv.key(), kv.value()) {
                Seen::Nothing => {}
                Seen::Done(v) => return Ok(v),
                Seen::Gone(r) => {
                    return Err(Error::RankGone {
                        rank: r,
                        why: "its etcd lease ended (the process exited or lost etcd)".into(),
                    });
                }
            }
        }
    }
}

impl Bootstrap for Etcd {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn publish(&mut self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        self.alive()?;
        not_in_runtime()?;
        let k = format!("{}data/{}/{key}", self.root, self.rank);
        let mut client = self.client.clone();
        let opts = PutOptions::new().with_lease(self.lease);
        self.rt
            .block_on(client.put(k, value, Some(opts)))
            .map_err(etcd)?;
        Ok(())
    }

    fn fetch(&mut self, rank: u32, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        check_key(key)?;
        check_rank(rank, self.size)?;
        let k = format!("{}data/{rank}/{key}", self.root);
        let member = format!("{}members/{rank}", self.root);
        let mut client = self.client.clone();
        let root = self.root.clone();
        let joined = Arc::new(AtomicBool::new(false));
        let joined_at_end = joined.clone();
        self.wait(
            timeout,
            || {
                let state = if joined_at_end.load(Ordering::Relaxed) {
                    "a member"
                } else {
                    "not a member"
                };
                format!("rank {rank} to publish {key:?} (rank {rank} is {state})")
            },
            async move {
                let resp = client.get(k.as_str(), None).await.map_err(etcd)?;
                if let Some(kv) = resp.kvs().first() {
                    return Ok(kv.value().to_vec());
                }
                let rev = resp.header().map_or(0, |h| h.revision());
                let at = GetOptions::new().with_revision(rev);
                let is_member = !client
                    .get(member.as_str(), Some(at))
                    .await
                    .map_err(etcd)?
                    .kvs()
                    .is_empty();
                joined.store(is_member, Ordering::Relaxed);
                watch_from(&mut client, &root, rev, |ty, key, value| match ty {
                    EventType::Put if key == k.as_bytes() => Seen::Done(value.to_vec()),
                    EventType::Put if key == member.as_bytes() => {
                        joined.store(true, Ordering::Relaxed);
                        Seen::Nothing
                    }
                    EventType::Delete if key == member.as_bytes() => Seen::Gone(rank),
                    _ => Seen::Nothing,
                })
                .await
            },
        )
    }

    fn barrier(&mut self, timeout: Duration) -> Result<()> {
        self.barriers += 1;
        let g = self.barriers;
        let prefix = format!("{}barrier/{g}/", self.root);
        let members = format!("{}members/", self.root);
        let mut client = self.client.clone();
        let (root, rank, size, linger) = (self.root.clone(), self.rank, self.size, self.linger);
        // The arrivals seen so far, for the timeout's message (the
        // waiting future keeps its own set and updates this one).
        let seen = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
        let report = seen.clone();
        self.wait(
            timeout,
            || {
                let seen = report.lock().unwrap_or_else(|p| p.into_inner());
                let missing: Vec<u32> = (0..size).filter(|r| !seen.contains(r)).collect();
                format!("barrier {g}: ranks {missing:?} did not arrive")
            },
            async move {
                let opts = PutOptions::new().with_lease(linger);
                client
                    .put(format!("{prefix}{rank}"), "", Some(opts))
                    .await
                    .map_err(etcd)?;
                let resp = client
                    .get(
                        prefix.as_str(),
                        Some(GetOptions::new().with_prefix().with_keys_only()),
                    )
                    .await
                    .map_err(etcd)?;
                let rev = resp.header().map_or(0, |h| h.revision());
                let note = |arrived: &BTreeSet<u32>| {
                    arrived.clone_into(&mut seen.lock().unwrap_or_else(|p| p.into_inner()));
                };
                let mut arrived = BTreeSet::new();
                arrived.extend(
                    resp.kvs()
                        .iter()
                        .filter_map(|kv| rank_after(kv.key(), &prefix)),
                );
                note(&arrived);
                if arrived.len() as u32 >= size {
                    return Ok(Vec::new());
                }
                // Events come in revision order: a rank's arrival is seen
                // before its lease's end, so a rank that passed the
                // barrier and left is never taken for a dead one.
                watch_from(&mut client, &root, rev, |ty, key, _| {
                    if ty == EventType::Put
                        && let Some(r) = rank_after(key, &prefix)
                    {
                        arrived.insert(r);
                        note(&arrived);
                        if arrived.len() as u32 >= size {
                            return Seen::Done(Vec::new());
                        }
                    }
                    if ty == EventType::Delete
                        && let Some(r) = rank_after(key, &members)
                        && !arrived.contains(&r)
                    {
                        return Seen::Gone(r);
                    }
                    Seen::Nothing
                })
                .await
            },
        )
        .map(drop)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.keeper.abort();
        if not_in_runtime().is_ok() {
            let mut client = self.client.clone();
            let lease = self.lease;
            // Best effort: if etcd is gone the lease expires by itself.
            self.rt.block_on(async move {
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(lease)).await;
            });
        }
    }
}
