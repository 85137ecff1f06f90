//! loom models of the signal protocol, over the host backend's real path.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p symm-driver --test loom` (what
//! `cargo xtask test` does). Every model builds a [`WorldMem`] (buffers of relaxed atomics, signal
//! pads with the orderings of `symm_core::signal::order`) and runs each rank's ops on the generic
//! [`Executor`] over a [`RankFabric`], exactly as the simulator and the thread backend do: the
//! code under test is the code that runs, and the ops are core's (schedules, barriers) or written
//! like a user's plan. Only the driving loop is the model's: a blocked wait yields to loom.
//!
//! `cargo xtask mutants` weakens each ordering of the protocol to `Relaxed`, one at a time, and
//! runs these models: each weakening must make at least one of them fail.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::exec::{Executor, Step};
use symm_core::op::{Buf, Loc, Op, SignalOp};
use symm_core::sched::{Algorithm, Collective, Request, Schedule};
use symm_core::signal::{Barrier, SlotKind};
use symm_driver::host::{
    compare, random_inputs, reference, FlagStep, FlagStream, RankFabric, Temps, WorldMem, POISON,
};

/// Bounded exploration: at most two preemptions per execution (as tokio's loom CI runs), which
/// keeps every model to seconds while still finding each weakened ordering.
fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(f);
}

