//! Loom models of the call signature check (`symm_core::sched::Signature::check`, run by
//! `symm_host::run_calls` and meant for every executor's entry): each rank publishes its call's
//! word in word `k mod 2` before its signal of call `k`, waits for its peer's signal of call
//! `k`, then checks the peer's word `k mod 2`. Two ranks, three calls back to back with no
//! barrier: agreeing calls never fire, in any interleaving, even when consecutive calls differ
//! (the peer may already have published its next call); a call that differs on one rank fires
//! on both. The weakened protocol (one word per rank, compared whole) is shown to fire on
//! agreeing calls, so the model can tell. The GPU's variant (`kernels/symm/signature.cuh`) pushes the
//! word into the peer's memory instead (a relaxed store ordered by the signal's release) and
//! reads what its peer pushed to it while it waits and after: modelled too, with the same
//! results.

#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Differs, Request, Signature};

fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(f);
}

/// How the words are kept and compared.
#[derive(Clone, Copy, PartialEq)]
enum Protocol {
    /// Two words per rank (call `k` in word `k mod 2`), [`Signature::check`].
    Parity,
    /// One word per rank, compared whole (no sequence number): the weakened protocol.
    OneWordWhole,
    /// The GPU's: each rank pushes its word for call `k` into the peer's word `k mod 2` (the
    /// peer's memory), and checks the word its peer pushed to it while it waits and after.
    Push,
}

struct Shared {
    /// Each rank's signature words.
    words: [[AtomicU64; 2]; 2],
    /// Signals each rank received from the other (its entry signals, one per call).
    signals: [AtomicU64; 2],
    /// What each rank's checks named: (call, what differs).
    fired: Mutex<Vec<(u16, u64, Differs)>>,
}

fn calls_of(rank: u16, differ_at: Option<usize>) -> Vec<Request> {
    let ar = Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        2,
        64,
        DType::F32,
        ReduceOp::Sum,
    );
    let ag = Request {
        collective: Collective::AllGather,
        algorithm: Algorithm::Ring,
        ..ar
    };
    // Consecutive calls differ, so a peer already at its next call has another word.
    let mut calls = vec![ar, ag, ar];
    if let Some(k) = differ_at.filter(|_| rank == 1) {
        calls[k] = Request {
            bytes: 128,
            ..calls[k]
        };
    }
    calls
}

fn rank(sh: &Shared, me: u16, calls: &[Request], p: Protocol) {
    let peer = 1 - me;
    for (k, req) in calls.iter().enumerate() {
        let k = k as u64;
        let sig = req.signature(k);
        let word = match p {
            Protocol::Parity | Protocol::Push => (k % 2) as usize,
            Protocol::OneWordWhole => 0,
        };
        let fire = |d: Differs| sh.fired.lock().unwrap().push((me, k, d));
        if p == Protocol::Push {
            sh.words[peer as usize][word].store(sig.0, Ordering::Relaxed);
        } else {
            sh.words[me as usize][word].store(sig.0, Ordering::Release);
        }
        sh.signals[peer as usize].fetch_add(1, Ordering::Release);
        let mut fired = false;
        while sh.signals[me as usize].load(Ordering::Acquire) < k + 1 {
            if p == Protocol::Push && !fired {
                // A spinning wait reads what the peer pushed so far.
                let theirs = Signature(sh.words[me as usize][word].load(Ordering::Relaxed));
                if let Some(d) = (theirs.0 != 0).then(|| sig.check(theirs)).flatten() {
                    fire(d);
                    fired = true;
                }
            }
            thread::yield_now();
        }
        let theirs = match p {
            Protocol::Push => Signature(sh.words[me as usize][word].load(Ordering::Relaxed)),
            _ => Signature(sh.words[peer as usize][word].load(Ordering::Acquire)),
        };
        let found = match p {
            Protocol::Parity | Protocol::Push => sig.check(theirs),
            Protocol::OneWordWhole => (theirs != sig).then(|| sig.differs(theirs)),
        };
        if let (Some(d), false) = (found, fired) {
            fire(d);
        }
    }
}

/// Runs the model; returns nothing, asserts `expect` on what fired in every execution.
fn run(p: Protocol, differ_at: Option<usize>, expect: fn(&[(u16, u64, Differs)])) {
    model(move || {
        let sh = Arc::new(Shared {
            words: Default::default(),
            signals: Default::default(),
            fired: Mutex::new(Vec::new()),
        });
        let t: Vec<_> = (0..2u16)
            .map(|me| {
                let sh = sh.clone();
                thread::spawn(move || rank(&sh, me, &calls_of(me, differ_at), p))
            })
            .collect();
        for h in t {
            h.join().unwrap();
        }
        expect(&sh.fired.lock().unwrap());
    });
}

#[test]
fn agreeing_calls_never_fire_2_ranks_3_calls_without_barriers() {
    run(Protocol::Parity, None, |fired| {
        assert!(fired.is_empty(), "{fired:?}");
    });
}

/// Call 1 differs in its size on rank 1: both ranks name it there, and nothing else fires.
fn fired_on_both_at_call_one(fired: &[(u16, u64, Differs)]) {
    let at_one: Vec<u16> = fired
        .iter()
        .filter(|f| f.1 == 1 && f.2 == Differs::SIZE)
        .map(|f| f.0)
        .collect();
    assert!(at_one.contains(&0) && at_one.contains(&1), "{fired:?}");
    assert!(fired.iter().all(|f| f.1 == 1), "{fired:?}");
}

#[test]
fn a_call_that_differs_on_one_rank_fires_on_both_ranks_at_that_call() {
    run(Protocol::Parity, Some(1), fired_on_both_at_call_one);
}

#[test]
fn pushed_words_never_fire_on_agreeing_calls_2_ranks_3_calls_without_barriers() {
    run(Protocol::Push, None, |fired| {
        assert!(fired.is_empty(), "{fired:?}");
    });
}

#[test]
fn a_pushed_word_that_differs_fires_on_both_ranks_at_that_call() {
    run(Protocol::Push, Some(1), fired_on_both_at_call_one);
}

#[test]
fn one_word_compared_whole_fires_on_agreeing_calls() {
    // The peer publishes its next call over the word before this rank reads it: loom finds it.
    let found = std::panic::catch_unwind(|| {
        run(Protocol::OneWordWhole, None, |fired| {
            assert!(fired.is_empty(), "{fired:?}");
        })
    });
    assert!(
        found.is_err(),
        "the weakened protocol must fire on agreeing calls"
    );
}
