//! Status codes, the typed errors behind them and the per-thread last error message.

use std::cell::RefCell;
use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_int;

use symm_core::sched::SchedError;
use symm_core::trace::{HeaderError, TraceError};
use symm_driver::cuda::{CudaError, ErrorKind};

/// Success.
pub const SYMM_OK: c_int = 0;
/// A required pointer argument was null.
pub const SYMM_ERR_NULL: c_int = -1;
/// An argument is out of range: an unknown code, a request that does not validate, a rank or
/// channel outside the request, a link with a non-positive bandwidth, buffers that do not fit,
/// a heap too small for an allocation, ranks that called with different arguments, or a call
/// the communicator's state does not allow now.
pub const SYMM_ERR_INVALID: c_int = -2;
/// An output buffer is smaller than what must be written into it.
pub const SYMM_ERR_TOO_SMALL: c_int = -3;
/// A bound was reached (the trace writer's event budget).
pub const SYMM_ERR_LIMIT: c_int = -4;
/// The trace could not be encoded.
pub const SYMM_ERR_TRACE: c_int = -5;
/// An internal error (a panic, caught at the boundary).
pub const SYMM_ERR_INTERNAL: c_int = -6;
/// The runtime cannot start here: a CUDA library, a usable device or the job's environment
/// (`WORLD_SIZE`, `RANK`, `SYMM_JOB`) is missing.
pub const SYMM_ERR_UNAVAILABLE: c_int = -7;
/// A deadline passed: a device wait, or the bootstrap waiting for ranks.
pub const SYMM_ERR_TIMEOUT: c_int = -8;
/// A peer's process is gone; the communicator cannot be used again.
pub const SYMM_ERR_PEER_LOST: c_int = -9;
/// An earlier collective failed; calls fail until `symm_comm_reset`.
pub const SYMM_ERR_POISONED: c_int = -10;
/// The device runtime failed otherwise (a driver call, kernel compilation, a peer's malformed
/// message).
pub const SYMM_ERR_DEVICE: c_int = -11;

/// Every status: its C name, value and meaning (the header's `symm_status`).
pub const STATUSES: [(&CStr, c_int, &str); 12] = [
    (c"SYMM_OK", SYMM_OK, "Success."),
    (
        c"SYMM_ERR_NULL",
        SYMM_ERR_NULL,
        "A required pointer argument was null.",
    ),
    (
        c"SYMM_ERR_INVALID",
        SYMM_ERR_INVALID,
        "An argument is out of range (unknown code, invalid request, rank or channel outside it, \
         buffers that do not fit, a full heap), the ranks' arguments differ, or the call is not \
         allowed in the communicator's state.",
    ),
    (
        c"SYMM_ERR_TOO_SMALL",
        SYMM_ERR_TOO_SMALL,
        "An output buffer is smaller than what must be written into it.",
    ),
    (
        c"SYMM_ERR_LIMIT",
        SYMM_ERR_LIMIT,
        "A bound was reached (the trace writer's event budget).",
    ),
    (
        c"SYMM_ERR_TRACE",
        SYMM_ERR_TRACE,
        "The trace could not be encoded.",
    ),
    (
        c"SYMM_ERR_INTERNAL",
        SYMM_ERR_INTERNAL,
        "An internal error (a panic, caught at the boundary).",
    ),
    (
        c"SYMM_ERR_UNAVAILABLE",
        SYMM_ERR_UNAVAILABLE,
        "The runtime cannot start here: a CUDA library, a usable device or the job's environment \
         (WORLD_SIZE, RANK, SYMM_JOB) is missing.",
    ),
    (
        c"SYMM_ERR_TIMEOUT",
        SYMM_ERR_TIMEOUT,
        "A deadline passed: a device wait, or the bootstrap waiting for ranks.",
    ),
    (
        c"SYMM_ERR_PEER_LOST",
        SYMM_ERR_PEER_LOST,
        "A peer's process is gone; the communicator cannot be used again.",
    ),
    (
        c"SYMM_ERR_POISONED",
        SYMM_ERR_POISONED,
        "An earlier collective failed; calls fail until symm_comm_reset.",
    ),
    (
        c"SYMM_ERR_DEVICE",
        SYMM_ERR_DEVICE,
        "The device runtime failed otherwise (a driver call, kernel compilation, a peer's \
         malformed message).",
    ),
];

