//! The driver conformance suite (`ringfence_testkit::conformance`) over
//! every driver: loopback (both completion modes), shm, tcp over
//! 127.0.0.1, and the test kit's SimDriver and FaultInjector over
//! loopback. One module per driver, each the whole suite.

use ringfence::{CompletionMode, Loopback};
use ringfence_testkit::conformance::{Drivers, Subject};
use ringfence_testkit::{FaultHandle, FaultInjector, SimDriver, SimHandle, SimTiming, Timing};

mod loopback {
    use super::*;
    ringfence_testkit::conformance_suite!(Drivers(Loopback::new));
}

mod loopback_next_poll {
    use super::*;
    ringfence_testkit::conformance_suite!(Drivers(|| Loopback::with_mode(
        CompletionMode::NextPoll
    )));
}

mod shm {
    ringfence_testkit::conformance_suite!(ringfence_testkit::conformance::Drivers(|| {
        ringfence_shm::Shm::new().expect("the shm driver")
    }));
}

mod tcp {
    ringfence_testkit::conformance_suite!(ringfence_testkit::conformance::Drivers(|| {
        ringfence_tcp::Tcp::builder()
            .ignore_env()
            .build()
            .expect("the tcp driver")
    }));
}

/// `SimDriver` over an immediate loopback on both workers, operations
/// completing a seeded 1 to 4 polls after their commit; its verdict: no
/// contract violation on either side.
#[derive(Debug, Default)]
struct Sim {
    handles: Vec<SimHandle>,
}

impl Subject for Sim {
    type Driver = SimDriver<Loopback>;

    fn driver(&mut self) -> SimDriver<Loopback> {
        let (driver, handle) = SimDriver::new(Loopback::with_mode(CompletionMode::Immediate));
        handle.set_timing(SimTiming::PollsBetween(1, 4));
        handle.connect_polls(2);
        handle.seed(0x51 + self.handles.len() as u64);
        self.handles.push(handle);
        driver
    }

    fn verdict(&mut self) {
        for h in &self.handles {
            assert_eq!(h.violations(), Vec::<String>::new(), "SimDriver violations");
            assert_eq!(h.stats().executed_uncommitted, 0);
        }
    }
}

mod sim {
    ringfence_testkit::conformance_suite!(super::Sim::default());
}

/// `FaultInjector` over an immediate loopback on both workers; its
/// verdict: it holds nothing once the workers are gone.
#[derive(Debug)]
struct Fault {
    timing: Timing,
    /// Unordered lanes (by index), with a delay on lane 2.
    unordered: u64,
    handles: Vec<FaultHandle>,
}

impl Fault {
    fn new(timing: Timing, unordered: u64) -> Fault {
        Fault {
            timing,
            unordered,
            handles: Vec::new(),
        }
    }
}

impl Subject for Fault {
    type Driver = FaultInjector<Loopback>;

    fn driver(&mut self) -> FaultInjector<Loopback> {
        let (driver, handle) = FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate));
        handle.set_timing(self.timing);
        handle.seed(0xfa + self.handles.len() as u64);
        if self.unordered != 0 {
            handle.set_unordered(self.unordered);
            handle.set_lane_timing(2, Timing::Delayed(3));
        }
        self.handles.push(handle);
        driver
    }

    fn verdict(&mut self) {
        for h in &self.handles {
            assert_eq!(h.held(), 0, "the injector still holds operations");
        }
    }
}

mod fault_reordered {
    ringfence_testkit::conformance_suite!(super::Fault::new(
        ringfence_testkit::Timing::Reordered,
        0
    ));
}

mod fault_unordered {
    ringfence_testkit::conformance_suite!(super::Fault::new(
        ringfence_testkit::Timing::NextPoll,
        0b1110
    ));
}
