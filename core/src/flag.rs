//! The flag form of a plan: the protocol of the copy-engine path.
//!
//! A GPU's copy engines move bytes without occupying an SM, and its stream can write a word and
//! wait for a word (CUDA stream memory operations), but a stream cannot add to a counter, and
//! what a stream waits for is fixed when the wait is enqueued, so a counter that grows from call
//! to call cannot be waited for by a CUDA graph that replays. The copy-engine path therefore
//! runs a plan in its *flag form*: every [`Op::Signal`] raises a flag word on the peer (stores
//! [`RAISED`], release), and every [`Op::Wait`] waits until its own flag is raised (acquire),
//! then lowers it (stores 0). Flags live beside the counters, never in the same words, so the
//! two forms never disturb each other.
//!
//! The flag form computes what the counter form computes when three conditions hold, and
//! [`check`] proves them for a whole request (every rank, every channel):
//!
//! 1. **Only copies and unit signals.** The plan holds [`Op::Copy`], [`Op::Signal`] adding 1 and
//!    [`Op::Wait`] for 1, nothing else ([`flag_op`] converts one op).
//! 2. **One raise per flag per call.** In one call each slot of a rank is signalled once, by one
//!    writer, and waited for once, so the counter would go from k to k + 1 and the wait expects
//!    k + 1: the flag goes 0, raised, lowered, the same information.
//! 3. **No raise on a raised flag.** A raise that lands before the reader lowered the previous
//!    call's raise would be lost (a counter would have counted it). So the writer's raise in
//!    the next call must come after the reader's lowering: before raising again, the writer
//!    waits for a flag that the reader raises after it lowered (a wait later in the same call
//!    on a raise the reader makes after its lowering, or any wait on the reader earlier in the
//!    next call). Only one-hop orderings are counted; a plan that needs a longer chain is
//!    refused, never run on a guess.
//!
//! A flag is waited for with "at least [`RAISED`]", so the runtime can release every wait of a
//! rank at once (a lost peer) by storing a larger value.

use crate::op::{Loc, Op, OpKind, SignalOp};
use crate::sched::{Algorithm, Collective, Request, Schedule};

/// The value a raised flag holds; a lowered one holds 0.
pub const RAISED: u64 = 1;

/// One step of a plan's flag form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagOp {
    /// Copy `bytes` bytes from `src` to `dst` (a copy engine's transfer).
    Copy {
        /// Source.
        src: Loc,
        /// Destination.
        dst: Loc,
        /// Byte count.
        bytes: u64,
    },
    /// Store [`RAISED`] into flag `slot` of `peer` (release: the copies before it are visible
    /// to whoever sees the flag raised).
    Raise {
        /// Rank whose flag is raised.
        peer: u16,
        /// Slot index of the flag.
        slot: u32,
    },
    /// Wait until own flag `slot` is at least [`RAISED`] (acquire), then store 0 into it.
    Lower {
        /// Own slot index.
        slot: u32,
    },
}

/// Why a plan has no flag form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlagError {
    /// The op is not a copy, a signal or a wait (a reduction, a low-latency or multicast op).
    NotCopy {
        /// The op's kind.
        kind: OpKind,
    },
    /// A signal that sets, or adds something other than 1.
    NotUnitSignal {
        /// Slot signalled.
        slot: u32,
    },
    /// A wait for more than one signal.
    NotUnitWait {
        /// Slot waited for.
        slot: u32,
    },
    /// A slot signalled or waited for more than once in one call, or a wait nobody signals.
    Unbalanced {
        /// The rank that owns the slot.
        rank: u16,
        /// The slot.
        slot: u32,
    },
    /// Nothing orders the writer's next raise after the reader's lowering (condition 3).
    Unordered {
        /// The rank that owns the flag.
        rank: u16,
        /// The flag's slot.
        slot: u32,
        /// The rank that raises it.
        writer: u16,
    },
    /// The request itself is invalid, or is not one the flag form serves ([`eligible`]).
    Request,
}

