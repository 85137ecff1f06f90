//! Automatic requests: the algorithm and channels symm picks when the caller names only what
//! to compute.
//!
//! [`Request::auto`] is the one place the default is decided, for every entry point (Rust,
//! Python, C): the calibration table measured on the job's [`Topology`] for its collective and
//! world, at the nearest size, else the cost model's pick ([`cost::tune_on`]). A caller may force
//! the algorithm, the channels or both ([`Request::with_choice`]); what is forced is kept, what
//! is not stays symm's. [`Request::for_call`] is the whole decision for one call, deterministic
//! mode included ([`Forced`]). The decision is a pure function of its arguments, so a runtime
//! may cache it per shape.

use super::{Algorithm, Collective, Request, SchedError};
use crate::cost::{self, Topology};
use crate::dtype::{DType, ReduceOp};

/// What the caller of one collective forces on symm's choice ([`Request::for_call`]); the
/// default forces nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Forced {
    /// The algorithm (`None`: symm's).
    pub algorithm: Option<Algorithm>,
    /// The channels (`None`: symm's, or the size's default when the algorithm is forced).
    pub channels: Option<u16>,
    /// Deterministic mode (`super::determinism`): symm picks only algorithms that honour it,
    /// and a forced one that does not is refused.
    pub deterministic: bool,
}

impl Request {
    /// The request symm runs for `collective` over `bytes` of `dtype` (combined with `op` where
    /// the collective reduces) at `world` ranks connected as `topology`: the algorithm and
    /// channels come from the calibration table for (topology, collective, world), else from
    /// the cost model; pipelining stays the default. The result validates whenever some
    /// algorithm takes the request at all (the same collective, world, size and dtype).
    ///
    /// ```
    /// use symm_core::cost::Topology;
    /// use symm_core::dtype::{DType, ReduceOp};
    /// use symm_core::sched::{Collective, Request};
    ///
    /// let (c, dt, op) = (Collective::AllReduce, DType::Bf16, ReduceOp::Sum);
    /// let small = Request::auto(c, 8, 4096, dt, op, Topology::Nvlink);
    /// let large = Request::auto(c, 8, 256 << 20, dt, op, Topology::Nvlink);
    /// assert_eq!(small.validate(), Ok(()));
    /// assert_ne!(small.algorithm, large.algorithm);
    /// assert!(large.channels > small.channels);
    /// ```
    pub fn auto(
        collective: Collective,
        world: u16,
        bytes: u64,
        dtype: DType,
        op: ReduceOp,
        topology: Topology,
    ) -> Request {
        // The algorithm given here is a placeholder: `tune_on` replaces it.
        let base = Request::new(collective, Algorithm::Ring, world, bytes, dtype, op);
        cost::tune_on(base, topology).0
    }

    /// The request one call runs: symm's choice ([`Request::auto`], or
    /// [`Request::auto_deterministic`] when `forced.deterministic`) with what the caller forces
    /// ([`Request::with_choice`]), validated. In deterministic mode a forced algorithm that
    /// cannot honour it is refused ([`SchedError::NotDeterministic`]), as is a call no
    /// algorithm can run deterministically.
    ///
    /// ```
    /// use symm_core::cost::Topology;
    /// use symm_core::dtype::{DType, ReduceOp};
    /// use symm_core::sched::{Algorithm, Collective, Forced, Request, SchedError};
    ///
    /// let call = |forced| Request::for_call(Collective::AllReduce, 4, 64 << 20, DType::Bf16,
    ///                                       ReduceOp::Sum, Topology::Nvlink, forced);
    /// let det = Forced { deterministic: true, ..Forced::default() };
    /// assert!(call(det).unwrap().is_deterministic());
    /// let ring = Forced { algorithm: Some(Algorithm::Ring), ..det };
    /// assert!(matches!(call(ring), Err(SchedError::NotDeterministic { .. })));
    /// assert_eq!(call(Forced { deterministic: false, ..ring }).unwrap().algorithm, Algorithm::Ring);
    /// ```
    pub fn for_call(
        collective: Collective,
        world: u16,
        bytes: u64,
        dtype: DType,
        op: ReduceOp,
        topology: Topology,
        forced: Forced,
    ) -> Result<Request, SchedError> {
        let base = if forced.deterministic && forced.algorithm.is_none() {
            Request::auto_deterministic(collective, world, bytes, dtype, op, topology)?
        } else {
            Request::auto(collective, world, bytes, dtype, op, topology)
        };
        let req = base.with_choice(forced.algorithm, forced.channels);
        req.validate()?;
        if forced.deterministic {
            req.deterministic()
        } else {
            Ok(req)
        }
    }

