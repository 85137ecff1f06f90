//! Deterministic mode: the same bits whatever the algorithm, channels, chunking, message size
//! or element position.
//!
//! **The guarantee.** In this mode element `i` of a reducing collective's result is the left
//! fold, in absolute rank order `0, 1, .., w - 1`, of the ranks' element `i`
//! ([`crate::dtype::fold`]): 16-bit floats are widened to `f32`, accumulated there and rounded
//! once; `f32` and `f64` add in their own precision in rank order; an average divides the sum
//! at the end. So an element gets the same bits in a 1 KiB call and in a 1 GiB call, on one
//! channel or 64, with any algorithm the mode chooses, and the bits are the host reference's
//! in rank order (`symm_host::reference_in_rank_order`).
//!
//! **Its limits.** Results at different world sizes are different sums and cannot be equal. A
//! request whose algorithm cannot honour the mode is refused ([`SchedError::NotDeterministic`])
//! rather than run; with [`Request::auto_deterministic`] symm picks one that can, or refuses
//! when none takes the request (a 16-bit sum over more ranks than one k-way reduce reads, too
//! large for the low-latency lines).
//!
//! **Selecting it.** Per call, [`Request::for_call`] with `Forced::deterministic`; per job, the
//! runtime's `CommOptions::deterministic` (`SYMM_DETERMINISTIC=1`, `symm.init(deterministic=True)`,
//! the C ABI's `SYMM_COMM_DETERMINISTIC`), under which every automatic request honours the mode
//! and admission refuses a request that does not.
//!
//! **The other reductions.** The MoE combine ([`crate::moe`]) sums a token's partials in
//! ascending rank order in `f32` and rounds once, and the fused all-reduce + RMSNorm
//! ([`crate::norm`]) sums in rank order in `f32`: both in every mode, and neither depends on the
//! batch around a token or row.
//!
//! **Which algorithms honour it** is a column of the algorithm table, [`Combines`]: how the
//! algorithm combines the ranks' contributions to one element.
//!
//! - Collectives that do not reduce move bits: every algorithm honours the mode.
//! - Integer types: a wrapping sum or product, a minimum or a maximum does not depend on the
//!   order: every algorithm honours it.
//! - Floats: only algorithms that reduce every element in one pass over the ranks in rank order
//!   ([`Combines::RankOrder`]: the direct one-shot, two-shot and direct reduce-scatter and
//!   reduce, whose k-way reduce reads up to `MAX_FANIN` ranks, beyond which they chain binary
//!   reduces in rank order, rounding each step, which only `f32` and `f64` tolerate;
//!   [`Combines::RankOrderLines`]: the low-latency ones, whose line reduce accumulates every
//!   rank in `f32` at any world). Rings, trees, halving-doubling and the switch combine in an
//!   order that depends on the element's position and the world ([`Combines::Unordered`]).

use super::direct::FUSED_FANIN;
use super::{Collective, Request, SchedError};
use crate::cost::{self, Topology};
use crate::dtype::{DType, ReduceOp};

/// How an algorithm combines the ranks' contributions to one element of a reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Combines {
    /// In an order that depends on the element's position, the world or the schedule (a ring's
    /// segments start at different ranks, a tree pairs ranks by its shape).
    Unordered,
    /// In absolute rank order, one k-way reduce of up to `MAX_FANIN` ranks (one rounding for
    /// 16-bit floats), a chain in rank order beyond (a rounding per step).
    RankOrder,
    /// In absolute rank order, one pass over every rank at any world, accumulating 16-bit
    /// floats in `f32` (the low-latency line reduce).
    RankOrderLines,
}

impl Request {
    /// Whether this request's result is the rank-order fold whatever its algorithm, channels,
    /// chunking and size (see the module doc).
    ///
    /// ```
    /// use symm_core::dtype::{DType, ReduceOp};
    /// use symm_core::sched::{Algorithm, Collective, Request};
    ///
    /// let two = Request::new(Collective::AllReduce, Algorithm::TwoShot, 8, 1 << 20,
    ///                        DType::Bf16, ReduceOp::Sum);
    /// assert!(two.is_deterministic());
    /// assert!(!Request { algorithm: Algorithm::Ring, ..two }.is_deterministic());
    /// // Sixteen ranks are more than one k-way reduce reads: bf16 would round per step.
    /// assert!(!Request { world: 16, ..two }.is_deterministic());
    /// assert!(Request { world: 16, dtype: DType::F32, ..two }.is_deterministic());
    /// // Integers and collectives that move data are the same bits in any order.
    /// assert!(Request { algorithm: Algorithm::Ring, dtype: DType::I32, ..two }.is_deterministic());
    /// ```
    pub fn is_deterministic(&self) -> bool {
        if !self.collective.reduces() || !self.dtype.is_float() {
            return true;
        }
        match self.algorithm.desc().combines {
            Combines::Unordered => false,
            Combines::RankOrderLines => true,
            Combines::RankOrder => {
                self.world as usize <= FUSED_FANIN
                    || !matches!(self.dtype, DType::F16 | DType::Bf16)
            }
        }
    }

