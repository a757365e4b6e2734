//! The core thread's sleep and wake-ups: through the SQ doorbell, through a
//! driver's wake descriptor while operations are in flight, and on to an
//! application that sleeps on its CQ eventfd.
//!
//! Nothing here synchronizes by sleeping or asserts on timing: threads wait
//! for conditions, and every wait has a generous deadline that only a hang
//! (a lost wake-up) reaches.
//!
//! `Device` is a driver whose operations finish on their own, as a NIC's
//! do: `post` queues the operation, `commit` hands the round's operations
//! to a device thread, which performs each copy later (when its gate is
//! open), publishes the completion and signals an eventfd, the driver's
//! wake descriptor. `poll` clears the eventfd first and then takes the
//! published completions, so one published after the clear leaves it
//! readable: a level-triggered descriptor, which needs no arming.
//!
//! `Device::one_shot` is the other kind, the kind a verbs completion
//! channel is: two descriptors (one per completion queue, jobs alternate
//! between them), signalled only when armed. `prepare_sleep` arms them
//! and then looks once more (not now if something finished meanwhile);
//! the device signals the first completion after the arming, once; `woke`
//! acknowledges and disarms. A busy-polling core thread arms nothing.

use ringfence::{CompletionMode, Driver, Loopback, QueuePair, RegisteredBuf, Worker};
use ringfence_ring::{RemoteBuf, Sqe};
use ringfence_testkit::{FaultInjector, SimDriver, SimTiming, Timing};
use std::time::{Duration, Instant};

/// Longer than any wait can take on a loaded machine unless a wake-up was
/// lost.
const HANG: Duration = Duration::from_secs(60);

mod device;

use device::Device;

/// A worker over `driver` with its core thread, a queue pair, and a
/// window PUTs land in through an endpoint to itself.
struct Rig {
    worker: Worker,
    qp: QueuePair,
    window: RegisteredBuf,
    src: RegisteredBuf,
    put: Sqe,
}

impl Rig {
    fn new(driver: impl Driver) -> Rig {
        let mut worker = Worker::builder()
            .driver(driver)
            .ignore_env()
            .build()
            .unwrap();
        let window = worker.alloc_registered(4096).unwrap();
        let ep = worker.connect(worker.address()).unwrap();
        let rkey = worker
            .unpack_rkey(ep, &worker.pack_rkey(window.handle()).unwrap())
            .unwrap();
        let src = worker.alloc_registered(64).unwrap();
        let put = Sqe::put(
            ep.as_raw(),
            src.local(0),
            RemoteBuf {
                rkey: rkey.as_raw(),
                addr: window.addr(),
            },
            8,
        );
        worker.start_core_thread(None).unwrap();
        let qp = worker.create_queue().unwrap();
        Rig {
            worker,
            qp,
            window,
            src,
            put,
        }
    }

    /// Waits until the core thread has gone to sleep more than `after`
    /// times and sleeps now; returns its sleep count.
    fn until_asleep(&self, after: u64) -> u64 {
        let deadline = Instant::now() + HANG;
        loop {
            let sleeps = self.worker.core_thread_sleeps();
            if sleeps > after && self.worker.is_core_thread_asleep() {
                return sleeps;
            }
            assert!(
                Instant::now() < deadline,
                "the core thread never went to sleep"
            );
            std::thread::yield_now();
        }
    }

    /// Sleeps on the CQ eventfd until a CQE is ready; returns it.
    fn wait_cqe(&mut self, what: &str) -> ringfence_ring::Cqe {
        assert!(
            self.qp.wait_cqe(Some(HANG)).unwrap(),
            "{what}: no CQE within {HANG:?}: a lost wake-up"
        );
        self.qp.pop().unwrap().expect("wait_cqe said one is ready")
    }

    fn window_word(&self) -> u64 {
        let mut bytes = [0u8; 8];
        self.window.read(0, &mut bytes);
        u64::from_le_bytes(bytes)
    }
}

