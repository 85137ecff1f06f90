//! The simulator's link model: shared ports, posted signals, and what follows from them.

use super::*;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Buf, Loc};
use symm_core::sched::{Algorithm, Collective};
use symm_core::trace;

fn all_reduce(a: Algorithm, world: u16, bytes: u64, channels: u16) -> Request {
    Request::new(
        Collective::AllReduce,
        a,
        world,
        bytes,
        DType::Bf16,
        ReduceOp::Sum,
    )
    .with_channels(channels)
}

fn timed(req: &Request, link: Link) -> f64 {
    let opts = SimOptions {
        link,
        trace: false,
        data: false,
        ..SimOptions::default()
    };
    simulate(req, &[], &opts)
        .unwrap_or_else(|e| panic!("{req:?}: {e}"))
        .time_us
}

/// The least time any all-reduce of `bytes` over `world` ranks takes on `link`: every rank
/// sends (and receives) `2(p-1)/p` of the buffer through its one port each way.
fn all_reduce_bound(world: u16, bytes: u64, link: &Link) -> f64 {
    let p = world as f64;
    link.launch_us + 2.0 * (p - 1.0) / p * bytes as f64 / link.beta_bytes_per_us
}

/// More channels do not make more link: at every channel count a bandwidth-bound all-reduce
/// stays above the port's bound, and a one-shot (each rank reads every peer's whole input)
/// above `(p-1) n / beta`, both within a few percent of it.
#[test]
fn channels_share_a_ranks_link() {
    let link = DEFAULT_LINK;
    let (world, bytes) = (4u16, 64u64 << 20);
    let bound = all_reduce_bound(world, bytes, &link);
    let reads = link.launch_us + (world - 1) as f64 * bytes as f64 / link.beta_bytes_per_us;
    for ch in [1u16, 4, 16, 64] {
        let two = timed(&all_reduce(Algorithm::TwoShot, world, bytes, ch), link);
        let one = timed(&all_reduce(Algorithm::OneShot, world, bytes, ch), link);
        assert!(
            two >= bound && two < 1.05 * bound,
            "two-shot on {ch} channels: {two} us, the link allows {bound}"
        );
        assert!(
            one >= reads && one < 1.05 * reads,
            "one-shot on {ch} channels: {one} us, the link allows {reads}"
        );
    }
}

/// A signal costs its sender the issue; the waiter proceeds a hop after it was sent. A put is
/// posted: its stream moves on when the bytes left, and a signal after it lands after them.
#[test]
fn a_signal_costs_its_sender_the_issue_and_lands_a_hop_later() {
    let link = DEFAULT_LINK;
    let req = all_reduce(Algorithm::OneShot, 2, 4096, 1);
    let bytes = 2048u64;
    let put = Op::Copy {
        src: Loc::new(0, Buf::Input, 0),
        dst: Loc::new(1, Buf::Output, 0),
        bytes,
    };
    let signal = Op::Signal {
        peer: 1,
        slot: 0,
        op: SignalOp::Add,
        value: 1,
    };
    let wait = Op::Wait { slot: 0, count: 1 };
    let inputs = vec![vec![0u8; 4096]; 2];
    let opts = SimOptions::default();
    let run = simulate_streams(&req, &inputs, &opts, |r, _| {
        Ok(if r == 0 {
            vec![put, signal].into_iter()
        } else {
            vec![wait].into_iter()
        })
    })
    .expect("runs");
    let t = trace::decode(&run.trace).expect("decodes");
    let end = |rank: u16, index: u32| {
        t.events
            .iter()
            .find(|e| e.rank == rank && e.index == index && e.kind == EventKind::End)
            .map(|e| e.time)
            .expect("the op ended")
    };
    let ns = |us: f64| (us * 1000.0).round() as u64;
    let launch = ns(link.launch_us);
    let sent = launch + ns(bytes as f64 / link.beta_bytes_per_us);
    assert_eq!(end(0, 0), sent, "a put ends when its bytes left");
    assert_eq!(end(0, 1), sent + ns(link.issue_us()), "a signal's sender");
    assert_eq!(
        end(1, 0),
        sent + ns(link.issue_us()) + ns(link.alpha_us),
        "the waiter"
    );
    assert_eq!(run.time_us * 1000.0, end(1, 0) as f64);
}

/// With posted signals and shared ports, a pipelined ring with several chunks per channel is
/// bandwidth bound at 64 MiB: within its pipeline's fill (the first chunk's `2(p-1)` steps, each
/// a transfer, an issue and a hop, after the ready handshake) of the port bound, so no slower
/// than two-shot by more than that fill. Under the old model (every signal a full hop on its
/// sender, channels with a link each) the ring was 2.9x the two-shot here.
#[test]
fn a_pipelined_ring_keeps_up_with_two_shot_at_large_sizes() {
    let link = DEFAULT_LINK;
    let (world, bytes, ch) = (8u16, 64u64 << 20, 16u16);
    let req = all_reduce(Algorithm::Ring, world, bytes, ch);
    let chunk = req.chunk_elems() * req.dtype.size();
    let per_segment = bytes / ch as u64 / world as u64;
    assert!(per_segment >= 4 * chunk, "several chunks per segment");
    let bound = all_reduce_bound(world, bytes, &link);
    let step = link.alpha_us + link.issue_us() + chunk as f64 / link.beta_bytes_per_us;
    let fill = link.alpha_us + link.issue_us() + 2.0 * (world as f64 - 1.0) * step;
    let ring = timed(&req, link);
    let two = timed(&all_reduce(Algorithm::TwoShot, world, bytes, ch), link);
    assert!(ring >= bound && two >= bound, "{ring} {two} {bound}");
    assert!(
        ring <= bound + fill,
        "ring {ring} us: more than the fill {fill} over the bound {bound}"
    );
    assert!(ring <= two + fill, "ring {ring} us, two-shot {two} us");
}

/// The double binary tree's few steps win over two-shot's chain of reductions somewhere
/// beyond 8 ranks (two-shot's fused reduction stops at 8 sources), and tree and ring are never
/// faster than the port allows.
#[test]
fn a_pipelined_tree_wins_somewhere() {
    let link = DEFAULT_LINK;
    let world = 16u16;
    let wins = [1u64 << 16, 1 << 18, 1 << 20].into_iter().any(|bytes| {
        let ch = symm_core::cost::default_channels(bytes);
        let tree = timed(&all_reduce(Algorithm::Tree, world, bytes, ch), link);
        let two = timed(&all_reduce(Algorithm::TwoShot, world, bytes, ch), link);
        assert!(tree >= all_reduce_bound(world, bytes, &link));
        tree < two
    });
    assert!(wins, "the tree never beat two-shot at world {world}");
}
