//! `symm._symm.GpuComm`: one rank of a GPU job, for the `symm.torch` layer.
//!
//! The Python layer owns the torch side (tensors, streams, dtypes); this class owns the
//! runtime: the job's bootstrap, the symmetric heap, the plans and the collectives. Tensors
//! cross as (address, bytes) pairs and streams as `CUstream` handles taken from torch, which
//! is why these methods are private to the package: an address that is not a live tensor of
//! the rank's GPU is refused (it must lie in the heap or in one device allocation of the
//! rank's context), but a stream handle is trusted as torch gives it.
//!
//! Every call that may wait (joining, allocating, the first use of a collective's arguments,
//! synchronising) releases the GIL while it waits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use symm_core::moe::{Mode, MoeConfig};
use symm_core::sched::{Collective, Request};
use symm_driver::bootstrap::{JobEnv, SocketBootstrap};
use symm_driver::cuda::compiled::PlanPath;
use symm_driver::cuda::{
    A2avLayer, Comm, CommOptions, CudaError, MoeLayer, Span, Stream, TokenType,
};

use crate::{algorithm, dtype, reduce_op};

/// Maps a runtime error to symm's Python exceptions (fields where the error has them).
pub(crate) fn py_err(py: Python<'_>, e: CudaError) -> PyErr {
    let msg = e.to_string();
    let build = || -> PyResult<PyErr> {
        let errors = py.import("symm.errors")?;
        let obj = match &e {
            CudaError::Timeout {
                rank,
                peer,
                slot,
                expected,
                found,
                ..
            } => errors.getattr("TimeoutError")?.call1((
                msg.clone(),
                *rank,
                *peer,
                *slot,
                *expected,
                *found,
            ))?,
            CudaError::PeerLost { rank } => errors
                .getattr("PeerLostError")?
                .call1((msg.clone(), *rank))?,
            CudaError::Bootstrap(b) if b.lost_rank().is_some() => errors
                .getattr("PeerLostError")?
                .call1((msg.clone(), b.lost_rank().unwrap_or(0)))?,
            CudaError::Poisoned(_) => errors.getattr("PoisonedError")?.call1((msg.clone(),))?,
            CudaError::SizeMismatch { .. }
            | CudaError::RanksDiffer { .. }
            | CudaError::NotDeviceMemory { .. }
            | CudaError::OutOfBounds { .. }
            | CudaError::BadRank { .. }
            | CudaError::Sched(_)
            | CudaError::Misaligned { .. }
            | CudaError::NotLive { .. }
            | CudaError::Moe(_)
            | CudaError::WrongOwner { .. } => return Ok(PyValueError::new_err(msg.clone())),
            _ => errors.getattr("SymmError")?.call1((msg.clone(),))?,
        };
        Ok(PyErr::from_value(obj))
    };
    build().unwrap_or_else(|err| err)
}

/// One rank of a GPU job (see the module doc).
#[pyclass(module = "symm._symm", frozen)]
pub struct GpuComm {
    comm: Arc<Comm>,
    /// symm's tuned request for each request as the caller gave it.
    tuned: Mutex<HashMap<Request, Request>>,
}

/// A block of the symmetric heap that a tensor's storage lives in: exposes
/// `__cuda_array_interface__` (bytes) so torch can wrap it without a copy, and gives the block
/// back when torch drops the last tensor over it.
#[pyclass(module = "symm._symm", frozen)]
pub struct Block {
    comm: Arc<Comm>,
    /// Heap offset (the same on every rank).
    #[pyo3(get)]
    offset: u64,
    /// This rank's device address of it.
    #[pyo3(get)]
    ptr: u64,
    /// Bytes.
    #[pyo3(get)]
    nbytes: u64,
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
        // Local and non-blocking; a closed or poisoned Comm still takes the mark.
        let _ = self.comm.release_block(self.offset);
    }
}

