//! The signal protocol: monotone counters, no resets.
//!
//! Each rank owns a *signal pad*: an array of `u64` slots that every peer can update. A slot is
//! keyed by (team, channel, kind, peer): the peer is the rank that signals it, so every slot has
//! exactly one writer and the counts it receives arrive in that writer's program order.
//!
//! A collective signal is an atomic add of 1 with release semantics at system scope. A wait names
//! a slot and a count: it spins with acquire loads until the slot reaches `expected[slot] + count`
//! and then advances the rank's private `expected[slot]`. Counters only grow, so there is no reset
//! race and no ABA problem, a replayed CUDA graph sees the same protocol (the expected counters
//! advance with it), and a barrier of generation g+1 can never be confused with generation g.
//! Every schedule is *balanced*: each signal it sends is waited for by its receiver within the same
//! collective, so every collective starts with every slot at its expected value.
//!
//! User-level signals ([`SignalOp::Set`] / [`SignalOp::Add`]) and waits with a comparison ([`Cmp`])
//! are also provided. All comparisons are wrap-safe: `a > b` means `a - b` (wrapping) is a positive
//! `i64`, so a counter that wraps past `u64::MAX` keeps comparing correctly within 2^63.

use crate::op::{Op, SignalOp};
use serde::{Deserialize, Serialize};

/// The memory orderings of the protocol: the one definition that the host pads, the loom models
/// and the GPU kernels (through the generated `plan.cuh`) all use.
///
/// A signal publishes everything its sender wrote before it (release); a wait that observes the
/// signalled value sees all of it (acquire). Data accesses themselves are relaxed: every ordering
/// edge between ranks is one of these. `cargo xtask mutants` weakens each of them to `Relaxed`, one
/// at a time, and the loom models must catch every one.
pub mod order {
    use core::sync::atomic::Ordering;

    /// The read-modify-write of a [`SignalOp::Add`](crate::op::SignalOp::Add) signal.
    pub const SIGNAL_ADD: Ordering = Ordering::Release;
    /// The store of a [`SignalOp::Set`](crate::op::SignalOp::Set) signal.
    pub const SIGNAL_SET: Ordering = Ordering::Release;
    /// The load a wait spins on.
    pub const WAIT: Ordering = Ordering::Acquire;
    /// The store that raises a flag of a plan's flag form ([`crate::flag`]).
    pub const FLAG_RAISE: Ordering = Ordering::Release;
    /// The load a flag's lowering spins on before it stores 0 ([`crate::flag`]).
    pub const FLAG_WAIT: Ordering = Ordering::Acquire;
    /// The store of a 128-byte line's flag word, after its data words ([`crate::ll`]).
    pub const LL128_PUBLISH: Ordering = Ordering::Release;
    /// The load of a 128-byte line's flag word, before its data words ([`crate::ll`]).
    pub const LL128_OBSERVE: Ordering = Ordering::Acquire;

    /// The PTX memory-ordering qualifier of `o` (`relaxed`, `acquire`, `release`, `acq_rel`;
    /// `SeqCst` has no single qualifier and maps to the strongest, `acq_rel`).
    pub const fn ptx(o: Ordering) -> &'static str {
        match o {
            Ordering::Relaxed => "relaxed",
            Ordering::Acquire => "acquire",
            Ordering::Release => "release",
            _ => "acq_rel",
        }
    }
}

/// What a slot is used for. The kind is part of the key so that two protocols between the same
/// pair of ranks on the same channel never share a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum SlotKind {
    /// "I have entered this collective": my buffers may be written or read.
    Ready = 0,
    /// "Data for you is in place" (first tree, or the only stream).
    Data = 1,
    /// "I consumed a scratch slot you filled" (flow control credit).
    Credit = 2,
    /// Data on the second tree of a double binary tree.
    DataB = 3,
    /// Credit on the second tree of a double binary tree.
    CreditB = 4,
    /// "I finished reading your buffers".
    Done = 5,
    /// Whole and split barriers.
    Barrier = 6,
    /// Free for user-level `put_signal` / `wait_until`.
    User = 7,
    /// The low-latency protocol's call counter: a rank signals its own slot once per LL call
    /// and the executor's counter for it is the call's epoch ([`crate::ll`]).
    Epoch = 8,
}

/// Number of slot kinds.
pub const KINDS: u32 = 9;

impl SlotKind {
    /// Decodes a kind from its number.
    pub const fn from_u8(v: u8) -> Option<SlotKind> {
        Some(match v {
            0 => SlotKind::Ready,
            1 => SlotKind::Data,
            2 => SlotKind::Credit,
            3 => SlotKind::DataB,
            4 => SlotKind::CreditB,
            5 => SlotKind::Done,
            6 => SlotKind::Barrier,
            7 => SlotKind::User,
            8 => SlotKind::Epoch,
            _ => return None,
        })
    }

