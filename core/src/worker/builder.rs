//! Building a worker: its configuration and drivers.

use super::*;

/// Builds a [`Worker`].
///
/// Setters take `&mut self` and return `&mut Self`; [`build`](Self::build)
/// applies the `RINGFENCE_*` environment overrides (see [`Config`]) on top.
#[derive(Debug, Default)]
pub struct WorkerBuilder {
    pub(super) config: Config,
    pub(super) drivers: Vec<Box<dyn Driver>>,
    pub(super) ignore_env: bool,
}

impl WorkerBuilder {
    /// Adds a driver; earlier drivers are preferred when connecting.
    pub fn driver(&mut self, driver: impl Driver) -> &mut Self {
        self.drivers.push(Box::new(driver));
        self
    }

    /// SQ and CQ entries of each queue pair.
    pub fn ring_entries(&mut self, sq: u32, cq: u32) -> &mut Self {
        self.config.sq_entries = sq;
        self.config.cq_entries = cq;
        self
    }

    /// Requests in flight per queue pair.
    pub fn requests(&mut self, requests: u32) -> &mut Self {
        self.config.requests = requests;
        self
    }

    /// Lanes per endpoint (capped by the driver).
    pub fn lanes(&mut self, lanes: u8) -> &mut Self {
        self.config.lanes = lanes;
        self
    }

    /// Notification buffers: `count` of `size` bytes, allocated (as one
    /// region counted against the memory limit, see
    /// [`limits`](crate::limits)) when the worker is built. A large pool is
    /// an anonymous mapping the kernel zeroes page by page as buffers are
    /// first used: building does not touch it.
    pub fn notify_buffers(&mut self, count: u32, size: u32) -> &mut Self {
        self.config.notify_buffers = count;
        self.config.notify_size = size;
        self
    }

    /// PUT/GET size from which bandwidth lanes are used.
    pub fn bw_threshold(&mut self, bytes: u32) -> &mut Self {
        self.config.bw_threshold = bytes;
        self
    }

    /// How long dropping the worker waits, progressing its drivers, for
    /// those whose teardown answers "not yet" ([`Config::quiesce_timeout`],
    /// default 10 s); after it their registered memory is leaked, never
    /// freed.
    pub fn quiesce_timeout(&mut self, timeout: std::time::Duration) -> &mut Self {
        self.config.quiesce_timeout = timeout;
        self
    }

    /// Ignores `RINGFENCE_*` variables (tests that must not be steered by
    /// the environment).
    pub fn ignore_env(&mut self) -> &mut Self {
        self.ignore_env = true;
        self
    }

    /// Builds the worker; the drivers move into it.
    ///
    /// # Errors
    /// [`Error::Config`] for a malformed environment variable,
    /// [`Error::InvalidConfig`] for a bad builder value, [`Error::Drivers`]
    /// if no driver is left, `RINGFENCE_DRIVERS` names one not provided, a
    /// driver's capabilities are unusable (`Capabilities::invalid`), two
    /// drivers share a name, or a name is empty or longer than 255 bytes
    /// (the worker address and packed keys hold it with a one-byte
    /// length); [`Error::Driver`] with [`Status::InvalidArgument`] if a
    /// driver's address part is longer than 65,535 bytes (its length is a
    /// `u16` in the worker address); [`Error::MemoryLimit`] (status
    /// [`Status::NoMemory`]) if the notification buffers exceed the memory
    /// limit, which is read again here ([`limits::memory_limit`]).
    pub fn build(&mut self) -> Result<Worker, Error> {
        let mut config = self.config.clone();
        if !self.ignore_env {
            config.apply_env(|var| std::env::var(var).ok())?;
        }
        config.validate()?;
        // Read the limit at creation (the control path), for this build and
        // for later allocations; a pool beyond it fails before anything is
        // set up.
        limits::refresh();
        let (count, size) = (config.notify_buffers, config.notify_size);
        let pool =
            NotifyPool::bytes(count, size).map_err(Error::status_of("notification buffers"))?;
        let reservation = match pool {
            0 => None,
            _ => Some(limits::reserve(pool).map_err(|source| Error::MemoryLimit {
                op: "notification buffers",
                source,
            })?),
        };
        let mut drivers = std::mem::take(&mut self.drivers);
        if let Some(names) = &config.drivers {
            let mut chosen = Vec::new();
            for name in names {
                let i = drivers
                    .iter()
                    .position(|d| d.name() == name)
                    .ok_or_else(|| {
                        let known: Vec<&str> = drivers.iter().map(|d| d.name()).collect();
                        Error::Drivers(format!(
                            "RINGFENCE_DRIVERS names {name:?}; this program provides {known:?}"
                        ))
                    })?;
                chosen.push(drivers.remove(i));
            }
            drivers = chosen;
        }
        if drivers.is_empty() {
            return Err(Error::Drivers("a worker needs at least one driver".into()));
        }
        for d in &drivers {
            if let Some(why) = d.capabilities().invalid() {
                return Err(Error::Drivers(format!("driver {:?}: {why}", d.name())));
            }
        }
        for (i, d) in drivers.iter().enumerate() {
            if drivers[..i].iter().any(|e| e.name() == d.name()) {
                return Err(Error::Drivers(format!(
                    "two drivers are named {:?}: names tag a worker's address and keys",
                    d.name()
                )));
            }
        }
        if drivers.len() > usize::from(u8::MAX) {
            return Err(Error::Drivers("at most 255 drivers".into()));
        }
        let notify = Arc::new(
            NotifyPool::reserved(count, size, reservation)
                .map_err(Error::status_of("notification buffers"))?,
        );
        let sq_bell = Arc::new(Doorbell::new().map_err(|source| Error::Os {
            op: "eventfd",
            source,
        })?);
        notify.set_waker(sq_bell.clone());
        let engine = Engine::new(config, drivers, notify.clone());
        let address = encode_address(&engine.drivers)?;
        let drivers = engine
            .drivers
            .iter()
            .map(|d| DriverInfo {
                name: d.name(),
                caps: d.capabilities(),
                prepare: d.prepare(),
            })
            .collect();
        tracing::debug!(drivers = ?engine.drivers.iter().map(|d| d.name()).collect::<Vec<_>>(), "worker built");
        Ok(Worker {
            shared: Arc::new(Shared {
                engine: Mutex::new(engine),
                sq_bell,
                notify,
                shut_down: AtomicBool::new(false),
                core_naps: Default::default(),
                core_running: AtomicBool::new(false),
                drivers,
            }),
            core: None,
            address,
        })
    }
}
