//! The fused all-reduce, residual add and RMSNorm of a [`super::GpuComm`]
//! (`symm.fused_all_reduce_rmsnorm`'s runtime side): a [`FusedNorm`] of one width, its block
//! given back to the heap (locally, as a [`super::Block`] is) when the last reference goes.

use std::sync::Arc;

use pyo3::prelude::*;

use symm_driver::cuda::{FusedNorm, NormArgs};

use super::args::{span, stream};
use super::errors::py_err;
use super::{GpuComm, Runtime};

/// The fused op of one width (see the module doc).
#[pyclass(module = "symm._symm", name = "FusedNorm", frozen)]
pub struct PyFusedNorm {
    /// Before the runtime: the op's kernel goes before the Comm it was loaded on.
    op: FusedNorm,
    rt: Arc<Runtime>,
}

/// Collective: the fused all-reduce + RMSNorm of `comm` for rows of `hidden` bf16 elements,
/// at most `max_rows` a call (not while stream `stream_handle` captures).
#[pyfunction]
pub fn fused_norm(
    py: Python<'_>,
    comm: &GpuComm,
    hidden: u32,
    max_rows: u32,
    stream_handle: u64,
) -> PyResult<PyFusedNorm> {
    let rt = comm.rt.clone();
    let s = stream(&rt.comm, stream_handle);
    let op = py
        .allow_threads(|| FusedNorm::new(&rt.comm, &rt.tensors, hidden, max_rows, &s))
        .map_err(|e| py_err(py, e))?;
    Ok(PyFusedNorm { op, rt })
}

#[pymethods]
impl PyFusedNorm {
    /// Elements per row.
    #[getter]
    fn hidden(&self) -> u32 {
        self.op.hidden()
    }

    /// Most rows a call takes.
    #[getter]
    fn max_rows(&self) -> u32 {
        self.op.max_rows()
    }

    /// Enqueues the op on stream `stream_handle` over tensors given as (address, bytes):
    /// the input, the residual, the new residual, the weight and the output.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        x: (u64, u64),
        residual: (u64, u64),
        residual_out: (u64, u64),
        weight: (u64, u64),
        out: (u64, u64),
        eps: f32,
        stream_handle: u64,
    ) -> PyResult<()> {
        let rt = &*self.rt;
        let s = stream(&rt.comm, stream_handle);
        let sp = |(p, n): (u64, u64)| span(p, n);
        let a = NormArgs {
            x: sp(x),
            residual: sp(residual),
            residual_out: sp(residual_out),
            weight: sp(weight),
            out: sp(out),
            eps,
        };
        // SAFETY: the spans are live tensors' storage: the Python layer passes `data_ptr()`
        // and byte sizes of contiguous tensors and keeps them alive until the stream reaches
        // this work; each is checked to lie in the heap or in one device allocation of this
        // rank's context.
        unsafe { self.op.enqueue(&rt.comm, &rt.tensors, &a, &s) }.map_err(|e| py_err(py, e))
    }
}

impl Drop for PyFusedNorm {
    fn drop(&mut self) {
        // Local and non-blocking, as for a `Block`.
        self.rt.release(self.op.block());
    }
}