/// The stream handle `raw` of torch, wrapped for the runtime.
fn stream(comm: &Comm, raw: u64) -> PyResult<Stream> {
    // SAFETY: `raw` is the handle of a live CUDA stream of the device's primary context (what
    // torch's `cuda_stream` gives; the Python layer passes nothing else), or 0 for the legacy
    // default stream; it outlives this call and the work enqueued on it.
    unsafe { Stream::borrowed(raw as usize as *mut std::ffi::c_void, comm.device()) }
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A MoE layer of a [`GpuComm`] (`symm.moe.Buffer`'s runtime side): the symmetric block of
/// its staging rows, headers, expert rows and spans, given back to the heap (locally, as a
/// [`Block`] is) when the last reference goes.
#[pyclass(module = "symm._symm", name = "MoeLayer", frozen)]
pub struct PyMoeLayer {
    comm: Arc<Comm>,
    layer: MoeLayer,
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
        let _ = self.comm.release_block(self.layer.block().0);
    }
}

/// An all-to-allv layer of a [`GpuComm`]: its output region holds `out_max` elements of
/// `elem` bytes.
#[pyclass(module = "symm._symm", name = "A2avLayer", frozen)]
pub struct PyA2avLayer {
    comm: Arc<Comm>,
    layer: A2avLayer,
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
        let _ = self.comm.release_block(self.layer.block());
    }
}

/// The mode named `name`.
fn moe_mode(name: &str) -> PyResult<Mode> {
    match name {
        "normal" => Ok(Mode::Normal),
        "low_latency" => Ok(Mode::LowLatency),
        other => Err(PyValueError::new_err(format!(
            "mode must be \"normal\" or \"low_latency\", got {:?}",
            other.chars().take(32).collect::<String>()
        ))),
    }
}

/// A span from the Python layer's (address, bytes) pair.
fn span(ptr: u64, len: u64) -> Span {
    Span { ptr, len }
}

fn u16_arg(what: &str, v: i64) -> PyResult<u16> {
    u16::try_from(v)
        .map_err(|_| PyValueError::new_err(format!("{what} must be in 0..=65535, got {v}")))
}

