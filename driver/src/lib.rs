//! # symm-driver
//!
//! Binds symm-core to real memory.
//!
//! * [`host`]: ranks are threads (or simulated streams) over host memory. The embedded default:
//!   tests, labs and `cargo xtask demo` run on it, no GPU needed.
//! * `cuda` (feature `cuda`): the CUDA VMM symmetric heap, rendezvous and plan-interpreter launch.
#![deny(missing_docs)]

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host;
pub mod sync;
