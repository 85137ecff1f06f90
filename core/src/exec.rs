//! A generic executor that steps one rank's ops without blocking.
//!
//! [`Executor`] walks any op iterator (a [`crate::sched::Schedule`], or a user-written plan)
//! against a [`Fabric`], the memory and signal pads of a concrete backend. A `Wait` that is not yet
//! satisfied returns [`Step::Blocked`] instead of spinning, so any runtime can drive ranks: one
//! thread per rank that spins or yields, a single-threaded simulator that round-robins every
//! rank, an async task, or a bare-metal loop.
//!
//! The executor owns the rank's private `expected` counters (a slice the caller provides, one per
//! pad slot, kept across collectives so counters stay monotone) and runs exactly the ops it is
//! given, in order. A channel's waits only name its own slots, which are contiguous in the pad
//! layout, so a runtime may give each channel's executor just that range ([`Executor::at`]).

use crate::op::Op;
use crate::signal::wait_satisfied;

/// Memory and signal pads of one rank, as seen by an executor.
pub trait Fabric {
    /// The backend's error.
    type Error;

    /// Performs a data op or a signal (`Copy`, `Reduce`, `Signal`, `McReduce`, `McStore`). A
    /// signal must have release semantics: everything written before is visible to a rank that
    /// observes the new slot value with an acquire load.
    fn execute(&mut self, op: &Op) -> Result<(), Self::Error>;

    /// Loads one of this rank's own slots with acquire semantics.
    fn load_slot(&mut self, slot: u32) -> Result<u64, Self::Error>;

    /// Performs a low-latency op ([`crate::ll`]) of the call whose epoch is `epoch` (the
    /// executor's counter of the op's slot). `LlPut` writes its lines (each 8-byte half with
    /// one atomic store) and is [`LlPoll::Done`]; `LlReduce` is [`LlPoll::Waiting`], having
    /// written nothing, while any line it reads lacks the call's flag, and otherwise folds the
    /// lines' data into `dst` and is `Done`. A fabric without the protocol returns an error.
    fn ll(&mut self, op: &Op, epoch: u64) -> Result<LlPoll, Self::Error>;
}

/// What [`Fabric::ll`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlPoll {
    /// The op ran.
    Done,
    /// A line the op reads does not carry the call's flag yet; the flag found in it.
    Waiting(u32),
}

/// What one call to [`Executor::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Op `index` ran (a `Wait` ran when its slot reached the target).
    Ran {
        /// Position of the op in the rank's stream.
        index: u32,
        /// The op.
        op: Op,
    },
    /// Op `index` is a `Wait` whose slot has not reached the target yet, or an `LlReduce`
    /// whose lines do not all carry the call's flag yet.
    Blocked {
        /// Position of the op in the rank's stream.
        index: u32,
        /// The slot waited on (an `LlReduce`: its epoch slot).
        slot: u32,
        /// The value the slot must reach (an `LlReduce`: the call's flag).
        target: u64,
        /// The value found (an `LlReduce`: the flag of the first line that lacks it).
        found: u64,
    },
    /// No ops are left.
    Done,
}

/// Why an executor stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecError<E> {
    /// An op names a slot outside the expected-counter slice.
    SlotOutOfRange {
        /// The slot.
        slot: u32,
        /// Position of the op.
        index: u32,
    },
    /// The fabric refused an op.
    Fabric {
        /// The backend error.
        error: E,
        /// Position of the op.
        index: u32,
    },
}

impl<E: core::fmt::Display> core::fmt::Display for ExecError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ExecError::SlotOutOfRange { slot, index } => {
                write!(
                    f,
                    "op {index} names slot {slot}, outside the expected counters"
                )
            }
            ExecError::Fabric { error, index } => {
                write!(f, "the fabric refused op {index}: {error}")
            }
        }
    }
}

impl<E: core::error::Error + 'static> core::error::Error for ExecError<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            ExecError::Fabric { error, .. } => Some(error),
            ExecError::SlotOutOfRange { .. } => None,
        }
    }
}

/// Steps one rank's op stream against a fabric.
///
/// A tiny fabric (one rank's signal pad, data ops ignored) and a stream that signals a peer,
/// then waits for a signal back: the wait is [`Step::Blocked`] until the peer's signal lands.
///
/// ```
/// use symm_core::exec::{Executor, Fabric, Step};
/// use symm_core::op::{Op, SignalOp};
/// use symm_core::signal;
///
/// /// Signal pads of two ranks; this fabric is rank 0's view.
/// struct Pads([[u64; 2]; 2]);
///
/// impl Fabric for Pads {
///     type Error = &'static str;
///     fn execute(&mut self, op: &Op) -> Result<(), Self::Error> {
///         match *op {
///             Op::Signal { peer, slot, op, value } => {
///                 let s = self.0.get_mut(peer as usize).and_then(|p| p.get_mut(slot as usize));
///                 let s = s.ok_or("no such slot")?;
///                 *s = signal::apply(op, *s, value);
///                 Ok(())
///             }
///             _ => Ok(()), // a real fabric moves bytes here
///         }
///     }
///     fn load_slot(&mut self, slot: u32) -> Result<u64, Self::Error> {
///         self.0[0].get(slot as usize).copied().ok_or("no such slot")
///     }
///     fn ll(&mut self, _op: &Op, _epoch: u64) -> Result<symm_core::exec::LlPoll, Self::Error> {
///         Err("no low-latency protocol here")
///     }
/// }
///
/// let ops = [
///     Op::Signal { peer: 1, slot: 0, op: SignalOp::Add, value: 1 },
///     Op::Wait { slot: 1, count: 1 },
/// ];
/// let mut pads = Pads([[0; 2]; 2]);
/// let mut expected = [0u64; 2]; // rank 0's counters, kept across collectives
/// let mut ex = Executor::new(ops.into_iter(), &mut expected);
///
/// assert!(matches!(ex.step(&mut pads), Ok(Step::Ran { index: 0, .. })));
/// assert_eq!(pads.0[1][0], 1); // rank 1's slot 0 got the signal
/// assert_eq!(
///     ex.step(&mut pads),
///     Ok(Step::Blocked { index: 1, slot: 1, target: 1, found: 0 })
/// );
/// pads.0[0][1] = 1; // rank 1 signals back (in a real runtime: another thread, or a later turn)
/// assert!(matches!(ex.step(&mut pads), Ok(Step::Ran { index: 1, .. })));
/// assert_eq!(ex.step(&mut pads), Ok(Step::Done));
/// assert_eq!(ex.expected(), &[0, 1]);
/// ```
///
/// `examples/foreign_runtime.rs` is a whole runtime built this way: buffers, pads, and a
/// scheduler that runs every rank's executors in turn.
pub struct Executor<'e, I> {
    ops: I,
    current: Option<Op>,
    index: u32,
    expected: &'e mut [u64],
    /// The pad slot `expected[0]` counts for.
    base: u32,
}

