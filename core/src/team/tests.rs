use super::check::{check_teams, Job};
use super::*;
use crate::dtype::{DType, ReduceOp};
use crate::sched::{algorithms, collectives, Algorithm, Collective};
use crate::signal::SlotKind;
use crate::symbolic::SymError;
use alloc::vec::Vec;

fn req(c: Collective, a: Algorithm, world: u16, channels: u16) -> Request {
    Request::new(c, a, world, 96 * world as u64, DType::F32, ReduceOp::Sum).with_channels(channels)
}

#[test]
fn teams_refuse_bad_members() {
    assert_eq!(Team::new(1, 4, &[]), Err(TeamError::Empty));
    assert_eq!(
        Team::new(1, 4, &[0, 4]),
        Err(TeamError::RankOutOfWorld { rank: 4, world: 4 })
    );
    assert_eq!(
        Team::new(1, 4, &[2, 2]),
        Err(TeamError::Duplicate { rank: 2 })
    );
    assert_eq!(Team::strided(1, 8, 1, 0, 2), Err(TeamError::BadStride));
    assert_eq!(Team::strided(1, 8, 1, 3, 3).unwrap().members(), &[1, 4, 7]);
    assert!(matches!(
        Team::strided(1, 8, 2, 3, 3),
        Err(TeamError::RankOutOfWorld { rank: 8, world: 8 })
    ));
    assert_eq!(
        Team::strided(1, 8, 1, 2, 4).unwrap().members(),
        &[1, 3, 5, 7]
    );
}

#[test]
fn split_groups_by_colour_and_orders_by_key_then_rank() {
    // Colours 0/1 alternate; keys reverse the order; rank 5 opts out.
    let colors: Vec<(i32, i32)> = (0..8)
        .map(|r| if r == 5 { (-1, 0) } else { (r % 2, -r / 2) })
        .collect();
    let t0 = Team::split(1, &colors, 0).unwrap().unwrap();
    assert_eq!(t0.members(), &[6, 4, 2, 0]);
    assert_eq!(t0.local(2), Some(2));
    assert_eq!(t0.global(0), Some(6));
    let t1 = Team::split(1, &colors, 3).unwrap().unwrap();
    assert_eq!(t1.members(), &[7, 3, 1]);
    assert_eq!(Team::split(1, &colors, 5), Ok(None));
    // Equal keys fall back to world rank order.
    let same = [(0, 0); 4];
    assert_eq!(
        Team::split(2, &same, 1).unwrap().unwrap().members(),
        &[0, 1, 2, 3]
    );
    assert_eq!(Team::split(1, &[], 0), Err(TeamError::BadSplit));
}

#[test]
fn maps_ranks_slots_and_offsets() {
    let team = Team::new(2, 6, &[4, 1, 3]).unwrap();
    let r = req(Collective::AllReduce, Algorithm::Ring, 3, 2);
    let outer = SlotLayout::new(3, 4, 6).unwrap();
    let m = TeamMap::new(&team, &r, outer, [0, 1000, 2000]).unwrap();
    let inner = r.layout();
    let s = inner.index_unchecked(0, 1, SlotKind::Data, 2);
    let op = Op::Signal {
        peer: 0,
        slot: s,
        op: crate::op::SignalOp::Add,
        value: 1,
    };
    let mapped = m.op(op).unwrap();
    let Op::Signal { peer, slot, .. } = mapped else {
        panic!("{mapped:?}")
    };
    assert_eq!(peer, 4);
    assert_eq!(slot, outer.index_unchecked(2, 1, SlotKind::Data, 2));
    let copy = Op::Copy {
        src: Loc::new(2, crate::op::Buf::Output, 8),
        dst: Loc::new(1, crate::op::Buf::Scratch, 16),
        bytes: 8,
    };
    assert_eq!(
        m.op(copy).unwrap(),
        Op::Copy {
            src: Loc::new(3, crate::op::Buf::Output, 1008),
            dst: Loc::new(1, crate::op::Buf::Scratch, 2016),
            bytes: 8,
        }
    );
    let out = Op::Copy {
        src: Loc::new(3, crate::op::Buf::Input, 0),
        dst: Loc::new(0, crate::op::Buf::Input, 0),
        bytes: 4,
    };
    assert_eq!(m.op(out), Err(TeamError::OpOutOfTeam));
    // The id must fit the world's layout, the request the team.
    let big = Team::new(3, 6, &[0, 1, 2]).unwrap();
    assert_eq!(
        TeamMap::new(&big, &r, outer, [0; 3]).err(),
        Some(TeamError::NoSlots { id: 3 })
    );
    assert!(matches!(
        TeamMap::new(
            &team,
            &req(Collective::AllReduce, Algorithm::Ring, 2, 1),
            outer,
            [0; 3]
        ),
        Err(TeamError::SizeMismatch {
            request: 2,
            team: 3
        })
    ));
}

