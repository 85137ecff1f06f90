//! `Request::owns`: the sides of a collective that no peer touches. The runtime hands such a
//! side to the kernel unstaged, wherever it lies in the rank's device memory, so the column must
//! never claim a side a peer's op names. This scans every rank's schedule of every collective x
//! algorithm over worlds, sizes and channel counts, and holds the column to exactly what the
//! schedules do (never more, so the runtime stays safe; never less, so no copy is kept that the
//! schedule does not need).

use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{At, Buf};
use symm_core::sched::{algorithms, collectives, Collective, Request, Schedule};

/// Whether any op of any rank names another rank's input (`[0]`) or output (`[1]`).
fn touched_by_peers(r: &Request) -> [bool; 2] {
    let mut peers = [false, false];
    for me in 0..r.world {
        for ch in 0..r.channels {
            for op in Schedule::new(*r, me, ch).expect("a valid request schedules") {
                for range in op.footprint().ranges() {
                    let (buf, remote) = match range.at {
                        At::Rank(l) => (l.buf, l.rank != me),
                        // A multicast op names the same bytes of every rank.
                        At::Every(m) => (m.buf, r.world > 1),
                    };
                    match buf {
                        Buf::Input => peers[0] |= remote,
                        Buf::Output => peers[1] |= remote,
                        Buf::Scratch => {}
                    }
                }
            }
        }
    }
    peers
}

#[test]
fn the_owned_sides_are_exactly_those_no_peer_touches() {
    let mut checked = 0;
    for world in [2u16, 3, 4, 5, 8] {
        for c in collectives(world) {
            for &a in algorithms(c) {
                let mut seen = [false, false];
                let mut any = false;
                for bytes in [4u64, 1024, (64 << 10) + 4] {
                    for channels in [1u16, 2, 3] {
                        let r = Request::new(c, a, world, bytes, DType::F32, ReduceOp::Sum)
                            .with_channels(channels);
                        if r.validate().is_err() {
                            continue;
                        }
                        any = true;
                        let peers = touched_by_peers(&r);
                        let owns = r.owns();
                        for side in 0..2 {
                            // Never claimed where a peer touches it.
                            assert!(
                                !(owns[side] && peers[side]),
                                "{} {} world {world} {bytes} B {channels} ch: side {side} is \
                                 touched by a peer",
                                c.name(),
                                a.name()
                            );
                            seen[side] |= peers[side];
                        }
                        checked += 1;
                    }
                }
                // Never withheld where no size or channel count lets a peer touch it.
                if any {
                    let owns = Request::new(c, a, world, 1024, DType::F32, ReduceOp::Sum).owns();
                    assert_eq!(
                        owns,
                        [!seen[0], !seen[1]],
                        "{} {} world {world}",
                        c.name(),
                        a.name()
                    );
                }
            }
        }
    }
    assert!(checked > 500, "{checked} requests");
}

#[test]
fn the_low_latency_algorithms_own_both_sides_and_two_shot_neither() {
    let r = |c, a| Request::new(c, a, 4, 4096, DType::Bf16, ReduceOp::Sum).owns();
    use symm_core::sched::Algorithm::*;
    assert_eq!(r(Collective::AllReduce, OneShotLl), [true, true]);
    assert_eq!(r(Collective::AllReduce, OneShotLl128), [true, true]);
    assert_eq!(r(Collective::AllGather, DirectLl), [true, true]);
    assert_eq!(r(Collective::AllReduce, TwoShot), [false, false]);
    assert_eq!(r(Collective::AllReduce, OneShot), [false, true]);
    assert_eq!(r(Collective::AllReduce, Ring), [true, false]);
}
