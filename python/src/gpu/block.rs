//! `symm._symm.Block`: a block of the symmetric heap that a tensor's storage lives in.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::Runtime;

/// A block of the symmetric heap that a tensor's storage lives in: exposes
/// `__cuda_array_interface__` (bytes) so torch can wrap it without a copy, and gives the block
/// back when torch drops the last tensor over it.
#[pyclass(module = "symm._symm", frozen)]
pub struct Block {
    /// The runtime the block belongs to (kept mapped while the block lives).
    pub(super) rt: Arc<Runtime>,
    /// Heap offset (the same on every rank).
    #[pyo3(get)]
    pub(super) offset: u64,
    /// This rank's device address of it.
    #[pyo3(get)]
    pub(super) ptr: u64,
    /// Bytes.
    #[pyo3(get)]
    pub(super) nbytes: u64,
}

#[pymethods]
impl Block {
    /// The CUDA array interface (version 3) of the block's bytes.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", (self.nbytes,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr, false))?;
        d.set_item("version", 3)?;
        d.set_item("strides", py.None())?;
        d.set_item("stream", py.None())?;
        Ok(d)
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // Local and non-blocking: freed at a later collective allocation, once every rank
        // released it, its device work is done and no captured graph names it.
        self.rt.release(self.offset);
    }
}