    /// Short name.
    pub const fn name(self) -> &'static str {
        match self {
            SlotKind::Ready => "ready",
            SlotKind::Data => "data",
            SlotKind::Credit => "credit",
            SlotKind::DataB => "data-b",
            SlotKind::CreditB => "credit-b",
            SlotKind::Done => "done",
            SlotKind::Barrier => "barrier",
            SlotKind::User => "user",
            SlotKind::Epoch => "epoch",
        }
    }
}

/// The full key of a slot on the pad of the rank that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SlotKey {
    /// Team (0 is the world).
    pub team: u16,
    /// Channel.
    pub channel: u16,
    /// Kind.
    pub kind: SlotKind,
    /// The rank that signals this slot.
    pub peer: u16,
}

/// Errors of the signal layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignalError {
    /// A key's team, channel or peer is outside the layout.
    KeyOutOfRange,
    /// The layout's slot count does not fit in `u32`.
    LayoutTooLarge,
}

impl core::fmt::Display for SignalError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SignalError::KeyOutOfRange => {
                write!(
                    f,
                    "a slot key's team, channel or peer is outside the layout"
                )
            }
            SignalError::LayoutTooLarge => write!(f, "the layout's slot count exceeds u32"),
        }
    }
}

impl core::error::Error for SignalError {}

/// Maps slot keys to pad indices: `((team * channels + channel) * KINDS + kind) * world + peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SlotLayout {
    /// Number of teams.
    pub teams: u16,
    /// Channels per team.
    pub channels: u16,
    /// Ranks in the world.
    pub world: u16,
}

impl SlotLayout {
    /// A layout, checked so that every index fits in `u32`.
    pub fn new(teams: u16, channels: u16, world: u16) -> Result<SlotLayout, SignalError> {
        let l = SlotLayout {
            teams,
            channels,
            world,
        };
        let n = teams as u64 * channels as u64 * KINDS as u64 * world as u64;
        if n > u32::MAX as u64 {
            return Err(SignalError::LayoutTooLarge);
        }
        Ok(l)
    }

    /// Number of slots in each rank's pad (saturated at `u32::MAX` for a layout that
    /// [`SlotLayout::new`] would refuse).
    pub fn slots(&self) -> u32 {
        let n = self.teams as u64 * self.channels as u64 * KINDS as u64 * self.world as u64;
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The pad index of a key.
    pub fn index(&self, k: SlotKey) -> Result<u32, SignalError> {
        if k.team >= self.teams || k.channel >= self.channels || k.peer >= self.world {
            return Err(SignalError::KeyOutOfRange);
        }
        let i = ((k.team as u64 * self.channels as u64 + k.channel as u64) * KINDS as u64
            + k.kind as u64)
            * self.world as u64
            + k.peer as u64;
        u32::try_from(i).map_err(|_| SignalError::LayoutTooLarge)
    }

    /// The pad index for in-range parts (schedules use this after validating the request).
    pub fn index_unchecked(&self, team: u16, channel: u16, kind: SlotKind, peer: u16) -> u32 {
        (((team as u32 * self.channels as u32 + channel as u32) * KINDS + kind as u32)
            * self.world as u32)
            + peer as u32
    }

    /// The key of an index, or `None` when it is outside the pad.
    pub fn key(&self, index: u32) -> Option<SlotKey> {
        if index >= self.slots() {
            return None;
        }
        let w = self.world as u32;
        let peer = (index % w) as u16;
        let rest = index / w;
        let kind = SlotKind::from_u8((rest % KINDS) as u8)?;
        let rest = rest / KINDS;
        let channel = (rest % self.channels as u32) as u16;
        let team = (rest / self.channels as u32) as u16;
        Some(SlotKey {
            team,
            channel,
            kind,
            peer,
        })
    }
}

/// A comparison for user-level `wait_until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Cmp {
    /// Equal.
    Eq = 0,
    /// Not equal.
    Ne = 1,
    /// Greater than (wrap-safe).
    Gt = 2,
    /// Greater or equal (wrap-safe).
    Ge = 3,
    /// Less than (wrap-safe).
    Lt = 4,
    /// Less or equal (wrap-safe).
    Le = 5,
}

impl Cmp {
    /// Every comparison.
    pub const ALL: [Cmp; 6] = [Cmp::Eq, Cmp::Ne, Cmp::Gt, Cmp::Ge, Cmp::Lt, Cmp::Le];

    /// Whether `value (cmp) target` holds, wrap-safe.
    pub fn holds(self, value: u64, target: u64) -> bool {
        let d = value.wrapping_sub(target) as i64;
        match self {
            Cmp::Eq => d == 0,
            Cmp::Ne => d != 0,
            Cmp::Gt => d > 0,
            Cmp::Ge => d >= 0,
            Cmp::Lt => d < 0,
            Cmp::Le => d <= 0,
        }
    }
}

