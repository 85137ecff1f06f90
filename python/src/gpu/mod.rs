//! `symm._symm.GpuComm`: one rank of a GPU job, for the `symm.torch` layer.
//!
//! The Python layer owns the torch side (tensors, streams, dtypes); this class owns the
//! runtime: the job's bootstrap, the symmetric heap, the plans and the collectives. Tensors
//! cross as (address, bytes) pairs and streams as `CUstream` handles taken from torch, which
//! is why these methods are private to the package: an address that is not a live tensor of
//! the rank's GPU is refused (it must lie in the heap or in one device allocation of the
//! rank's context), but a stream handle is trusted as torch gives it.
//!
//! A collective takes a `symm.Request` ([`GpuComm::request`]: names parsed once, the
//! algorithm and channels the runtime's automatic choice unless forced) and its buffers.
//! Errors become exceptions by their kind ([`errors`]). Every call that may wait (joining,
//! allocating, the first use of a collective's arguments, synchronising) releases the GIL
//! while it waits.
//!
//! * [`runtime`]: what the class holds: the Comm and its features, torn down in order.
//! * [`block`]: heap blocks that tensors' storage lives in.
//! * [`join`]: joining the job the way every entry point does.
//! * [`moe`], [`norm`], [`pool`]: MoE layers, the fused all-reduce + RMSNorm, `mem_pool`.

mod args;
mod block;
mod errors;
mod join;
mod moe;
pub(crate) mod norm;
pub(crate) mod pool;
mod runtime;
pub(crate) mod sums;

pub use block::Block;
pub(crate) use errors::py_err;
pub use moe::{PyA2avLayer, PyMoeLayer};
pub use sums::AllReduces;

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use symm_driver::cuda::{compiled::PlanPath, AutoRequests};

use args::{span, stream, u16_arg};
use runtime::Runtime;

use crate::parse::{collective, dtype, reduce_op};
use crate::request::{forced, refused, PyRequest};

/// One rank of a GPU job (see the module doc).
#[pyclass(module = "symm._symm", frozen)]
pub struct GpuComm {
    /// The Comm and its features; tensors and layers hold it too.
    rt: Arc<Runtime>,
    /// symm's automatic request per shape, for this job.
    auto: AutoRequests,
    /// The kernel that runs plans, as the Comm was opened with.
    plans: PlanPath,
}

