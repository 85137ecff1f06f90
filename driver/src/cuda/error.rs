//! The CUDA backend's error type: driver codes matched into named cases, plus symm's own.

use symm_core::heap::HeapError;
use symm_core::plan::PlanError;
use symm_core::sched::SchedError;
use symm_core::signal::SignalError;
use symm_core::team::TeamError;
use symm_core::trace::TraceError;

use super::multicast::McError;
use crate::bootstrap::BootstrapError;

mod display;
mod kind;

pub use kind::ErrorKind;

/// One call of a symmetric allocator, as compared between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeapCall {
    /// An allocation.
    Alloc {
        /// Bytes.
        size: u64,
        /// Alignment.
        align: u64,
    },
    /// A free.
    Free {
        /// The offset freed.
        offset: u64,
    },
    /// No call is remembered there.
    Nothing,
}

/// Why a CUDA-backend call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// A library (libcuda, libnvrtc, libnccl) could not be loaded or lacks an entry point.
    Unavailable(String),
    /// A driver call returned a code other than success.
    Driver {
        /// The call.
        call: &'static str,
        /// The raw result code.
        code: i32,
        /// The driver's name for the code (or "unknown").
        name: String,
    },
    /// NVRTC could not compile a kernel; the log says why.
    Compile {
        /// The variant.
        variant: &'static str,
        /// The compiler log.
        log: String,
    },
    /// An NCCL call failed.
    Nccl {
        /// The call.
        call: &'static str,
        /// The raw result code.
        code: i32,
    },
    /// The device cannot do what symm needs (VMM, POSIX-fd handles, peer access).
    Unsupported(String),
    /// An internal condition a caller cannot act on (a handle used twice, a state that was
    /// just set up and is missing); the text names it.
    Invalid(String),
    /// A kernel source, file name or entry name holds a NUL byte.
    NulByte {
        /// Which string.
        what: &'static str,
    },
    /// Bytes lie outside the area they must be in (`offset .. offset + len` not in `[lo, hi)`).
    OutOfBounds {
        /// What the bytes are (a buffer, a heap offset, an epoch slot).
        what: &'static str,
        /// First byte.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Start of the area.
        lo: u64,
        /// End of the area (exclusive).
        hi: u64,
    },
    /// A buffer holds fewer bytes than the call needs.
    TooSmall {
        /// The buffer.
        what: &'static str,
        /// Bytes it holds.
        have: u64,
        /// Bytes needed.
        need: u64,
    },
    /// A size or count is above what symm takes.
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// The size or count asked for.
        size: u64,
        /// The most taken.
        limit: u64,
    },
    /// A size computed from the arguments does not fit in 64 bits.
    Overflow {
        /// The size.
        what: &'static str,
    },
    /// An offset is not a multiple of the alignment it needs.
    Misaligned {
        /// What the offset places.
        what: &'static str,
        /// The offset.
        offset: u64,
        /// The alignment needed.
        align: u64,
    },
    /// A rank or peer is not in the world.
    BadRank {
        /// The rank.
        rank: u16,
        /// The world's size.
        world: u16,
    },
    /// Two counts that must agree differ (a request's world and the world's, plans and ranks).
    SizeMismatch {
        /// What is counted.
        what: &'static str,
        /// The count given.
        have: u64,
        /// The count expected.
        want: u64,
    },
    /// A rank called a per-rank object (a bootstrap) that belongs to another rank.
    NotOwnRank {
        /// The rank that called.
        rank: u16,
        /// The object's rank.
        own: u16,
    },
    /// An offset is not the start of a live buffer of the heap it is returned to.
    NotLive {
        /// The offset.
        offset: u64,
    },
    /// The symmetric-heap allocator refused a call.
    Heap(HeapError),
    /// A request does not schedule.
    Sched(SchedError),
    /// A mixture-of-experts shape or token count is refused.
    Moe(symm_core::moe::MoeError),
    /// A fused all-reduce + RMSNorm shape is refused.
    Norm(symm_core::norm::NormError),
    /// A team could not be formed, or a request does not map onto it.
    Team(TeamError),
    /// The signal-pad layout refused a key or size.
    Signal(SignalError),
    /// A plan sent to the copy engines has no flag form ([`symm_core::flag`]).
    FlagForm(symm_core::flag::FlagError),
    /// A trace could not be encoded or decoded.
    Trace(TraceError),
    /// An op of a plan does not decode, or reaches outside its buffers, the world or the pad.
    BadPlanOp {
        /// The plan's rank.
        rank: u16,
        /// The channel.
        channel: u16,
        /// Position in the channel's op stream.
        index: u32,
        /// Why it does not decode; `None` when it decodes but is out of bounds.
        decode: Option<PlanError>,
    },
    /// A plan's channel offsets do not tile its op list.
    MalformedPlan {
        /// The plan's rank.
        rank: u16,
    },
    /// Ranks' symmetric allocators diverged: their call sequences differ.
    Diverged {
        /// Which allocator (the symmetric heap, a team heap).
        what: &'static str,
        /// Position of the first differing call.
        seq: u64,
        /// This rank.
        rank: u16,
        /// This rank's call there.
        mine: HeapCall,
        /// The rank whose sequence differs.
        peer: u16,
        /// That rank's call there.
        theirs: HeapCall,
    },
    /// Ranks gave different arguments to a collective call that needs the same on all.
    Disagree {
        /// The call.
        what: &'static str,
        /// The rank that differs, where known.
        rank: Option<u16>,
    },
    /// The buffers are captured in a live graph: drop the graph before freeing them.
    Pinned,
    /// A request's plan is not prepared: call `prepare(req)` before capturing it.
    NotPrepared,
    /// Something that waits for the device or allocates was asked for while the caller's
    /// stream is capturing a graph: run it once before the capture.
    Capturing {
        /// What was asked for.
        what: &'static str,
    },
    /// The object was made before the communicator's last reset, which may have left its
    /// state (a fused op's call epochs) different across ranks: make it again.
    Stale {
        /// What it is.
        what: &'static str,
    },
    /// The ranks called a collective with different arguments (checked the first time each
    /// set of arguments is used).
    RanksDiffer {
        /// A rank whose arguments differ from this rank's.
        rank: u16,
        /// This rank's arguments.
        mine: String,
        /// That rank's arguments.
        theirs: String,
    },
    /// Memory passed by address is not one device allocation of this rank's context.
    NotDeviceMemory {
        /// The address.
        ptr: u64,
        /// Bytes from it.
        len: u64,
    },
    /// An element size the call does not take.
    BadElementSize {
        /// What the elements are (all-to-allv elements).
        what: &'static str,
        /// The size given, in bytes.
        bytes: u64,
        /// The sizes taken.
        takes: &'static str,
    },
    /// Two ranges that must not meet overlap (a peer would write what this rank still reads).
    Overlap {
        /// The range read.
        read: &'static str,
        /// The range written.
        written: &'static str,
    },
    /// A lock was poisoned by a thread that panicked while holding it.
    LockPoisoned {
        /// The lock.
        what: &'static str,
    },
    /// An object (a team, a stream, captured graphs) belongs to another communicator, world or
    /// device context.
    WrongOwner {
        /// The object.
        what: &'static str,
    },
    /// Per-rank traces could not be merged into one.
    TraceMerge {
        /// The part at fault, where one is.
        part: Option<usize>,
        /// What is wrong with it.
        why: &'static str,
        /// The decoder's error, where it refused the part.
        error: Option<TraceError>,
    },
    /// A traced launch wrote more events than the trace buffer holds: raise `trace_cap`.
    TraceOverflow,
    /// A host-visible wait of an example kernel passed its deadline (its counters are unknown).
    Expired {
        /// The example.
        what: &'static str,
        /// The rank whose wait expired, where known.
        rank: Option<u16>,
    },
    /// The bootstrap (the socket rendezvous between processes) failed.
    Bootstrap(BootstrapError),
    /// A rank sent an exchange message that does not parse.
    Malformed {
        /// The rank.
        rank: u16,
        /// The message.
        what: &'static str,
    },
    /// An exchange delivered another number of bytes or entries than announced or expected.
    LengthMismatch {
        /// The rank that sent it, where known.
        rank: Option<u16>,
        /// The message.
        what: &'static str,
        /// Bytes or entries sent.
        sent: u64,
        /// Bytes or entries expected.
        expected: u64,
    },
    /// A rank's thread panicked during a one-process exchange or world creation.
    RankPanicked,
    /// A one-process exchange passed its deadline before every rank arrived.
    ExchangeTimeout {
        /// The rank that waited.
        rank: u16,
        /// Milliseconds waited.
        waited_ms: u64,
        /// Ranks that had arrived.
        arrived: u16,
        /// The world's size.
        world: u16,
    },
    /// A rank aborted an exchange; the text is its reason.
    RankFailed {
        /// The rank.
        rank: u16,
        /// Its reason.
        why: String,
    },
    /// Ranks called different exchanges in the same round.
    MixedExchange {
        /// A rank that called another one.
        rank: u16,
        /// The exchange this rank called.
        want: &'static str,
    },
    /// A file descriptor could not be duplicated during an exchange.
    Dup {
        /// The rank whose descriptor it is.
        rank: u16,
        /// The operating system's message.
        message: String,
    },
    /// A team member did not reach a team allocation before the deadline.
    TeamTimeout {
        /// The team's id.
        team: u16,
        /// The member that did not arrive.
        peer: u16,
        /// The allocation's position in the team's sequence.
        seq: u64,
        /// Milliseconds waited.
        waited_ms: u64,
    },
    /// A peer's process is gone (its bootstrap connection closed): kernels stop at their next
    /// wait, and the communicator cannot be used again.
    PeerLost {
        /// The lost rank.
        rank: u16,
    },
    /// An earlier collective failed (a device timeout, a failed launch), so signal pads and
    /// counters may hold its signals: launches fail until `World::reset`. The text says why.
    Poisoned(String),
    /// A device wait passed its deadline.
    Timeout {
        /// The waiting rank.
        rank: u16,
        /// The rank that should have signalled.
        peer: u16,
        /// The pad slot.
        slot: u32,
        /// The channel.
        channel: u16,
        /// The value the slot had to reach.
        expected: u64,
        /// The value it held.
        found: u64,
        /// Position of the wait in the (rank, channel) op stream.
        op_index: u32,
    },
    /// The interpreter met an op it cannot run (for example a multicast op in a unicast build).
    BadOp {
        /// The rank.
        rank: u16,
        /// The channel.
        channel: u16,
        /// Position in the op stream.
        op_index: u32,
    },
    /// Multicast was refused before the driver call it would have made: the guard, the budget,
    /// the request or a plan's multicast ops without an object (see `cuda::multicast`).
    Multicast(McError),
    /// Filesystem trouble with the kernel cache.
    Io(String),
    /// A library that may create NVLink multicast objects (NCCL) was not loaded, because the
    /// multicast-off variables are not all set in this process (`crate::safety_env`).
    MulticastEnv(crate::safety_env::MulticastEnvError),
    /// A plan was launched on a `World` or `Comm` other than the one that validated it, or on
    /// another rank, or (for user plans) with buffers other than those it was checked against.
    ForeignPlan(String),
    /// An option is out of its range; the text names it and the range.
    BadOption(String),
    /// An environment variable that configures a `Comm` holds a value it does not take
    /// ([`crate::cuda::CommOptions::from_env`]).
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value (cut to 32 characters; lossy where it is not UTF-8).
        value: String,
        /// What it takes.
        expected: &'static str,
    },
    /// This rank has no GPU to open (see `cuda::placement`).
    Placement(super::placement::PlacementError),
}

