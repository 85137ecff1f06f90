//! The CUDA backend's error type: driver codes matched into named cases, plus symm's own.

use core::fmt;

use super::multicast::McError;

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
    /// A request, plan or argument is invalid; the text names it.
    Invalid(String),
    /// A host-side exchange between ranks passed its deadline or a rank failed during it.
    Rendezvous(String),
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
    /// This rank has no GPU to open (see `cuda::placement`).
    Placement(super::placement::PlacementError),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Unavailable(s) => write!(f, "CUDA unavailable: {s}"),
            CudaError::Driver { call, code, name } => write!(f, "{call} failed: {name} ({code})"),
            CudaError::Compile { variant, log } => write!(f, "NVRTC could not compile {variant}:\n{log}"),
            CudaError::Nccl { call, code } => write!(f, "{call} failed with NCCL code {code}"),
            CudaError::Unsupported(s) => write!(f, "unsupported: {s}"),
            CudaError::Invalid(s) => write!(f, "invalid: {s}"),
            CudaError::Rendezvous(s) => write!(f, "rendezvous: {s}"),
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
            CudaError::Placement(e) => write!(f, "placement: {e}"),
        }
    }
}

impl std::error::Error for CudaError {}

impl From<McError> for CudaError {
    fn from(e: McError) -> CudaError {
        CudaError::Multicast(e)
    }
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