impl core::fmt::Display for FlagError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FlagError::NotCopy { kind } => {
                write!(
                    f,
                    "{kind:?} has no flag form (copies, signals and waits only)"
                )
            }
            FlagError::NotUnitSignal { slot } => {
                write!(f, "signal of slot {slot} is not an add of 1")
            }
            FlagError::NotUnitWait { slot } => write!(f, "wait on slot {slot} is not for 1"),
            FlagError::Unbalanced { rank, slot } => write!(
                f,
                "slot {slot} of rank {rank} is not signalled once and waited for once per call"
            ),
            FlagError::Unordered { rank, slot, writer } => write!(
                f,
                "rank {writer}'s next raise of slot {slot} of rank {rank} may come before \
                 rank {rank} lowered it"
            ),
            FlagError::Request => write!(f, "not a request the flag form serves"),
        }
    }
}

impl core::error::Error for FlagError {}

/// The flag form of one op.
pub fn flag_op(op: &Op) -> Result<FlagOp, FlagError> {
    match *op {
        Op::Copy { src, dst, bytes } => Ok(FlagOp::Copy { src, dst, bytes }),
        Op::Signal {
            peer,
            slot,
            op: SignalOp::Add,
            value: 1,
        } => Ok(FlagOp::Raise { peer, slot }),
        Op::Signal { slot, .. } => Err(FlagError::NotUnitSignal { slot }),
        Op::Wait { slot, count: 1 } => Ok(FlagOp::Lower { slot }),
        Op::Wait { slot, .. } => Err(FlagError::NotUnitWait { slot }),
        ref o => Err(FlagError::NotCopy { kind: o.kind() }),
    }
}

/// Whether the copy-engine path serves `req`: the collectives that only move bytes (all-gather,
/// broadcast, scatter, gather, all-to-all, send-recv) on their one-hop schedules (`direct`,
/// `pairwise`). A function of the request alone, so every rank decides alike; [`check`] proves
/// the flag form of each of them (the tests run it over worlds, channels, sizes and roots).
pub fn eligible(req: &Request) -> bool {
    matches!(req.algorithm, Algorithm::Direct | Algorithm::Pairwise)
        && matches!(
            req.collective,
            Collective::AllGather
                | Collective::Broadcast { .. }
                | Collective::Scatter { .. }
                | Collective::Gather { .. }
                | Collective::AllToAll
                | Collective::SendRecv { .. }
        )
        && req.validate().is_ok()
}

/// One channel's ops of one rank (`None` when the rank has no plan).
pub trait Plans {
    /// The op stream.
    type Ops: Iterator<Item = Op>;
    /// Rank `r`'s ops on channel `c`.
    fn ops(&self, r: u16, c: u16) -> Option<Self::Ops>;
}

struct Scheduled(Request);

impl Plans for Scheduled {
    type Ops = Schedule;
    fn ops(&self, r: u16, c: u16) -> Option<Schedule> {
        Schedule::new(self.0, r, c).ok()
    }
}

/// Proves the three conditions of the module doc for every rank and channel of `req`.
///
/// Cost: for each wait, a scan of every rank's plan for its writer, then a scan of the writer's
/// waits; a few milliseconds at 8 ranks.
pub fn check(req: &Request) -> Result<(), FlagError> {
    if !eligible(req) {
        return Err(FlagError::Request);
    }
    check_plans(&Scheduled(*req), req.world, req.channels)
}

/// [`check`] over any plans: `world` ranks, `channels` channels each (a user's plans, or a
/// model's).
pub fn check_plans<P: Plans>(plans: &P, world: u16, channels: u16) -> Result<(), FlagError> {
    let v = Checker { plans, world };
    for c in 0..channels {
        for r in 0..world {
            let ops = plans.ops(r, c).ok_or(FlagError::Request)?;
            for (j, op) in ops.enumerate() {
                let slot = match flag_op(&op)? {
                    FlagOp::Lower { slot } => slot,
                    FlagOp::Raise { peer, slot } => {
                        // Each (peer, slot) raised once per call by this rank.
                        if v.signal_at(r, c, peer, slot) != Some(j) {
                            return Err(FlagError::Unbalanced { rank: peer, slot });
                        }
                        continue;
                    }
                    FlagOp::Copy { .. } => continue,
                };
                v.lowered_once(r, c, slot, j)?;
                let writer = v.writer_of(r, c, slot)?;
                v.ordered(c, r, slot, j, writer)?;
            }
        }
    }
    Ok(())
}

