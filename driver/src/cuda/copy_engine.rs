//! The copy-engine path: a plan in its flag form ([`symm_core::flag`]) as stream operations,
//! with no kernel and no SM.
//!
//! Each op of a rank's plan becomes operations on the caller's stream:
//!
//! * a copy is `cuMemcpyDtoDAsync` between heap addresses (a peer's buffers through the heap's
//!   mapping): a copy engine moves the bytes;
//! * a raise is `cuStreamWriteValue32` of [`RAISED`] into the peer's flag word, after the
//!   write's memory barrier (the release of `symm_core::signal::order::FLAG_RAISE`; the barrier
//!   is always there: the drivers here refuse the flag that leaves it out): the stream's
//!   earlier copies are visible to whoever sees the flag;
//! * a lowering is `cuStreamWaitValue32` until the own flag word is at least [`RAISED`], with a
//!   flush of remote writes where the device offers it (the acquire of `FLAG_WAIT`), then a
//!   write of 0.
//!
//! The 32-bit operations are the ones every device has (the 64-bit ones are optional); a flag
//! only ever holds 0 or [`RAISED`], in the low half of its word (little endian).
//!
//! Flags sit in the pad's second half, one word per slot at `flag_off + slot * 8` of the
//! owner's heap, so the counters of the kernel paths are never touched and the two paths can
//! alternate. What a wait waits for is fixed ([`RAISED`]), so a captured graph replays.
//!
//! Only requests [`symm_core::flag::eligible`] accepts take this path (a function of the
//! request, so every rank decides alike, and every rank of a job must run with the same
//! [`CopyEngine`]: a `Comm` checks it when it opens). The plans were validated like every plan
//! (ranks, ranges, slots), so every address here lies in the heap's buffers or the pad.
//!
//! A stream wait has no deadline: it ends when its flag is raised. This is why the path is opt
//! in; a lost peer is still reported by the `Comm`, but a stream blocked on its flag stays
//! blocked until the process exits.

use symm_core::flag::{flag_op, FlagOp, RAISED};
use symm_core::op::Loc;
use symm_core::sched::Request;
use symm_core::signal::order;

use super::device::{Device, Event, Stream};
use super::error::{check, driver, CudaError, Result};
use super::ffi::driver as ffi;
use super::plan::RankPlan;
use super::trace::RawEvent;
use symm_kernels::abi;

/// Which requests run on copy engines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CopyEngine {
    /// None: every plan runs in a kernel.
    #[default]
    Off,
    /// Eligible requests of at least [`CE_MIN_BYTES`].
    On,
    /// Every eligible request, whatever its size (what the checks use).
    Always,
}

/// The smallest request (bytes as the request counts them) [`CopyEngine::On`] sends to the copy
/// engines. Two ranks on one H100 (docs/perf.md): copy engines took 0.86 to 0.94 times the
/// kernel path's time at 128 to 256 MiB requests and 1.03 to 1.18 times at 8 to 16 MiB, and
/// about twice as long below 1 MiB (each transfer's fixed cost). They never occupy an SM.
pub const CE_MIN_BYTES: u64 = 32 << 20;

impl CopyEngine {
    /// Parses `off`, `on` or `always` (what `SYMM_COPY_ENGINE` takes).
    pub fn parse(s: &str) -> Option<CopyEngine> {
        match s {
            "off" => Some(CopyEngine::Off),
            "on" => Some(CopyEngine::On),
            "always" => Some(CopyEngine::Always),
            _ => None,
        }
    }

    /// Whether `req` runs on copy engines.
    pub fn takes(self, req: &Request) -> bool {
        match self {
            CopyEngine::Off => false,
            CopyEngine::On => req.bytes >= CE_MIN_BYTES && symm_core::flag::eligible(req),
            CopyEngine::Always => symm_core::flag::eligible(req),
        }
    }

    /// The option of [`CopyEngine::code`] (`Off` for an unknown code).
    pub(crate) fn from_code(c: u8) -> CopyEngine {
        match c {
            1 => CopyEngine::On,
            2 => CopyEngine::Always,
            _ => CopyEngine::Off,
        }
    }

    /// The option as one byte (what ranks compare when a job opens).
    pub(crate) fn code(self) -> u8 {
        match self {
            CopyEngine::Off => 0,
            CopyEngine::On => 1,
            CopyEngine::Always => 2,
        }
    }
}

/// A validated plan's flag form, per channel (channels run one after the other: each one's
/// handshake is its own, so no channel waits for a later one).
#[derive(Clone, Debug)]
pub(crate) struct FlagPlan {
    chans: Vec<Vec<FlagOp>>,
}

impl FlagPlan {
    /// The flag form of `plan` (validated by the caller).
    pub(crate) fn new(plan: &RankPlan) -> Result<FlagPlan> {
        let mut chans = Vec::with_capacity(plan.channels());
        for w in plan.chan_start.windows(2) {
            let ops = plan
                .ops
                .get(w[0] as usize..w[1] as usize)
                .ok_or(CudaError::Invalid(
                    "channel offsets of a validated plan".into(),
                ))?;
            let mut v = Vec::with_capacity(ops.len());
            for p in ops {
                let op = p
                    .decode()
                    .map_err(|_| CudaError::Invalid("an op of a validated plan".into()))?;
                v.push(flag_op(&op).map_err(CudaError::FlagForm)?);
            }
            chans.push(v);
        }
        Ok(FlagPlan { chans })
    }