/// Applies a signal to a slot value (what the atomic on the pad does).
pub fn apply(op: SignalOp, slot: u64, value: u64) -> u64 {
    match op {
        SignalOp::Set => value,
        SignalOp::Add => slot.wrapping_add(value),
    }
}

/// Whether a collective wait is satisfied: the slot has reached `expected + count` (wrap-safe).
pub fn wait_satisfied(slot: u64, expected: u64, count: u64) -> bool {
    Cmp::Ge.holds(slot, expected.wrapping_add(count))
}

/// Whole and split barriers over every rank of a team on one channel.
///
/// `arrive` signals the barrier slot of every peer; `wait` waits for one arrival from every peer.
/// With per-peer monotone counters, generation g's wait counts exactly the g-th arrival of each
/// peer, so a fast rank arriving at g+1 cannot release a rank still waiting at g early.
#[derive(Clone, Copy, Debug)]
pub struct Barrier {
    layout: SlotLayout,
    team: u16,
    channel: u16,
    me: u16,
}

impl Barrier {
    /// A barrier for `me` on (team, channel).
    pub fn new(
        layout: SlotLayout,
        team: u16,
        channel: u16,
        me: u16,
    ) -> Result<Barrier, SignalError> {
        layout.index(SlotKey {
            team,
            channel,
            kind: SlotKind::Barrier,
            peer: me,
        })?;
        Ok(Barrier {
            layout,
            team,
            channel,
            me,
        })
    }

    fn peers(&self) -> impl Iterator<Item = u16> + '_ {
        (0..self.layout.world).filter(move |&p| p != self.me)
    }

    /// The arrive half: one signal to every peer.
    pub fn arrive(&self) -> impl Iterator<Item = Op> + '_ {
        self.peers().map(move |p| Op::Signal {
            peer: p,
            slot: self
                .layout
                .index_unchecked(self.team, self.channel, SlotKind::Barrier, self.me),
            op: SignalOp::Add,
            value: 1,
        })
    }

    /// The wait half: one arrival from every peer.
    pub fn wait(&self) -> impl Iterator<Item = Op> + '_ {
        self.peers().map(move |p| Op::Wait {
            slot: self
                .layout
                .index_unchecked(self.team, self.channel, SlotKind::Barrier, p),
            count: 1,
        })
    }

    /// A whole barrier: arrive then wait.
    pub fn whole(&self) -> impl Iterator<Item = Op> + '_ {
        self.arrive().chain(self.wait())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_every_key() {
        let l = SlotLayout::new(2, 3, 5).unwrap();
        let mut seen = 0;
        for i in 0..l.slots() {
            let k = l.key(i).unwrap();
            assert_eq!(l.index(k).unwrap(), i);
            seen += 1;
        }
        assert_eq!(seen, 2 * 3 * KINDS * 5);
        assert_eq!(l.key(l.slots()), None);
        let bad = SlotKey {
            team: 0,
            channel: 3,
            kind: SlotKind::Data,
            peer: 0,
        };
        assert_eq!(l.index(bad), Err(SignalError::KeyOutOfRange));
        // A layout built without `new` never overflows.
        let huge = SlotLayout {
            teams: 1,
            channels: u16::MAX,
            world: u16::MAX,
        };
        assert_eq!(huge.slots(), u32::MAX);
        assert!(huge.key(u32::MAX - 1).is_some());
        let last = SlotKey {
            team: 0,
            channel: u16::MAX - 1,
            kind: SlotKind::User,
            peer: u16::MAX - 1,
        };
        assert_eq!(huge.index(last), Err(SignalError::LayoutTooLarge));
    }

    #[test]
    fn comparisons_are_wrap_safe() {
        let near_max = u64::MAX - 1;
        let wrapped = near_max.wrapping_add(3);
        assert!(Cmp::Gt.holds(wrapped, near_max));
        assert!(Cmp::Lt.holds(near_max, wrapped));
        assert!(Cmp::Ge.holds(5, 5) && Cmp::Le.holds(5, 5) && Cmp::Eq.holds(5, 5));
        assert!(Cmp::Ne.holds(5, 6) && !Cmp::Ne.holds(6, 6));
        assert!(wait_satisfied(wrapped, near_max, 3));
        assert!(!wait_satisfied(wrapped, near_max, 4));
    }

    #[test]
    fn barrier_signals_every_peer_and_waits_for_each() {
        let l = SlotLayout::new(1, 1, 4).unwrap();
        let b = Barrier::new(l, 0, 0, 2).unwrap();
        let ops: heapless::Vec<Op, 8> = b.whole().collect();
        assert_eq!(ops.len(), 6);
        let waits = ops.iter().filter(|o| matches!(o, Op::Wait { .. })).count();
        assert_eq!(waits, 3);
    }
}