#[pymethods]
impl GpuComm {
    /// Joins job `job` (secret `token`, hex) as `rank` of `world` on the GPU local rank
    /// `local_rank` is placed on, the way every entry point joins
    /// (`CommOptions::join`): the environment's settings (`SYMM_PLANS`, `SYMM_COPY_ENGINE`,
    /// `SYMM_NVRTC`, `SYMM_DEVICES`) hold, `plans` (when given) over `SYMM_PLANS`; `device`
    /// (when given) is the GPU, whatever the placement. Collective: every rank calls it.
    #[staticmethod]
    #[pyo3(signature = (rank, world, local_rank, job, token, heap_bytes, timeout_ms, bootstrap_timeout_ms, plans=None, deterministic=None, device=None))]
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
        plans: Option<&str>,
        deterministic: Option<bool>,
        device: Option<i32>,
    ) -> PyResult<GpuComm> {
        join::open(
            py,
            (rank, world, local_rank),
            (job, token),
            heap_bytes,
            (timeout_ms, bootstrap_timeout_ms),
            (plans, deterministic),
            device,
        )
    }

    /// Whether the job runs in deterministic mode (`SYMM_DETERMINISTIC`, or
    /// `symm.init(deterministic=...)`).
    #[getter]
    fn deterministic(&self) -> bool {
        self.auto.deterministic()
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u16 {
        self.rt.comm.rank()
    }

    /// Ranks in the job.
    #[getter]
    fn world(&self) -> u16 {
        self.rt.comm.world()
    }

    /// The CUDA ordinal of this rank's GPU.
    #[getter]
    fn device(&self) -> i32 {
        self.rt.comm.device().ordinal()
    }

    /// "shared_device" when ranks share this rank's GPU, else "nvlink".
    #[getter]
    fn topology(&self) -> &'static str {
        self.rt.comm.sharing().topology().name()
    }

    /// The kernel that runs plans: "auto", "interpreted" or "compiled".
    #[getter]
    fn plans(&self) -> &'static str {
        self.plans.name()
    }

    /// Collective: a block of `nbytes` bytes of the symmetric heap, released when the returned
    /// object is dropped (by torch, when the last tensor over it dies).
    fn alloc(&self, py: Python<'_>, nbytes: u64, stream_handle: u64) -> PyResult<Block> {
        let rt = &*self.rt;
        let s = stream(&rt.comm, stream_handle);
        let (offset, ptr) = py
            .allow_threads(|| {
                let off = rt.tensors.alloc_block(&rt.comm, nbytes, &s)?;
                match rt.comm.memory().ptr(rt.comm.rank(), off) {
                    Ok(p) => Ok((off, p)),
                    Err(e) => {
                        rt.release(off);
                        Err(e)
                    }
                }
            })
            .map_err(|e| py_err(py, e))?;
        Ok(Block {
            rt: self.rt.clone(),
            offset,
            ptr,
            nbytes,
        })
    }

    /// Compiles and loads the stream signals kernel (before a capture uses it).
    fn load_signals(&self, py: Python<'_>) -> PyResult<()> {
        let rt = &*self.rt;
        py.allow_threads(|| rt.load_signals().map(drop))
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
        let rt = &*self.rt;
        let s = stream(&rt.comm, stream_handle);
        let peer = u16_arg("peer", peer)?;
        rt.signals(&s)
            .and_then(|k| k.put(&rt.comm, (pad, pad_len), peer, slot, &s))
            .map_err(|e| py_err(py, e))
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
        let rt = &*self.rt;
        let s = stream(&rt.comm, stream_handle);
        let peer = u16_arg("peer", peer)?;
        rt.signals(&s)
            .and_then(|k| k.wait(&rt.comm, (pad, pad_len), peer, slot, &s))
            .map_err(|e| py_err(py, e))
    }

    /// Heap bytes per rank (the distance between two ranks' copies) and the buffer area.
    fn layout(&self) -> (u64, u64, u64) {
        let (lo, hi) = self.rt.comm.buffer_area();
        (hi, lo, hi)
    }

    /// Local: gives block `offset` back (freed at a later allocation once every rank did).
    fn release(&self, py: Python<'_>, offset: u64) -> PyResult<()> {
        self.rt
            .tensors
            .release_block(offset)
            .map_err(|e| py_err(py, e))
    }

    /// Collective: frees what every rank released; returns how many blocks.
    fn collect(&self, py: Python<'_>) -> PyResult<usize> {
        let rt = &*self.rt;
        py.allow_threads(|| rt.tensors.collect_blocks(&rt.comm))
            .map_err(|e| py_err(py, e))
    }

    /// Live blocks and their bytes.
    fn usage(&self, py: Python<'_>) -> PyResult<(usize, u64)> {
        self.rt.tensors.block_usage().map_err(|e| py_err(py, e))
    }

    /// The address of heap offset `offset` of `peer`, in this rank's mapping.
    fn ptr(&self, py: Python<'_>, peer: i64, offset: u64) -> PyResult<u64> {
        self.rt
            .comm
            .memory()
            .ptr(u16_arg("peer", peer)?, offset)
            .map_err(|e| py_err(py, e))
    }

    /// The request this job runs for `collective` over `nbytes` of `dtype` with `op` (and
    /// `root`): the runtime's choice (`AutoRequests::get`, cached per shape) with the
    /// `algorithm` and `channels` the caller forces, in deterministic mode when the job or
    /// `deterministic` asks for it.
    #[pyo3(signature = (collective, nbytes, dtype, op="sum", algorithm=None, channels=None, root=0, deterministic=false))]
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        collective: &str,
        nbytes: u64,
        dtype: &str,
        op: &str,
        algorithm: Option<&str>,
        channels: Option<i64>,
        root: i64,
        deterministic: bool,
    ) -> PyResult<PyRequest> {
        let world = self.rt.comm.world();
        let c = self::collective(collective, world, root, 0, None)?;
        let forced = forced(algorithm, channels, deterministic)?;
        let req = self
            .auto
            .get(c, nbytes, self::dtype(dtype)?, reduce_op(op)?, forced)
            .map_err(|e| refused(c, e))?;
        Ok(PyRequest { req })
    }

    /// Enqueues `request` reading `in_len` bytes at `in_ptr` and writing `out_len` bytes at
    /// `out_ptr` on stream `stream_handle`.
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        py: Python<'_>,
        request: &PyRequest,
        in_ptr: u64,
        in_len: u64,
        out_ptr: u64,
        out_len: u64,
        stream_handle: u64,
    ) -> PyResult<()> {
        let (req, rt) = (&request.req, &*self.rt);
        let s = stream(&rt.comm, stream_handle);
        let (input, output) = (span(in_ptr, in_len), span(out_ptr, out_len));
        // Both enqueues below: the spans are live tensors' storage (the Python layer passes
        // `data_ptr()` and byte sizes, and keeps the tensors alive until the stream reaches this
        // work); a span outside the heap is checked against the driver's allocation table. A
        // repeated call keeps the GIL (releasing it costs more than the enqueue itself).
        // SAFETY: the spans are live tensors' storage, as said above.
        let done = unsafe { rt.tensors.try_enqueue(&rt.comm, req, input, output, &s) }
            .map_err(|e| py_err(py, e))?;
        if !done {
            // SAFETY: the spans are live tensors' storage, as said above.
            py.allow_threads(|| unsafe { rt.tensors.enqueue(&rt.comm, req, input, output, &s) })
                .map_err(|e| py_err(py, e))?;
        }
        Ok(())
    }

    /// The job's remembered in-place sums (`AllReduces`) over `tensor`s on `current_stream()`.
    fn all_reduces(&self, tensor: Py<PyAny>, current_stream: Py<PyAny>) -> AllReduces {
        AllReduces {
            rt: self.rt.clone(),
            tensor,
            current_stream,
            by_shape: Default::default(),
        }
    }

    /// Reports asynchronous errors without waiting (raises symm's errors).
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.rt.comm.check().map_err(|e| py_err(py, e))
    }

    /// Waits for stream `stream_handle`, then checks.
    fn synchronize(&self, py: Python<'_>, stream_handle: u64) -> PyResult<()> {
        let comm = &self.rt.comm;
        let s = stream(comm, stream_handle);
        py.allow_threads(|| comm.synchronize(&s))
            .map_err(|e| py_err(py, e))
    }

    /// Collective: brings the job back after a failure (`Tensors::reset`).
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        let rt = &*self.rt;
        py.allow_threads(|| rt.tensors.reset(&rt.comm))
            .map_err(|e| py_err(py, e))
    }

    /// Ends this rank's part in the job in order (the memory stays mapped while tensors live).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.rt.comm;
        py.allow_threads(|| comm.close()).map_err(|e| py_err(py, e))
    }

    /// Collective: every rank's `data` (at most 64 KiB) in rank order, through the bootstrap.
    fn exchange<'py>(&self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let comm = &self.rt.comm;
        let all = py
            .allow_threads(|| comm.exchange(data))
            .map_err(|e| py_err(py, e))?;
        PyList::new(py, all.iter().map(|b| PyBytes::new(py, b)))
    }

    /// Times `iters` enqueues of `request` from Rust (what the Python layer's cost is measured
    /// against): mean microseconds per call on the host, the stream not waited for between
    /// calls. Collective.
    #[allow(clippy::too_many_arguments)]
    fn host_loop_us(
        &self,
        py: Python<'_>,
        request: &PyRequest,
        in_ptr: u64,
        in_len: u64,
        out_ptr: u64,
        out_len: u64,
        stream_handle: u64,
        iters: u32,
    ) -> PyResult<f64> {
        let rt = &*self.rt;
        let s = stream(&rt.comm, stream_handle);
        let spans = (span(in_ptr, in_len), span(out_ptr, out_len));
        // SAFETY: as in `collective`.
        unsafe { rt.host_loop_us(&request.req, spans, &s, iters) }.map_err(|e| py_err(py, e))
    }

    /// Times `calls` bare launches of an empty kernel with `request`'s grid and block and a
    /// parameter block of the interpreter's size on stream `stream_handle` from Rust: host
    /// microseconds per launch, the floor under every cached call (`LaunchFloor`). The first
    /// call compiles the kernel (or finds it in the kernel cache). Local.
    fn launch_floor_us(
        &self,
        py: Python<'_>,
        request: &PyRequest,
        stream_handle: u64,
        calls: u32,
    ) -> PyResult<f64> {
        let rt = &*self.rt;
        let s = stream(&rt.comm, stream_handle);
        rt.launch_floor_us(&request.req, &s, calls)
            .map_err(|e| py_err(py, e))
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
        let s = stream(&self.rt.comm, stream_handle);
        let (rt, dt) = (&self.rt, dtype);
        moe::layer(py, rt, experts, topk, tokens_max, hidden, dt, &s, rows_max)
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
        let mode = moe::mode(mode)?;
        let rt = &*self.rt;
        let s = stream(&rt.comm, stream_handle);
        let (x, idx) = (span(x_ptr, x_len), span(idx_ptr, idx_len));
        let w = span(weights_ptr, weights_len);
        // SAFETY: the spans are live tensors' storage (the Python layer passes `data_ptr()` and
        // their byte sizes and keeps the tensors alive until the stream reaches this work, as
        // for `collective`); the runtime checks each lies in one device allocation of this
        // rank's context with the bytes the shape needs.
        unsafe { (layer.layer).dispatch(&rt.comm, &rt.tensors, mode, tokens, x, idx, w, &s) }
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
        let mode = moe::mode(mode)?;
        let rt = &*self.rt;
        let s = stream(&rt.comm, stream_handle);
        let (input, out) = (span(expert_out_ptr, expert_out_len), span(out_ptr, out_len));
        // SAFETY: as in `moe_dispatch`.
        unsafe { (layer.layer).combine(&rt.comm, &rt.tensors, mode, input, out, &s) }
            .map_err(|e| py_err(py, e))
    }

    /// Reads and clears the layer's counters: (skipped invalid indices, dropped rows). Waits
    /// for this rank's GPU.
    fn moe_status(&self, py: Python<'_>, layer: &PyMoeLayer) -> PyResult<(u32, u32)> {
        let comm = &self.rt.comm;
        let st = py
            .allow_threads(|| layer.layer.status(comm))
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
        let s = stream(&self.rt.comm, stream_handle);
        moe::a2av_layer(py, &self.rt, elem, out_max, &s)
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
        let rt = &*self.rt;
        let s = stream(&rt.comm, stream_handle);
        let send = span(send_counts_ptr, send_counts_len);
        let recv = span(recv_counts_ptr, recv_counts_len);
        let input = span(input_ptr, input_len);
        // SAFETY: as in `moe_dispatch`.
        unsafe { (layer.layer).enqueue(&rt.comm, &rt.tensors, send, input, recv, &s) }
            .map_err(|e| py_err(py, e))
    }

    /// Reads and clears the all-to-allv layer's count of dropped elements (waits for this
    /// rank's GPU).
    fn a2av_dropped(&self, py: Python<'_>, layer: &PyA2avLayer) -> PyResult<u32> {
        let comm = &self.rt.comm;
        py.allow_threads(|| layer.layer.dropped(comm))
            .map_err(|e| py_err(py, e))
    }
}
