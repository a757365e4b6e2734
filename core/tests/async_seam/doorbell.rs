//! One doorbell per round: the engine commits once per progress round, and
//! nothing executes before the commit.

use crate::{BIG, SLOT, initiator, target};
use ringfence::EndpointState;
use ringfence_ring::{RemoteBuf, Sqe};
use ringfence_testkit::SimTiming;

/// (d) One doorbell per round, and nothing executes before it: the engine
/// calls `commit` exactly once per progress round (idle ones included),
/// and an operation posted in a round executes no earlier than the next
/// round's poll, even with the shortest timing.
#[test]
fn nothing_executes_before_the_rounds_commit() {
    let (t, window) = target(4096);
    let (w, sim) = initiator(4);
    sim.set_timing(SimTiming::Polls(0));
    sim.connect_polls(1);
    let ep = w.connect(t.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(4096).unwrap();
    let mut qp = w.create_queue().unwrap();
    let before = sim.commits();
    let mut rounds = 0;
    // Round 1 finishes the handshake.
    w.progress();
    rounds += 1;
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connected);
    let remote = |slot: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr() + slot * SLOT,
    };
    for batch in 0..20u64 {
        let sqes: Vec<Sqe> = (0..8)
            .map(|k| {
                let slot = batch * 8 + k;
                let len = if k % 2 == 0 { 8 } else { BIG };
                Sqe::put(ep.as_raw(), src.local(0), remote(slot % 60), len).with_user_data(slot)
            })
            .collect();
        qp.push_batch(&sqes).unwrap();
        qp.submit();
        let executed = sim.stats().executed;
        // The round that takes them posts them; its commit comes after its
        // poll, so none can have executed when it returns.
        w.progress();
        rounds += 1;
        assert_eq!(sim.stats().posted, (batch + 1) * 8);
        assert_eq!(
            sim.stats().executed,
            executed,
            "executed in its posting round"
        );
        // The next round's poll runs them.
        w.progress();
        rounds += 1;
        assert_eq!(sim.stats().executed, executed + 8);
        let mut got = 0;
        while qp.pop().unwrap().is_some() {
            got += 1;
        }
        assert_eq!(got, 8);
    }
    for _ in 0..10 {
        w.progress(); // idle rounds ring the doorbell too (for nothing)
        rounds += 1;
    }
    assert_eq!(sim.commits() - before, rounds, "one commit per round");
    assert_eq!(sim.stats().executed_uncommitted, 0);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}
