//! The flag form on the host: a rank's plan run the way the copy-engine path runs it.
//!
//! [`symm_core::flag`] defines the form and proves when it computes what the counter form
//! computes; this module runs it over a [`WorldMem`] whose pads hold flags (a world runs one form:
//! the GPU keeps flags and counters in different words). A copy is the memory's copy, a raise is
//! [`WorldMem::raise`] (release), a lowering spins on [`WorldMem::lower`] (acquire, then a store of
//! 0), all with the orderings of `symm_core::signal::order`, so the loom model that drives these
//! steps checks the orderings the GPU's stream operations are derived from.

use symm_core::flag::{flag_op, FlagError, FlagOp};
use symm_core::op::Op;

use super::mem::{Oob, Temps, WorldMem};

/// What one [`FlagStream::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagStep {
    /// Ran the op at this index.
    Ran(usize),
    /// The op at this index waits for a flag that is not raised yet.
    Blocked(usize),
    /// Every op ran.
    Done,
}

/// One rank's plan (one channel) in flag form, with its position.
#[derive(Clone, Debug)]
pub struct FlagStream {
    rank: u16,
    ops: Vec<FlagOp>,
    at: usize,
}

impl FlagStream {
    /// Converts `ops` (rank `rank`'s plan of one channel); fails on the first op without a flag
    /// form. Whether the whole request may run in this form is [`symm_core::flag::check`]'s.
    pub fn new(rank: u16, ops: impl IntoIterator<Item = Op>) -> Result<FlagStream, FlagError> {
        let ops = ops
            .into_iter()
            .map(|o| flag_op(&o))
            .collect::<Result<_, _>>()?;
        Ok(FlagStream { rank, ops, at: 0 })
    }

    /// Runs the next op if it can.
    pub fn step(&mut self, mem: &WorldMem, t: &mut Temps) -> Result<FlagStep, Oob> {
        let Some(op) = self.ops.get(self.at) else {
            return Ok(FlagStep::Done);
        };
        let i = self.at;
        match *op {
            FlagOp::Copy { src, dst, bytes } => mem.apply(&Op::Copy { src, dst, bytes }, t)?,
            FlagOp::Raise { peer, slot } => mem.raise(peer, slot)?,
            FlagOp::Lower { slot } => {
                if !mem.lower(self.rank, slot)? {
                    return Ok(FlagStep::Blocked(i));
                }
            }
        }
        self.at += 1;
        Ok(FlagStep::Ran(i))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{random_inputs, reference, POISON};
    use std::sync::Arc;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::op::Buf;
    use symm_core::sched::{Algorithm, Collective, Request, Schedule};

    /// `calls` calls of `req` back to back on one memory, one thread per rank, new inputs each
    /// call and no barrier between calls: every call's outputs are the reference's.
    fn back_to_back(req: Request, calls: u64) {
        symm_core::flag::check(&req).unwrap();
        let sizes = req.buffer_sizes();
        let slots = req.layout().slots();
        let mem = Arc::new(
            WorldMem::blank(
                req.world,
                [sizes.input, sizes.output, sizes.scratch],
                slots,
                POISON,
            )
            .expect("a small world"),
        );
        let wants: Vec<Vec<Vec<u8>>> = (0..calls)
            .map(|c| reference(&req, &random_inputs(&req, c)))
            .collect();
        let wants = Arc::new(wants);
        let handles: Vec<_> = (0..req.world)
            .map(|rank| {
                let (mem, wants) = (mem.clone(), wants.clone());
                std::thread::spawn(move || {
                    let mut t = Temps::default();
                    for call in 0..calls {
                        let input = &random_inputs(&req, call)[rank as usize];
                        mem.write_at(symm_core::op::Loc::new(rank, Buf::Input, 0), input)
                            .unwrap();
                        for ch in 0..req.channels {
                            let ops = Schedule::new(req, rank, ch).unwrap();
                            let mut s = FlagStream::new(rank, ops).unwrap();
                            let mut spins = 0u64;
                            loop {
                                match s.step(&mem, &mut t).unwrap() {
                                    FlagStep::Ran(_) => {}
                                    FlagStep::Blocked(_) => {
                                        spins += 1;
                                        assert!(spins < 1 << 32, "rank {rank} hangs");
                                        std::thread::yield_now();
                                    }
                                    FlagStep::Done => break,
                                }
                            }
                        }
                        // Nobody writes this rank's output before it raises its next call's
                        // "ready", so it holds this call's result now.
                        assert_eq!(
                            mem.output(rank as usize),
                            wants[call as usize][rank as usize],
                            "rank {rank} call {call} of {req:?}"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn eligible_collectives_run_back_to_back_in_flag_form() {
        for world in [2u16, 3, 4] {
            for (c, a) in [
                (Collective::AllGather, Algorithm::Direct),
                (Collective::Broadcast { root: world - 1 }, Algorithm::Direct),
                (Collective::Scatter { root: 0 }, Algorithm::Direct),
                (Collective::Gather { root: 1 }, Algorithm::Direct),
                (Collective::AllToAll, Algorithm::Pairwise),
            ] {
                for ch in [1, 2] {
                    let req =
                        Request::new(c, a, world, 96, DType::U8, ReduceOp::Sum).with_channels(ch);
                    back_to_back(req, 50);
                }
            }
        }
    }

    #[test]
    fn a_reduction_has_no_flag_form() {
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::OneShot,
            2,
            64,
            DType::F32,
            ReduceOp::Sum,
        );
        let ops = Schedule::new(req, 0, 0).unwrap();
        assert!(matches!(
            FlagStream::new(0, ops),
            Err(FlagError::NotCopy { .. })
        ));
    }
}