/// Runs one op stream per rank (stream i on rank `ranks[i]`), one loom thread each, on the
/// executor over the world's memory; a blocked wait yields. Returns the memory after all joined.
fn run(req: Request, inputs: Vec<Vec<u8>>, streams: Vec<(u16, Vec<Op>)>) -> Arc<WorldMem> {
    let mem = Arc::new(WorldMem::new(&req, &inputs, POISON).expect("model request is valid"));
    let slots = req.layout().slots() as usize;
    let handles: Vec<_> = streams
        .into_iter()
        .map(|(rank, ops)| {
            let mem = mem.clone();
            thread::spawn(move || {
                let mut temps = Temps::default();
                let mut fabric = RankFabric::new(&mem, rank, &mut temps);
                let mut expected = vec![0u64; slots];
                let mut ex = Executor::new(ops.into_iter(), &mut expected);
                loop {
                    match ex.step(&mut fabric).expect("model ops are in bounds") {
                        Step::Ran { .. } => {}
                        Step::Blocked { .. } => thread::yield_now(),
                        Step::Done => break,
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    mem
}

/// A two-rank world with 2-byte inputs and 4-byte outputs (an all-gather's buffers).
fn small_world() -> (Request, Vec<Vec<u8>>) {
    let req = Request::new(
        Collective::AllGather,
        Algorithm::Direct,
        2,
        2,
        DType::U8,
        ReduceOp::Sum,
    );
    (req, vec![vec![11, 12], vec![21, 22]])
}

fn slot(req: &Request, kind: SlotKind, peer: u16) -> u32 {
    req.layout().index_unchecked(0, 0, kind, peer)
}

/// Rank 0 puts its input into rank 1's output and signals (with `op`); rank 1 waits, then
/// copies what arrived to the second half of its output. The copy must see the put.
fn put_signal_wait(op: SignalOp) {
    model(move || {
        let (req, inputs) = small_world();
        let s = slot(&req, SlotKind::User, 0);
        let sender = vec![
            Op::Copy {
                src: Loc::new(0, Buf::Input, 0),
                dst: Loc::new(1, Buf::Output, 0),
                bytes: 2,
            },
            Op::Signal {
                peer: 1,
                slot: s,
                op,
                value: 1,
            },
        ];
        let receiver = vec![
            Op::Wait { slot: s, count: 1 },
            Op::Copy {
                src: Loc::new(1, Buf::Output, 0),
                dst: Loc::new(1, Buf::Output, 2),
                bytes: 2,
            },
        ];
        let mem = run(req, inputs, vec![(0, sender), (1, receiver)]);
        assert_eq!(
            mem.output(1),
            vec![11, 12, 11, 12],
            "the wait passed before the put was visible"
        );
    });
}

#[test]
fn signal_add_publishes_prior_writes() {
    put_signal_wait(SignalOp::Add);
}

#[test]
fn signal_set_publishes_prior_writes() {
    put_signal_wait(SignalOp::Set);
}

/// Repeated whole or split barriers from `symm_core::signal::Barrier`, two ranks, three
/// generations: at generation g each rank writes g into its output byte, passes the barrier, and
/// copies its peer's byte into its scratch byte g. A rank can never see its peer before
/// generation g (the barrier held it) nor beyond g + 1 (the peer cannot pass g + 1 without it).
fn barriers(split: bool) {
    const GENS: u8 = 3;
    model(move || {
        // Only the buffers of this request are used: 4-byte inputs and outputs and (one slot of
        // a 3-byte chunk) 3 bytes of scratch, one per generation.
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            2,
            GENS as u64 + 1,
            DType::U8,
            ReduceOp::Sum,
        )
        .with_pipeline(GENS as u64, 1);
        let inputs: Vec<Vec<u8>> = (0..2).map(|_| (0..=GENS).collect()).collect();
        let streams = (0..2u16)
            .map(|me| {
                let b = Barrier::new(req.layout(), 0, 0, me).unwrap();
                let peer = 1 - me;
                let mut ops = Vec::new();
                for g in 1..=GENS as u64 {
                    // Input byte g holds g: publish "I entered generation g".
                    ops.push(Op::Copy {
                        src: Loc::new(me, Buf::Input, g),
                        dst: Loc::new(me, Buf::Output, 0),
                        bytes: 1,
                    });
                    ops.extend(b.arrive());
                    if split {
                        // Work between arrive and wait touches only own memory.
                        ops.push(Op::Copy {
                            src: Loc::new(me, Buf::Input, 0),
                            dst: Loc::new(me, Buf::Output, 1),
                            bytes: 1,
                        });
                    }
                    ops.extend(b.wait());
                    ops.push(Op::Copy {
                        src: Loc::new(peer, Buf::Output, 0),
                        dst: Loc::new(me, Buf::Scratch, g - 1),
                        bytes: 1,
                    });
                }
                (me, ops)
            })
            .collect();
        let mem = run(req, inputs, streams);
        for me in 0..2 {
            let seen = mem.buffer(me, Buf::Scratch);
            for g in 1..=GENS {
                let s = seen[g as usize - 1];
                assert!(
                    s >= g && s <= g + 1,
                    "rank {me} at generation {g} saw its peer at generation {s}"
                );
            }
        }
    });
}

#[test]
fn whole_barriers_never_pass_early_2_ranks_3_generations() {
    barriers(false);
}

#[test]
fn split_barriers_never_pass_early_2_ranks_3_generations() {
    barriers(true);
}

/// Runs core's schedule for `req` on every rank and checks the outputs against the reference.
fn schedule(req: Request) {
    model(move || {
        let inputs = random_inputs(&req, 7);
        let streams = (0..req.world)
            .map(|r| (r, Schedule::new(req, r, 0).unwrap().collect()))
            .collect();
        let mem = run(req, inputs.clone(), streams);
        let outputs: Vec<Vec<u8>> = (0..req.world as usize).map(|r| mem.output(r)).collect();
        if let Err(m) = compare(&req, &outputs, &reference(&req, &inputs)) {
            panic!("{m:?}");
        }
    });
}

/// Ring all-reduce, two ranks, two 1-element chunks per segment through one scratch slot: data,
/// a credit (the slot is reused only after the receiver freed it) and the ready handshake.
#[test]
fn ring_all_reduce_with_credits_2_ranks() {
    schedule(
        Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            2,
            4,
            DType::U8,
            ReduceOp::Sum,
        )
        .with_pipeline(1, 1),
    );
}

/// Three ranks: two put their byte into the third's output and signal its per-peer data slots;
/// the third waits for each and combines them (the first step of a one-shot or direct reduce).
#[test]
fn fan_in_of_three_ranks_sees_every_contribution() {
    model(|| {
        let req = Request::new(
            Collective::Gather { root: 2 },
            Algorithm::Direct,
            3,
            1,
            DType::U8,
            ReduceOp::Sum,
        );
        let inputs = vec![vec![5], vec![7], vec![0]];
        let mut streams: Vec<(u16, Vec<Op>)> = (0..2u16)
            .map(|q| {
                let ops = vec![
                    Op::Copy {
                        src: Loc::new(q, Buf::Input, 0),
                        dst: Loc::new(2, Buf::Output, q as u64),
                        bytes: 1,
                    },
                    Op::Signal {
                        peer: 2,
                        slot: slot(&req, SlotKind::Data, q),
                        op: SignalOp::Add,
                        value: 1,
                    },
                ];
                (q, ops)
            })
            .collect();
        let mut root: Vec<Op> = (0..2u16)
            .map(|q| Op::Wait {
                slot: slot(&req, SlotKind::Data, q),
                count: 1,
            })
            .collect();
        root.push(Op::Reduce {
            a: Loc::new(2, Buf::Output, 0),
            b: Loc::new(2, Buf::Output, 1),
            dst: Loc::new(2, Buf::Output, 2),
            elems: 1,
            dtype: DType::U8,
            op: ReduceOp::Sum,
            div: 1,
        });
        streams.push((2, root));
        let mem = run(req, inputs, streams);
        assert_eq!(
            mem.output(2),
            vec![5, 7, 12],
            "the root missed a contribution"
        );
    });
}

/// One-shot all-reduce on core's schedule, two ranks: the fused k-way reduce (`ReduceN`) reads
/// every rank's input in one op between the `Ready` and `Done` handshakes. (Three ranks' spins
/// exceed loom's branch bound; the symbolic check covers every world.)
#[test]
fn one_shot_k_way_reduce_2_ranks() {
    schedule(Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        2,
        1,
        DType::U8,
        ReduceOp::Sum,
    ));
}

/// Three calls of a low-latency schedule (core's), two ranks, back to back on the same memory
/// and counters with new inputs each time and no barrier between calls: every call's output is
/// `want(rank, call)`. Calls 1 and 3 use the same half of every region, so a rank that runs
/// ahead into call 3 must not disturb a peer still reading call 1's lines, and no rank may take
/// a line of an earlier call for one of the current call.
fn ll_three_calls(
    req: Request,
    [input_len, output_len]: [usize; 2],
    input: fn(u16, u8) -> Vec<u8>,
    want: fn(u16, u8) -> Vec<u8>,
) {
    model(move || {
        let slots = req.layout().slots();
        // A few bytes take one line per region: the request's own layout is small enough to
        // model as it is.
        let scratch = req.buffer_sizes().scratch;
        let line = Schedule::new(req, 0, 0)
            .unwrap()
            .find_map(|o| o.line_format())
            .map_or(16, |f| f.line());
        assert_eq!(
            scratch,
            4 * line,
            "one line per region, two sources, two halves"
        );
        let sizes = [input_len as u64, output_len as u64, scratch];
        let mem = Arc::new(WorldMem::blank(2, sizes, slots, POISON).expect("two small ranks"));
        let handles: Vec<_> = (0..2u16)
            .map(|rank| {
                let mem = mem.clone();
                thread::spawn(move || {
                    let mut temps = Temps::default();
                    let mut expected = vec![0u64; slots as usize];
                    for call in 0..3u8 {
                        mem.write_at(Loc::new(rank, Buf::Input, 0), &input(rank, call))
                            .unwrap();
                        let ops = Schedule::new(req, rank, 0).unwrap();
                        let mut fabric = RankFabric::new(&mem, rank, &mut temps);
                        let mut ex = Executor::new(ops, &mut expected);
                        loop {
                            match ex.step(&mut fabric).expect("model ops are in bounds") {
                                Step::Ran { .. } => {}
                                Step::Blocked { .. } => thread::yield_now(),
                                Step::Done => break,
                            }
                        }
                        assert_eq!(
                            mem.output(rank as usize),
                            want(rank, call),
                            "rank {rank} call {call} took lines of another call"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

/// Three calls of the low-latency one-shot all-reduce `a` (either line format): each call's
/// output is that call's sum.
fn ll_all_reduce(a: Algorithm) {
    let req = Request::new(Collective::AllReduce, a, 2, 4, DType::U8, ReduceOp::Sum);
    ll_three_calls(
        req,
        [4, 4],
        |r, call| vec![10 * r as u8 + call + 1; 4],
        |_, call| vec![2 * call + 2 + 10; 4],
    );
}

/// Three calls of the low-latency all-to-all `a` (either line format; its lines each go to one
/// peer's region and come back out as a copy): rank r's block q of each call lands in rank q's
/// block r of that call.
fn ll_all_to_all(a: Algorithm) {
    let req = Request::new(Collective::AllToAll, a, 2, 4, DType::U8, ReduceOp::Sum);
    // Block q of rank r in call c holds 100 * c + 10 * r + q + 1.
    ll_three_calls(
        req,
        [8, 8],
        |r, call| {
            (0..8)
                .map(|i| 100 * call + 10 * r as u8 + (i / 4) as u8 + 1)
                .collect()
        },
        |q, call| {
            (0..8)
                .map(|i| 100 * call + 10 * (i / 4) as u8 + q as u8 + 1)
                .collect()
        },
    );
}

#[test]
fn ll_all_reduce_three_calls_without_barriers_2_ranks() {
    ll_all_reduce(Algorithm::OneShotLl);
}

#[test]
fn ll_all_to_all_three_calls_without_barriers_2_ranks() {
    ll_all_to_all(Algorithm::DirectLl);
}

/// Over 128-byte lines the reader takes a line's data only after its flag word (acquire), which
/// the writer stored after the data (release): without either, a rank reads the data of the
/// call before, or none.
#[test]
fn ll128_all_reduce_three_calls_without_barriers_2_ranks() {
    ll_all_reduce(Algorithm::OneShotLl128);
}

/// The all-to-all over 128-byte lines (`direct_ll128`).
#[test]
fn ll128_all_to_all_three_calls_without_barriers_2_ranks() {
    ll_all_to_all(Algorithm::DirectLl128);
}

/// The flag form (`symm_core::flag`, what the copy-engine path runs): three direct all-gathers,
/// two ranks, back to back on the same flags with new inputs each call and no barrier. Each
/// call's output is that call's blocks: a raise publishes the copy before it, a lowering sees
/// it, and no raise of the next call lands on a flag still raised.
#[test]
fn flag_form_all_gather_three_calls_2_ranks() {
    let req = Request::new(
        Collective::AllGather,
        Algorithm::Direct,
        2,
        2,
        DType::U8,
        ReduceOp::Sum,
    );
    symm_core::flag::check(&req).unwrap();
    model(move || {
        let slots = req.layout().slots();
        let mem = Arc::new(WorldMem::blank(2, [2, 4, 0], slots, POISON).expect("two small ranks"));
        let handles: Vec<_> = (0..2u16)
            .map(|rank| {
                let mem = mem.clone();
                thread::spawn(move || {
                    let mut temps = Temps::default();
                    for call in 0..3u8 {
                        let mine = |r: u16| 10 * call + r as u8 + 1;
                        mem.write_at(Loc::new(rank, Buf::Input, 0), &[mine(rank); 2])
                            .unwrap();
                        let ops = Schedule::new(req, rank, 0).unwrap();
                        let mut s = FlagStream::new(rank, ops).unwrap();
                        loop {
                            match s.step(&mem, &mut temps).expect("in bounds") {
                                FlagStep::Ran(_) => {}
                                FlagStep::Blocked(_) => thread::yield_now(),
                                FlagStep::Done => break,
                            }
                        }
                        assert_eq!(
                            mem.output(rank as usize),
                            [mine(0), mine(0), mine(1), mine(1)],
                            "rank {rank} call {call}"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

/// The lost-peer arm (`symm_driver::abort`): the watcher's raise never runs after the owner's
/// `disarm` returned, and the arm keeps no reference to the word afterwards.
#[test]
fn abort_arm_never_raises_a_freed_word() {
    use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use symm_driver::abort::{Arm, Raise};

    struct Word {
        raised: AtomicU32,
        freed: Arc<AtomicBool>,
    }
    impl Raise for Word {
        fn raise(&self) {
            assert!(
                !self.freed.load(Ordering::SeqCst),
                "raised after it was freed"
            );
            self.raised.fetch_add(1, Ordering::SeqCst);
        }
    }
    impl Drop for Word {
        fn drop(&mut self) {
            self.freed.store(true, Ordering::SeqCst);
        }
    }

    model(|| {
        let freed = Arc::new(AtomicBool::new(false));
        let word = Arc::new(Word {
            raised: AtomicU32::new(0),
            freed: freed.clone(),
        });
        let arm = Arm::new(word.clone());
        let cb = arm.callback();
        let watcher = thread::spawn(move || cb(1));
        arm.disarm();
        let raised = word.raised.load(Ordering::SeqCst);
        drop(word);
        assert!(freed.load(Ordering::SeqCst), "the arm kept the word alive");
        watcher.join().unwrap();
        assert!(raised <= 1);
    });
}

/// MoE dispatch (and combine) over `symm_driver::host::moe`'s protocol: two ranks, one token
/// each, hidden 1, one expert per rank, `calls` calls back to back with no barrier. In call c
/// rank r's token (value 10c + r + 1) goes to expert (r + c) % 2, so the counts change every
/// call: each rank must read exactly its call's counts and rows. With `combine`, each dispatch
/// is followed by a combine of the identity expert, so a token comes back times its weight.
/// Dispatches 1 and 3 share a half: a rank running ahead into call 3 must not disturb a peer
/// still reading call 1's rows, and no header word of another call may pass for this one's.
fn moe_calls(calls: u8, combine: bool) {
    use std::time::Duration;
    use symm_core::moe::MoeConfig;
    use symm_driver::host::moe::{
        moe_combine_reference, moe_reference, MoeDtype, MoeRank, MoeRankInput, MoeWorld,
    };
    let cfg = MoeConfig::new(2, 2, 1, 1, 1).unwrap();
    let dtype = MoeDtype::Bf16;
    let input = move |r: u16, c: u8| {
        let mut x = vec![0u8; 2];
        dtype.put(&mut x, 0, f32::from(10 * c + r as u8 + 1));
        MoeRankInput {
            x,
            topk_idx: vec![i64::from((r + u16::from(c)) % 2)],
            topk_weights: vec![0.5],
        }
    };
    // The expected results, per call and rank: (dispatch, combined output).
    let want: Vec<Vec<_>> = (0..calls)
        .map(|c| {
            let inputs: Vec<_> = (0..2).map(|r| input(r, c)).collect();
            let d = moe_reference(&cfg, dtype, &inputs).unwrap();
            let y: Vec<Vec<u8>> = d.iter().map(|d| d.expert_x.clone()).collect();
            let out = moe_combine_reference(&cfg, dtype, &inputs, &y).unwrap();
            d.into_iter().zip(out).collect()
        })
        .collect();
    let want = std::sync::Arc::new(want);
    model(move || {
        let world = Arc::new(MoeWorld::new(cfg, dtype, Duration::from_secs(3600)).unwrap());
        let handles: Vec<_> = (0..2u16)
            .map(|r| {
                let (world, want) = (world.clone(), want.clone());
                thread::spawn(move || {
                    let mut rank = MoeRank::new(r);
                    for c in 0..calls {
                        let (wd, wc) = &want[c as usize][r as usize];
                        let d = rank.dispatch(&world, &input(r, c)).unwrap();
                        assert_eq!(&d, wd, "rank {r} dispatch {c} read another call's data");
                        if combine {
                            let out = rank.combine(&world, &d.expert_x).unwrap();
                            assert_eq!(&out, wc, "rank {r} combine {c} read another call's data");
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

/// Three dispatches: the header's release and acquire order the rows, and the halves keep
/// call 3's rows and headers off call 1's while a peer may still read them.
#[test]
fn moe_three_dispatches_without_barriers_2_ranks() {
    moe_calls(3, false);
}

/// Dispatch, combine, dispatch, combine: the combine's partials and counts, each published the
/// same way, in their own halves.
#[test]
fn moe_dispatch_combine_twice_without_barriers_2_ranks() {
    moe_calls(2, true);
}

/// The fused all-reduce + RMSNorm's protocol (`symm_driver::host::norm`, the kernel's for one
/// block), 2 ranks, 3 calls of one row: the flag's release and acquire order the staged rows,
/// and the halves keep call 3's rows off call 1's while a peer may still read them. Every
/// call's result must be the reference's for that call's inputs.
#[test]
fn fused_norm_three_calls_one_barrier_each_2_ranks() {
    use std::time::Duration;
    use symm_core::dtype::f32_to_bf16;
    use symm_driver::host::norm::{NormRank, NormWorld};
    let hidden = 8;
    let input = move |r: u16, c: u16| -> Vec<u16> {
        (0..hidden)
            .map(|i| f32_to_bf16(f32::from(10 * c + 2 * r + 1) + i as f32))
            .collect()
    };
    let weight: Vec<u16> = (0..hidden).map(|_| f32_to_bf16(1.0)).collect();
    let res = vec![f32_to_bf16(0.5); hidden];
    let want: Vec<(Vec<u16>, Vec<u16>)> = (0..3)
        .map(|c| {
            let (a, b) = (input(0, c), input(1, c));
            let (mut ro, mut o) = (vec![0; hidden], vec![0; hidden]);
            symm_core::norm::all_reduce_rmsnorm(&[&a, &b], &res, &weight, 1e-6, &mut ro, &mut o)
                .unwrap();
            (ro, o)
        })
        .collect();
    let shared = std::sync::Arc::new((want, weight, res));
    model(move || {
        let world = Arc::new(NormWorld::new(2, hidden, 1, Duration::from_secs(3600)).unwrap());
        let handles: Vec<_> = (0..2u16)
            .map(|r| {
                let (world, shared) = (world.clone(), shared.clone());
                thread::spawn(move || {
                    let (want, weight, res) = &*shared;
                    let mut rank = NormRank::new(r);
                    for c in 0..3u16 {
                        let got = rank.call(&world, &input(r, c), res, weight, 1e-6).unwrap();
                        assert_eq!(
                            &got, &want[c as usize],
                            "rank {r} call {c} read another call's rows"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

/// The fused op's call epoch on the device (`symm_driver::host::norm::BlockEpoch`): a call
/// runs as 2 blocks, the next call starts when both ended (stream order: the block's thread
/// is joined), and every block of call `k` must read epoch `k`, whichever block ends last.
#[test]
fn fused_norm_epoch_advances_once_per_call_of_2_blocks() {
    use symm_driver::host::norm::BlockEpoch;
    model(|| {
        let epoch = Arc::new(BlockEpoch::default());
        for call in 1..=3u64 {
            // Block 1 on a thread of its own, block 0 on this one (loom's threads are few).
            let other = {
                let epoch = epoch.clone();
                thread::spawn(move || {
                    let e = epoch.begin();
                    assert_eq!(e, call, "block 1 of call {call} read epoch {e}");
                    epoch.end(e, 2);
                })
            };
            let e = epoch.begin();
            assert_eq!(e, call, "block 0 of call {call} read epoch {e}");
            epoch.end(e, 2);
            other.join().unwrap();
        }
        assert_eq!(epoch.begin(), 4);
    });
}
