//! `symm._symm.AllReduces`: the repeated call of `symm.all_reduce`, in one step.
//!
//! The Python layer's most frequent call is an in-place sum over a tensor whose shape it has
//! seen before. Its request was made by the runtime on the first call
//! ([`super::GpuComm::request`]); this remembers it by the tensor's (bytes, torch dtype), so a
//! repeated call is one call from Python: the tensor's attributes read here, one lookup and
//! one enqueue. The torch dtype is
//! known by its object (torch's dtypes are singletons); the map holds a reference to each, so
//! an address it keys by is never another object's.
//!
//! A call it cannot finish without waiting on the host (the arguments' first use on this
//! stream, as [`Tensors::try_enqueue`](symm_driver::cuda::Tensors::try_enqueue) says) or a
//! shape it has not seen returns `False` having enqueued nothing, and the caller takes the full
//! path. Its errors are the enqueue's: a span that is not device memory of this rank's GPU is
//! refused there, whatever the Python side checked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use symm_core::sched::{Collective, Request};

use super::args::{span, stream};
use super::{py_err, Runtime};
use crate::request::PyRequest;

/// Shapes remembered before the memory starts over (a job with more distinct all-reduce
/// shapes than this rebuilds some requests, from the runtime's own cache).
const MAX_SHAPES: usize = 4096;

/// A remembered sum: the torch dtype it is for (kept alive) and its request.
type Remembered = (Py<PyAny>, Request);

/// The remembered in-place sums of one job (see the module doc).
#[pyclass(module = "symm._symm", frozen)]
pub struct AllReduces {
    /// The runtime the requests run on.
    pub(super) rt: Arc<Runtime>,
    /// `torch.Tensor`: only tensors of exactly this type take the one step.
    pub(super) tensor: Py<PyAny>,
    /// Returns torch's current stream of the rank's device as a `CUstream` handle.
    pub(super) current_stream: Py<PyAny>,
    /// The request by (bytes, address of the torch dtype), with the dtype it keeps alive.
    pub(super) by_shape: Mutex<HashMap<(u64, usize), Remembered>>,
}

#[pymethods]
impl AllReduces {
    /// Enqueues the remembered sum over tensor `t` in place on torch's current stream;
    /// `False` (nothing enqueued) when `t` is not a plain contiguous `torch.Tensor` of a
    /// remembered shape, or the call must wait: the caller takes the full path, which explains
    /// any refusal. Errors are the enqueue's.
    fn run(&self, py: Python<'_>, t: &Bound<'_, PyAny>) -> PyResult<bool> {
        if !t.get_type().is(self.tensor.bind(py)) {
            return Ok(false);
        }
        if !t.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
            return Ok(false);
        }
        let nbytes: u64 = t.getattr(intern!(py, "nbytes"))?.extract()?;
        let dtype = t.getattr(intern!(py, "dtype"))?;
        let key = (nbytes, dtype.as_ptr() as usize);
        let found = match self.by_shape.lock() {
            Ok(m) => m.get(&key).map(|(_, r)| *r),
            Err(_) => None,
        };
        let Some(req) = found else {
            return Ok(false);
        };
        let ptr: u64 = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
        let handle: u64 = self.current_stream.bind(py).call0()?.extract()?;
        let rt = &*self.rt;
        let s = stream(&rt.comm, handle);
        let span = span(ptr, nbytes);
        // SAFETY: `ptr` and `nbytes` are the storage of the live contiguous tensor `t`, which
        // the Python layer keeps alive until the stream reaches this work (as for
        // `GpuComm::collective`); a span outside the heap is checked against the driver's
        // allocation table, so memory of another device or of the host is refused. The handle
        // is torch's current stream of the rank's device (the callable the layer gave).
        unsafe { rt.tensors.try_enqueue(&rt.comm, &req, span, span, &s) }.map_err(|e| py_err(py, e))
    }

    /// Remembers `request`, an all-reduce of `nbytes` bytes, for tensors of torch dtype
    /// `dtype` (a `ValueError` for any other request).
    fn remember(&self, nbytes: u64, dtype: Bound<'_, PyAny>, request: &PyRequest) -> PyResult<()> {
        let r = request.req;
        let sizes = r.buffer_sizes();
        if r.collective != Collective::AllReduce || sizes.input != nbytes || sizes.output != nbytes
        {
            return Err(PyValueError::new_err(format!(
                "an all-reduce of {nbytes} bytes is remembered, not {r:?}"
            )));
        }
        let key = (nbytes, dtype.as_ptr() as usize);
        if let Ok(mut m) = self.by_shape.lock() {
            if m.len() >= MAX_SHAPES {
                m.clear();
            }
            m.insert(key, (dtype.unbind(), r));
        }
        Ok(())
    }

    /// Shapes remembered.
    fn __len__(&self) -> usize {
        self.by_shape.lock().map(|m| m.len()).unwrap_or(0)
    }
}

