//! Which calls symm serves, decided without a GPU.
//!
//! A collective call of the NCCL API becomes a symm request when its element type and reduction
//! are symm's ([`symm_driver::cuda::ffi::nccl::TYPES`], `OPS`; user-made pre-multiplied sums are
//! not) and the runtime's automatic request for it exists ([`AutoRequests::get`]: the runtime,
//! not the shim, decides the algorithm and refuses what it cannot run). Anything else is a
//! [`Refusal`], which the shim forwards to the real library, or returns as an error when there
//! is none ([`Mode::Alone`]).

use std::ffi::{c_int, OsString};

use symm_core::dtype::ReduceOp;
use symm_core::sched::{Collective, Forced, Request, SchedError};
use symm_driver::cuda::ffi::nccl::{dtype_of, reduce_of};
use symm_driver::cuda::AutoRequests;

/// The variable that selects the shim's [`Mode`].
pub const SYMM_NCCL_SHIM: &str = "SYMM_NCCL_SHIM";

/// What the shim does with a communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// symm serves what it can; the real library makes every communicator and serves the rest
    /// (the default).
    On,
    /// Every call goes to the real library: the shim is a pass-through.
    Off,
    /// No real library: symm serves what it can and refuses the rest with
    /// `ncclInvalidUsage`. For machines without libnccl, and for ranks that share a GPU
    /// (which NCCL refuses).
    Alone,
}

impl Mode {
    /// The mode `SYMM_NCCL_SHIM` names (`on`, `off` or `alone`; unset: `on`), read through
    /// `get`. Any other value is an error naming the variable, the value (cut) and the choices.
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<Mode, String> {
        let Some(v) = get(SYMM_NCCL_SHIM) else {
            return Ok(Mode::On);
        };
        match v.to_str() {
            Some("on") => Ok(Mode::On),
            Some("off") => Ok(Mode::Off),
            Some("alone") => Ok(Mode::Alone),
            _ => {
                let shown: String = v.to_string_lossy().chars().take(32).collect();
                Err(format!(
                    "{SYMM_NCCL_SHIM}={shown:?}: expected on, off or alone"
                ))
            }
        }
    }
}

/// A collective call of the NCCL API, with the arguments that choose the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `ncclAllReduce`.
    AllReduce {
        /// `ncclRedOp_t`.
        op: c_int,
    },
    /// `ncclAllGather` (the count is each rank's).
    AllGather,
    /// `ncclReduceScatter` (the count is each rank's result).
    ReduceScatter {
        /// `ncclRedOp_t`.
        op: c_int,
    },
    /// `ncclBroadcast`.
    Broadcast {
        /// The root rank.
        root: c_int,
    },
    /// `ncclReduce`.
    Reduce {
        /// `ncclRedOp_t`.
        op: c_int,
        /// The root rank.
        root: c_int,
    },
}

/// Why symm does not serve a call.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The element type is not symm's (an `ncclDataType_t` code).
    Type(c_int),
    /// The reduction is not symm's (an `ncclRedOp_t` code; from 5, a pre-multiplied sum).
    Op(c_int),
    /// The root is not a rank of the communicator.
    Root(c_int),
    /// The element count times the element size does not fit in 64 bits.
    TooLarge,
    /// No element: nothing to run.
    Empty,
    /// The runtime has no request for the call ([`Request::for_call`]'s reason).
    Sched(SchedError),
}

impl core::fmt::Display for Refusal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Refusal::Type(c) => write!(f, "symm has no element type of NCCL code {c}"),
            Refusal::Op(c) => write!(f, "symm has no reduction of NCCL code {c}"),
            Refusal::Root(r) => write!(f, "root {r} is not a rank of the communicator"),
            Refusal::TooLarge => f.write_str("the element count overflows"),
            Refusal::Empty => f.write_str("no element to move"),
            Refusal::Sched(e) => write!(f, "symm has no request for the call: {e}"),
        }
    }
}

