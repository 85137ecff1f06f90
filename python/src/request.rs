//! `symm.Request`: a collective request as symm runs it, made once from names and reused.
//!
//! A request names what to compute (collective, bytes, dtype, op, root); the algorithm and
//! channels are symm's automatic choice (`Request::auto`: the calibration table of the job's
//! topology, else the cost model) unless the caller forces them. The binding never decides
//! them itself. On the host a request is made for a world and topology given; on the GPU,
//! `GpuComm.request` makes one for its job (cached per shape in the runtime).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use symm_core::sched::{Collective, Forced, Request, SchedError, MAX_CHANNELS, MAX_WORLD};

use crate::parse::{algorithm, collective, dtype, reduce_op, topology, Int};

/// A collective request: what to compute and how symm runs it (algorithm and channels).
///
/// ``Request(collective, world, nbytes, dtype="f32", op="sum", *, algorithm=None,
/// channels=None, root=0, src=0, dst=None, topology="nvlink", deterministic=False)`` is
/// symm's request for ``nbytes`` of ``dtype`` at ``world`` ranks connected as ``topology``;
/// ``algorithm`` and ``channels`` force symm's choice; ``deterministic`` picks only algorithms
/// whose result is the rank-order sum, the same bits at every size and channel count, and
/// refuses a forced one that is not. On the GPU, collectives make theirs for the job.
#[pyclass(module = "symm._symm", name = "Request", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyRequest {
    pub(crate) req: Request,
}

#[pymethods]
impl PyRequest {
    #[new]
    #[pyo3(signature = (collective, world, nbytes, dtype="f32", op="sum", *, algorithm=None, channels=None, root=Int(0), src=Int(0), dst=None, topology="nvlink", deterministic=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        collective: &str,
        world: Int,
        nbytes: Int,
        dtype: &str,
        op: &str,
        algorithm: Option<&str>,
        channels: Option<Int>,
        root: Int,
        src: Int,
        dst: Option<Int>,
        topology: &str,
        deterministic: bool,
    ) -> PyResult<PyRequest> {
        let (world, nbytes, root, src) = (world.0, nbytes.0, root.0, src.0);
        let (channels, dst) = (channels.map(|c| c.0), dst.map(|d| d.0));
        let world = u16::try_from(world)
            .ok()
            .filter(|w| (1..=MAX_WORLD).contains(w))
            .ok_or_else(|| {
                PyValueError::new_err(format!("world {world} is not between 1 and {MAX_WORLD}"))
            })?;
        let bytes = u64::try_from(nbytes)
            .map_err(|_| PyValueError::new_err(format!("nbytes {nbytes} is negative")))?;
        let c = self::collective(collective, world, root, src, dst)?;
        let req = Request::for_call(
            c,
            world,
            bytes,
            self::dtype(dtype)?,
            reduce_op(op)?,
            self::topology(topology)?,
            forced(algorithm, channels, deterministic)?,
        )
        .map_err(|e| refused(c, e))?;
        Ok(PyRequest { req })
    }

    /// Whether its result is the rank-order sum whatever the algorithm, channels and size
    /// (deterministic mode; always for collectives that do not reduce).
    #[getter]
    fn deterministic(&self) -> bool {
        self.req.is_deterministic()
    }

    /// The collective's name.
    #[getter]
    fn collective(&self) -> &'static str {
        self.req.collective.name()
    }

    /// The algorithm's name.
    #[getter]
    fn algorithm(&self) -> &'static str {
        self.req.algorithm.name()
    }

    /// Channels (thread blocks on the GPU).
    #[getter]
    fn channels(&self) -> u16 {
        self.req.channels
    }

    /// Ranks.
    #[getter]
    fn world(&self) -> u16 {
        self.req.world
    }

    /// Bytes (per rank, or per block for the collectives that count blocks).
    #[getter]
    fn nbytes(&self) -> u64 {
        self.req.bytes
    }

    /// The element type's name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.req.dtype.name()
    }

    /// The reduction operator's name.
    #[getter]
    fn op(&self) -> &'static str {
        self.req.op.name()
    }

    /// The root of a rooted collective (broadcast, reduce, scatter, gather), else None.
    #[getter]
    fn root(&self) -> Option<u16> {
        match self.req.collective {
            Collective::Broadcast { root }
            | Collective::Reduce { root }
            | Collective::Scatter { root }
            | Collective::Gather { root } => Some(root),
            _ => None,
        }
    }

    /// Input, output and scratch bytes each rank needs.
    fn buffer_sizes(&self) -> (u64, u64, u64) {
        let s = self.req.buffer_sizes();
        (s.input, s.output, s.scratch)
    }

    fn __repr__(&self) -> String {
        let r = &self.req;
        let root = self
            .root()
            .map(|x| format!(", root={x}"))
            .unwrap_or_default();
        format!(
            "Request('{}', world={}, nbytes={}, dtype='{}', op='{}', algorithm='{}', \
             channels={}{root})",
            r.collective.name(),
            r.world,
            r.bytes,
            r.dtype.name(),
            r.op.name(),
            r.algorithm.name(),
            r.channels
        )
    }
}

/// What the caller forces on a call (`Forced`): `algorithm` by name, `channels` checked.
pub(crate) fn forced(
    algorithm: Option<&str>,
    channels: Option<i64>,
    deterministic: bool,
) -> PyResult<Forced> {
    let algorithm = algorithm.map(self::algorithm).transpose()?;
    let channels = channels
        .map(|c| {
            u16::try_from(c)
                .ok()
                .filter(|c| (1..=MAX_CHANNELS).contains(c))
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "channels {c} is not between 1 and {MAX_CHANNELS}"
                    ))
                })
        })
        .transpose()?;
    Ok(Forced {
        algorithm,
        channels,
        deterministic,
    })
}

/// A call `Request::for_call` refused, as Python's `ValueError`.
pub(crate) fn refused(c: Collective, e: SchedError) -> PyErr {
    PyValueError::new_err(format!("{} does not schedule: {e}", c.name()))
}
