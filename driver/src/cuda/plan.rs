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
mod tests;
