//! Automatic requests of a job, cached per shape.
//!
//! [`Request::auto`] decides the algorithm and channels from the job's world and topology (a
//! calibration table, else the cost model); [`AutoRequests`] remembers the decision per shape
//! (collective, bytes, dtype, operator) and what the caller forces ([`Forced`]), so a repeated
//! call costs a lookup. Every rank of a job has the same world, topology and mode (the Comm's
//! join agrees on [`CommOptions::deterministic`](super::CommOptions::deterministic)), so every
//! rank decides the same request. In a deterministic job every call is decided in
//! deterministic mode ([`Request::for_call`]); a call may also ask for it alone.

use std::collections::HashMap;
use std::sync::Mutex;

use symm_core::cost::Topology;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Collective, Forced, Request, SchedError};

use super::comm::Comm;

/// Shapes remembered before the cache starts over (a bound on its memory).
pub const MAX_SHAPES: usize = 4096;

/// What an automatic request is decided from, besides the job.
type Shape = (Collective, u64, DType, ReduceOp, Forced);

/// The automatic requests of one job (see the module doc).
#[derive(Debug)]
pub struct AutoRequests {
    world: u16,
    topology: Topology,
    deterministic: bool,
    cache: Mutex<HashMap<Shape, Request>>,
}

impl AutoRequests {
    /// For a job of `world` ranks connected as `topology`, in deterministic mode or not.
    pub fn new(world: u16, topology: Topology, deterministic: bool) -> AutoRequests {
        AutoRequests {
            world,
            topology,
            deterministic,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// For `comm`'s job ([`Comm::world`], the topology of [`Comm::sharing`], and its
    /// [`CommOptions::deterministic`](super::CommOptions::deterministic)).
    pub fn of(comm: &Comm) -> AutoRequests {
        AutoRequests::new(
            comm.world(),
            comm.sharing().topology(),
            comm.options().deterministic,
        )
    }

    /// Whether every call is decided in deterministic mode.
    pub fn deterministic(&self) -> bool {
        self.deterministic
    }

    /// The request symm runs for `collective` over `bytes` of `dtype` with `op`, with what the
    /// caller forces ([`Request::for_call`]; deterministic whenever the job is), from the cache
    /// when this shape was asked before.
    pub fn get(
        &self,
        collective: Collective,
        bytes: u64,
        dtype: DType,
        op: ReduceOp,
        forced: Forced,
    ) -> Result<Request, SchedError> {
        let forced = Forced {
            deterministic: forced.deterministic || self.deterministic,
            ..forced
        };
        let key = (collective, bytes, dtype, op, forced);
        // A poisoned lock only means a panic elsewhere while it was held: the map is whole.
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = cache.get(&key) {
            return Ok(*r);
        }
        if cache.len() >= MAX_SHAPES {
            cache.clear();
        }
        let (world, topology) = (self.world, self.topology);
        let r = Request::for_call(collective, world, bytes, dtype, op, topology, forced)?;
        cache.insert(key, r);
        Ok(r)
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
        let auto = AutoRequests::new(4, Topology::SharedDevice, false);
        let (c, dt, op) = (Collective::AllReduce, DType::Bf16, ReduceOp::Sum);
        let none = Forced::default();
        for bytes in [1024, 1 << 20, 1024] {
            assert_eq!(
                auto.get(c, bytes, dt, op, none),
                Ok(Request::auto(c, 4, bytes, dt, op, Topology::SharedDevice))
            );
        }
        assert_eq!(auto.cached(), 2);
        let rs = Collective::ReduceScatter;
        assert_eq!(auto.get(rs, 1024, dt, op, none).unwrap().collective, rs);
        for n in 0..MAX_SHAPES as u64 + 10 {
            auto.get(c, 2 * n, dt, op, none).unwrap();
        }
        assert!(auto.cached() <= MAX_SHAPES);
    }

    /// A deterministic job decides every call deterministically, at every size, and refuses a
    /// forced algorithm that is not; a call of a default job may ask for the mode alone.
    #[test]
    fn a_deterministic_job_decides_every_call_deterministically() {
        let (dt, op) = (DType::Bf16, ReduceOp::Sum);
        let none = Forced::default();
        let job = AutoRequests::new(8, Topology::Nvlink, true);
        let free = AutoRequests::new(8, Topology::Nvlink, false);
        let mut moved = 0;
        for c in [Collective::AllReduce, Collective::Reduce { root: 0 }] {
            for shift in 4..31 {
                let r = job.get(c, 1 << shift, dt, op, none).unwrap();
                assert!(r.is_deterministic() && r.validate().is_ok(), "{r:?}");
                let asked = Forced {
                    deterministic: true,
                    ..none
                };
                assert_eq!(free.get(c, 1 << shift, dt, op, asked), Ok(r));
                moved += usize::from(free.get(c, 1 << shift, dt, op, none) != Ok(r));
            }
        }
        // The default mode picks other algorithms somewhere (a tree for the rooted reduce).
        assert!(moved > 0);
        let c = Collective::AllReduce;
        let ring = Forced {
            algorithm: Some(symm_core::sched::Algorithm::Ring),
            ..none
        };
        assert!(matches!(
            job.get(c, 1 << 20, dt, op, ring),
            Err(SchedError::NotDeterministic { .. })
        ));
        assert!(free.get(c, 1 << 20, dt, op, ring).is_ok());
    }
}
