//! The CUDA backend: a VMM symmetric heap over NVLink, rendezvous, and the plan interpreter.
pub mod compile;
pub mod error;
pub mod ffi;

pub use error::{CudaError, Result};
