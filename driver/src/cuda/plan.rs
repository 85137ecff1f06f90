//! Plans: the encoded ops one rank's interpreter runs, built from schedules and checked.
//!
//! A rank's plan is every channel's op stream back to back plus `chan_start` (channels + 1
//! offsets), exactly the ops [`symm_core::sched::Schedule`] yields for that (rank, channel), or a
//! user-written list. Before a plan reaches a GPU every op is checked against the world, the
//! buffer sizes and the pad, so a bad plan is a typed error on the host, never a stray access on
//! the device.

use symm_core::op::{At, Buf, Op};
use symm_core::plan::PlanOp;
use symm_core::sched::{BufferSizes, Request, Schedule};

use super::error::{CudaError, Result};
use super::multicast::McError;

/// One rank's encoded plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankPlan {
    /// Every channel's ops, channel 0 first.
    pub ops: Vec<PlanOp>,
    /// Start of each channel's ops in `ops`, plus the end (channels + 1 entries).
    pub chan_start: Vec<u32>,
}

/// Most ops a rank's plan may hold (64 bytes each on the device: 256 MiB).
pub const MAX_PLAN_OPS: usize = 1 << 22;

impl RankPlan {
    /// Encodes per-channel op lists.
    pub fn from_channels(channels: &[Vec<Op>]) -> Result<RankPlan> {
        let mut p = RankPlan {
            ops: Vec::new(),
            chan_start: vec![0],
        };
        for ops in channels {
            p.ops.extend(ops.iter().map(PlanOp::encode));
            let n = u32::try_from(p.ops.len()).map_err(|_| CudaError::TooLarge {
                what: "plan ops",
                size: p.ops.len() as u64,
                limit: u32::MAX as u64,
            })?;
            p.chan_start.push(n);
        }
        Ok(p)
    }

    /// Encodes `channels` op streams (`stream(c)` for channel `c`), refused while they are
    /// collected, before they are all held, when they have more than [`MAX_PLAN_OPS`] ops.
    pub fn collect<I>(channels: u16, mut stream: impl FnMut(u16) -> Result<I>) -> Result<RankPlan>
    where
        I: Iterator<Item = Result<Op>>,
    {
        let mut chans = Vec::with_capacity(channels as usize);
        let mut total = 0usize;
        for c in 0..channels {
            let mut ops = Vec::new();
            for op in stream(c)? {
                total += 1;
                if total > MAX_PLAN_OPS {
                    return Err(CudaError::TooLarge {
                        what: "plan ops",
                        size: total as u64,
                        limit: MAX_PLAN_OPS as u64,
                    });
                }
                ops.push(op?);
            }
            chans.push(ops);
        }
        Self::from_channels(&chans)
    }

    /// The schedule of `rank` for `req`, every channel (see [`RankPlan::collect`]).
    pub fn schedule(req: &Request, rank: u16) -> Result<RankPlan> {
        Self::collect(req.channels, |c| {
            Schedule::new(*req, rank, c)
                .map(|s| s.map(Ok))
                .map_err(CudaError::Sched)
        })
    }

    /// Channels.
    pub fn channels(&self) -> usize {
        self.chan_start.len().saturating_sub(1)
    }

    /// The ops of one channel, decoded.
    pub fn channel_ops(&self, c: usize) -> Vec<Op> {
        let (Some(&a), Some(&b)) = (self.chan_start.get(c), self.chan_start.get(c + 1)) else {
            return Vec::new();
        };
        self.ops[a as usize..b as usize]
            .iter()
            .filter_map(|p| p.decode().ok())
            .collect()
    }