/// What `symm.all_reduce` reaches from Rust: the job's remembered sums (none between jobs),
/// the full Python path, and the Python check that explains a refusal.
#[derive(Default)]
struct Front {
    sums: Option<Py<AllReduces>>,
    full: Option<Py<PyAny>>,
    explain: Option<Py<PyAny>>,
}

static FRONT: Mutex<Option<Front>> = Mutex::new(None);

fn front() -> PyResult<std::sync::MutexGuard<'static, Option<Front>>> {
    FRONT.lock().map_err(|_| {
        pyo3::exceptions::PyRuntimeError::new_err("symm's all_reduce front is poisoned")
    })
}

/// Names the full Python path of `all_reduce` and the check that explains a refused tensor
/// (`symm._gpu`, once at import).
#[pyfunction]
pub fn all_reduce_paths(full: Py<PyAny>, explain: Py<PyAny>) -> PyResult<()> {
    let mut f = front()?;
    let f = f.get_or_insert_with(Front::default);
    f.full = Some(full);
    f.explain = Some(explain);
    Ok(())
}

/// Makes `sums` the job's remembered sums that `all_reduce` runs in one step (`None` when the
/// job ends).
#[pyfunction]
#[pyo3(signature = (sums))]
pub fn all_reduce_job(sums: Option<Py<AllReduces>>) -> PyResult<()> {
    front()?.get_or_insert_with(Front::default).sums = sums;
    Ok(())
}

/// Reduce ``t`` over every rank, in place, on the current stream (or ``stream``).
///
/// ``t`` may be a symmetric tensor (read in place) or any contiguous CUDA tensor of this
/// rank's GPU: used where it lies by the algorithms no peer reads it in (the low-latency
/// ones, at small sizes), else staged through a symmetric workspace. ``op``: sum, prod, min,
/// max. ``deterministic=True`` makes this call's result the rank-order sum, the same bits at
/// every size (see :func:`init`; a deterministic job makes every call so). Every rank passes
/// the same shape, dtype and kind of tensor. Returns ``t``.
///
/// A sum over a tensor whose shape this job has seen, with no other argument, is one step
/// here; every other call takes the full path.
#[pyfunction]
#[pyo3(
    signature = (t, *args, **kwargs),
    text_signature = "(t, op='sum', *, stream=None, algorithm=None, channels=None, deterministic=False)"
)]
pub fn all_reduce(
    py: Python<'_>,
    t: &Bound<'_, PyAny>,
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    // The hot path takes only the sums from the front; the Python paths are fetched when needed.
    let path = |pick: fn(&Front) -> Option<&Py<PyAny>>| -> PyResult<Option<Py<PyAny>>> {
        Ok(front()?.as_ref().and_then(pick).map(|p| p.clone_ref(py)))
    };
    let plain = args.is_empty() && kwargs.is_none_or(|k| k.is_empty());
    let sums = if plain {
        front()?
            .as_ref()
            .and_then(|f| f.sums.as_ref().map(|s| s.clone_ref(py)))
    } else {
        None
    };
    if let Some(sums) = sums {
        match sums.get().run(py, t) {
            Ok(true) => return Ok(t.clone().unbind()),
            Ok(false) => {}
            Err(e) => {
                // A tensor the Python side refuses is explained in its terms.
                if let Some(x) = path(|f| f.explain.as_ref())? {
                    x.call1(py, (t,))?;
                }
                return Err(e);
            }
        }
    }
    let Some(full) = path(|f| f.full.as_ref())? else {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "symm._gpu is not imported: import symm",
        ));
    };
    let mut all = vec![t.clone()];
    all.extend(args.iter());
    full.call(py, PyTuple::new(py, all)?, kwargs)
}