macro_rules! wrap {
    ($($ty:ty => $variant:ident),* $(,)?) => {
        $(impl From<$ty> for CudaError {
            fn from(e: $ty) -> CudaError {
                CudaError::$variant(e)
            }
        })*
    };
}

wrap! {
    McError => Multicast,
    HeapError => Heap,
    SchedError => Sched,
    TeamError => Team,
    SignalError => Signal,
    TraceError => Trace,
    BootstrapError => Bootstrap,
}

/// Result of the CUDA backend.
pub type Result<T> = core::result::Result<T, CudaError>;

/// Matches a driver result code: 0 is success, anything else a [`CudaError::Driver`].
pub fn check(call: &'static str, code: i32) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    Err(CudaError::Driver {
        call,
        code,
        name: error_name(code),
    })
}

/// The driver's name of a code, "unknown" when it has none.
pub fn error_name(code: i32) -> String {
    let Ok(api) = super::ffi::driver::api() else {
        return "unknown".into();
    };
    let mut p: *const core::ffi::c_char = core::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or fails for unknown codes.
    let rc = unsafe { (api.get_error_name)(code, &mut p) };
    if rc != 0 || p.is_null() {
        return "unknown".into();
    }
    // SAFETY: on success `p` points to a NUL-terminated static string owned by the driver.
    unsafe { core::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// The loaded driver or [`CudaError::Unavailable`].
pub fn driver() -> Result<&'static super::ffi::driver::DriverApi> {
    super::ffi::driver::api().map_err(|s| CudaError::Unavailable(s.into()))
}

impl From<super::ffi::nccl::NcclLoadError> for CudaError {
    fn from(e: super::ffi::nccl::NcclLoadError) -> CudaError {
        match e {
            super::ffi::nccl::NcclLoadError::MulticastEnv(e) => CudaError::MulticastEnv(e),
            e => CudaError::Unavailable(e.to_string()),
        }
    }
}