    /// Bytes of the encoded ops (what is uploaded).
    pub fn op_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.ops.len() * 64);
        for o in &self.ops {
            v.extend_from_slice(&o.to_bytes());
        }
        v
    }

    /// Checks every op: decodable, ranks in the world, byte ranges inside the buffers, slots
    /// inside the pad, and no multicast op: a plan with `McReduce` / `McStore` is refused
    /// ([`McError::NoObject`]) whatever `_multicast` says, because it may launch only with a
    /// multicast object, through `validate_multicast` (feature `multicast`).
    pub fn validate(
        &self,
        rank: u16,
        world: u16,
        sizes: &BufferSizes,
        pad_slots: u32,
        _multicast: bool,
    ) -> Result<()> {
        self.check(rank, world, sizes, pad_slots, false)
    }

    /// [`RankPlan::validate`] for a plan that may hold multicast ops, launched with `mc`, the
    /// multicast object mapped over the team's heaps: its team must be the world, each
    /// multicast range must lie inside its buffer, and the three buffers must fit in the view.
    /// The launcher still checks that the buffers' placement in the heap lies inside the view.
    #[cfg(feature = "multicast")]
    pub fn validate_multicast(
        &self,
        rank: u16,
        world: u16,
        sizes: &BufferSizes,
        pad_slots: u32,
        mc: &super::multicast::Multicast,
    ) -> Result<()> {
        if mc.devices().len() != world as usize {
            return Err(CudaError::SizeMismatch {
                what: "multicast devices",
                have: mc.devices().len() as u64,
                want: world as u64,
            });
        }
        let total = sizes
            .input
            .checked_add(sizes.output)
            .and_then(|t| t.checked_add(sizes.scratch));
        if total.is_none_or(|t| t > mc.size() as u64) {
            return Err(CudaError::TooSmall {
                what: "multicast view",
                have: mc.size() as u64,
                need: total.unwrap_or(u64::MAX),
            });
        }
        self.check(rank, world, sizes, pad_slots, true)
    }

    fn check(
        &self,
        rank: u16,
        world: u16,
        sizes: &BufferSizes,
        pad_slots: u32,
        multicast: bool,
    ) -> Result<()> {
        if self.channels() > symm_core::sched::MAX_CHANNELS as usize {
            return Err(CudaError::TooLarge {
                what: "channels",
                size: self.channels() as u64,
                limit: symm_core::sched::MAX_CHANNELS as u64,
            });
        }
        if self.chan_start.first() != Some(&0)
            || self.chan_start.windows(2).any(|w| w[0] > w[1])
            || self.chan_start.last().copied() != Some(self.ops.len() as u32)
        {
            return Err(CudaError::MalformedPlan { rank });
        }
        let size = |b: Buf| match b {
            Buf::Input => sizes.input,
            Buf::Output => sizes.output,
            Buf::Scratch => sizes.scratch,
        };
        for (c, w) in self.chan_start.windows(2).enumerate() {
            for (i, p) in self.ops[w[0] as usize..w[1] as usize].iter().enumerate() {
                let bad = |decode: Option<symm_core::plan::PlanError>| CudaError::BadPlanOp {
                    rank,
                    channel: u16::try_from(c).unwrap_or(u16::MAX),
                    index: u32::try_from(i).unwrap_or(u32::MAX),
                    decode,
                };
                let op = p.decode().map_err(|e| bad(Some(e)))?;
                if op.is_multicast() && !multicast {
                    return Err(McError::NoObject {
                        rank,
                        channel: u16::try_from(c).unwrap_or(u16::MAX),
                        op_index: u32::try_from(i).unwrap_or(u32::MAX),
                    }
                    .into());
                }
                let fits = |buf: Buf, offset: u64, len: u64| {
                    offset.checked_add(len).is_some_and(|end| end <= size(buf))
                };
                let fp = op.footprint();
                // Every range inside its buffer on a rank of the world; lines only in the
                // scratch, aligned; the slot inside the pad, a signal's peer inside the world.
                let ok = fp.ranges().iter().all(|r| {
                    let placed = match r.at {
                        At::Rank(l) => l.rank < world && fits(l.buf, l.offset, r.span),
                        At::Every(m) => fits(m.buf, m.offset, r.span),
                    };
                    placed
                        && r.lines
                            .is_none_or(|l| l.aligned && r.at.buf() == Buf::Scratch)
                }) && fp
                    .slot
                    .is_none_or(|s| s.slot < pad_slots && s.peer.is_none_or(|p| p < world));
                if !ok {
                    return Err(bad(None));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::sched::{Algorithm, Collective};

    /// A request whose schedule would hold more than `MAX_PLAN_OPS` ops (a 1-element chunk
    /// over 64 Mi elements) is refused while the ops are collected.
    #[test]
    fn oversized_plans_are_refused() {
        let req = Request::new(
            Collective::AllGather,
            Algorithm::Ring,
            2,
            256 << 20,
            DType::F32,
            ReduceOp::Sum,
        )
        .with_pipeline(4, 2);
        assert!(req.validate().is_ok());
        let t = std::time::Instant::now();
        let r = RankPlan::schedule(&req, 0);
        assert!(
            matches!(
                &r,
                Err(CudaError::TooLarge {
                    what: "plan ops",
                    limit,
                    ..
                }) if *limit == MAX_PLAN_OPS as u64
            ),
            "{:?}",
            r.as_ref().map(|p| p.ops.len())
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(20));
    }

    /// Changes a put's (dst, bytes, flip, slot) through `f`.
    fn set_put(v: &mut Op, f: impl Fn(&mut symm_core::op::Loc, &mut u64, &mut u64, &mut u32)) {
        if let Op::LlPut {
            dst,
            bytes,
            flip,
            slot,
            ..
        } = v
        {
            f(dst, bytes, flip, slot);
        }
    }

    /// Changes a reduce's (stride, sources, flip) through `f`.
    fn set_reduce(v: &mut Op, f: impl Fn(&mut u64, &mut u16, &mut u64)) {
        if let Op::LlReduce {
            stride,
            sources,
            flip,
            ..
        } = v
        {
            f(stride, sources, flip);
        }
    }

    /// 128-byte-line ops are checked against the spans of their own format: a put or reduce
    /// whose 128-byte lines would reach past the scratch (more data, the half offset at its end,
    /// a huge stride), lines into a user buffer, misaligned lines, a slot past the pad or a peer
    /// outside the world are refused, and the plan compiler makes no source of them.
    #[test]
    fn hostile_128_byte_line_ops_are_refused() {
        use symm_core::op::{Buf, Loc};
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::OneShotLl128,
            2,
            4096,
            DType::F32,
            ReduceOp::Sum,
        );
        let sizes = req.buffer_sizes();
        let slots = req.layout().slots();
        let plan = RankPlan::schedule(&req, 0).unwrap();
        plan.validate(0, 2, &sizes, slots, false).unwrap();
        let views: Vec<(usize, Op)> = plan
            .ops
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, p.decode().ok()?)))
            .filter(|(_, o)| o.line_format() == Some(symm_core::ll::Format::Ll128))
            .collect();
        assert!(views.len() >= 3, "two puts and a reduce: {views:?}");
        let mut refused = 0;
        for (i, v) in views {
            // `v` with one thing changed by `f`.
            let with = |f: &dyn Fn(&mut Op)| {
                let mut b = v;
                f(&mut b);
                b
            };
            let bad: Vec<Op> = match v {
                Op::LlPut { .. } => vec![
                    with(&|b| set_put(b, |_, _, flip, _| *flip = sizes.scratch)),
                    with(&|b| set_put(b, |_, bytes, _, _| *bytes = sizes.scratch)),
                    with(&|b| set_put(b, |_, bytes, _, _| *bytes = u64::MAX)),
                    with(&|b| set_put(b, |dst, _, _, _| dst.offset += 8)),
                    with(&|b| set_put(b, |dst, _, _, _| *dst = Loc::new(1, Buf::Output, 0))),
                    with(&|b| set_put(b, |dst, _, _, _| dst.rank = 2)),
                    with(&|b| set_put(b, |_, _, _, slot| *slot = slots)),
                ],
                Op::LlReduce { .. } => vec![
                    with(&|b| set_reduce(b, |stride, _, _| *stride = u64::MAX)),
                    with(&|b| set_reduce(b, |stride, _, _| *stride = sizes.scratch)),
                    with(&|b| set_reduce(b, |_, sources, _| *sources = u16::MAX)),
                    with(&|b| set_reduce(b, |_, sources, _| *sources = 0)),
                    with(&|b| set_reduce(b, |_, _, flip| *flip = sizes.scratch)),
                ],
                Op::Copy { .. }
                | Op::Reduce { .. }
                | Op::Signal { .. }
                | Op::Wait { .. }
                | Op::ReduceN { .. }
                | Op::McReduce { .. }
                | Op::McStore { .. } => vec![],
            };
            for b in bad {
                let mut p = plan.clone();
                p.ops[i] = PlanOp::encode(&b);
                assert!(p.validate(0, 2, &sizes, slots, false).is_err(), "{b:?}");
                assert!(
                    crate::cuda::compiled::checked_source(&p, 0, 2, &sizes, slots).is_err(),
                    "{b:?}"
                );
                refused += 1;
            }
        }
        assert!(refused >= 19, "{refused}");
    }

    /// Low-latency and k-way ops that would reach past their buffers (a hostile or broken
    /// plan: huge stride, half offset past the scratch, lines into a user buffer, misaligned
    /// lines, a source rank outside the world) are refused before any launch.
    #[test]
    fn out_of_bounds_fused_and_ll_ops_are_refused() {
        use symm_core::op::{Buf, Loc, Op, Ranks};
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::OneShotLl,
            2,
            1024,
            DType::F32,
            ReduceOp::Sum,
        );
        let sizes = req.buffer_sizes();
        let slots = req.layout().slots();
        let plan = RankPlan::schedule(&req, 0).unwrap();
        plan.validate(0, 2, &sizes, slots, false).unwrap();
        let decoded: Vec<Op> = plan.ops.iter().map(|p| p.decode().unwrap()).collect();
        let with = |i: usize, op: Op| {
            let mut p = plan.clone();
            p.ops[i] = PlanOp::encode(&op);
            p.validate(0, 2, &sizes, slots, false)
        };
        let put = decoded
            .iter()
            .position(|o| matches!(o, Op::LlPut { .. }))
            .unwrap();
        let red = decoded
            .iter()
            .position(|o| matches!(o, Op::LlReduce { .. }))
            .unwrap();
        let Op::LlPut {
            format,
            src,
            dst,
            bytes,
            slot,
            flip,
        } = decoded[put]
        else {
            unreachable!()
        };
        for bad in [
            Op::LlPut {
                format,
                src,
                dst,
                bytes,
                slot,
                flip: sizes.scratch,
            },
            Op::LlPut {
                format,
                src,
                dst: Loc {
                    offset: dst.offset + 8,
                    ..dst
                },
                bytes,
                slot,
                flip,
            },
            Op::LlPut {
                format,
                src,
                dst: Loc::new(1, Buf::Output, 0),
                bytes,
                slot,
                flip,
            },
            Op::LlPut {
                format,
                src,
                dst,
                bytes: u64::MAX,
                slot,
                flip,
            },
            Op::LlPut {
                format,
                src,
                dst,
                bytes,
                slot: slots,
                flip,
            },
        ] {
            assert!(with(put, bad).is_err(), "{bad:?}");
        }
        let Op::LlReduce {
            format,
            src,
            dst,
            elems,
            dtype,
            op,
            div,
            slot,
            flip,
            ..
        } = decoded[red]
        else {
            unreachable!()
        };
        let reduce = |stride: u64, sources: u16| Op::LlReduce {
            format,
            src,
            stride,
            sources,
            dst,
            elems,
            dtype,
            op,
            div,
            slot,
            flip,
        };
        for bad in [
            reduce(u64::MAX, 2),
            reduce(sizes.scratch, 2),
            reduce(16, u16::MAX),
        ] {
            assert!(with(red, bad).is_err(), "{bad:?}");
        }
        let k = Op::ReduceN {
            buf: Buf::Input,
            offset: 0,
            ranks: Ranks::new(&[0, 2]).unwrap(),
            dst: Loc::new(0, Buf::Output, 0),
            elems: 4,
            dtype: DType::F32,
            op: ReduceOp::Sum,
            div: 1,
        };
        assert!(with(red, k).is_err(), "a source rank outside the world");
    }

    #[test]
    fn schedules_encode_and_validate() {
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            4,
            1 << 20,
            DType::Bf16,
            ReduceOp::Sum,
        )
        .with_channels(3);
        for r in 0..4 {
            let p = RankPlan::schedule(&req, r).unwrap();
            assert_eq!(p.channels(), 3);
            p.validate(r, 4, &req.buffer_sizes(), req.layout().slots(), false)
                .unwrap();
            let n: usize = (0..3).map(|c| p.channel_ops(c).len()).sum();
            assert_eq!(n, p.ops.len());
        }
    }

    #[test]
    fn out_of_bounds_ops_are_refused() {
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::OneShot,
            2,
            64,
            DType::F32,
            ReduceOp::Sum,
        );
        let bad = Op::Copy {
            src: symm_core::op::Loc::new(0, Buf::Input, 32),
            dst: symm_core::op::Loc::new(1, Buf::Output, 0),
            bytes: 64,
        };
        let p = RankPlan::from_channels(&[vec![bad]]).unwrap();
        assert!(p.validate(0, 2, &req.buffer_sizes(), 16, false).is_err());
        let w = Op::Wait { slot: 99, count: 1 };
        let p = RankPlan::from_channels(&[vec![w]]).unwrap();
        assert!(p.validate(0, 2, &req.buffer_sizes(), 16, false).is_err());
    }

    fn multicast_all_reduce() -> Request {
        Request::new(
            Collective::AllReduce,
            Algorithm::Multicast,
            4,
            2 << 20,
            DType::F32,
            ReduceOp::Sum,
        )
    }

    #[test]
    fn multicast_plans_are_refused_without_a_multicast_object() {
        let req = multicast_all_reduce();
        let p = RankPlan::schedule(&req, 1).unwrap();
        assert!(p
            .ops
            .iter()
            .any(|o| o.decode().is_ok_and(|o| o.is_multicast())));
        for allow in [false, true] {
            match p.validate(1, 4, &req.buffer_sizes(), req.layout().slots(), allow) {
                Err(CudaError::Multicast(McError::NoObject { rank: 1, .. })) => {}
                other => panic!("{other:?}"),
            }
        }
    }

    #[cfg(feature = "multicast")]
    #[test]
    fn multicast_plans_validate_with_a_multicast_object() {
        use crate::cuda::multicast::fake;
        let req = multicast_all_reduce();
        let sizes = req.buffer_sizes();
        let mc = fake::object(4, 16 << 20);
        for r in 0..4 {
            let p = RankPlan::schedule(&req, r).unwrap();
            p.validate_multicast(r, 4, &sizes, req.layout().slots(), &mc)
                .unwrap();
        }
        let p = RankPlan::schedule(&req, 0).unwrap();
        let small = fake::object(4, 2 << 20);
        assert!(p
            .validate_multicast(0, 4, &sizes, req.layout().slots(), &small)
            .is_err());
        let other_team = fake::object(2, 16 << 20);
        assert!(p
            .validate_multicast(0, 4, &sizes, req.layout().slots(), &other_team)
            .is_err());
        let bad = Op::McStore {
            src: symm_core::op::Loc::new(0, Buf::Input, 0),
            dst: symm_core::op::McLoc {
                buf: Buf::Output,
                offset: 1,
            },
            bytes: sizes.output,
        };
        let p = RankPlan::from_channels(&[vec![bad]]).unwrap();
        assert!(p
            .validate_multicast(0, 4, &sizes, req.layout().slots(), &mc)
            .is_err());
    }
}
