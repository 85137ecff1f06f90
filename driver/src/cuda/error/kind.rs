//! What a caller can do about an error: [`CudaError::kind`].
//!
//! Bindings map the kind, never the variants: Python raises `ValueError` for
//! [`ErrorKind::InvalidArgument`] and [`ErrorKind::RanksDiffer`], `symm.TimeoutError`,
//! `symm.PeerLostError` and `symm.PoisonedError` for the three failures of a running job, and
//! `symm.SymmError` otherwise; the C ABI returns one status per kind. The match below names
//! every variant, so a new one cannot reach a binding without a decision here.

use super::CudaError;
use crate::bootstrap::BootstrapError;
use symm_core::heap::HeapError;

/// What kind of failure an error is: what its caller can do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument, option, request or buffer is out of range or does not fit the call: the
    /// call is wrong and fails the same way every time.
    InvalidArgument,
    /// The call is valid but not now (a graph pins the buffers, a capture is running, a plan is
    /// not prepared, the rank left the job).
    InvalidState,
    /// The ranks called with different arguments or in different orders.
    RanksDiffer,
    /// The symmetric heap has no room for the allocation.
    OutOfMemory,
    /// A deadline passed (a device wait, a host exchange, joining the job).
    Timeout,
    /// A peer's process is gone; the communicator cannot be used again.
    PeerLost,
    /// An earlier failure poisoned the communicator: calls fail until a reset.
    Poisoned,
    /// symm cannot run here: a library, a device feature, the job's environment or a GPU for
    /// this rank is missing, or multicast is refused.
    Unavailable,
    /// The device or the runtime failed otherwise (a driver call, kernel compilation, a
    /// peer's malformed message, the file system, an internal condition).
    Device,
}

impl CudaError {
    /// What kind of failure this is ([`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            CudaError::Unavailable(_)
            | CudaError::Unsupported(_)
            | CudaError::Placement(_)
            | CudaError::Multicast(_)
            | CudaError::MulticastEnv(_) => K::Unavailable,
            CudaError::Driver { .. }
            | CudaError::Compile { .. }
            | CudaError::Nccl { .. }
            | CudaError::Invalid(_)
            | CudaError::FlagForm(_)
            | CudaError::Trace(_)
            | CudaError::LockPoisoned { .. }
            | CudaError::TraceMerge { .. }
            | CudaError::Malformed { .. }
            | CudaError::RankPanicked
            | CudaError::RankFailed { .. }
            | CudaError::Dup { .. }
            | CudaError::BadOp { .. }
            | CudaError::Io(_) => K::Device,
            CudaError::NulByte { .. }
            | CudaError::OutOfBounds { .. }
            | CudaError::TooSmall { .. }
            | CudaError::TooLarge { .. }
            | CudaError::Overflow { .. }
            | CudaError::Misaligned { .. }
            | CudaError::BadRank { .. }
            | CudaError::SizeMismatch { .. }
            | CudaError::NotOwnRank { .. }
            | CudaError::NotLive { .. }
            | CudaError::Sched(_)
            | CudaError::Moe(_)
            | CudaError::Norm(_)
            | CudaError::Team(_)
            | CudaError::Signal(_)
            | CudaError::BadPlanOp { .. }
            | CudaError::MalformedPlan { .. }
            | CudaError::NotDeviceMemory { .. }
            | CudaError::BadElementSize { .. }
            | CudaError::Overlap { .. }
            | CudaError::WrongOwner { .. }
            | CudaError::TraceOverflow
            | CudaError::ForeignPlan(_)
            | CudaError::BadOption(_)
            | CudaError::BadEnv { .. } => K::InvalidArgument,
            CudaError::Heap(h) => match h {
                HeapError::OutOfMemory { .. } | HeapError::TooManyBlocks => K::OutOfMemory,
                HeapError::Divergence(_) => K::RanksDiffer,
                _ => K::InvalidArgument,
            },
            CudaError::Pinned
            | CudaError::NotPrepared
            | CudaError::Capturing { .. }
            | CudaError::Stale { .. } => K::InvalidState,
            CudaError::Diverged { .. }
            | CudaError::Disagree { .. }
            | CudaError::RanksDiffer { .. }
            | CudaError::LengthMismatch { .. }
            | CudaError::MixedExchange { .. } => K::RanksDiffer,
            CudaError::Expired { .. }
            | CudaError::ExchangeTimeout { .. }
            | CudaError::TeamTimeout { .. }
            | CudaError::Timeout { .. } => K::Timeout,
            CudaError::PeerLost { .. } => K::PeerLost,
            CudaError::Poisoned(_) => K::Poisoned,
            CudaError::Bootstrap(b) => bootstrap_kind(b),
        }
    }

    /// The rank whose process is gone, when this error is a lost peer (of the Comm or of its
    /// bootstrap).
    pub fn lost_rank(&self) -> Option<u16> {
        match self {
            CudaError::PeerLost { rank } => Some(*rank),
            CudaError::Bootstrap(b) => b.lost_rank(),
            _ => None,
        }
    }
}

