//! The text of [`CudaError`] and the errors it wraps ([`std::error::Error::source`]).

use core::fmt;

use super::{CudaError, HeapCall};

impl fmt::Display for HeapCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeapCall::Alloc { size, align } => write!(f, "alloc(size {size}, align {align})"),
            HeapCall::Free { offset } => write!(f, "free(offset {offset})"),
            HeapCall::Nothing => write!(f, "nothing"),
        }
    }
}

/// ", rank N" where a rank is known.
struct OfRank(Option<u16>);

impl fmt::Display for OfRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, " (rank {r})"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Unavailable(s) => write!(f, "CUDA unavailable: {s}"),
            CudaError::Driver { call, code, name } => write!(f, "{call} failed: {name} ({code})"),
            CudaError::Compile { variant, log } => {
                write!(f, "NVRTC could not compile {variant}:\n{log}")
            }
            CudaError::Nccl { call, code } => write!(f, "{call} failed with NCCL code {code}"),
            CudaError::Unsupported(s) => write!(f, "unsupported: {s}"),
            CudaError::Invalid(s) => write!(f, "invalid: {s}"),
            CudaError::NulByte { what } => write!(f, "the {what} holds a NUL byte"),
            CudaError::OutOfBounds {
                what,
                offset,
                len,
                lo,
                hi,
            } => write!(
                f,
                "the {what} at {offset}..+{len} is outside the area {lo}..{hi}"
            ),
            CudaError::TooSmall { what, have, need } => {
                write!(f, "the {what} has {have} bytes; {need} are needed")
            }
            CudaError::TooLarge { what, size, limit } => {
                write!(f, "{what} of {size}: at most {limit}")
            }
            CudaError::Overflow { what } => write!(f, "the {what} overflows 64 bits"),
            CudaError::Misaligned {
                what,
                offset,
                align,
            } => write!(f, "the {what} at {offset} is not {align}-byte aligned"),
            CudaError::BadRank { rank, world } => {
                write!(f, "rank {rank} is not in a world of {world}")
            }
            CudaError::SizeMismatch { what, have, want } => {
                write!(f, "{have} {what}, not {want}")
            }
            CudaError::NotOwnRank { rank, own } => {
                write!(f, "rank {rank} called the bootstrap of rank {own}")
            }
            CudaError::NotLive { offset } => {
                write!(f, "offset {offset} is not a live buffer of this heap")
            }
            CudaError::Heap(e) => write!(f, "heap: {e}"),
            CudaError::Sched(e) => write!(f, "request: {e}"),
            CudaError::Moe(e) => write!(f, "MoE: {e}"),
            CudaError::Norm(e) => write!(f, "fused all-reduce + RMSNorm: {e}"),
            CudaError::Team(e) => write!(f, "team: {e}"),
            CudaError::Signal(e) => write!(f, "signal pad: {e}"),
            CudaError::FlagForm(e) => write!(f, "copy-engine path: {e}"),
            CudaError::Trace(e) => write!(f, "trace: {e}"),
            CudaError::BadPlanOp {
                rank,
                channel,
                index,
                decode,
            } => {
                write!(f, "rank {rank} channel {channel} op {index}: ")?;
                match decode {
                    Some(e) => write!(f, "does not decode: {e}"),
                    None => write!(f, "out of bounds"),
                }
            }
            CudaError::MalformedPlan { rank } => {
                write!(f, "rank {rank}'s plan has malformed channel offsets")
            }
            CudaError::Diverged {
                what,
                seq,
                rank,
                mine,
                peer,
                theirs,
            } => write!(
                f,
                "{what} diverged at call {seq}: rank {rank} called {mine}, rank {peer} called {theirs}"
            ),
            CudaError::Disagree { what, rank } => write!(
                f,
                "{what}: ranks gave different arguments{}",
                OfRank(*rank)
            ),
            CudaError::Pinned => write!(
                f,
                "these buffers are captured in a live graph: drop it first"
            ),
            CudaError::Capturing { what } => write!(
                f,
                "{what} cannot run while the stream captures a graph: run it once before capturing"
            ),
            CudaError::RanksDiffer { rank, mine, theirs } => write!(
                f,
                "ranks called a collective with different arguments: this rank {mine}, rank {rank} {theirs}"
            ),
            CudaError::NotDeviceMemory { ptr, len } => write!(
                f,
                "{len} bytes at {ptr:#x} are not one device allocation of this rank's GPU"
            ),
            CudaError::BadElementSize { what, bytes, takes } => {
                write!(f, "{what} of {bytes} bytes: it takes {takes}")
            }
            CudaError::Overlap { read, written } => {
                write!(f, "the {read} overlaps the {written}: they must not meet")
            }
            CudaError::NotPrepared => write!(
                f,
                "the request's plan is not prepared: call prepare(req) before capturing it"
            ),
            CudaError::LockPoisoned { what } => {
                write!(f, "the {what} lock is poisoned (a thread panicked)")
            }
            CudaError::Stale { what } => write!(
                f,
                "{what} was made before the communicator's last reset: make it again"
            ),
            CudaError::WrongOwner { what } => write!(f, "{what} belongs to another owner"),
            CudaError::TraceMerge { part, why, error } => {
                write!(f, "trace merge: ")?;
                if let Some(i) = part {
                    write!(f, "part {i} ")?;
                }
                write!(f, "{why}")?;
                match error {
                    Some(e) => write!(f, ": {e}"),
                    None => Ok(()),
                }
            }
            CudaError::TraceOverflow => {
                write!(f, "trace buffer overflowed: raise the options' trace_cap")
            }
            CudaError::Expired { what, rank } => write!(
                f,
                "a wait of the {what} passed its deadline{}",
                OfRank(*rank)
            ),
            CudaError::Bootstrap(e) => write!(f, "rendezvous: {e}"),
            CudaError::Malformed { rank, what } => {
                write!(f, "rendezvous: rank {rank} sent a malformed {what}")
            }
            CudaError::LengthMismatch {
                rank,
                what,
                sent,
                expected,
            } => write!(
                f,
                "rendezvous: {sent} {what} where {expected} were expected{}",
                OfRank(*rank)
            ),
            CudaError::RankPanicked => write!(f, "rendezvous: a rank's thread panicked"),
            CudaError::ExchangeTimeout {
                rank,
                waited_ms,
                arrived,
                world,
            } => write!(
                f,
                "rendezvous: rank {rank} waited {waited_ms} ms for the other ranks ({arrived} of {world} arrived)"
            ),
            CudaError::RankFailed { rank, why } => {
                write!(f, "rendezvous: rank {rank} failed: {why}")
            }
            CudaError::MixedExchange { rank, want } => {
                write!(f, "rendezvous: rank {rank} called another exchange than {want}")
            }
            CudaError::Dup { rank, message } => {
                write!(f, "rendezvous: dup of rank {rank}'s descriptor: {message}")
            }
            CudaError::TeamTimeout {
                team,
                peer,
                seq,
                waited_ms,
            } => write!(
                f,
                "team {team}: rank {peer} did not reach team allocation {seq} within {waited_ms} ms"
            ),
            CudaError::PeerLost { rank } => write!(f, "rank {rank} was lost (its process ended)"),
            CudaError::Poisoned(s) => write!(
                f,
                "the world is poisoned by an earlier failure ({s}); call reset() first"
            ),
            CudaError::Timeout {
                rank,
                peer,
                slot,
                channel,
                expected,
                found,
                op_index,
            } => write!(
                f,
                "device wait timed out: rank {rank} channel {channel} op {op_index} waited on slot {slot} \
                 (signalled by peer {peer}) for {expected}, found {found}"
            ),
            CudaError::BadOp {
                rank,
                channel,
                op_index,
            } => write!(f, "rank {rank} channel {channel}: op {op_index} cannot run in this kernel"),
            CudaError::Multicast(e) => write!(f, "multicast refused: {e}"),
            CudaError::Io(s) => write!(f, "kernel cache: {s}"),
            CudaError::MulticastEnv(e) => write!(f, "{e}"),
            CudaError::ForeignPlan(s) => write!(f, "foreign plan: {s}"),
            CudaError::BadOption(s) => write!(f, "bad option: {s}"),
            CudaError::BadEnv {
                var,
                value,
                expected,
            } => write!(f, "{var}={value:?}: expected {expected}"),
            CudaError::Placement(e) => write!(f, "placement: {e}"),
        }
    }
}

impl std::error::Error for CudaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CudaError::Heap(e) => Some(e),
            CudaError::Sched(e) => Some(e),
            CudaError::Moe(e) => Some(e),
            CudaError::Norm(e) => Some(e),
            CudaError::Team(e) => Some(e),
            CudaError::Signal(e) => Some(e),
            CudaError::FlagForm(e) => Some(e),
            CudaError::Trace(e) => Some(e),
            CudaError::TraceMerge { error: Some(e), .. } => Some(e),
            CudaError::BadPlanOp {
                decode: Some(e), ..
            } => Some(e),
            CudaError::Bootstrap(e) => Some(e),
            CudaError::Multicast(e) => Some(e),
            CudaError::MulticastEnv(e) => Some(e),
            CudaError::Placement(e) => Some(e),
            _ => None,
        }
    }
}
