//! Collectives over the bootstrap's star: every rank sends its part to the root, the root sends
//! every part to every rank.
//!
//! A collective is one round with a sequence number. Rank r sends `Contribute { op, seq }` with
//! its bytes (and descriptors) to the root; the root takes one contribution from each rank in rank
//! order, checks that it is the same collective with the same number (else
//! [`BootstrapError::Mismatch`]), then sends each rank one `Part { op, seq, source }` per source
//! rank, in rank order. Receiving the last part means every rank contributed, so `barrier` is an
//! empty round. Descriptors ride on the parts with SCM_RIGHTS; each rank receives new ones
//! (close-on-exec) for every rank's, its own included.
//!
//! Calls are serialised per process and each has a deadline. Any failure poisons the bootstrap
//! (later calls return [`BootstrapError::Poisoned`]); the root first sends `Abort` with the reason
//! to every rank, so they fail promptly with the same cause.
//!
//! **Recovering.** While every process is alive, [`SocketBootstrap::recover`], called by every
//! rank, makes it usable again. Every frame carries the sender's epoch. A rank moves to the
//! next epoch and sends `Recover` in it to the root; the root, in the next epoch too, takes one
//! `Recover` from each rank, and then sends `Recover` to every rank; sequence numbers start
//! over. Links are ordered, so whatever a failed collective left on a link (a contribution, parts,
//! an abort) arrives before the `Recover` behind it, in an older epoch: the recover drops it, and
//! nothing stale is left behind. A root still in a collective that takes a rank's `Recover` puts
//! it back and fails ([`BootstrapError::Recovering`]), and its own recover finds it; a root that
//! starts to recover first sends `Abort` in the old epoch, so a rank still waiting in a
//! collective fails at once the same way.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::error::{BootstrapError, Result};
use super::watch::Shared;
use super::wire::{self, Head, Kind, Op};
use super::SocketBootstrap;

/// How long the root spends telling the ranks that a collective failed.
const NOTICE: Duration = Duration::from_millis(200);

