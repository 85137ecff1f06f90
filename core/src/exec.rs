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
//! given, in order.

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
    /// Op `index` is a `Wait` whose slot has not reached the target yet.
    Blocked {
        /// Position of the op in the rank's stream.
        index: u32,
        /// The slot waited on.
        slot: u32,
        /// The value the slot must reach.
        target: u64,
        /// The value found.
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

/// Steps one rank's op stream against a fabric.
pub struct Executor<'e, I> {
    ops: I,
    current: Option<Op>,
    index: u32,
    expected: &'e mut [u64],
}

impl<'e, I: Iterator<Item = Op>> Executor<'e, I> {
    /// An executor over `ops` with the rank's expected counters.
    pub fn new(ops: I, expected: &'e mut [u64]) -> Self {
        Executor {
            ops,
            current: None,
            index: 0,
            expected,
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
            let exp = self
                .expected
                .get_mut(slot as usize)
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
        } else {
            f.execute(&op)
                .map_err(|error| ExecError::Fabric { error, index })?;
        }
        self.current = None;
        self.index += 1;
        Ok(Step::Ran { index, op })
    }

    /// The expected counters (for inspection after a run).
    pub fn expected(&self) -> &[u64] {
        self.expected
    }
}
