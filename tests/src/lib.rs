//! Shared helpers of the conformance tests: the request matrix.

#![forbid(unsafe_code)]

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};

/// Every collective at `world` (core's one list).
pub fn collectives(world: u16) -> Vec<Collective> {
    symm_core::sched::collectives(world).to_vec()
}

/// Every (collective, algorithm) pair at `world` (core's one list).
pub fn pairs(world: u16) -> Vec<(Collective, Algorithm)> {
    symm_core::sched::pairs(world).collect()
}

/// A request with a small chunk so that pipelining and credits are exercised.
pub fn request(
    c: Collective,
    a: Algorithm,
    world: u16,
    elems: u64,
    dtype: DType,
    op: ReduceOp,
) -> Request {
    Request::new(c, a, world, elems * dtype.size(), dtype, op)
}

pub mod fuzz;
pub mod hostile;
pub mod matrix;