/// Cycles of one PUT each, every one started while the core thread sleeps:
/// submit (the SQ doorbell wakes it), wait on the CQ eventfd, reap, and
/// wait for the core thread to sleep again.
fn sleep_wake_cycles(driver: impl Driver, cycles: u64) {
    let mut rig = Rig::new(driver);
    let mut sleeps = 0;
    for i in 1..=cycles {
        sleeps = rig.until_asleep(sleeps);
        rig.src.write(0, &i.to_le_bytes());
        rig.qp.push(rig.put.with_user_data(i)).unwrap();
        rig.qp.submit();
        let cqe = rig.wait_cqe(&format!("cycle {i}"));
        assert_eq!((cqe.user_data, cqe.res), (i, 8), "cycle {i}");
        assert_eq!(rig.window_word(), i, "cycle {i}: the PUT landed");
    }
    assert!(rig.worker.core_thread_sleeps() >= cycles);
}

#[test]
fn ten_thousand_sleep_wake_cycles_through_the_sq_doorbell() {
    sleep_wake_cycles(Loopback::new(), 10_000);
}

#[test]
fn ten_thousand_sleep_wake_cycles_with_an_asynchronous_driver() {
    // The core thread may also sleep with the PUT in flight at the device;
    // the device's descriptor wakes it then.
    let (device, _handle) = Device::new(true);
    sleep_wake_cycles(device, 10_000);
}

/// The core thread sleeps with a PUT in flight at the device; the device
/// finishes it on its own; the application, asleep on its CQ eventfd,
/// wakes with the CQE.
#[test]
fn a_driver_completion_wakes_the_core_thread_and_the_application() {
    let (device, handle) = Device::new(false);
    let mut rig = Rig::new(device);
    rig.src.write(0, &0x5eed_u64.to_le_bytes());
    rig.qp.push(rig.put.with_user_data(7)).unwrap();
    rig.qp.submit();
    // The device has the PUT (behind its closed gate), and the core thread
    // has gone to sleep since: with the PUT in flight.
    let deadline = Instant::now() + HANG;
    while handle.received() == 0 {
        assert!(
            Instant::now() < deadline,
            "the PUT never reached the device"
        );
        std::thread::yield_now();
    }
    // The core thread was awake when it handed the PUT over (`received`
    // is read with Acquire, after its Release in `commit`): asleep from
    // now on means asleep with the PUT in flight.
    while !rig.worker.is_core_thread_asleep() {
        assert!(
            Instant::now() < deadline,
            "the core thread never went to sleep"
        );
        std::thread::yield_now();
    }
    assert!(
        rig.qp.arm_cq_doorbell().unwrap(),
        "no CQE can be ready: the device holds the PUT"
    );
    handle.open_gate();
    // Only the device's descriptor can wake the core thread now, and only
    // the core thread's CQE can ring the CQ doorbell.
    let rung = rig.qp.cq_doorbell().wait(Some(HANG)).unwrap();
    rig.qp.disarm_cq_doorbell();
    assert!(rung, "the CQ doorbell was never rung: a lost wake-up");
    let cqe = rig.qp.pop().unwrap().expect("a CQE after the doorbell");
    assert_eq!((cqe.user_data, cqe.res), (7, 8));
    assert_eq!(rig.window_word(), 0x5eed);
}

/// A queue pair created while the core thread sleeps: its SQ had no
/// NEED_WAKEUP when the core thread went to sleep, so creating it must wake
/// the core thread, or its first submit would wake nobody.
#[test]
fn a_queue_pair_created_while_the_core_thread_sleeps_is_served() {
    let mut rig = Rig::new(Loopback::new());
    let mut sleeps = 0;
    for i in 0..20 {
        // Each round starts with the core thread asleep; creating the
        // queue pair wakes it, so the next round waits for a later sleep.
        sleeps = rig.until_asleep(sleeps);
        let mut qp = rig.worker.create_queue().unwrap();
        qp.push(Sqe::nop().with_user_data(i)).unwrap();
        qp.submit();
        assert!(
            qp.wait_cqe(Some(HANG)).unwrap(),
            "queue pair {i}: a lost wake-up"
        );
        assert_eq!(qp.pop().unwrap().map(|c| c.user_data), Some(i));
    }
    rig.qp.push(Sqe::nop().with_user_data(99)).unwrap();
    rig.qp.submit();
    assert_eq!(rig.wait_cqe("the first queue pair").user_data, 99);
}

/// A driver without a wake descriptor (operations released by the fault
/// injector only inside its poll, after a wall-clock latency) keeps the core
/// thread polling while it has work in flight: if it slept, nothing would
/// ever complete the PUT.
#[test]
fn a_driver_without_a_wake_descriptor_keeps_the_core_thread_polling() {
    let (injector, faults) = FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate));
    faults.set_timing(Timing::Latency(Duration::from_millis(5)));
    let mut rig = Rig::new(injector);
    for i in 1..=20 {
        rig.qp.push(rig.put.with_user_data(i)).unwrap();
        rig.qp.submit();
        let cqe = rig.wait_cqe(&format!("PUT {i}"));
        assert_eq!((cqe.user_data, cqe.res), (i, 8));
    }
}

