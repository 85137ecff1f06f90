//! Teams on the host backends: the shared conformance matrix on a team while other teams'
//! collectives run at the same time on the same world (simulator and real threads), and the
//! symbolic check of whole splits at once.
//!
//! Splits: world 8 as 2 x 4 by colour (`split`), world 8 as 4 x 2 strided (`split_strided`), odd
//! splits of world 7, and two collectives at once on the same ranks under different team ids.

use std::time::Duration;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::team::check::{check_teams, Job};
use symm_core::team::Team;
use symm_driver::backend::HostTeam;
use symm_driver::host::{self, TeamJob, TeamMode};
use symm_tests::matrix::{run, Compare, Matrix};

/// (world, teams of one split) of every scenario.
fn scenarios() -> Vec<(u16, Vec<Team>)> {
    let by_colour: Vec<(i32, i32)> = (0..8).map(|r| (r / 4, 7 - r)).collect();
    vec![
        (
            8,
            [0, 4]
                .iter()
                .map(|&r| Team::split(1, &by_colour, r).unwrap().unwrap())
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
            vec![
                Team::new(1, 7, &[6, 0, 3]).unwrap(),
                Team::new(1, 7, &[1, 5, 2, 4]).unwrap(),
            ],
        ),
        (
            7,
            vec![
                Team::new(1, 7, &[0, 1, 2, 3, 4, 5, 6]).unwrap(),
                Team::new(2, 7, &[6, 5, 4, 3, 2, 1, 0]).unwrap(),
            ],
        ),
    ]
}

fn beside(team: &Team, seed: u64) -> TeamJob {
    let request = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        team.size(),
        384,
        DType::I32,
        ReduceOp::Sum,
    )
    .with_channels(2);
    TeamJob {
        team: team.clone(),
        inputs: host::random_inputs(&request, seed),
        request,
    }
}

fn matrix() -> Matrix {
    Matrix {
        worlds: vec![],
        sizes: vec![4, 200, 1000],
        dtypes: vec![DType::F32, DType::I32],
        ops: vec![ReduceOp::Sum, ReduceOp::Max],
        multicast: false,
        shape: |r| r.with_channels(2).with_pipeline(64, 2),
        keep: |_| true,
        inputs: host::random_inputs,
        compare: Compare::Tolerant,
    }
}

#[test]
fn the_matrix_passes_on_every_team_beside_the_others() {
    let mut cases = 0;
    for (world, teams) in scenarios() {
        for (i, team) in teams.iter().enumerate() {
            let others: Vec<TeamJob> = teams
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(j, t)| beside(t, j as u64))
                .collect();
            for mode in [
                TeamMode::Simulate,
                TeamMode::Threads(Duration::from_secs(20)),
            ] {
                let mut b = HostTeam {
                    world,
                    team: team.clone(),
                    beside: others.clone(),
                    mode,
                };
                let rep = run(&mut b, &matrix(), &mut 1);
                assert!(
                    rep.failures.is_empty() && rep.stopped.is_none(),
                    "{}: {:?} {:?}",
                    symm_driver::backend::Backend::name(&b),
                    rep.failures.first(),
                    rep.stopped
                );
                cases += rep.cases;
            }
        }
    }
    assert!(cases > 1000, "{cases} cases");
}

/// Every collective and algorithm on all teams of a split at once, symbolically, under several
/// interleavings.
#[test]
fn whole_splits_pass_the_symbolic_check() {
    let mut runs = 0;
    for (world, teams) in scenarios() {
        for &(c, a) in &symm_core::sched::pairs(4).collect::<Vec<_>>() {
            if a == Algorithm::Multicast {
                continue;
            }
            let jobs: Vec<Job> = teams
                .iter()
                .map(|t| {
                    let c = symm_core::sched::collectives(t.size())
                        .into_iter()
                        .find(|x| std::mem::discriminant(x) == std::mem::discriminant(&c))
                        .unwrap_or(Collective::AllReduce);
                    let a = if symm_core::sched::algorithms(c).contains(&a) {
                        a
                    } else {
                        symm_core::sched::algorithms(c)[0]
                    };
                    Job {
                        team: t.clone(),
                        request: Request::new(
                            c,
                            a,
                            t.size(),
                            48 * t.size() as u64,
                            DType::F32,
                            ReduceOp::Sum,
                        )
                        .with_channels(3)
                        .with_pipeline(16, 2),
                    }
                })
                .collect();
            for seed in 0..4 {
                check_teams(world, &jobs, seed).unwrap_or_else(|e| {
                    panic!(
                        "world {world} {} {}: seed {seed}: {e:?}",
                        c.name(),
                        a.name()
                    )
                });
                runs += 1;
            }
        }
    }
    assert!(runs > 100, "{runs}");
}

/// A simulated team collective's trace names its team, uses local ranks, replays in the viewer's
/// model, and the viewer says which team it belongs to.
#[test]
fn team_traces_name_their_team_in_the_viewer() {
    use symm_driver::backend::Backend;
    let (world, teams) = scenarios().swap_remove(2);
    let team = teams[0].clone();
    let mut b = HostTeam {
        world,
        team: team.clone(),
        beside: vec![beside(&teams[1], 9)],
        mode: TeamMode::Simulate,
    };
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        team.size(),
        3 * 64,
        DType::F32,
        ReduceOp::Sum,
    );
    let out = b.run(&req, &host::random_inputs(&req, 5), true).unwrap();
    let bytes = out.trace.expect("a trace");
    let d = symm_core::trace::decode(&bytes).unwrap();
    let tag = d.header.team.clone().expect("a team tag");
    assert_eq!(tag.members.as_slice(), team.members());
    assert_eq!((tag.id, tag.world), (team.id(), world));
    assert!(!d.events.is_empty() && d.events.iter().all(|e| e.rank < team.size()));
    let t = symm_viz::model::Trace::decode("team", bytes).unwrap();
    assert_eq!(
        symm_viz::describe::world(&t.header),
        "3: team 1 of world 7, ranks 6 0 3"
    );
}

/// Hostile team jobs get typed errors, never a panic or pads sized from the input: an id past
/// `MAX_TEAMS`, a team of another world, inputs of the wrong count or size.
#[test]
fn hostile_team_jobs_are_refused() {
    use symm_core::sched::MAX_WORLD;
    use symm_core::team::{TeamError, MAX_TEAMS};
    use symm_driver::host::{run_teams, HostError};
    assert_eq!(Team::world(MAX_WORLD).unwrap().size(), MAX_WORLD);
    assert!(Team::world(MAX_WORLD + 1).is_err());
    assert!(Team::world(u16::MAX).is_err());
    let team = Team::new(MAX_TEAMS, 4, &[0, 1]).unwrap();
    let job = beside(&team, 1);
    assert!(matches!(
        run_teams(4, &[job], TeamMode::Simulate),
        Err(HostError::Team(TeamError::NoSlots { .. }))
    ));
    let job = beside(&Team::new(1, 8, &[0, 1]).unwrap(), 1);
    assert!(matches!(
        run_teams(4, &[job], TeamMode::Simulate),
        Err(HostError::Team(TeamError::RankOutOfWorld { .. }))
    ));
    let mut job = beside(&Team::new(1, 4, &[3, 2]).unwrap(), 1);
    job.inputs.pop();
    assert!(run_teams(4, std::slice::from_ref(&job), TeamMode::Simulate).is_err());
    job.inputs = vec![vec![0; 3], vec![0; 3]];
    assert!(run_teams(4, &[job], TeamMode::Threads(Duration::from_secs(5))).is_err());
}