/// Why a call failed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A required pointer argument was null.
    Null {
        /// The argument's name.
        arg: &'static str,
    },
    /// A field holds a value that is not one of its codes.
    BadCode {
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A value is outside its range.
    Range {
        /// What the value is.
        what: &'static str,
        /// The value found.
        value: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// The request does not validate.
    Request(SchedError),
    /// The trace header does not validate.
    Header(HeaderError),
    /// A link parameter is not finite and non-negative (bandwidths: positive).
    Link {
        /// The field.
        field: &'static str,
    },
    /// An output buffer is too small.
    TooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        have: usize,
    },
    /// The trace writer holds its maximum number of events.
    EventLimit {
        /// The writer's budget.
        max: u64,
    },
    /// The trace could not be encoded.
    Trace(TraceError),
    /// The device runtime refused or failed a call.
    Runtime(CudaError),
    /// A panic was caught at the boundary.
    Internal,
}

impl Error {
    /// The status code the error returns as.
    pub fn status(&self) -> c_int {
        match self {
            Error::Null { .. } => SYMM_ERR_NULL,
            Error::BadCode { .. }
            | Error::Range { .. }
            | Error::Request(_)
            | Error::Header(_)
            | Error::Link { .. } => SYMM_ERR_INVALID,
            Error::TooSmall { .. } => SYMM_ERR_TOO_SMALL,
            Error::EventLimit { .. } => SYMM_ERR_LIMIT,
            Error::Trace(_) => SYMM_ERR_TRACE,
            Error::Runtime(e) => runtime_status(e),
            Error::Internal => SYMM_ERR_INTERNAL,
        }
    }
}

/// The status a runtime error returns as: one per kind ([`CudaError::kind`]), so C and Python
/// classify every error the same way.
fn runtime_status(e: &CudaError) -> c_int {
    match e.kind() {
        ErrorKind::InvalidArgument
        | ErrorKind::InvalidState
        | ErrorKind::RanksDiffer
        | ErrorKind::OutOfMemory => SYMM_ERR_INVALID,
        ErrorKind::Timeout => SYMM_ERR_TIMEOUT,
        ErrorKind::PeerLost => SYMM_ERR_PEER_LOST,
        ErrorKind::Poisoned => SYMM_ERR_POISONED,
        ErrorKind::Unavailable => SYMM_ERR_UNAVAILABLE,
        _ => SYMM_ERR_DEVICE,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Null { arg } => write!(f, "{arg} is null"),
            Error::BadCode { field, value } => write!(f, "{field} {value} is not a known code"),
            Error::Range { what, value, max } => {
                write!(f, "{what} {value} is out of range (at most {max})")
            }
            Error::Request(e) => write!(f, "invalid request: {e}"),
            Error::Header(e) => write!(f, "invalid trace header: {e}"),
            Error::Link { field } => write!(
                f,
                "link {field} must be finite and non-negative (bandwidth: positive)"
            ),
            Error::TooSmall { need, have } => {
                write!(f, "the buffer holds {have} bytes, {need} are needed")
            }
            Error::EventLimit { max } => {
                write!(f, "the trace writer already holds its {max} events")
            }
            Error::Trace(e) => write!(f, "trace: {e}"),
            Error::Runtime(e) => write!(f, "{e}"),
            Error::Internal => write!(f, "{INTERNAL}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Request(e) => Some(e),
            Error::Header(e) => Some(e),
            Error::Trace(e) => Some(e),
            Error::Runtime(e) => Some(e),
            _ => None,
        }
    }
}

impl From<SchedError> for Error {
    fn from(e: SchedError) -> Error {
        Error::Request(e)
    }
}

impl From<CudaError> for Error {
    fn from(e: CudaError) -> Error {
        Error::Runtime(e)
    }
}

impl From<TraceError> for Error {
    fn from(e: TraceError) -> Error {
        Error::Trace(e)
    }
}

thread_local! {
    static LAST: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records the outcome of a call on this thread: the message of `err`, or none.
pub fn set_last(err: Option<&Error>) {
    // `try_with`: a call during thread teardown (the thread-local gone) records nothing
    // instead of aborting the process.
    let _ = LAST.try_with(|l| {
        let mut l = l.borrow_mut();
        l.clear();
        if let Some(e) = err {
            use fmt::Write as _;
            let _ = write!(l, "{e}");
        }
    });
}

/// Records that a call failed with a caught panic, without formatting anything (used when
/// recording the call's own error panicked).
pub fn set_last_internal() {
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.clear();
            l.push_str(INTERNAL);
        }
    });
}