fn jobs_for(teams: &[Team], c: impl Fn(u16) -> Collective, a: Algorithm, ch: u16) -> Vec<Job> {
    teams
        .iter()
        .map(|t| Job {
            team: t.clone(),
            request: req(c(t.size()), a, t.size(), ch),
        })
        .collect()
}

/// World 8 split 2 x 4 (by colour) and 4 x 2 (strided), and odd splits of world 7: every
/// collective and algorithm on every team of a split at once, symbolically.
#[test]
fn concurrent_teams_pass_the_symbolic_check() {
    let splits: Vec<(u16, Vec<Team>)> = Vec::from([
        (
            8,
            (0..2)
                .map(|c| {
                    let colors: Vec<(i32, i32)> = (0..8).map(|r| (r / 4, 0)).collect();
                    Team::split(1, &colors, c * 4).unwrap().unwrap()
                })
                .collect(),
        ),
        (
            8,
            (0..4)
                .map(|s| Team::strided(1, 8, s, 4, 2).unwrap())
                .collect(),
        ),
        (
            7,
            Vec::from([
                Team::new(1, 7, &[6, 0, 3]).unwrap(),
                Team::new(1, 7, &[1, 5, 2, 4]).unwrap(),
            ]),
        ),
        (
            7,
            Vec::from([
                Team::new(1, 7, &[0, 1, 2, 3, 4]).unwrap(),
                Team::new(2, 7, &[3, 4, 5, 6]).unwrap(),
                Team::new(3, 7, &[5]).unwrap(),
            ]),
        ),
    ]);
    let mut runs = 0;
    for (world, teams) in &splits {
        for c in collectives(4) {
            for &a in algorithms(c) {
                if a == Algorithm::Multicast {
                    continue;
                }
                // The same collective on every team, each at its own size.
                let same = |n: u16| {
                    collectives(n)
                        .into_iter()
                        .find(|x| core::mem::discriminant(x) == core::mem::discriminant(&c))
                        .unwrap_or(Collective::AllReduce)
                };
                let jobs = jobs_for(teams, same, a, 2);
                for seed in 0..3 {
                    check_teams(*world, &jobs, seed)
                        .unwrap_or_else(|e| panic!("world {world} {c:?} {a:?} seed {seed}: {e:?}"));
                    runs += 1;
                }
            }
        }
    }
    assert!(runs > 100);
}

/// Two collectives at once on the same ranks with the same id share every slot: the check must
/// catch the crosstalk (a wait passing on the other collective's signal reads unwritten data).
#[test]
fn teams_sharing_an_id_are_caught() {
    let a = Team::new(1, 4, &[0, 1, 2]).unwrap();
    let b = Team::new(1, 4, &[0, 1, 2]).unwrap();
    let jobs = jobs_for(&[a, b], |_| Collective::AllReduce, Algorithm::Ring, 1);
    let caught = (0..20)
        .filter(|&s| check_teams(4, &jobs, s).is_err())
        .count();
    assert!(
        caught > 0,
        "shared slots went unnoticed in 20 interleavings"
    );
    // With distinct ids the same pair passes, as do overlapping teams.
    let a = Team::new(1, 4, &[0, 1, 2]).unwrap();
    let b = Team::new(2, 4, &[0, 1, 2]).unwrap();
    let jobs = jobs_for(&[a, b], |_| Collective::AllReduce, Algorithm::Ring, 1);
    for s in 0..20 {
        check_teams(4, &jobs, s).unwrap();
    }
    let a = Team::new(1, 4, &[0, 1, 2]).unwrap();
    let b = Team::new(2, 4, &[3, 2, 1]).unwrap();
    let jobs = jobs_for(&[a, b], |_| Collective::AllReduce, Algorithm::Ring, 1);
    for s in 0..20 {
        check_teams(4, &jobs, s).unwrap();
    }
    assert!(matches!(
        check_teams(5, &jobs, 0),
        Err(SymError::Team(TeamError::RankOutOfWorld { .. }))
    ));
    // Ids past MAX_TEAMS would size the pads from input: refused.
    let far = Team::new(u16::MAX, 4, &[0, 1, 2]).unwrap();
    let jobs = jobs_for(&[far], |_| Collective::AllReduce, Algorithm::Ring, 1);
    assert!(matches!(
        check_teams(4, &jobs, 0),
        Err(SymError::Team(TeamError::NoSlots { .. }))
    ));
}
