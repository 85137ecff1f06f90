//! Why multicast was refused: the guard, the budget and the request, all decided before the
//! driver is asked for anything.

use core::fmt;

/// A multicast refusal. Driver failures are [`CudaError::Driver`](crate::cuda::CudaError::Driver); everything
/// here is decided by symm before the driver call it would have made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum McError {
    /// This build has no `multicast` feature, so it holds no multicast entry point.
    NotCompiled,
    /// The user did not opt in: `SYMM_ENABLE_MULTICAST=1` is not set.
    NotEnabled,
    /// A machine-wide switch of NCCL, PyTorch or NVSHMEM turns multicast off.
    SwitchedOff {
        /// The variable.
        var: &'static str,
        /// The value that turns multicast off.
        value: &'static str,
    },
    /// The device reports no multicast support (`CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` is 0).
    NoDeviceSupport {
        /// The device.
        device: i32,
    },
    /// The device is not one the permit was given for.
    NotPermitted {
        /// The device.
        device: i32,
    },
    /// Creating one more object would exceed the budget's object count.
    TooManyObjects {
        /// Objects held now.
        held: u32,
        /// The budget.
        max: u32,
    },
    /// Creating the object would exceed the budget's byte total.
    TooManyBytes {
        /// Bytes held now.
        held: u64,
        /// Bytes asked for.
        requested: u64,
        /// The budget.
        max: u64,
    },
    /// A budget variable is not a plain decimal number in range.
    BadSetting {
        /// The variable.
        var: &'static str,
        /// Its value, cut to 32 characters and escaped.
        value: String,
    },
    /// A size or offset is not a multiple of the multicast granularity.
    Misaligned {
        /// What is misaligned.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The minimum multicast granularity.
        granularity: u64,
    },
    /// The request is malformed; the text says how.
    BadRequest(String),
    /// Two ranks share a device: their traffic never crosses NVLink, so multicast is never
    /// used for them.
    SharedDevice {
        /// The device listed twice.
        device: i32,
    },
    /// A plan holds multicast ops but no multicast object was supplied for its launch.
    NoObject {
        /// The rank.
        rank: u16,
        /// The channel.
        channel: u16,
        /// Position of the op in the channel's stream.
        op_index: u32,
    },
}

impl fmt::Display for McError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            McError::NotCompiled => write!(f, "this build has no `multicast` feature"),
            McError::NotEnabled => write!(f, "SYMM_ENABLE_MULTICAST=1 is not set"),
            McError::SwitchedOff { var, value } => write!(f, "{var}={value} is set"),
            McError::NoDeviceSupport { device } => {
                write!(f, "device {device} does not support multicast")
            }
            McError::NotPermitted { device } => {
                write!(f, "device {device} was not checked by the guard")
            }
            McError::TooManyObjects { held, max } => write!(
                f,
                "budget: {held} multicast object(s) held, at most {max} allowed \
                 (SYMM_MULTICAST_MAX_OBJECTS)"
            ),
            McError::TooManyBytes {
                held,
                requested,
                max,
            } => write!(
                f,
                "budget: {held} bytes held + {requested} requested exceeds {max} \
                 (SYMM_MULTICAST_MAX_BYTES)"
            ),
            McError::BadSetting { var, value } => {
                write!(f, "{var}=\"{value}\" is not a decimal number in range")
            }
            McError::Misaligned {
                what,
                value,
                granularity,
            } => write!(
                f,
                "{what} {value} is not a multiple of the multicast granularity {granularity}"
            ),
            McError::BadRequest(s) => write!(f, "{s}"),
            McError::SharedDevice { device } => write!(
                f,
                "device {device} holds more than one rank: multicast is never used between ranks \
                 that share a device"
            ),
            McError::NoObject {
                rank,
                channel,
                op_index,
            } => write!(
                f,
                "rank {rank} channel {channel} op {op_index}: a multicast op in a plan launched \
                 without a multicast object"
            ),
        }
    }
}

impl std::error::Error for McError {}