    /// This request with what the caller forces: `algorithm` (its channels then default by
    /// size, [`cost::default_channels`], unless `channels` is given too) and `channels`. `None`
    /// keeps this request's choice. The result is not validated: a forced algorithm may not
    /// take the request.
    pub fn with_choice(self, algorithm: Option<Algorithm>, channels: Option<u16>) -> Request {
        let (algorithm, default) = match algorithm {
            Some(a) => (a, cost::default_channels(self.bytes)),
            None => (self.algorithm, self.channels),
        };
        Request {
            algorithm,
            channels: channels.unwrap_or(default),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{calibrated, tune_on, Choice};
    use crate::sched::collectives;

    /// An automatic request validates for every collective, world and size some algorithm
    /// takes, on both topologies, and keeps what the caller asked to compute.
    #[test]
    fn auto_requests_validate() {
        for topology in Topology::ALL {
            for world in [1, 2, 3, 4, 8, 72] {
                for c in collectives(world) {
                    for bytes in [0, 4, 1024, 48 << 10, 1 << 20, 1 << 30] {
                        let r = Request::auto(c, world, bytes, DType::F32, ReduceOp::Max, topology);
                        assert_eq!(r.validate(), Ok(()), "{r:?}");
                        assert_eq!(
                            (r.collective, r.world, r.bytes, r.dtype, r.op),
                            (c, world, bytes, DType::F32, ReduceOp::Max)
                        );
                        assert_eq!((r.chunk_bytes, r.slots), (0, 0));
                    }
                }
            }
        }
    }

    /// Hostile shapes (no ranks, every rank a u16 holds, sizes at the ends of u64, sizes no
    /// element divides) give a request, never a panic; whatever it is, validation judges it.
    #[test]
    fn hostile_shapes_never_panic() {
        for topology in Topology::ALL {
            for world in [0, 1, 2, 1000, u16::MAX] {
                for c in Collective::ALL {
                    for bytes in [0, 1, 3, 4097, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                        for dt in [DType::F32, DType::Bf16, DType::I64] {
                            let r = Request::auto(c, world, bytes, dt, ReduceOp::Sum, topology);
                            assert_eq!((r.collective, r.world, r.bytes), (c, world, bytes));
                            let _ = r.validate();
                            let _ = r
                                .with_choice(Some(Algorithm::Ring), Some(u16::MAX))
                                .validate();
                        }
                    }
                }
            }
        }
    }

    /// Where a calibration table measured the shape, the automatic request is its entry, and
    /// only on the topology it was measured on.
    #[test]
    fn auto_follows_the_calibration_table() {
        let mut seen = 0;
        for e in calibrated() {
            let c = Collective::parse(e.collective).unwrap_or_else(|err| panic!("{err}"));
            let r = Request::auto(c, e.world, e.bytes, DType::Bf16, ReduceOp::Sum, e.topology);
            let (_, how) = tune_on(r, e.topology);
            assert_eq!(how, Choice::Calibrated);
            assert_eq!(
                (r.algorithm, r.channels),
                (e.algorithm, e.channels),
                "{e:?}"
            );
            seen += 1;
        }
        assert!(seen > 0, "no calibration entry was checked");
    }

    /// Without a table (a world never measured) the model decides: one-shot over low-latency
    /// lines for small all-reduces, two-shot for large ones, channels by size.
    #[test]
    fn auto_falls_back_to_the_model() {
        let at = |bytes| {
            Request::auto(
                Collective::AllReduce,
                7,
                bytes,
                DType::Bf16,
                ReduceOp::Sum,
                Topology::Nvlink,
            )
        };
        assert_eq!(at(4096).algorithm, Algorithm::OneShotLl);
        assert_eq!(at(4096).channels, 1);
        assert_eq!(at(256 << 20).algorithm, Algorithm::TwoShot);
        assert_eq!(at(256 << 20).channels, 64);
    }

    /// What the caller forces is kept; a forced algorithm without channels gets channels by
    /// size, not the automatic algorithm's.
    #[test]
    fn forced_choices_win() {
        let auto = Request::auto(
            Collective::AllReduce,
            4,
            1 << 20,
            DType::F32,
            ReduceOp::Sum,
            Topology::Nvlink,
        );
        assert_eq!(auto.with_choice(None, None), auto);
        let ring = auto.with_choice(Some(Algorithm::Ring), None);
        assert_eq!(ring.algorithm, Algorithm::Ring);
        assert_eq!(ring.channels, cost::default_channels(1 << 20));
        let both = auto.with_choice(Some(Algorithm::Tree), Some(3));
        assert_eq!((both.algorithm, both.channels), (Algorithm::Tree, 3));
        let ch = auto.with_choice(None, Some(2));
        assert_eq!((ch.algorithm, ch.channels), (auto.algorithm, 2));
    }
}
