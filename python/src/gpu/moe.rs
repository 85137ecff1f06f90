//! The MoE and device-count all-to-allv layers of a [`super::GpuComm`] (`symm.moe`'s runtime
//! side): each owns a symmetric block, given back to the heap (locally, as a
//! [`super::Block`] is) when the last reference goes.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use symm_core::moe::{Mode, MoeConfig};
use symm_driver::cuda::{A2avLayer, MoeLayer, Stream, TokenType};

use super::errors::py_err;
use super::Runtime;

/// A MoE layer of a [`super::GpuComm`] (`symm.moe.Buffer`'s runtime side): the symmetric
/// block of its staging rows, headers, expert rows and spans.
#[pyclass(module = "symm._symm", name = "MoeLayer", frozen)]
pub struct PyMoeLayer {
    /// Before the runtime: the layer's kernels go before the Comm they were loaded on.
    pub(super) layer: MoeLayer,
    rt: Arc<Runtime>,
    /// This rank's device address of the expert rows (`rows_max x hidden` elements).
    #[pyo3(get)]
    rows_ptr: u64,
    /// This rank's device address of the spans (`local_experts` pairs of u32).
    #[pyo3(get)]
    spans_ptr: u64,
}

#[pymethods]
impl PyMoeLayer {
    /// Experts over all ranks.
    #[getter]
    fn experts(&self) -> u32 {
        self.layer.config().experts
    }

    /// Experts per token.
    #[getter]
    fn topk(&self) -> u16 {
        self.layer.config().topk
    }

    /// Most tokens a rank dispatches in one call.
    #[getter]
    fn tokens_max(&self) -> u32 {
        self.layer.config().tokens_max
    }

    /// Elements per token.
    #[getter]
    fn hidden(&self) -> u32 {
        self.layer.config().hidden
    }

    /// Expert rows this rank holds.
    #[getter]
    fn rows_max(&self) -> u32 {
        self.layer.config().rows_max
    }

    /// Experts per rank.
    #[getter]
    fn local_experts(&self) -> u32 {
        self.layer.config().local_experts()
    }

    /// "bf16" or "f32".
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.layer.token_type() {
            TokenType::Bf16 => "bf16",
            _ => "f32",
        }
    }

    /// Heap offset and bytes of the layer's block.
    #[getter]
    fn block(&self) -> (u64, u64) {
        self.layer.block()
    }

    /// Tokens of the last dispatch enqueued.
    #[getter]
    fn tokens(&self) -> u32 {
        self.layer.tokens()
    }
}

impl Drop for PyMoeLayer {
    fn drop(&mut self) {
        // Local and non-blocking, as for a `Block`: the heap frees it once every rank released
        // it, its device work is done and no captured graph names it.
        self.rt.release(self.layer.block().0);
    }
}

/// An all-to-allv layer of a [`super::GpuComm`]: its output region holds `out_max` elements
/// of `elem` bytes.
#[pyclass(module = "symm._symm", name = "A2avLayer", frozen)]
pub struct PyA2avLayer {
    /// Before the runtime, as for a [`PyMoeLayer`].
    pub(super) layer: A2avLayer,
    rt: Arc<Runtime>,
    /// This rank's device address of the output.
    #[pyo3(get)]
    output_ptr: u64,
    /// Bytes per element.
    #[pyo3(get)]
    elem: u64,
}

#[pymethods]
impl PyA2avLayer {
    /// Elements the output holds.
    #[getter]
    fn out_max(&self) -> u64 {
        self.layer.out_max()
    }
}

impl Drop for PyA2avLayer {
    fn drop(&mut self) {
        // Local and non-blocking, as for a `MoeLayer`.
        self.rt.release(self.layer.block());
    }
}

/// The mode named `name`.
pub(super) fn mode(name: &str) -> PyResult<Mode> {
    match name {
        "normal" => Ok(Mode::Normal),
        "low_latency" => Ok(Mode::LowLatency),
        other => Err(PyValueError::new_err(format!(
            "mode must be \"normal\" or \"low_latency\", got {:?}",
            other.chars().take(32).collect::<String>()
        ))),
    }
}

/// Collective, not while capturing: a MoE layer of `comm` (see `GpuComm.moe_layer`).
#[allow(clippy::too_many_arguments)]
pub(super) fn layer(
    py: Python<'_>,
    rt: &Arc<Runtime>,
    experts: u32,
    topk: u16,
    tokens_max: u32,
    hidden: u32,
    dtype: &str,
    s: &Stream,
    rows_max: Option<u32>,
) -> PyResult<PyMoeLayer> {
    let ty = match dtype {
        "bf16" => TokenType::Bf16,
        "f32" => TokenType::F32,
        other => {
            return Err(PyValueError::new_err(format!(
                "MoE tokens are bf16 or f32, got {:?}",
                other.chars().take(32).collect::<String>()
            )))
        }
    };
    let shape_err = |e: symm_core::moe::MoeError| PyValueError::new_err(e.to_string());
    let mut cfg =
        MoeConfig::new(rt.comm.world(), experts, topk, tokens_max, hidden).map_err(shape_err)?;
    if let Some(rows) = rows_max {
        cfg = cfg.with_rows_max(rows).map_err(shape_err)?;
    }
    let (layer, rows_ptr, spans_ptr) = py
        .allow_threads(|| {
            let layer = MoeLayer::new(&rt.comm, &rt.tensors, cfg, ty, s)?;
            let mem = rt.comm.memory();
            let rows = mem.ptr(rt.comm.rank(), layer.expert_rows());
            let spans = mem.ptr(rt.comm.rank(), layer.spans_ptr());
            match (rows, spans) {
                (Ok(r), Ok(p)) => Ok((layer, r, p)),
                (Err(e), _) | (_, Err(e)) => {
                    rt.release(layer.block().0);
                    Err(e)
                }
            }
        })
        .map_err(|e| py_err(py, e))?;
    Ok(PyMoeLayer {
        layer,
        rt: Arc::clone(rt),
        rows_ptr,
        spans_ptr,
    })
}

/// Collective, not while capturing: an all-to-allv layer of `comm` (see `GpuComm.a2av_layer`).
pub(super) fn a2av_layer(
    py: Python<'_>,
    rt: &Arc<Runtime>,
    elem: u64,
    out_max: u64,
    s: &Stream,
) -> PyResult<PyA2avLayer> {
    let (layer, output_ptr) = py
        .allow_threads(|| {
            let layer = A2avLayer::new(&rt.comm, &rt.tensors, elem, out_max, s)?;
            match rt.comm.memory().ptr(rt.comm.rank(), layer.output()) {
                Ok(out) => Ok((layer, out)),
                Err(e) => {
                    rt.release(layer.block());
                    Err(e)
                }
            }
        })
        .map_err(|e| py_err(py, e))?;
    Ok(PyA2avLayer {
        layer,
        rt: Arc::clone(rt),
        output_ptr,
        elem,
    })
}
