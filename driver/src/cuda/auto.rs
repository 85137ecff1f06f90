//! Automatic requests of a job, cached per shape.
//!
//! [`Request::auto`] decides the algorithm and channels from the job's world and topology (a
//! calibration table, else the cost model); [`AutoRequests`] remembers the decision per shape
//! (collective, bytes, dtype, operator), so a repeated call costs a lookup. Every rank of a job
//! has the same world and topology, so every rank decides the same request. A binding or a
//! program that names only what to compute asks it; one that forces an algorithm or channels
//! applies [`Request::with_choice`] to the answer.

use std::collections::HashMap;
use std::sync::Mutex;

use symm_core::cost::Topology;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Collective, Request};

use super::comm::Comm;

/// Shapes remembered before the cache starts over (a bound on its memory).
pub const MAX_SHAPES: usize = 4096;

/// What an automatic request is decided from, besides the job.
type Shape = (Collective, u64, DType, ReduceOp);

/// The automatic requests of one job (see the module doc).
#[derive(Debug)]
pub struct AutoRequests {
    world: u16,
    topology: Topology,
    cache: Mutex<HashMap<Shape, Request>>,
}

impl AutoRequests {
    /// For a job of `world` ranks connected as `topology`.
    pub fn new(world: u16, topology: Topology) -> AutoRequests {
        AutoRequests {
            world,
            topology,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// For `comm`'s job ([`Comm::world`], and the topology of [`Comm::sharing`]).
    pub fn of(comm: &Comm) -> AutoRequests {
        AutoRequests::new(comm.world(), comm.sharing().topology())
    }

    /// The request symm runs for `collective` over `bytes` of `dtype` with `op`
    /// ([`Request::auto`]), from the cache when this shape was asked before.
    pub fn get(&self, collective: Collective, bytes: u64, dtype: DType, op: ReduceOp) -> Request {
        let key = (collective, bytes, dtype, op);
        // A poisoned lock only means a panic elsewhere while it was held: the map is whole.
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = cache.get(&key) {
            return *r;
        }
        if cache.len() >= MAX_SHAPES {
            cache.clear();
        }
        let r = Request::auto(collective, self.world, bytes, dtype, op, self.topology);
        cache.insert(key, r);
        r
    }

    /// Shapes cached now.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache answers what `Request::auto` decides, per shape, and stays bounded.
    #[test]
    fn cached_requests_are_the_automatic_ones() {
        let auto = AutoRequests::new(4, Topology::SharedDevice);
        let (c, dt, op) = (Collective::AllReduce, DType::Bf16, ReduceOp::Sum);
        for bytes in [1024, 1 << 20, 1024] {
            assert_eq!(
                auto.get(c, bytes, dt, op),
                Request::auto(c, 4, bytes, dt, op, Topology::SharedDevice)
            );
        }
        assert_eq!(auto.cached(), 2);
        let rs = Collective::ReduceScatter;
        assert_eq!(auto.get(rs, 1024, dt, op).collective, rs);
        for n in 0..MAX_SHAPES as u64 + 10 {
            auto.get(c, 2 * n, dt, op);
        }
        assert!(auto.cached() <= MAX_SHAPES);
    }
}
