//! The worker's drivers, as the engine holds them: each with its
//! capabilities and whether it offers the direct path, both read once (the
//! data path consults them for every SQE), and the sleep handshake with
//! all of them ([`Driver::prepare_sleep`], [`Driver::woke`]).

use crate::driver::{Capabilities, Driver, DriverContext, Sleep};
use crate::sys::notify::NotifyPool;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

/// The drivers, indexed as in the worker's address (`Endpoint::driver`).
#[derive(Debug)]
pub(crate) struct DriverSet {
    list: Vec<Box<dyn Driver>>,
    capabilities: Vec<Capabilities>,
    /// Which drivers offer the direct path ([`Driver::direct`]).
    direct: Vec<bool>,
    /// Per driver: its last [`Driver::prepare_sleep`] answered
    /// [`Sleep::WhenIdle`].
    when_idle: Vec<bool>,
    /// The drivers were asked to prepare for sleep, and not yet told they
    /// woke.
    sleep_prepared: bool,
}

/// What the drivers answered to [`DriverSet::prepare_sleep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SleepAnswer {
    /// One answered [`Sleep::NotNow`].
    StayUp,
    /// They may all sleep, for at most this long (`None`: until woken);
    /// `when_idle` says whether one of them answered [`Sleep::WhenIdle`]
    /// (it sleeps only if nothing of its is in flight).
    Sleep {
        timeout: Option<Duration>,
        when_idle: bool,
    },
}

impl DriverSet {
    /// Attaches every driver to the worker (`notify`: where incoming
    /// notifications go) and reads what it offers.
    pub(super) fn attach(mut list: Vec<Box<dyn Driver>>, notify: &Arc<NotifyPool>) -> DriverSet {
        for d in &mut list {
            d.attach(DriverContext {
                notify: notify.clone(),
            });
        }
        let capabilities = list.iter().map(|d| d.capabilities()).collect();
        let direct = list.iter_mut().map(|d| d.direct().is_some()).collect();
        let when_idle = vec![false; list.len()];
        DriverSet {
            list,
            capabilities,
            direct,
            when_idle,
            sleep_prepared: false,
        }
    }

    /// Driver `d`'s capabilities.
    pub(super) fn caps(&self, d: usize) -> &Capabilities {
        &self.capabilities[d]
    }

    /// Whether driver `d` offers the direct path.
    pub(super) fn has_direct(&self, d: usize) -> bool {
        self.direct[d]
    }

    /// Whether driver `d` answered [`Sleep::WhenIdle`] to the last
    /// [`prepare_sleep`](DriverSet::prepare_sleep).
    pub(super) fn when_idle(&self, d: usize) -> bool {
        self.when_idle[d]
    }

    /// The end of a round: every driver submits what the round posted and
    /// flushed ([`Driver::commit`]).
    pub(super) fn commit(&mut self) {
        for d in &mut self.list {
            d.commit();
        }
    }

    /// Asks every driver to prepare for sleep. Unless the answer is
    /// [`SleepAnswer::StayUp`] (they were then told they woke), [`woke`]
    /// must follow.
    ///
    /// [`woke`]: DriverSet::woke
    pub(super) fn prepare_sleep(&mut self) -> SleepAnswer {
        let mut timeout: Option<Duration> = None;
        let mut stay = false;
        let mut when_idle = false;
        self.sleep_prepared = true;
        for (d, driver) in self.list.iter_mut().enumerate() {
            let answer = driver.prepare_sleep();
            self.when_idle[d] = answer == Sleep::WhenIdle;
            match answer {
                Sleep::Ready => {}
                Sleep::WhenIdle => when_idle = true,
                Sleep::Within(t) => timeout = Some(timeout.map_or(t, |old| old.min(t))),
                Sleep::NotNow => stay = true,
            }
        }
        if stay {
            self.woke();
            return SleepAnswer::StayUp;
        }
        SleepAnswer::Sleep { timeout, when_idle }
    }

    /// Tells every driver that the core thread is up again
    /// ([`Driver::woke`]); nothing if they were not asked to prepare.
    pub(super) fn woke(&mut self) {
        if std::mem::take(&mut self.sleep_prepared) {
            for driver in &mut self.list {
                driver.woke();
            }
        }
    }

    /// Drops every driver (teardown: no peer may reach this worker's
    /// memory again). What they offered stays readable: validation after
    /// shutdown still consults it before it refuses the SQE.
    pub(super) fn clear(&mut self) {
        self.list.clear();
    }
}

impl Deref for DriverSet {
    type Target = [Box<dyn Driver>];

    fn deref(&self) -> &Self::Target {
        &self.list
    }
}

impl DerefMut for DriverSet {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.list
    }
}