#[pymethods]
impl GpuComm {
    /// Joins job `job` (secret `token`, hex) as `rank` of `world` on the GPU local rank
    /// `local_rank` is placed on. Collective: every rank calls it.
    #[staticmethod]
    #[pyo3(signature = (rank, world, local_rank, job, token, heap_bytes, timeout_ms, bootstrap_timeout_ms, plans="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        rank: i64,
        world: i64,
        local_rank: i64,
        job: String,
        token: String,
        heap_bytes: u64,
        timeout_ms: u64,
        bootstrap_timeout_ms: u64,
        plans: &str,
    ) -> PyResult<GpuComm> {
        let plans = PlanPath::parse(plans).ok_or_else(|| {
            PyValueError::new_err(format!(
                "plans must be auto, interpreted or compiled, got {:?}",
                plans.chars().take(32).collect::<String>()
            ))
        })?;
        let vars: HashMap<&str, String> = [
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("SYMM_JOB", job),
            ("SYMM_TOKEN", token),
        ]
        .into_iter()
        .collect();
        let env = JobEnv::from_vars(|k| vars.get(k).map(Into::into))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let opts = CommOptions {
            heap_bytes,
            timeout: Duration::from_millis(timeout_ms),
            bootstrap_timeout: Duration::from_millis(bootstrap_timeout_ms),
            plans,
            ..CommOptions::default()
        };
        let comm = py
            .allow_threads(|| {
                opts.validate()?;
                let boot = SocketBootstrap::join(&env, opts.bootstrap_timeout)
                    .map_err(CudaError::Bootstrap)?;
                let ordinal = Comm::placement(boot.local_rank())?;
                Comm::open(boot, ordinal, opts)
            })
            .map_err(|e| py_err(py, e))?;
        Ok(GpuComm {
            comm: Arc::new(comm),
            tuned: Mutex::new(HashMap::new()),
        })
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u16 {
        self.comm.rank()
    }

    /// Ranks in the job.
    #[getter]
    fn world(&self) -> u16 {
        self.comm.world()
    }

    /// The CUDA ordinal of this rank's GPU.
    #[getter]
    fn device(&self) -> i32 {
        self.comm.device().ordinal()
    }

    /// "shared_device" when ranks share this rank's GPU, else "nvlink".
    #[getter]
    fn topology(&self) -> &'static str {
        self.comm.topology().name()
    }

    /// Collective: a block of `nbytes` bytes of the symmetric heap, released when the returned
    /// object is dropped (by torch, when the last tensor over it dies).
    fn alloc(&self, py: Python<'_>, nbytes: u64, stream_handle: u64) -> PyResult<Block> {
        let s = stream(&self.comm, stream_handle)?;
        let comm = &self.comm;
        let (offset, ptr) = py
            .allow_threads(|| {
                let off = comm.alloc_block(nbytes, &s)?;
                Ok((off, comm.ptr(comm.rank(), off)?))
            })
            .map_err(|e| py_err(py, e))?;
        Ok(Block {
            comm: self.comm.clone(),
            offset,
            ptr,
            nbytes,
        })
    }

    /// Compiles and loads the stream signals kernel (before a capture uses it).
    fn load_signals(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.comm;
        py.allow_threads(|| comm.load_signals())
            .map_err(|e| py_err(py, e))
    }

    /// Enqueues a put of signal `slot` into `peer`'s pad (heap offset `pad`, `pad_len` bytes).
    fn put_signal(
        &self,
        py: Python<'_>,
        pad: u64,
        pad_len: u64,
        peer: i64,
        slot: u32,
        stream_handle: u64,
    ) -> PyResult<()> {
        self.signal(py, (pad, pad_len), peer, slot, stream_handle, false)
    }

    /// Enqueues a wait for signal `slot` from `peer` in this rank's pad (which clears it).
    fn wait_signal(
        &self,
        py: Python<'_>,
        pad: u64,
        pad_len: u64,
        peer: i64,
        slot: u32,
        stream_handle: u64,
    ) -> PyResult<()> {
        self.signal(py, (pad, pad_len), peer, slot, stream_handle, true)
    }

    /// Heap bytes per rank (the distance between two ranks' copies) and the buffer area.
    fn layout(&self) -> (u64, u64, u64) {
        let (lo, hi) = self.comm.buffer_area();
        (self.comm.stride(), lo, hi)
    }

    /// Local: gives block `offset` back (freed at a later allocation once every rank did).
    fn release(&self, py: Python<'_>, offset: u64) -> PyResult<()> {
        self.comm.release_block(offset).map_err(|e| py_err(py, e))
    }

    /// Collective: frees what every rank released; returns how many blocks.
    fn collect(&self, py: Python<'_>) -> PyResult<usize> {
        let comm = &self.comm;
        py.allow_threads(|| comm.collect_blocks())
            .map_err(|e| py_err(py, e))
    }

    /// Live blocks and their bytes.
    fn usage(&self, py: Python<'_>) -> PyResult<(usize, u64)> {
        self.comm.block_usage().map_err(|e| py_err(py, e))
    }

    /// The address of heap offset `offset` of `peer`, in this rank's mapping.
    fn ptr(&self, py: Python<'_>, peer: i64, offset: u64) -> PyResult<u64> {
        self.comm
            .ptr(u16_arg("peer", peer)?, offset)
            .map_err(|e| py_err(py, e))
    }

    /// Enqueues a collective reading `in_len` bytes at `in_ptr` and writing `out_len` bytes at
    /// `out_ptr` on stream `stream_handle`. `algorithm` and `channels` default to symm's tuned
    /// choice. Returns the (algorithm, channels) that ran.
    #[pyo3(signature = (collective, nbytes, dtype, op, in_ptr, in_len, out_ptr, out_len, stream_handle, algorithm=None, channels=None, root=0))]
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        py: Python<'_>,
        collective: &str,
        nbytes: u64,
        dtype: &str,
        op: &str,
        in_ptr: u64,
        in_len: u64,
        out_ptr: u64,
        out_len: u64,
        stream_handle: u64,
        algorithm: Option<&str>,
        channels: Option<i64>,
        root: i64,
    ) -> PyResult<(&'static str, u16)> {
        let req = self.request(collective, nbytes, dtype, op, algorithm, channels, root)?;
        let s = stream(&self.comm, stream_handle)?;
        let comm = &self.comm;
        let (input, output) = (
            Span {
                ptr: in_ptr,
                len: in_len,
            },
            Span {
                ptr: out_ptr,
                len: out_len,
            },
        );
        // Both enqueues below: the spans are live tensors' storage (the Python layer passes
        // `data_ptr()` and their byte sizes, and keeps the tensors alive until the stream
        // reaches this work, as torch's own collectives do); a span outside the heap is checked
        // against the driver's allocation table.
        let r = if comm.spans_ready(&req, input, output) {
            // Nothing to wait for on the host: keep the GIL (releasing and taking it back costs
            // more than the enqueue's own checks).
            // SAFETY: the spans are live tensors' storage, as said above.
            unsafe { comm.enqueue_spans(&req, input, output, &s) }
        } else {
            // SAFETY: the spans are live tensors' storage, as said above.
            py.allow_threads(|| unsafe { comm.enqueue_spans(&req, input, output, &s) })
        };
        r.map_err(|e| py_err(py, e))?;
        Ok((req.algorithm.name(), req.channels))
    }

    /// Reports asynchronous errors without waiting (raises symm's errors).
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.comm.check().map_err(|e| py_err(py, e))
    }

    /// Waits for stream `stream_handle`, then checks.
    fn synchronize(&self, py: Python<'_>, stream_handle: u64) -> PyResult<()> {
        let s = stream(&self.comm, stream_handle)?;
        let comm = &self.comm;
        py.allow_threads(|| comm.synchronize(&s))
            .map_err(|e| py_err(py, e))
    }

    /// Collective: lifts the poison after a timeout.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.comm;
        py.allow_threads(|| comm.reset()).map_err(|e| py_err(py, e))
    }

    /// Ends this rank's part in the job in order (the memory stays mapped while tensors live).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.comm;
        py.allow_threads(|| comm.close()).map_err(|e| py_err(py, e))
    }

    /// Collective: every rank's `data` (at most 64 KiB) in rank order, through the bootstrap.
    fn exchange<'py>(&self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let comm = &self.comm;
        let all = py
            .allow_threads(|| comm.exchange(data))
            .map_err(|e| py_err(py, e))?;
        PyList::new(py, all.iter().map(|b| PyBytes::new(py, b)))
    }

    /// Times `iters` calls of a collective enqueued from Rust (what the Python layer's cost is
    /// measured against): mean microseconds per call on the host, the stream not waited for
    /// between calls. Collective.
    #[pyo3(signature = (collective, nbytes, dtype, op, in_ptr, in_len, out_ptr, out_len, stream_handle, iters, algorithm=None, channels=None))]
    #[allow(clippy::too_many_arguments)]
    fn host_loop_us(
        &self,
        py: Python<'_>,
        collective: &str,
        nbytes: u64,
        dtype: &str,
        op: &str,
        in_ptr: u64,
        in_len: u64,
        out_ptr: u64,
        out_len: u64,
        stream_handle: u64,
        iters: u32,
        algorithm: Option<&str>,
        channels: Option<i64>,
    ) -> PyResult<f64> {
        let s = stream(&self.comm, stream_handle)?;
        let (input, output) = (
            Span {
                ptr: in_ptr,
                len: in_len,
            },
            Span {
                ptr: out_ptr,
                len: out_len,
            },
        );
        let t0 = std::time::Instant::now();
        for _ in 0..iters.max(1) {
            // The request is built per call, as the Python layer does.
            let req = self.request(collective, nbytes, dtype, op, algorithm, channels, 0)?;
            // SAFETY: as in `collective`.
            unsafe { self.comm.enqueue_spans(&req, input, output, &s) }
                .map_err(|e| py_err(py, e))?;
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters.max(1)))
    }

    /// Collective, not while capturing: a MoE layer of `experts` experts, `topk` per token, at
    /// most `tokens_max` tokens of `hidden` elements of `dtype` ("bf16" or "f32") per rank and
    /// `rows_max` expert rows (default: room for every entry).
    #[pyo3(signature = (experts, topk, tokens_max, hidden, dtype, stream_handle, rows_max=None))]
    #[allow(clippy::too_many_arguments)]
    fn moe_layer(
        &self,
        py: Python<'_>,
        experts: u32,
        topk: u16,
        tokens_max: u32,
        hidden: u32,
        dtype: &str,
        stream_handle: u64,
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
        let mut cfg = MoeConfig::new(self.comm.world(), experts, topk, tokens_max, hidden)
            .map_err(shape_err)?;
        if let Some(rows) = rows_max {
            cfg = cfg.with_rows_max(rows).map_err(shape_err)?;
        }
        let s = stream(&self.comm, stream_handle)?;
        let comm = &self.comm;
        let (layer, rows_ptr, spans_ptr) = py
            .allow_threads(|| {
                let layer = comm.moe_layer(cfg, ty, &s)?;
                let rows = comm.ptr(comm.rank(), layer.expert_rows());
                let spans = comm.ptr(comm.rank(), layer.spans_ptr());
                match (rows, spans) {
                    (Ok(r), Ok(p)) => Ok((layer, r, p)),
                    (Err(e), _) | (_, Err(e)) => {
                        let _ = comm.release_block(layer.block().0);
                        Err(e)
                    }
                }
            })
            .map_err(|e| py_err(py, e))?;
        Ok(PyMoeLayer {
            comm: self.comm.clone(),
            layer,
            rows_ptr,
            spans_ptr,
        })
    }

    /// Enqueues a dispatch of `tokens` tokens on the layer: `x`, `idx` (i64) and `weights`
    /// (f32) as (address, bytes) pairs. Collective.
    #[pyo3(signature = (layer, mode, tokens, x_ptr, x_len, idx_ptr, idx_len, weights_ptr, weights_len, stream_handle))]
    #[allow(clippy::too_many_arguments)]
    fn moe_dispatch(
        &self,
        py: Python<'_>,
        layer: &PyMoeLayer,
        mode: &str,
        tokens: u32,
        x_ptr: u64,
        x_len: u64,
        idx_ptr: u64,
        idx_len: u64,
        weights_ptr: u64,
        weights_len: u64,
        stream_handle: u64,
    ) -> PyResult<()> {
        let mode = moe_mode(mode)?;
        let s = stream(&self.comm, stream_handle)?;
        // SAFETY: the spans are live tensors' storage (the Python layer passes `data_ptr()` and
        // their byte sizes and keeps the tensors alive until the stream reaches this work, as
        // for `collective`); the runtime checks each lies in one device allocation of this
        // rank's context with the bytes the shape needs.
        unsafe {
            self.comm.moe_dispatch(
                &layer.layer,
                mode,
                tokens,
                span(x_ptr, x_len),
                span(idx_ptr, idx_len),
                span(weights_ptr, weights_len),
                &s,
            )
        }
        .map_err(|e| py_err(py, e))
    }

    /// Enqueues the combine of the layer's last dispatch: `expert_out` (`rows_max x hidden`)
    /// in, `out` (`tokens x hidden`) out, as (address, bytes) pairs. Collective.
    #[pyo3(signature = (layer, mode, expert_out_ptr, expert_out_len, out_ptr, out_len, stream_handle))]
    #[allow(clippy::too_many_arguments)]
    fn moe_combine(
        &self,
        py: Python<'_>,
        layer: &PyMoeLayer,
        mode: &str,
        expert_out_ptr: u64,
        expert_out_len: u64,
        out_ptr: u64,
        out_len: u64,
        stream_handle: u64,
    ) -> PyResult<()> {
        let mode = moe_mode(mode)?;
        let s = stream(&self.comm, stream_handle)?;
        // SAFETY: as in `moe_dispatch`.
        unsafe {
            self.comm.moe_combine(
                &layer.layer,
                mode,
                span(expert_out_ptr, expert_out_len),
                span(out_ptr, out_len),
                &s,
            )
        }
        .map_err(|e| py_err(py, e))
    }

    /// Reads and clears the layer's counters: (skipped invalid indices, dropped rows). Waits
    /// for this rank's GPU.
    fn moe_status(&self, py: Python<'_>, layer: &PyMoeLayer) -> PyResult<(u32, u32)> {
        let comm = &self.comm;
        let st = py
            .allow_threads(|| comm.moe_status(&layer.layer))
            .map_err(|e| py_err(py, e))?;
        Ok((st.invalid, st.dropped))
    }

    /// Collective, not while capturing: an all-to-allv layer for elements of `elem` bytes
    /// (1, 2, 4, 8 or 16) with room for `out_max` received elements.
    fn a2av_layer(
        &self,
        py: Python<'_>,
        elem: u64,
        out_max: u64,
        stream_handle: u64,
    ) -> PyResult<PyA2avLayer> {
        let s = stream(&self.comm, stream_handle)?;
        let comm = &self.comm;
        let (layer, output_ptr) = py
            .allow_threads(|| {
                let layer = comm.a2av_layer(elem, out_max, &s)?;
                let out = comm.ptr(comm.rank(), layer.output())?;
                Ok((layer, out))
            })
            .map_err(|e| py_err(py, e))?;
        Ok(PyA2avLayer {
            comm: Arc::clone(&self.comm),
            layer,
            output_ptr,
            elem,
        })
    }

    /// Enqueues an all-to-allv whose counts stay on the device: `send_counts` and
    /// `recv_counts` hold `world` i64 element counts, `input` the elements packed by
    /// destination; the output is the layer's. Collective.
    #[pyo3(signature = (layer, send_counts_ptr, send_counts_len, input_ptr, input_len, recv_counts_ptr, recv_counts_len, stream_handle))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_allv_device(
        &self,
        py: Python<'_>,
        layer: &PyA2avLayer,
        send_counts_ptr: u64,
        send_counts_len: u64,
        input_ptr: u64,
        input_len: u64,
        recv_counts_ptr: u64,
        recv_counts_len: u64,
        stream_handle: u64,
    ) -> PyResult<()> {
        let s = stream(&self.comm, stream_handle)?;
        // SAFETY: as in `moe_dispatch`.
        unsafe {
            self.comm.all_to_allv_device(
                &layer.layer,
                span(send_counts_ptr, send_counts_len),
                span(input_ptr, input_len),
                span(recv_counts_ptr, recv_counts_len),
                &s,
            )
        }
        .map_err(|e| py_err(py, e))
    }

    /// Reads and clears the all-to-allv layer's count of dropped elements (waits for this
    /// rank's GPU).
    fn a2av_dropped(&self, py: Python<'_>, layer: &PyA2avLayer) -> PyResult<u32> {
        let comm = &self.comm;
        py.allow_threads(|| comm.a2av_dropped(&layer.layer))
            .map_err(|e| py_err(py, e))
    }
}

