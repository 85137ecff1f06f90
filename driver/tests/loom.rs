//! loom models of the signal protocol, over the host backend's own pad code.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p symm-driver --test loom` (what
//! `cargo xtask test` does). Each model runs with the protocol's orderings (release signal,
//! acquire wait) and must pass, and again with both weakened to relaxed, where loom must find an
//! execution that breaks it (those tests expect the failure).
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Bounded exploration: at most two preemptions per execution (as tokio's loom CI runs), which
/// keeps every model to seconds while still finding each relaxed-ordering failure below.
fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(f);
}
use symm_core::op::SignalOp;
use symm_core::signal::wait_satisfied;
use symm_driver::host::pad::{Orderings, Pad};

/// Spins (yielding to loom) until `slot` of `pad` reaches `expected + count`, then advances
/// `expected`, exactly as the executor's `Wait` does.
fn wait(pad: &Pad, slot: u32, expected: &mut u64, count: u64, o: Orderings) {
    loop {
        let v = pad.load(slot, o).expect("slot exists");
        if wait_satisfied(v, *expected, count) {
            *expected += count;
            return;
        }
        thread::yield_now();
    }
}

/// Data written before a signal is visible after the matching wait.
fn signal_then_wait(o: Orderings) {
    model(move || {
        let pads: Arc<[Pad; 2]> = Arc::new([Pad::new(1), Pad::new(1)]);
        let data = Arc::new(UnsafeCell::new(0u64));
        let (p, d) = (pads.clone(), data.clone());
        let t = thread::spawn(move || {
            // SAFETY (model): the write happens before the signal; loom checks the claim.
            d.with_mut(|x| unsafe { *x = 42 });
            p[1].signal(0, SignalOp::Add, 1, o).unwrap();
        });
        let mut expected = 0;
        wait(&pads[1], 0, &mut expected, 1, o);
        // SAFETY (model): the read happens after the matching wait; loom checks the claim.
        let v = data.with(|x| unsafe { *x });
        assert_eq!(v, 42);
        t.join().unwrap();
    });
}

#[test]
fn signal_makes_prior_writes_visible() {
    signal_then_wait(Orderings::PROTOCOL);
}

#[test]
#[should_panic]
fn relaxed_signal_loses_prior_writes() {
    signal_then_wait(Orderings::RELAXED);
}