/// The message of [`Error::Internal`].
const INTERNAL: &str = "internal error (a panic was caught)";

/// Runs `f` with the last error message of this thread (empty during thread teardown, when the
/// message is gone).
pub fn with_last<R>(f: impl FnOnce(&str) -> R) -> R {
    match LAST.try_with(|l| l.try_borrow().map(|m| m.clone()).ok()) {
        Ok(Some(m)) => f(&m),
        _ => f(""),
    }
}

/// The status's C name, for `symm_status_name`.
pub fn status_name(status: c_int) -> Option<&'static CStr> {
    STATUSES
        .iter()
        .find(|(_, v, _)| *v == status)
        .map(|(n, _, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_driver::bootstrap::{BootstrapError, EnvError};

    /// Runtime errors return the status a C caller can act on, with the runtime's message.
    #[test]
    fn runtime_errors_map_to_their_statuses() {
        let missing = Error::from(CudaError::Bootstrap(BootstrapError::Env(
            EnvError::Missing { var: "WORLD_SIZE" },
        )));
        assert_eq!(missing.status(), SYMM_ERR_UNAVAILABLE);
        assert!(
            missing.to_string().contains("WORLD_SIZE is not set"),
            "{missing}"
        );
        for (e, status) in [
            (
                CudaError::Unavailable("libcuda".into()),
                SYMM_ERR_UNAVAILABLE,
            ),
            (CudaError::PeerLost { rank: 2 }, SYMM_ERR_PEER_LOST),
            (
                CudaError::Bootstrap(BootstrapError::PeerLost { rank: 1 }),
                SYMM_ERR_PEER_LOST,
            ),
            (
                CudaError::Bootstrap(BootstrapError::Poisoned(Box::new(
                    BootstrapError::PeerLost { rank: 1 },
                ))),
                SYMM_ERR_PEER_LOST,
            ),
            (CudaError::Poisoned("a timeout".into()), SYMM_ERR_POISONED),
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
                SYMM_ERR_TIMEOUT,
            ),
            (CudaError::BadRank { rank: 9, world: 4 }, SYMM_ERR_INVALID),
            (CudaError::NotLive { offset: 64 }, SYMM_ERR_INVALID),
            (CudaError::BadOption("timeout".into()), SYMM_ERR_INVALID),
            // Caller errors and disagreeing ranks are INVALID, as Python's ValueError; every
            // deadline is TIMEOUT, as Python's symm.TimeoutError.
            (
                CudaError::SizeMismatch {
                    what: "world",
                    have: 2,
                    want: 4,
                },
                SYMM_ERR_INVALID,
            ),
            (
                CudaError::RanksDiffer {
                    rank: 1,
                    mine: "a".into(),
                    theirs: "b".into(),
                },
                SYMM_ERR_INVALID,
            ),
            (
                CudaError::NotDeviceMemory { ptr: 64, len: 8 },
                SYMM_ERR_INVALID,
            ),
            (
                CudaError::ExchangeTimeout {
                    rank: 0,
                    waited_ms: 5,
                    arrived: 1,
                    world: 2,
                },
                SYMM_ERR_TIMEOUT,
            ),
            (
                CudaError::TeamTimeout {
                    team: 1,
                    peer: 0,
                    seq: 2,
                    waited_ms: 5,
                },
                SYMM_ERR_TIMEOUT,
            ),
            (
                CudaError::Driver {
                    call: "cuLaunchKernel",
                    code: 700,
                    name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                },
                SYMM_ERR_DEVICE,
            ),
        ] {
            assert_eq!(Error::from(e.clone()).status(), status, "{e:?}");
        }
    }

    /// Every status has one name and one value.
    #[test]
    fn statuses_are_distinct() {
        for (i, (n, v, _)) in STATUSES.iter().enumerate() {
            assert_eq!(status_name(*v), Some(*n));
            assert!(STATUSES[i + 1..].iter().all(|(m, w, _)| m != n && w != v));
        }
    }
}