/// Stopping a sleeping core thread, and starting it again.
#[test]
fn a_sleeping_core_thread_stops_and_restarts() {
    let mut rig = Rig::new(Loopback::new());
    rig.until_asleep(0);
    rig.worker.stop_core_thread();
    assert!(!rig.worker.is_core_thread_asleep());
    rig.worker.start_core_thread(None).unwrap();
    rig.qp.push(Sqe::nop().with_user_data(5)).unwrap();
    rig.qp.submit();
    assert_eq!(rig.wait_cqe("after a restart").user_data, 5);
}

/// A one-shot driver with two descriptors (as verbs' completion channels):
/// the core thread sleeps with a PUT in flight, armed through
/// `prepare_sleep`, and the completion that lands on either descriptor
/// wakes it. Each wake comes from an arming (no descriptor is written while
/// nothing is armed: a busy-polling core thread asks for no interrupt),
/// and every `prepare_sleep` is followed by `woke`.
#[test]
fn a_one_shot_driver_wakes_the_core_thread_through_either_descriptor() {
    let (device, handle) = Device::one_shot(false);
    let mut rig = Rig::new(device);
    let mut sleeps = 0;
    for i in 1..=6u64 {
        handle.close_gate();
        rig.src.write(0, &i.to_le_bytes());
        let received = handle.received();
        rig.qp.push(rig.put.with_user_data(i)).unwrap();
        rig.qp.submit();
        let deadline = Instant::now() + HANG;
        while handle.received() == received {
            assert!(
                Instant::now() < deadline,
                "PUT {i} never reached the device"
            );
            std::thread::yield_now();
        }
        // Asleep after the hand-over: asleep with the PUT in flight, and
        // only the device can wake it.
        sleeps = rig.until_asleep(sleeps);
        handle.open_gate();
        let cqe = rig.wait_cqe(&format!("PUT {i}"));
        assert_eq!((cqe.user_data, cqe.res), (i, 8));
        assert_eq!(rig.window_word(), i);
    }
    rig.worker.stop_core_thread();
    let (prepares, wokes, signals) = handle.sleep_counts();
    assert_eq!(prepares, wokes, "every prepare_sleep is followed by woke");
    assert!(
        signals[0] >= 1 && signals[1] >= 1,
        "both descriptors woke the core thread: {signals:?}"
    );
    assert!(
        signals[0] + signals[1] <= prepares,
        "a signal without an arming"
    );
}

/// The test kit's `SimDriver` with a one-shot timer (`arm_on_sleep`): its
/// operations complete after a delay, and a core thread that sleeps
/// meanwhile is woken by the timer `prepare_sleep` armed. The timer is set
/// only when the core thread is about to sleep and disarmed when it woke:
/// no timer call per poll (a level-triggered SimDriver sets it at every
/// poll that has something pending).
#[test]
fn a_one_shot_simulated_driver_arms_its_timer_only_to_sleep() {
    let (sim, handle) = SimDriver::new(Loopback::with_mode(CompletionMode::Immediate));
    handle.arm_on_sleep(true);
    handle.set_timing(SimTiming::Delay(Duration::from_millis(2)));
    handle.connect_timing(SimTiming::Delay(Duration::from_millis(1)));
    let mut rig = Rig::new(sim);
    for i in 1..=20u64 {
        rig.src.write(0, &i.to_le_bytes());
        rig.qp.push(rig.put.with_user_data(i)).unwrap();
        rig.qp.submit();
        let cqe = rig.wait_cqe(&format!("PUT {i}"));
        assert_eq!((cqe.user_data, cqe.res), (i, 8));
        assert_eq!(rig.window_word(), i);
    }
    rig.worker.stop_core_thread();
    let stats = handle.stats();
    assert!(
        stats.timer_sets <= 2 * stats.sleeps_prepared,
        "the timer was set outside sleeps: {stats:?}"
    );
    assert!(stats.polls > stats.timer_sets, "{stats:?}");
    assert!(handle.violations().is_empty(), "{:?}", handle.violations());
}