/// Repeated barriers (whole, or split with work between arrive and wait) over per-peer monotone
/// counters: no rank passes generation g before every rank entered it, and generations never mix.
fn barriers(ranks: usize, gens: u64, split: bool, o: Orderings) {
    model(move || {
        let pads: Arc<Vec<Pad>> = Arc::new((0..ranks).map(|_| Pad::new(ranks)).collect());
        let entered: Arc<Vec<AtomicU64>> =
            Arc::new((0..ranks).map(|_| AtomicU64::new(0)).collect());
        let handles: Vec<_> = (0..ranks)
            .map(|me| {
                let (pads, entered) = (pads.clone(), entered.clone());
                thread::spawn(move || {
                    let mut expected = vec![0u64; ranks];
                    for g in 1..=gens {
                        entered[me].store(g, Ordering::Relaxed);
                        for (q, pad) in pads.iter().enumerate() {
                            if q != me {
                                pad.signal(me as u32, SignalOp::Add, 1, o).unwrap();
                            }
                        }
                        if split {
                            thread::yield_now();
                        }
                        for (q, e) in expected.iter_mut().enumerate() {
                            if q != me {
                                wait(&pads[me], q as u32, e, 1, o);
                            }
                        }
                        for (q, e) in entered.iter().enumerate() {
                            let seen = e.load(Ordering::Relaxed);
                            assert!(seen >= g, "rank {me} passed generation {g} before rank {q} entered it (saw {seen})");
                            assert!(seen <= g + 1, "rank {q} is two generations ahead");
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn whole_barriers_never_pass_early_2_ranks_3_generations() {
    barriers(2, 3, false, Orderings::PROTOCOL);
}

#[test]
fn split_barriers_never_pass_early_2_ranks_3_generations() {
    barriers(2, 3, true, Orderings::PROTOCOL);
}

#[test]
#[should_panic]
fn relaxed_barriers_pass_early() {
    barriers(2, 2, false, Orderings::RELAXED);
}

/// A ring step with credits: the sender streams 3 chunks through 2 scratch slots of the
/// receiver, reusing a slot only after the receiver's credit for the chunk that used it.
fn ring_credits(o: Orderings) {
    const CHUNKS: u64 = 3;
    const SLOTS: u64 = 2;
    model(move || {
        // Pad slot 0: data (receiver's pad), slot 1: credit (sender's pad).
        let pads: Arc<[Pad; 2]> = Arc::new([Pad::new(2), Pad::new(2)]);
        let scratch: Arc<Vec<UnsafeCell<u64>>> =
            Arc::new((0..SLOTS).map(|_| UnsafeCell::new(0)).collect());
        let (p, s) = (pads.clone(), scratch.clone());
        let sender = thread::spawn(move || {
            let mut credits = 0;
            for j in 0..CHUNKS {
                if j >= SLOTS {
                    wait(&p[0], 1, &mut credits, 1, o);
                }
                // SAFETY (model): the slot is free once its credit arrived; loom checks it.
                s[(j % SLOTS) as usize].with_mut(|x| unsafe { *x = 100 + j });
                p[1].signal(0, SignalOp::Add, 1, o).unwrap();
            }
        });
        let mut data = 0;
        for j in 0..CHUNKS {
            wait(&pads[1], 0, &mut data, 1, o);
            // SAFETY (model): the chunk was signalled; loom checks it.
            let v = scratch[(j % SLOTS) as usize].with(|x| unsafe { *x });
            assert_eq!(v, 100 + j, "chunk {j} was overwritten before it was read");
            if j + SLOTS < CHUNKS {
                pads[0].signal(1, SignalOp::Add, 1, o).unwrap();
            }
        }
        sender.join().unwrap();
    });
}

#[test]
fn ring_credits_never_overwrite_unread_scratch() {
    ring_credits(Orderings::PROTOCOL);
}

#[test]
#[should_panic]
fn relaxed_ring_credits_overwrite_unread_scratch() {
    ring_credits(Orderings::RELAXED);
}

/// Three ranks: two producers write their data and signal the consumer's per-peer slots; the
/// consumer waits for each and reads both (the first step of a one-shot or direct reduce).
fn fan_in(o: Orderings) {
    model(move || {
        let pads: Arc<[Pad; 3]> = Arc::new([Pad::new(3), Pad::new(3), Pad::new(3)]);
        let data: Arc<[UnsafeCell<u64>; 2]> = Arc::new([UnsafeCell::new(0), UnsafeCell::new(0)]);
        let producers: Vec<_> = (0..2u32)
            .map(|me| {
                let (p, d) = (pads.clone(), data.clone());
                thread::spawn(move || {
                    // SAFETY (model): written before the signal; loom checks the claim.
                    d[me as usize].with_mut(|x| unsafe { *x = 10 + me as u64 });
                    p[2].signal(me, SignalOp::Add, 1, o).unwrap();
                })
            })
            .collect();
        let mut expected = [0u64; 2];
        for (q, e) in expected.iter_mut().enumerate() {
            wait(&pads[2], q as u32, e, 1, o);
        }
        // SAFETY (model): read after both waits; loom checks the claim.
        let sum: u64 = data.iter().map(|c| c.with(|x| unsafe { *x })).sum();
        assert_eq!(sum, 21);
        for h in producers {
            h.join().unwrap();
        }
    });
}

#[test]
fn fan_in_of_three_ranks_sees_every_contribution() {
    fan_in(Orderings::PROTOCOL);
}

#[test]
#[should_panic]
fn relaxed_fan_in_misses_a_contribution() {
    fan_in(Orderings::RELAXED);
}