/// The symm request that serves `call` over `count` elements of NCCL type `dtype` on `world`
/// ranks, as `auto` decides it.
pub fn request(
    call: Call,
    count: usize,
    dtype: c_int,
    world: u16,
    auto: &AutoRequests,
) -> Result<Request, Refusal> {
    let t = dtype_of(dtype).ok_or(Refusal::Type(dtype))?;
    let op = |code: c_int| reduce_of(code).ok_or(Refusal::Op(code));
    let root = |r: c_int| {
        u16::try_from(r)
            .ok()
            .filter(|&r| r < world)
            .ok_or(Refusal::Root(r))
    };
    let (collective, reduce) = match call {
        Call::AllReduce { op: o } => (Collective::AllReduce, op(o)?),
        Call::AllGather => (Collective::AllGather, ReduceOp::Sum),
        Call::ReduceScatter { op: o } => (Collective::ReduceScatter, op(o)?),
        Call::Broadcast { root: r } => (Collective::Broadcast { root: root(r)? }, ReduceOp::Sum),
        Call::Reduce { op: o, root: r } => (Collective::Reduce { root: root(r)? }, op(o)?),
    };
    if count == 0 {
        return Err(Refusal::Empty);
    }
    let bytes = u64::try_from(count)
        .ok()
        .and_then(|n| n.checked_mul(t.size()))
        .ok_or(Refusal::TooLarge)?;
    auto.get(collective, bytes, t, reduce, Forced::default())
        .map_err(Refusal::Sched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::cost::Topology;
    use symm_core::dtype::DType;

    fn auto() -> AutoRequests {
        AutoRequests::new(4, Topology::Nvlink, false)
    }

    #[test]
    fn the_mode_is_parsed_strictly() {
        let of = |v: Option<&str>| Mode::from_vars(|_| v.map(Into::into));
        assert_eq!(of(None), Ok(Mode::On));
        assert_eq!(of(Some("on")), Ok(Mode::On));
        assert_eq!(of(Some("off")), Ok(Mode::Off));
        assert_eq!(of(Some("alone")), Ok(Mode::Alone));
        for bad in ["", "ON", "1", "alone ", &"x".repeat(4096)] {
            let e = of(Some(bad)).unwrap_err();
            assert!(e.starts_with("SYMM_NCCL_SHIM=") && e.len() < 120, "{e}");
        }
    }

    #[test]
    fn what_symm_serves_becomes_the_runtimes_request() {
        let a = auto();
        let r = request(Call::AllReduce { op: 0 }, 1024, 9, 4, &a).unwrap();
        assert_eq!(r.collective, Collective::AllReduce);
        assert_eq!((r.bytes, r.dtype, r.op), (2048, DType::Bf16, ReduceOp::Sum));
        assert_eq!(
            r,
            a.get(
                Collective::AllReduce,
                2048,
                DType::Bf16,
                ReduceOp::Sum,
                Forced::default()
            )
            .unwrap()
        );
        let g = request(Call::AllGather, 100, 7, 4, &a).unwrap();
        assert_eq!(
            (g.collective, g.buffer_sizes().output),
            (Collective::AllGather, 1600)
        );
        let s = request(Call::ReduceScatter { op: 4 }, 100, 7, 4, &a).unwrap();
        assert_eq!((s.op, s.buffer_sizes().input), (ReduceOp::Avg, 1600));
        let b = request(Call::Broadcast { root: 3 }, 8, 4, 4, &a).unwrap();
        assert_eq!(b.collective, Collective::Broadcast { root: 3 });
        let r = request(Call::Reduce { op: 2, root: 1 }, 8, 2, 4, &a).unwrap();
        assert_eq!(
            (r.collective, r.op),
            (Collective::Reduce { root: 1 }, ReduceOp::Max)
        );
    }

    #[test]
    fn what_symm_lacks_is_refused_with_its_reason() {
        let a = auto();
        let ar = |op| Call::AllReduce { op };
        assert_eq!(request(ar(0), 8, 0, 4, &a), Err(Refusal::Type(0))); // int8
        assert_eq!(request(ar(0), 8, 10, 4, &a), Err(Refusal::Type(10))); // fp8
        assert_eq!(request(ar(0), 8, -1, 4, &a), Err(Refusal::Type(-1)));
        assert_eq!(request(ar(5), 8, 7, 4, &a), Err(Refusal::Op(5))); // premul sum
        assert_eq!(request(ar(0), 0, 7, 4, &a), Err(Refusal::Empty));
        assert_eq!(request(ar(0), usize::MAX, 7, 4, &a), Err(Refusal::TooLarge));
        for root in [-1, 4, c_int::MAX] {
            let b = Call::Broadcast { root };
            assert_eq!(request(b, 8, 7, 4, &a), Err(Refusal::Root(root)));
        }
        assert!(matches!(
            request(ar(0), 1 << 60, 7, 4, &a),
            Err(Refusal::Sched(_))
        ));
    }
}
