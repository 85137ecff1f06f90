//! Recovering the bootstrap after failed collectives, ranks as threads over real sockets.

use std::sync::Barrier;
use std::time::Duration;

use crate::job::env::Token;
use crate::job::{BootstrapError, JobEnv, SocketBootstrap};

const LONG: Duration = Duration::from_secs(20);

fn job(rank: u16, world: u16, name: &str) -> JobEnv {
    JobEnv {
        rank,
        world,
        local_rank: rank,
        job: format!("r{}-{name}", std::process::id()),
        token: Token::from_bytes(&[9; 32]).unwrap(),
    }
}

/// Runs `body(rank, bootstrap, meeting)` on `world` threads, one rank each, and returns what
/// each returned, in rank order; each rank then finishes (which must succeed when `ends_well`).
fn world_of<T: Send>(
    world: u16,
    name: &str,
    ends_well: bool,
    body: impl Fn(u16, &SocketBootstrap, &Barrier) -> T + Sync,
) -> Vec<T> {
    let meeting = Barrier::new(world as usize);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|r| {
                let (body, meeting) = (&body, &meeting);
                s.spawn(move || {
                    let boot = SocketBootstrap::join(&job(r, world, name), LONG).unwrap();
                    let out = body(r, &boot, meeting);
                    let end = boot.finish(LONG);
                    assert!(end.is_ok() || !ends_well, "rank {r}: {end:?}");
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Twenty gathers whose every part is checked, then a barrier.
fn rounds_are_correct(rank: u16, boot: &SocketBootstrap) {
    for round in 0..20u8 {
        let got = boot.all_gather(&[rank as u8, round], LONG).unwrap();
        for (q, v) in got.iter().enumerate() {
            assert_eq!(v, &vec![q as u8, round], "rank {rank} round {round}");
        }
    }
    boot.barrier(LONG).unwrap();
}

#[test]
fn ranks_in_different_collectives_fail_then_recover_and_run_correctly() {
    let errors = world_of(3, "differ", true, |rank, boot, _| {
        boot.barrier(LONG).unwrap();
        // The root meets a barrier, the others a gather: every rank fails, naming it.
        let e = if rank == 0 {
            boot.barrier(LONG).unwrap_err()
        } else {
            boot.all_gather(b"x", LONG).unwrap_err()
        };
        // Still failing until the recover.
        assert!(matches!(
            boot.barrier(LONG),
            Err(BootstrapError::Poisoned(_))
        ));
        boot.recover(LONG).unwrap();
        rounds_are_correct(rank, boot);
        // And again: a second failure and recover move to a later epoch.
        if rank == 2 {
            boot.barrier(LONG).unwrap_err();
        } else {
            boot.all_gather(b"y", LONG).unwrap_err();
        }
        boot.recover(LONG).unwrap();
        rounds_are_correct(rank, boot);
        e.to_string()
    });
    assert!(
        errors[0].contains("rank 1 called all_gather where the root called barrier"),
        "{errors:?}"
    );
    for e in &errors[1..] {
        assert!(e.contains("all_gather"), "{errors:?}");
    }
}

#[test]
fn a_rank_that_gave_up_alone_is_met_by_the_others_recover() {
    world_of(3, "alone", true, |rank, boot, meeting| {
        if rank == 1 {
            // Its own deadline passes before the others arrive; the root then completes the
            // round and its parts wait, stale, on this rank's link.
            let e = boot.barrier(Duration::from_millis(50)).unwrap_err();
            assert!(matches!(e, BootstrapError::Timeout { .. }), "{e:?}");
            meeting.wait();
            boot.recover(LONG).unwrap();
        } else {
            meeting.wait();
            boot.barrier(LONG).unwrap();
            // The next collective meets rank 1's recover: it fails at every other rank too.
            let e = boot.barrier(LONG).unwrap_err();
            if rank == 0 {
                assert!(e.to_string().contains("recover"), "{e}");
            }
            boot.recover(LONG).unwrap();
        }
        rounds_are_correct(rank, boot);
    });
}

#[test]
fn a_recover_without_a_failure_is_a_meeting() {
    world_of(2, "idle", true, |rank, boot, _| {
        rounds_are_correct(rank, boot);
        for _ in 0..3 {
            boot.recover(LONG).unwrap();
            rounds_are_correct(rank, boot);
        }
    });
}

#[test]
fn a_rank_that_left_stays_lost_through_a_recover() {
    world_of(3, "left", false, |rank, boot, meeting| {
        boot.barrier(LONG).unwrap();
        if rank == 2 {
            boot.leave();
            meeting.wait();
            return;
        }
        meeting.wait();
        let e = boot.barrier(LONG).unwrap_err();
        assert!(
            e.lost_rank().is_some() || matches!(e, BootstrapError::Poisoned(_)),
            "{e:?}"
        );
        let e = boot.recover(LONG).unwrap_err();
        assert_eq!(e, BootstrapError::PeerLost { rank: 2 }, "rank {rank}");
    });
}

#[test]
fn a_root_that_recovers_wakes_the_ranks_waiting_in_a_collective() {
    world_of(3, "root", true, |rank, boot, _| {
        boot.barrier(LONG).unwrap();
        if rank == 0 {
            // The root skips the barrier the others enter (as a rank held on its device would)
            // and recovers: the others fail at once, naming it, not at their deadline.
            std::thread::sleep(Duration::from_millis(100));
            boot.recover(LONG).unwrap();
        } else {
            let t = std::time::Instant::now();
            let e = boot.barrier(LONG).unwrap_err();
            assert_eq!(e, BootstrapError::Recovering { rank: 0 }, "rank {rank}");
            assert!(t.elapsed() < LONG / 4, "{:?}", t.elapsed());
            boot.recover(LONG).unwrap();
        }
        rounds_are_correct(rank, boot);
    });
}