    /// This request, refused ([`SchedError::NotDeterministic`]) when its algorithm cannot
    /// honour deterministic mode at its world and type.
    pub fn deterministic(self) -> Result<Request, SchedError> {
        if self.is_deterministic() {
            Ok(self)
        } else {
            Err(SchedError::NotDeterministic {
                collective: self.collective,
                algorithm: self.algorithm,
            })
        }
    }

    /// [`Request::auto`] in deterministic mode: symm's own choice when it honours the mode,
    /// else the fastest by the cost model among the algorithms that do and take the request;
    /// refused ([`SchedError::NotDeterministic`], naming symm's own choice) when none does.
    ///
    /// ```
    /// use symm_core::cost::Topology;
    /// use symm_core::dtype::{DType, ReduceOp};
    /// use symm_core::sched::{Collective, Request};
    ///
    /// for bytes in [1024, 1 << 20, 256 << 20] {
    ///     let r = Request::auto_deterministic(Collective::AllReduce, 8, bytes, DType::Bf16,
    ///                                         ReduceOp::Sum, Topology::Nvlink).unwrap();
    ///     assert!(r.is_deterministic() && r.validate().is_ok());
    /// }
    /// ```
    pub fn auto_deterministic(
        collective: Collective,
        world: u16,
        bytes: u64,
        dtype: DType,
        op: ReduceOp,
        topology: Topology,
    ) -> Result<Request, SchedError> {
        let own = Request::auto(collective, world, bytes, dtype, op, topology);
        if own.is_deterministic() {
            return Ok(own);
        }
        let base = Request {
            channels: cost::default_channels(bytes),
            ..own
        };
        let best = cost::select_where(&base, &topology.link(), false, Request::is_deterministic);
        best.map(|algorithm| Request { algorithm, ..base })
            .ok_or(SchedError::NotDeterministic {
                collective,
                algorithm: own.algorithm,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::{algorithms, collectives, Algorithm};

    #[test]
    fn only_rank_ordered_algorithms_honour_the_mode_for_float_reductions() {
        for world in [2u16, 4, 8, 16, 64] {
            for c in collectives(world).into_iter().filter(Collective::reduces) {
                for &a in algorithms(c) {
                    for dtype in [DType::Bf16, DType::F16, DType::F32] {
                        let r = Request::new(c, a, world, 4096, dtype, ReduceOp::Sum);
                        let order = a.desc().combines;
                        let wide = dtype == DType::F32;
                        let want = match order {
                            Combines::Unordered => false,
                            Combines::RankOrderLines => true,
                            Combines::RankOrder => wide || world <= 8,
                        };
                        assert_eq!(r.is_deterministic(), want, "{r:?}");
                        assert_eq!(r.deterministic().is_ok(), want);
                    }
                }
            }
        }
    }

    #[test]
    fn rings_trees_and_the_switch_are_unordered() {
        for a in [
            Algorithm::Ring,
            Algorithm::Tree,
            Algorithm::Rhd,
            Algorithm::Multicast,
        ] {
            assert_eq!(a.desc().combines, Combines::Unordered, "{a:?}");
        }
    }

    #[test]
    fn the_auto_choice_honours_the_mode_or_is_refused() {
        for world in [2u16, 3, 4, 8, 16] {
            for bytes in [256u64, 64 << 10, 16 << 20, 1 << 30] {
                for dtype in [DType::Bf16, DType::F32] {
                    for c in [Collective::AllReduce, Collective::ReduceScatter] {
                        let got = Request::auto_deterministic(
                            c,
                            world,
                            bytes,
                            dtype,
                            ReduceOp::Sum,
                            Topology::Nvlink,
                        );
                        match got {
                            Ok(r) => {
                                assert!(r.is_deterministic(), "{r:?}");
                                assert_eq!(r.validate(), Ok(()), "{r:?}");
                            }
                            // Only 16-bit sums over more ranks than one k-way reduce reads,
                            // too large for the lines, have no deterministic algorithm.
                            Err(SchedError::NotDeterministic { .. }) => {
                                assert!(world > 8 && dtype == DType::Bf16, "{c:?} {world} {bytes}");
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            }
        }
    }
}