struct Checker<'a, P> {
    plans: &'a P,
    world: u16,
}

impl<P: Plans> Checker<'_, P> {
    /// The position of rank `r`'s first signal of `(to, slot)` on channel `c`, if any.
    fn signal_at(&self, r: u16, c: u16, to: u16, slot: u32) -> Option<usize> {
        self.plans.ops(r, c)?.enumerate().find_map(|(i, op)| {
            matches!(op, Op::Signal { peer, slot: s, .. } if peer == to && s == slot).then_some(i)
        })
    }

    /// Fails unless rank `r`'s wait at `j` is its only wait on `slot`.
    fn lowered_once(&self, r: u16, c: u16, slot: u32, j: usize) -> Result<(), FlagError> {
        let ops = self.plans.ops(r, c).ok_or(FlagError::Request)?;
        let mut waits = ops
            .enumerate()
            .filter(|(_, op)| matches!(op, Op::Wait { slot: s, .. } if *s == slot));
        if waits.any(|(i, _)| i != j) {
            return Err(FlagError::Unbalanced { rank: r, slot });
        }
        Ok(())
    }

    /// The one rank (on channel `c`) that signals `slot` of rank `r`.
    fn writer_of(&self, r: u16, c: u16, slot: u32) -> Result<u16, FlagError> {
        let mut writer = None;
        for q in 0..self.world {
            if self.signal_at(q, c, r, slot).is_some() {
                if writer.is_some() {
                    return Err(FlagError::Unbalanced { rank: r, slot });
                }
                writer = Some(q);
            }
        }
        writer.ok_or(FlagError::Unbalanced { rank: r, slot })
    }

    /// Condition 3 for flag `slot` of rank `r`, lowered at position `j`, raised by `writer`.
    fn ordered(&self, c: u16, r: u16, slot: u32, j: usize, writer: u16) -> Result<(), FlagError> {
        let unordered = FlagError::Unordered {
            rank: r,
            slot,
            writer,
        };
        let raise = self.signal_at(writer, c, r, slot).ok_or(unordered)?;
        if writer == r {
            // Raised by its own reader: program order puts the next raise after this lowering
            // only if the raise comes after the wait.
            return if raise > j { Ok(()) } else { Err(unordered) };
        }
        let ops = self.plans.ops(writer, c).ok_or(FlagError::Request)?;
        for (p, op) in ops.enumerate() {
            let Op::Wait { slot: s, .. } = op else {
                continue;
            };
            // Only waits on a flag the reader raises order anything here.
            let Some(m) = self.signal_at(r, c, writer, s) else {
                continue;
            };
            // In the next call, a wait before the raise follows all of the reader's call; in
            // this call, a wait on a raise the reader makes after its lowering.
            if p < raise || m > j {
                return Ok(());
            }
        }
        Err(unordered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};
    use crate::op::Buf;

    fn req(c: Collective, a: Algorithm, world: u16, channels: u16) -> Request {
        Request::new(c, a, world, 4096, DType::F32, ReduceOp::Sum).with_channels(channels)
    }

    #[test]
    fn every_eligible_request_has_a_proven_flag_form() {
        let mut proven = 0;
        for world in 1..=8u16 {
            let last = world - 1;
            let cs = [
                Collective::AllGather,
                Collective::Broadcast { root: 0 },
                Collective::Broadcast { root: last },
                Collective::Scatter { root: last },
                Collective::Gather { root: 0 },
                Collective::AllToAll,
                Collective::SendRecv { src: last, dst: 0 },
                Collective::SendRecv { src: 0, dst: last },
            ];
            for c in cs {
                for a in [Algorithm::Direct, Algorithm::Pairwise] {
                    for ch in [1, 2, 3] {
                        let r = req(c, a, world, ch);
                        if eligible(&r) {
                            assert_eq!(check(&r), Ok(()), "{r:?}");
                            proven += 1;
                        }
                    }
                }
            }
        }
        // All-gather, broadcast (2 roots), scatter, gather, send-recv (2) on `direct` and
        // all-to-all on `pairwise`, at 8 worlds and 3 channel counts (send-recv needs 2 ranks).
        assert!(proven >= 7 * 8 * 3, "{proven}");
    }

    #[test]
    fn reductions_and_staged_schedules_are_refused() {
        for (c, a) in [
            (Collective::AllReduce, Algorithm::OneShot),
            (Collective::AllGather, Algorithm::Ring),
            (Collective::AllGather, Algorithm::DirectLl),
            (Collective::Broadcast { root: 0 }, Algorithm::Tree),
        ] {
            let r = req(c, a, 4, 1);
            assert!(!eligible(&r), "{r:?}");
            assert_eq!(check(&r), Err(FlagError::Request));
        }
    }

    /// Hand-written plans of two ranks, one channel.
    struct Written<'a>([&'a [Op]; 2]);

    impl<'a> Plans for Written<'a> {
        type Ops = core::iter::Copied<core::slice::Iter<'a, Op>>;
        fn ops(&self, r: u16, _: u16) -> Option<Self::Ops> {
            self.0.get(r as usize).map(|o| o.iter().copied())
        }
    }

    const fn sig(peer: u16, slot: u32) -> Op {
        Op::Signal {
            peer,
            slot,
            op: SignalOp::Add,
            value: 1,
        }
    }

    const fn wait(slot: u32) -> Op {
        Op::Wait { slot, count: 1 }
    }

    const PUT: Op = Op::Copy {
        src: Loc::new(0, Buf::Input, 0),
        dst: Loc::new(1, Buf::Output, 0),
        bytes: 8,
    };

    #[test]
    fn a_raise_nothing_orders_after_the_lowering_is_refused() {
        // Rank 0 pushes and raises "data" on rank 1 with no handshake: its next call's raise
        // may land before rank 1 lowered this one.
        let push: &[Op] = &[PUT, sig(1, 7)];
        let take: &[Op] = &[wait(7)];
        assert_eq!(
            check_plans(&Written([push, take]), 2, 1),
            Err(FlagError::Unordered {
                rank: 1,
                slot: 7,
                writer: 0
            })
        );
        // With rank 1's "ready" first (slot 2 of rank 0), the next raise waits for it.
        let push: &[Op] = &[wait(2), PUT, sig(1, 7)];
        let take: &[Op] = &[sig(0, 2), wait(7)];
        assert_eq!(check_plans(&Written([push, take]), 2, 1), Ok(()));
        // A "ready" raised before the reader's lowering orders nothing in this call, and the
        // writer waits for it after its raise: refused (rank 0's own flag is found first; its
        // next raise by rank 1 is as unordered).
        let push: &[Op] = &[PUT, sig(1, 7), wait(2)];
        let take: &[Op] = &[sig(0, 2), wait(7)];
        assert_eq!(
            check_plans(&Written([push, take]), 2, 1),
            Err(FlagError::Unordered {
                rank: 0,
                slot: 2,
                writer: 1
            })
        );
        // Two raises of one flag in a call.
        let push: &[Op] = &[wait(2), sig(1, 7), sig(1, 7)];
        assert_eq!(
            check_plans(&Written([push, take]), 2, 1),
            Err(FlagError::Unbalanced { rank: 1, slot: 7 })
        );
    }

    #[test]
    fn ops_without_a_flag_form_are_typed() {
        let l = Loc::new(0, Buf::Input, 0);
        let set = Op::Signal {
            peer: 1,
            slot: 3,
            op: SignalOp::Set,
            value: 1,
        };
        assert_eq!(flag_op(&set), Err(FlagError::NotUnitSignal { slot: 3 }));
        let add2 = Op::Signal {
            peer: 1,
            slot: 3,
            op: SignalOp::Add,
            value: 2,
        };
        assert_eq!(flag_op(&add2), Err(FlagError::NotUnitSignal { slot: 3 }));
        let wait2 = Op::Wait { slot: 4, count: 2 };
        assert_eq!(flag_op(&wait2), Err(FlagError::NotUnitWait { slot: 4 }));
        let put = Op::LlPut {
            format: crate::ll::Format::Ll,
            src: l,
            dst: l,
            bytes: 8,
            slot: 0,
            flip: 0,
        };
        assert_eq!(
            flag_op(&put),
            Err(FlagError::NotCopy {
                kind: OpKind::LlPut
            })
        );
        assert_eq!(
            flag_op(&Op::Wait { slot: 4, count: 1 }),
            Ok(FlagOp::Lower { slot: 4 })
        );
    }
}