impl GpuComm {
    /// A put (`wait` false) or a wait of signal `slot` with `peer` in the pad `(offset, len)`.
    fn signal(
        &self,
        py: Python<'_>,
        (pad, pad_len): (u64, u64),
        peer: i64,
        slot: u32,
        stream_handle: u64,
        wait: bool,
    ) -> PyResult<()> {
        let s = stream(&self.comm, stream_handle)?;
        let peer = u16_arg("peer", peer)?;
        if wait {
            self.comm.wait_signal(pad, pad_len, peer, slot, &s)
        } else {
            self.comm.put_signal(pad, pad_len, peer, slot, &s)
        }
        .map_err(|e| py_err(py, e))
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        collective: &str,
        nbytes: u64,
        dtype_name: &str,
        op: &str,
        algorithm_name: Option<&str>,
        channels: Option<i64>,
        root: i64,
    ) -> PyResult<Request> {
        let world = self.comm.world();
        let root = u16_arg("root", root)?;
        let coll = match collective {
            "all_reduce" => Collective::AllReduce,
            "reduce_scatter" => Collective::ReduceScatter,
            "all_gather" => Collective::AllGather,
            "all_to_all" => Collective::AllToAll,
            "broadcast" => Collective::Broadcast { root },
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown collective {other:?}: all_reduce, reduce_scatter, all_gather, \
                     all_to_all or broadcast"
                )))
            }
        };
        let (dt, rop) = (dtype(dtype_name)?, reduce_op(op)?);
        if !nbytes.is_multiple_of(dt.size()) {
            return Err(PyValueError::new_err(format!(
                "{nbytes} bytes is not a whole number of {dtype_name} elements"
            )));
        }
        let given = match algorithm_name {
            Some(a) => Some(algorithm(a)?),
            None => None,
        };
        let ch = match channels {
            Some(c) => Some(u16_arg("channels", c).and_then(|c| {
                if c == 0 {
                    Err(PyValueError::new_err("channels must be at least 1"))
                } else {
                    Ok(c)
                }
            })?),
            None => None,
        };
        let base = Request::new(
            coll,
            symm_core::sched::Algorithm::Ring,
            world,
            nbytes,
            dt,
            rop,
        );
        let tuned = {
            let mut cache = self.tuned.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() > 4096 {
                cache.clear();
            }
            *cache.entry(base).or_insert_with(|| self.comm.tuned(base))
        };
        let req = Request {
            algorithm: given.unwrap_or(tuned.algorithm),
            channels: ch.unwrap_or(if given.is_some() {
                symm_core::cost::default_channels(nbytes)
            } else {
                tuned.channels
            }),
            ..tuned
        };
        req.validate().map_err(|e| {
            PyValueError::new_err(format!("{} does not schedule: {e}", req.collective.name()))
        })?;
        Ok(req)
    }
}
