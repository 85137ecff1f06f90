//! Shared helpers of the conformance tests: the request matrix.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, Algorithm, Collective, Request};

/// Every collective, with roots and peers chosen for `world`.
pub fn collectives(world: u16) -> Vec<Collective> {
    let last = world - 1;
    vec![
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: last / 2 },
        Collective::Reduce { root: last },
        Collective::Scatter { root: last / 2 },
        Collective::Gather { root: last },
        Collective::AllToAll,
        Collective::SendRecv { src: last, dst: 0 },
    ]
}

/// Every (collective, algorithm) pair for `world`.
pub fn pairs(world: u16) -> Vec<(Collective, Algorithm)> {
    collectives(world)
        .into_iter()
        .flat_map(|c| algorithms(c).iter().map(move |&a| (c, a)))
        .collect()
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