    /// Ops per channel.
    pub(crate) fn channels(&self) -> &[Vec<FlagOp>] {
        &self.chans
    }
}

/// Where a launch's addresses come from: the heap and this launch's buffers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Area {
    /// This rank (whose flags its lowerings wait on).
    pub rank: u16,
    /// Rank 0's heap base; rank r's is `base + r * stride`.
    pub base: u64,
    /// Bytes between two ranks' heaps.
    pub stride: u64,
    /// Heap offsets of input, output and scratch.
    pub buf_off: [u64; 3],
    /// Heap offset of flag word 0.
    pub flag_off: u64,
}

impl Area {
    fn loc(&self, l: Loc) -> u64 {
        self.base + l.rank as u64 * self.stride + self.buf_off[l.buf as usize] + l.offset
    }

    fn flag(&self, rank: u16, slot: u32) -> u64 {
        self.base + rank as u64 * self.stride + self.flag_off + slot as u64 * 8
    }
}

/// The flags of every stream write: the default, a system-wide memory barrier before the write.
const WRITE: core::ffi::c_uint = ffi::WRITE_VALUE_DEFAULT;

/// The wait flags a lowering uses: the flush is the acquire of `FLAG_WAIT`, where the device
/// can flush remote writes (else its waits already see them in order).
fn wait_flags(dev: &Device) -> Result<core::ffi::c_uint> {
    let acquire = !matches!(order::FLAG_WAIT, core::sync::atomic::Ordering::Relaxed);
    let can = dev.attribute(ffi::ATTR_CAN_FLUSH_REMOTE_WRITES)? != 0;
    Ok(ffi::WAIT_VALUE_GEQ
        | if acquire && can {
            ffi::WAIT_VALUE_FLUSH
        } else {
            0
        })
}

/// Enqueues `plan` on `stream` over `area` and returns at once; with `marks`, records one event
/// before the first op and one after each op (channel by channel), for a trace.
///
/// # Safety
/// `plan` was validated for this rank against buffers that `area.buf_off` holds inside the
/// heap's buffer area, and every slot it names is below the pad's slot count, whose flag words
/// `area.flag_off` starts: then every copy and flag word lies in the heap.
pub(crate) unsafe fn enqueue(
    plan: &FlagPlan,
    area: &Area,
    dev: &Device,
    stream: &Stream,
    marks: Option<&[Event]>,
) -> Result<()> {
    let api = driver()?;
    let mem = ffi::stream_mem_api().map_err(|s| CudaError::Unavailable(s.into()))?;
    let wait = wait_flags(dev)?;
    let s = stream.raw();
    let mut mark = marks.map(|m| m.iter());
    let mut next_mark = || -> Result<()> {
        if let Some(e) = mark.as_mut().and_then(|m| m.next()) {
            e.record(stream)?;
        }
        Ok(())
    };
    dev.bind()?;
    next_mark()?;
    for ops in &plan.chans {
        for op in ops {
            match *op {
                FlagOp::Copy { src, dst, bytes } => {
                    if bytes > 0 {
                        // SAFETY: both ranges lie in the heap (the caller's contract), the
                        // stream belongs to the bound context, and the copy is stream-ordered.
                        check("cuMemcpyDtoDAsync", unsafe {
                            (api.memcpy_dtod_async)(area.loc(dst), area.loc(src), bytes as usize, s)
                        })?;
                    }
                }
                FlagOp::Raise { peer, slot } => {
                    // SAFETY: the flag word lies in `peer`'s pad (the caller's contract).
                    check("cuStreamWriteValue32", unsafe {
                        (mem.write_value_32)(s, area.flag(peer, slot), RAISED as u32, WRITE)
                    })?;
                }
                FlagOp::Lower { slot } => {
                    let own = area.flag(area.rank, slot);
                    // SAFETY: the flag word lies in this rank's pad (the caller's contract).
                    check("cuStreamWaitValue32", unsafe {
                        (mem.wait_value_32)(s, own, RAISED as u32, wait)
                    })?;
                    // SAFETY: as above; only this rank lowers its flags.
                    check("cuStreamWriteValue32", unsafe {
                        (mem.write_value_32)(s, own, 0, WRITE)
                    })?;
                }
            }
            next_mark()?;
        }
    }
    Ok(())
}

/// The trace of a plan run with `marks` ([`enqueue`]): per channel, each op's begin and end as
/// raw events. The device's clock is read through timing events, so times are the host's
/// wall clock at the end of the run minus the elapsed time to it (close to the GPU timer's
/// epoch, not to its nanosecond).
pub(crate) fn raw_events(plan: &FlagPlan, marks: &[Event]) -> Result<Vec<Vec<RawEvent>>> {
    let n: usize = plan.chans.iter().map(Vec::len).sum();
    let marks = marks.get(..n + 1).ok_or(CudaError::TraceOverflow)?;
    let mut at = Vec::with_capacity(n + 1);
    for m in marks {
        at.push((marks[0].elapsed_ms(m)? as f64 * 1e6) as u64);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let base = now.saturating_sub(at[n]);
    let mut k = 0;
    let mut per = Vec::with_capacity(plan.chans.len());
    for ops in &plan.chans {
        let mut evs = Vec::with_capacity(2 * ops.len());
        for i in 0..ops.len() {
            evs.push((base + at[k], i as u32, abi::EV_BEGIN));
            evs.push((base + at[k + 1], i as u32, abi::EV_END));
            k += 1;
        }
        per.push(evs);
    }
    Ok(per)
}