/// One rank's contribution to a round.
struct Part {
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl SocketBootstrap {
    /// Returns when every rank has called it.
    pub fn barrier(&self, timeout: Duration) -> Result<()> {
        self.round(Op::Barrier, &[], &[], timeout).map(|_| ())
    }

    /// Every rank contributes `data` (at most [`wire::MAX_PAYLOAD`] bytes; lengths may differ);
    /// every rank gets all contributions in rank order.
    pub fn all_gather(&self, data: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let parts = self.round(Op::Gather, data, &[], timeout)?;
        Ok(parts.into_iter().map(|p| p.payload).collect())
    }

    /// Every rank contributes `fds` (at most [`wire::MAX_FDS`]); every rank gets, for each rank
    /// in order, new descriptors for that rank's (its own included), owned and close-on-exec.
    pub fn all_gather_fds(
        &self,
        fds: &[BorrowedFd<'_>],
        timeout: Duration,
    ) -> Result<Vec<Vec<OwnedFd>>> {
        let parts = self.round(Op::GatherFds, &[], fds, timeout)?;
        Ok(parts.into_iter().map(|p| p.fds).collect())
    }

    /// Makes the bootstrap usable again after a failed collective, while every process is
    /// alive (see the module doc). Collective: every rank calls it. A lost rank stays lost
    /// ([`BootstrapError::PeerLost`]); a failure here poisons the bootstrap again.
    pub fn recover(&self, timeout: Duration) -> Result<()> {
        let sh = &*self.shared;
        let mut seq = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rank) = sh.lost_rank() {
            return Err(BootstrapError::PeerLost { rank });
        }
        if sh.closing.load(Ordering::Acquire) {
            return Err(BootstrapError::Poisoned(Box::new(BootstrapError::Left {
                rank: sh.rank,
            })));
        }
        let epoch = sh.epoch.load(Ordering::Acquire).wrapping_add(1);
        sh.epoch.store(epoch, Ordering::Release);
        sh.lock().poisoned = None;
        let deadline = wire::after(Instant::now(), timeout);
        let r = if sh.rank == 0 {
            root_recover(sh, epoch, deadline)
        } else {
            rank_recover(sh, epoch, deadline)
        };
        match &r {
            Ok(()) => *seq = 0,
            Err(e) => {
                if let Some(rank) = e.lost_rank() {
                    sh.raise_lost(rank);
                }
                if sh.rank == 0 {
                    let notice = Instant::now() + NOTICE;
                    let head = Head::control(Kind::Abort, 0).in_epoch(epoch);
                    let why = wire::abort(e);
                    for l in &sh.links {
                        let _ = wire::send(l.fd.as_fd(), head, &why, &[], notice);
                    }
                }
                let mut st = sh.lock();
                if st.poisoned.is_none() {
                    st.poisoned = Some(e.clone());
                }
            }
        }
        r
    }

    fn round(
        &self,
        op: Op,
        payload: &[u8],
        fds: &[BorrowedFd<'_>],
        timeout: Duration,
    ) -> Result<Vec<Part>> {
        if payload.len() > wire::MAX_PAYLOAD {
            return Err(BootstrapError::TooLarge {
                what: "all_gather bytes",
                len: payload.len(),
                max: wire::MAX_PAYLOAD,
            });
        }
        if fds.len() > wire::MAX_FDS {
            return Err(BootstrapError::TooLarge {
                what: "all_gather_fds descriptors",
                len: fds.len(),
                max: wire::MAX_FDS,
            });
        }
        let sh = &*self.shared;
        let mut seq = self.seq.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &sh.lock().poisoned {
            return Err(BootstrapError::Poisoned(Box::new(e.clone())));
        }
        if !sh.closing.load(Ordering::Acquire) {
            if let Some(rank) = sh.lost_rank() {
                return Err(BootstrapError::PeerLost { rank });
            }
        }
        let next = seq.wrapping_add(1);
        *seq = next;
        let deadline = wire::after(Instant::now(), timeout);
        let r = if sh.rank == 0 {
            root_round(sh, op, next, payload, fds, deadline)
        } else {
            rank_round(sh, op, next, payload, fds, deadline)
        };
        if let Err(e) = &r {
            // Whatever told this rank of a loss first (the watcher, the root's abort, a failed
            // send), the lost word and callbacks have it before the error is returned.
            if let (Some(rank), false) = (e.lost_rank(), sh.closing.load(Ordering::Acquire)) {
                sh.raise_lost(rank);
            }
            if sh.rank == 0 {
                let notice = Instant::now() + NOTICE;
                let head = Head::control(Kind::Abort, 0).in_epoch(sh.epoch.load(Ordering::Acquire));
                let why = wire::abort(e);
                for l in &sh.links {
                    let _ = wire::send(l.fd.as_fd(), head, &why, &[], notice);
                }
            }
            let mut st = sh.lock();
            if st.poisoned.is_none() {
                st.poisoned = Some(e.clone());
            }
        }
        r
    }
}

fn root_round(
    sh: &Shared,
    op: Op,
    seq: u32,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    deadline: Instant,
) -> Result<Vec<Part>> {
    let own = fds
        .iter()
        .map(|f| f.try_clone_to_owned())
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| BootstrapError::sys("dup", e))?;
    let epoch = sh.epoch.load(Ordering::Acquire);
    let mut parts = Vec::with_capacity(sh.links.len() + 1);
    parts.push(Part {
        payload: payload.to_vec(),
        fds: own,
    });
    for (i, link) in sh.links.iter().enumerate() {
        let f = match sh.take(i, op.name(), deadline) {
            Err(BootstrapError::Timeout { .. }) => {
                let waiting_for = (i..sh.links.len())
                    .filter(|&j| j == i || !sh.has_frame(j))
                    .map(|j| sh.links[j].peer)
                    .collect();
                return Err(BootstrapError::Timeout {
                    op: op.name(),
                    waiting_for,
                });
            }
            other => other?,
        };
        if f.head.kind == Kind::Recover {
            // That rank gave this collective up and recovers: so will this one.
            sh.put_back(i, f);
            return Err(BootstrapError::Recovering { rank: link.peer });
        }
        if f.head.op != op || f.head.seq != seq {
            return Err(BootstrapError::Mismatch {
                rank: link.peer,
                expected: op.name(),
                found: if f.head.op != op {
                    f.head.op.name()
                } else {
                    "a collective out of step"
                },
            });
        }
        parts.push(Part {
            payload: f.payload,
            fds: f.fds,
        });
    }
    for link in &sh.links {
        for (src, p) in parts.iter().enumerate() {
            let head = Head {
                kind: Kind::Part,
                op,
                rank: src as u16,
                seq,
                epoch,
            };
            let fds: Vec<BorrowedFd<'_>> = p.fds.iter().map(|f| f.as_fd()).collect();
            wire::send(link.fd.as_fd(), head, &p.payload, &fds, deadline)
                .map_err(|e| e.at(link.peer, op.name()))?;
        }
    }
    Ok(parts)
}

fn rank_round(
    sh: &Shared,
    op: Op,
    seq: u32,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    deadline: Instant,
) -> Result<Vec<Part>> {
    let root = sh
        .links
        .first()
        .ok_or(BootstrapError::PeerLost { rank: 0 })?;
    let head = Head {
        kind: Kind::Contribute,
        op,
        rank: sh.rank,
        seq,
        epoch: sh.epoch.load(Ordering::Acquire),
    };
    match wire::send(root.fd.as_fd(), head, payload, fds, deadline) {
        Ok(()) => {}
        // The root closed: what it sent before (a loss, an abort) is still to be read, and
        // names the cause better than the closed connection; `take` reports it.
        Err(wire::LinkError::Closed) => {}
        Err(e) => return Err(e.at(0, op.name())),
    }
    let mut parts = Vec::with_capacity(sh.world as usize);
    for src in 0..sh.world {
        let f = sh.take(0, op.name(), deadline)?;
        if f.head.kind == Kind::Abort {
            return Err(wire::parse_abort(&f.payload, op.name()));
        }
        if f.head.kind != Kind::Part || f.head.op != op || f.head.seq != seq || f.head.rank != src {
            return Err(BootstrapError::Protocol {
                rank: 0,
                what: "a part out of order",
            });
        }
        parts.push(Part {
            payload: f.payload,
            fds: f.fds,
        });
    }
    Ok(parts)
}

/// The root's side of a recover into `epoch`: one `Recover` from every rank (what is before it
/// on the link is stale), then `Recover` to every rank.
fn root_recover(sh: &Shared, epoch: u8, deadline: Instant) -> Result<()> {
    // A rank still waiting in a collective of the old epoch learns at once that it must
    // recover too (one already recovering drops this, as everything of the old epoch).
    let notice = Instant::now() + NOTICE;
    let head = Head::control(Kind::Abort, 0).in_epoch(epoch.wrapping_sub(1));
    let why = wire::abort(&BootstrapError::Recovering { rank: 0 });
    for l in &sh.links {
        let _ = wire::send(l.fd.as_fd(), head, &why, &[], notice);
    }
    for (i, link) in sh.links.iter().enumerate() {
        loop {
            let f = sh.take(i, "recover", deadline)?;
            if f.head.kind == Kind::Recover && f.head.epoch == epoch {
                break;
            }
            if f.head.epoch == epoch {
                return Err(BootstrapError::Mismatch {
                    rank: link.peer,
                    expected: "recover",
                    found: f.head.op.name(),
                });
            }
        }
    }
    let head = Head::control(Kind::Recover, 0).in_epoch(epoch);
    for link in &sh.links {
        wire::send(link.fd.as_fd(), head, &[], &[], deadline)
            .map_err(|e| e.at(link.peer, "recover"))?;
    }
    Ok(())
}

/// A rank's side of a recover into `epoch`: `Recover` to the root, then its answer.
fn rank_recover(sh: &Shared, epoch: u8, deadline: Instant) -> Result<()> {
    let root = sh
        .links
        .first()
        .ok_or(BootstrapError::PeerLost { rank: 0 })?;
    let head = Head::control(Kind::Recover, sh.rank).in_epoch(epoch);
    match wire::send(root.fd.as_fd(), head, &[], &[], deadline) {
        Ok(()) | Err(wire::LinkError::Closed) => {}
        Err(e) => return Err(e.at(0, "recover")),
    }
    loop {
        let f = sh.take(0, "recover", deadline)?;
        if f.head.epoch != epoch {
            continue;
        }
        match f.head.kind {
            Kind::Recover => return Ok(()),
            Kind::Abort => return Err(wire::parse_abort(&f.payload, "recover")),
            _ => {
                return Err(BootstrapError::Protocol {
                    rank: 0,
                    what: "a frame before the recover's answer",
                })
            }
        }
    }
}