/// The kind of a bootstrap failure.
fn bootstrap_kind(b: &BootstrapError) -> ErrorKind {
    match b {
        BootstrapError::Env(_) => ErrorKind::Unavailable,
        BootstrapError::NoRoot { .. }
        | BootstrapError::Missing { .. }
        | BootstrapError::Timeout { .. } => ErrorKind::Timeout,
        BootstrapError::PeerLost { .. } => ErrorKind::PeerLost,
        BootstrapError::Mismatch { .. } => ErrorKind::RanksDiffer,
        BootstrapError::TooLarge { .. } => ErrorKind::InvalidArgument,
        BootstrapError::Left { .. } | BootstrapError::Recovering { .. } => ErrorKind::InvalidState,
        // A bootstrap stays failed: its first error says what happened.
        BootstrapError::Poisoned(first) => bootstrap_kind(first),
        _ => ErrorKind::Device,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::EnvError;
    use crate::cuda::error::HeapCall;
    use crate::cuda::multicast::McError;
    use crate::cuda::placement::PlacementError;
    use crate::safety_env::MulticastEnvError;
    use symm_core::plan::PlanError;
    use symm_core::sched::SchedError;
    use symm_core::signal::SignalError;
    use symm_core::team::TeamError;
    use symm_core::trace::TraceError;

    /// The kind of every variant (and of the bootstrap and heap errors that decide theirs):
    /// what Python raises and what C returns follow from this table alone.
    #[test]
    fn every_variant_has_its_kind() {
        use ErrorKind as K;
        let s = || String::from("x");
        let boot = |b| CudaError::Bootstrap(b);
        let cases: Vec<(CudaError, ErrorKind)> = vec![
            (CudaError::Unavailable(s()), K::Unavailable),
            (
                CudaError::Driver {
                    call: "cuLaunchKernel",
                    code: 700,
                    name: s(),
                },
                K::Device,
            ),
            (
                CudaError::Compile {
                    variant: "interp",
                    log: s(),
                },
                K::Device,
            ),
            (
                CudaError::Nccl {
                    call: "ncclAllReduce",
                    code: 1,
                },
                K::Device,
            ),
            (CudaError::Unsupported(s()), K::Unavailable),
            (CudaError::Invalid(s()), K::Device),
            (CudaError::NulByte { what: "source" }, K::InvalidArgument),
            (
                CudaError::OutOfBounds {
                    what: "input",
                    offset: 8,
                    len: 8,
                    lo: 0,
                    hi: 8,
                },
                K::InvalidArgument,
            ),
            (
                CudaError::TooSmall {
                    what: "output",
                    have: 1,
                    need: 2,
                },
                K::InvalidArgument,
            ),
            (
                CudaError::TooLarge {
                    what: "heap",
                    size: 2,
                    limit: 1,
                },
                K::InvalidArgument,
            ),
            (CudaError::Overflow { what: "size" }, K::InvalidArgument),
            (
                CudaError::Misaligned {
                    what: "buffer",
                    offset: 3,
                    align: 16,
                },
                K::InvalidArgument,
            ),
            (CudaError::BadRank { rank: 9, world: 4 }, K::InvalidArgument),
            (
                CudaError::SizeMismatch {
                    what: "world",
                    have: 2,
                    want: 4,
                },
                K::InvalidArgument,
            ),
            (
                CudaError::NotOwnRank { rank: 1, own: 0 },
                K::InvalidArgument,
            ),
            (CudaError::NotLive { offset: 64 }, K::InvalidArgument),
            (
                CudaError::Heap(HeapError::OutOfMemory {
                    size: 1 << 40,
                    largest_free: 0,
                }),
                K::OutOfMemory,
            ),
            (CudaError::Heap(HeapError::TooManyBlocks), K::OutOfMemory),
            (CudaError::Heap(HeapError::ZeroSize), K::InvalidArgument),
            (
                CudaError::Sched(SchedError::BadWorld { world: 0 }),
                K::InvalidArgument,
            ),
            (
                CudaError::Moe(symm_core::moe::MoeError::BadWorld { world: 0 }),
                K::InvalidArgument,
            ),
            (
                CudaError::Norm(symm_core::norm::NormError::BadHidden { hidden: 0 }),
                K::InvalidArgument,
            ),
            (
                CudaError::Team(TeamError::RankOutOfWorld { rank: 5, world: 4 }),
                K::InvalidArgument,
            ),
            (
                CudaError::Signal(SignalError::KeyOutOfRange),
                K::InvalidArgument,
            ),
            (
                CudaError::FlagForm(symm_core::flag::FlagError::NotCopy {
                    kind: symm_core::op::OpKind::Reduce,
                }),
                K::Device,
            ),
            (CudaError::Trace(TraceError::BadMagic), K::Device),
            (
                CudaError::BadPlanOp {
                    rank: 0,
                    channel: 0,
                    index: 0,
                    decode: Some(PlanError::BadKind(255)),
                },
                K::InvalidArgument,
            ),
            (CudaError::MalformedPlan { rank: 0 }, K::InvalidArgument),
            (
                CudaError::Diverged {
                    what: "heap",
                    seq: 1,
                    rank: 0,
                    mine: HeapCall::Nothing,
                    peer: 1,
                    theirs: HeapCall::Free { offset: 0 },
                },
                K::RanksDiffer,
            ),
            (
                CudaError::Disagree {
                    what: "split",
                    rank: None,
                },
                K::RanksDiffer,
            ),
            (CudaError::Pinned, K::InvalidState),
            (CudaError::NotPrepared, K::InvalidState),
            (CudaError::Capturing { what: "alloc" }, K::InvalidState),
            (
                CudaError::RanksDiffer {
                    rank: 1,
                    mine: s(),
                    theirs: s(),
                },
                K::RanksDiffer,
            ),
            (
                CudaError::NotDeviceMemory { ptr: 8, len: 8 },
                K::InvalidArgument,
            ),
            (
                CudaError::BadElementSize {
                    what: "all-to-allv elements",
                    bytes: 3,
                    takes: "1, 2, 4, 8 or 16",
                },
                K::InvalidArgument,
            ),
            (
                CudaError::Overlap {
                    read: "input",
                    written: "output",
                },
                K::InvalidArgument,
            ),
            (CudaError::LockPoisoned { what: "plans" }, K::Device),
            (CudaError::WrongOwner { what: "team" }, K::InvalidArgument),
            (CudaError::Stale { what: "op" }, K::InvalidState),
            (
                CudaError::TraceMerge {
                    part: None,
                    why: "empty",
                    error: None,
                },
                K::Device,
            ),
            (CudaError::TraceOverflow, K::InvalidArgument),
            (
                CudaError::Expired {
                    what: "example",
                    rank: None,
                },
                K::Timeout,
            ),
            (
                CudaError::Malformed {
                    rank: 1,
                    what: "offsets",
                },
                K::Device,
            ),
            (
                CudaError::LengthMismatch {
                    rank: Some(1),
                    what: "gather",
                    sent: 1,
                    expected: 2,
                },
                K::RanksDiffer,
            ),
            (CudaError::RankPanicked, K::Device),
            (
                CudaError::ExchangeTimeout {
                    rank: 0,
                    waited_ms: 10,
                    arrived: 1,
                    world: 2,
                },
                K::Timeout,
            ),
            (CudaError::RankFailed { rank: 1, why: s() }, K::Device),
            (
                CudaError::MixedExchange {
                    rank: 1,
                    want: "all_gather",
                },
                K::RanksDiffer,
            ),
            (
                CudaError::Dup {
                    rank: 1,
                    message: s(),
                },
                K::Device,
            ),
            (
                CudaError::TeamTimeout {
                    team: 1,
                    peer: 2,
                    seq: 3,
                    waited_ms: 4,
                },
                K::Timeout,
            ),
            (CudaError::PeerLost { rank: 2 }, K::PeerLost),
            (CudaError::Poisoned(s()), K::Poisoned),
            (
                CudaError::Timeout {
                    rank: 0,
                    peer: 1,
                    slot: 3,
                    channel: 0,
                    expected: 2,
                    found: 1,
                    op_index: 4,
                },
                K::Timeout,
            ),
            (
                CudaError::BadOp {
                    rank: 0,
                    channel: 0,
                    op_index: 0,
                },
                K::Device,
            ),
            (CudaError::Multicast(McError::NotCompiled), K::Unavailable),
            (CudaError::Io(s()), K::Device),
            (
                CudaError::MulticastEnv(MulticastEnvError::Missing {
                    var: "NCCL_NVLS_ENABLE",
                    want: "0",
                }),
                K::Unavailable,
            ),
            (CudaError::ForeignPlan(s()), K::InvalidArgument),
            (CudaError::BadOption(s()), K::InvalidArgument),
            (
                CudaError::BadEnv {
                    var: "SYMM_PLANS",
                    value: s(),
                    expected: "auto",
                },
                K::InvalidArgument,
            ),
            (
                CudaError::Placement(PlacementError::PastVisible {
                    local_rank: 3,
                    visible: 1,
                }),
                K::Unavailable,
            ),
            (
                boot(BootstrapError::Env(EnvError::Missing { var: "RANK" })),
                K::Unavailable,
            ),
            (
                boot(BootstrapError::NoRoot {
                    name: s(),
                    waited_ms: 1,
                }),
                K::Timeout,
            ),
            (
                boot(BootstrapError::Missing {
                    ranks: vec![1],
                    refused: vec![],
                }),
                K::Timeout,
            ),
            (
                boot(BootstrapError::Timeout {
                    op: "barrier",
                    waiting_for: vec![1],
                }),
                K::Timeout,
            ),
            (boot(BootstrapError::PeerLost { rank: 1 }), K::PeerLost),
            (
                boot(BootstrapError::Mismatch {
                    rank: 1,
                    expected: "barrier",
                    found: "all_gather",
                }),
                K::RanksDiffer,
            ),
            (
                boot(BootstrapError::TooLarge {
                    what: "exchange",
                    len: 2,
                    max: 1,
                }),
                K::InvalidArgument,
            ),
            (boot(BootstrapError::Left { rank: 0 }), K::InvalidState),
            (
                boot(BootstrapError::Recovering { rank: 2 }),
                K::InvalidState,
            ),
            (
                boot(BootstrapError::Poisoned(Box::new(
                    BootstrapError::PeerLost { rank: 3 },
                ))),
                K::PeerLost,
            ),
            (
                boot(BootstrapError::Protocol {
                    rank: 1,
                    what: "frame",
                }),
                K::Device,
            ),
        ];
        for (e, kind) in &cases {
            assert_eq!(e.kind(), *kind, "{e:?}");
        }
        // Every variant of CudaError (61) appears above; a new one must be added here, as
        // `kind` makes it be added there.
        let variants: std::collections::HashSet<_> = cases
            .iter()
            .map(|(e, _)| std::mem::discriminant(e))
            .collect();
        assert_eq!(variants.len(), 61);
        assert_eq!(CudaError::PeerLost { rank: 2 }.lost_rank(), Some(2));
        assert_eq!(CudaError::Poisoned(s()).lost_rank(), None);
        let lost = boot(BootstrapError::Poisoned(Box::new(
            BootstrapError::PeerLost { rank: 3 },
        )));
        assert_eq!(lost.lost_rank(), Some(3));
    }
}