impl<'e, I: Iterator<Item = Op>> Executor<'e, I> {
    /// An executor over `ops` with the rank's expected counters.
    pub fn new(ops: I, expected: &'e mut [u64]) -> Self {
        Self::at(ops, expected, 0)
    }

    /// An executor whose counters cover pad slots `base .. base + expected.len()` (one channel's
    /// range); a wait on any other slot is [`ExecError::SlotOutOfRange`].
    pub fn at(ops: I, expected: &'e mut [u64], base: u32) -> Self {
        Executor {
            ops,
            current: None,
            index: 0,
            expected,
            base,
        }
    }

    /// The next op to run and its index, without running it.
    pub fn peek(&mut self) -> Option<(u32, Op)> {
        if self.current.is_none() {
            self.current = self.ops.next();
        }
        self.current.map(|o| (self.index, o))
    }

    /// Index of the next op.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Runs the next op, or reports that it is blocked.
    pub fn step<F: Fabric>(&mut self, f: &mut F) -> Result<Step, ExecError<F::Error>> {
        let Some((index, op)) = self.peek() else {
            return Ok(Step::Done);
        };
        if let Op::Wait { slot, count } = op {
            let exp = slot
                .checked_sub(self.base)
                .and_then(|i| self.expected.get_mut(i as usize))
                .ok_or(ExecError::SlotOutOfRange { slot, index })?;
            let found = f
                .load_slot(slot)
                .map_err(|error| ExecError::Fabric { error, index })?;
            if !wait_satisfied(found, *exp, count) {
                return Ok(Step::Blocked {
                    index,
                    slot,
                    target: exp.wrapping_add(count),
                    found,
                });
            }
            *exp = exp.wrapping_add(count);
        } else if let Some(slot) = op.ll_slot() {
            let epoch = self
                .expected_of(slot)
                .ok_or(ExecError::SlotOutOfRange { slot, index })?;
            let poll = f
                .ll(&op, epoch)
                .map_err(|error| ExecError::Fabric { error, index })?;
            if let LlPoll::Waiting(found) = poll {
                return Ok(Step::Blocked {
                    index,
                    slot,
                    target: crate::ll::flag(epoch) as u64,
                    found: found as u64,
                });
            }
        } else {
            f.execute(&op)
                .map_err(|error| ExecError::Fabric { error, index })?;
        }
        self.current = None;
        // An op index past u32 (a stream of over 4 billion ops, timed only) stays there.
        self.index = self.index.saturating_add(1);
        Ok(Step::Ran { index, op })
    }

    /// The expected counters (for inspection after a run); `expected()[i]` counts slot
    /// `base + i`.
    pub fn expected(&self) -> &[u64] {
        self.expected
    }

    /// The counter of pad slot `slot`, when it is in this executor's range.
    pub fn expected_of(&self, slot: u32) -> Option<u64> {
        slot.checked_sub(self.base)
            .and_then(|i| self.expected.get(i as usize).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pad(u64);

    impl Fabric for Pad {
        type Error = ();
        fn execute(&mut self, _op: &Op) -> Result<(), ()> {
            Ok(())
        }
        fn load_slot(&mut self, _slot: u32) -> Result<u64, ()> {
            Ok(self.0)
        }
        fn ll(&mut self, _op: &Op, _epoch: u64) -> Result<LlPoll, ()> {
            Err(())
        }
    }

    #[test]
    fn a_channel_range_counts_its_own_slots_and_refuses_others() {
        let ops = [
            Op::Wait { slot: 10, count: 1 },
            Op::Wait { slot: 11, count: 1 },
            Op::Wait { slot: 9, count: 1 },
        ];
        let mut expected = [0u64; 2];
        let mut ex = Executor::at(ops.into_iter(), &mut expected, 10);
        let mut pad = Pad(1);
        assert!(matches!(ex.step(&mut pad), Ok(Step::Ran { index: 0, .. })));
        assert!(matches!(ex.step(&mut pad), Ok(Step::Ran { index: 1, .. })));
        assert_eq!(ex.expected_of(10), Some(1));
        assert_eq!(ex.expected_of(9), None);
        assert_eq!(
            ex.step(&mut pad),
            Err(ExecError::SlotOutOfRange { slot: 9, index: 2 })
        );
    }
}
