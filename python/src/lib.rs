//! `symm._symm`: the host side of symm for Python.
//!
//! Every function validates its arguments before anything runs: a bad name, size, rank or
//! buffer is a `ValueError` (a `symm.TraceError` for trace bytes) that says what is accepted,
//! never a panic. Buffers cross the boundary as `bytes`; trace events cross as packed
//! little-endian columns, which the pure-Python package turns into numpy arrays or lists.
#![deny(unsafe_code)]

// The GPU runtime's binding: the one module with unsafe code (stream handles and addresses).
#[allow(unsafe_code)]
mod gpu;
mod norm;
mod parse;
mod request;

use parse::{algorithm, collective, dtype, reduce_op, topology};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use symm_core::cost::{self, Choice};
use symm_core::op::OpKind;
use symm_core::sched::{Collective, Request};
use symm_core::trace::{EventKind, Reader, TraceError};
use symm_driver::host::{self, SimOptions};

/// Most bytes of input plus output, over all ranks, that one simulated run may hold.
const MAX_SIM_BYTES: u64 = 1 << 30;

/// The request's parameters as Python passes them.
struct Args<'a> {
    collective: &'a str,
    algorithm: &'a str,
    world: i64,
    nbytes: i64,
    dtype: &'a str,
    op: &'a str,
    channels: Option<i64>,
    root: i64,
    src: i64,
    dst: Option<i64>,
}

impl Args<'_> {
    /// The validated request.
    fn request(&self) -> PyResult<Request> {
        let world = u16::try_from(self.world)
            .ok()
            .filter(|&w| (1..=symm_core::sched::MAX_WORLD).contains(&w))
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "world {} is not between 1 and {}",
                    self.world,
                    symm_core::sched::MAX_WORLD
                ))
            })?;
        let bytes = u64::try_from(self.nbytes)
            .map_err(|_| PyValueError::new_err(format!("nbytes {} is negative", self.nbytes)))?;
        let channels = match self.channels {
            None => 1,
            Some(c) => u16::try_from(c)
                .ok()
                .filter(|&c| (1..=symm_core::sched::MAX_CHANNELS).contains(&c))
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "channels {c} is not between 1 and {}",
                        symm_core::sched::MAX_CHANNELS
                    ))
                })?,
        };
        let c = collective(self.collective, world, self.root, self.src, self.dst)?;
        let req = Request::new(
            c,
            algorithm(self.algorithm)?,
            world,
            bytes,
            dtype(self.dtype)?,
            reduce_op(self.op)?,
        )
        .with_channels(channels);
        req.validate()
            .map_err(|e| PyValueError::new_err(format!("invalid request: {e}")))?;
        Ok(req)
    }

    /// The validated request, with buffers small enough to hold in memory.
    fn data_request(&self) -> PyResult<Request> {
        let req = self.request()?;
        if req.collective == Collective::AllToAllV {
            return Err(PyValueError::new_err(
                "all_to_allv needs per-pair counts, which simulate and reference do not take: \
                 use symm.moe.all_to_allv on the GPU (symm.cost and symm.Request take it)",
            ));
        }
        let sz = req.buffer_sizes();
        let total = (sz.input + sz.output).saturating_mul(u64::from(req.world));
        if total > MAX_SIM_BYTES {
            return Err(PyValueError::new_err(format!(
                "the run would hold {total} bytes of buffers; at most {MAX_SIM_BYTES} are allowed"
            )));
        }
        // The whole run's memory (scratch and pads too) within the host backend's bound.
        host::check_footprint(&req, true).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(req)
    }
}

/// Runs `work` on a thread of its own with the GIL released, and answers Python's signals while
/// it runs: Ctrl-C raises `KeyboardInterrupt` at once (the work finishes in the background, its
/// memory bounded as every host run's is, and its result is dropped).
fn interruptible<T: Send + 'static>(
    py: Python<'_>,
    work: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    let (tx, rx) = channel();
    std::thread::Builder::new()
        .name("symm-simulate".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| PyRuntimeError::new_err(format!("no thread for the run: {e}")))?;
    let mut rx = rx;
    loop {
        let (back, got) = py.allow_threads(move || {
            let got = rx.recv_timeout(std::time::Duration::from_millis(50));
            (rx, got)
        });
        rx = back;
        match got {
            Ok(v) => return Ok(v),
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "the run's thread ended without a result",
                ))
            }
        }
    }
}

fn bytes_list<'py>(py: Python<'py>, bufs: &[Vec<u8>]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, bufs.iter().map(|b| PyBytes::new(py, b)))
}

/// Every name the functions take: collectives, algorithms, dtypes, ops and topologies.
#[pyfunction]
fn names(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (kind, list) in parse::all() {
        d.set_item(kind, list)?;
    }
    Ok(d)
}

/// Element size in bytes of a dtype.
#[pyfunction]
fn dtype_size(name: &str) -> PyResult<u64> {
    Ok(dtype(name)?.size())
}

/// Buffer sizes per rank of a request: (input, output, scratch).
#[pyfunction]
#[pyo3(signature = (collective, algorithm, world, nbytes, dtype="f32", op="sum", channels=None, root=0, src=0, dst=None))]
#[allow(clippy::too_many_arguments)]
fn buffer_sizes(
    collective: &str,
    algorithm: &str,
    world: i64,
    nbytes: i64,
    dtype: &str,
    op: &str,
    channels: Option<i64>,
    root: i64,
    src: i64,
    dst: Option<i64>,
) -> PyResult<(u64, u64, u64)> {
    let args = Args {
        collective,
        algorithm,
        world,
        nbytes,
        dtype,
        op,
        channels,
        root,
        src,
        dst,
    };
    let sz = args.request()?.buffer_sizes();
    Ok((sz.input, sz.output, sz.scratch))
}

/// Runs a request in the deterministic simulator on random inputs from `seed`, and computes the
/// reference outputs for the same inputs. Returns a dict: `inputs`, `outputs`, `reference`
/// (lists of `bytes`, one per rank), `trace` (`bytes`), `time_us`, `ops` and `matches`
/// (outputs equal the reference within the dtype's tolerance).
#[pyfunction]
#[pyo3(signature = (collective, algorithm, world, nbytes, dtype="f32", op="sum", channels=None, seed=0, root=0, src=0, dst=None))]
#[allow(clippy::too_many_arguments)]
fn simulate<'py>(
    py: Python<'py>,
    collective: &str,
    algorithm: &str,
    world: i64,
    nbytes: i64,
    dtype: &str,
    op: &str,
    channels: Option<i64>,
    seed: u64,
    root: i64,
    src: i64,
    dst: Option<i64>,
) -> PyResult<Bound<'py, PyDict>> {
    let req = Args {
        collective,
        algorithm,
        world,
        nbytes,
        dtype,
        op,
        channels,
        root,
        src,
        dst,
    }
    .data_request()?;
    let inputs = host::random_inputs(&req, seed);
    let run = interruptible(py, {
        let inputs = inputs.clone();
        move || host::simulate(&req, &inputs, &SimOptions::default())
    })?
    .map_err(|e| PyValueError::new_err(format!("the simulator failed: {e}")))?;
    let want = host::reference(&req, &inputs);
    let matches = host::compare(&req, &run.outputs, &want).is_ok();
    let d = PyDict::new(py);
    d.set_item("inputs", bytes_list(py, &inputs)?)?;
    d.set_item("outputs", bytes_list(py, &run.outputs)?)?;
    d.set_item("reference", bytes_list(py, &want)?)?;
    d.set_item("trace", PyBytes::new(py, &run.trace))?;
    d.set_item("time_us", run.time_us)?;
    d.set_item("ops", run.ops)?;
    d.set_item("matches", matches)?;
    Ok(d)
}

/// The outputs a request defines for `inputs` (one `bytes` of the request's input size per
/// rank); outputs a collective leaves undefined hold the poison byte 0xA5. With `rank_order`,
/// every reduction is the rank-order sum of deterministic mode (`reference_in_rank_order`):
/// the bits a deterministic call gives.
#[pyfunction]
#[pyo3(signature = (collective, algorithm, world, nbytes, inputs, dtype="f32", op="sum", channels=None, root=0, src=0, dst=None, rank_order=false))]
#[allow(clippy::too_many_arguments)]
fn reference<'py>(
    py: Python<'py>,
    collective: &str,
    algorithm: &str,
    world: i64,
    nbytes: i64,
    inputs: Vec<Vec<u8>>,
    dtype: &str,
    op: &str,
    channels: Option<i64>,
    root: i64,
    src: i64,
    dst: Option<i64>,
    rank_order: bool,
) -> PyResult<Bound<'py, PyList>> {
    let req = Args {
        collective,
        algorithm,
        world,
        nbytes,
        dtype,
        op,
        channels,
        root,
        src,
        dst,
    }
    .data_request()?;
    host::check_inputs(&req, &inputs)
        .map_err(|e| PyValueError::new_err(format!("bad inputs: {e}")))?;
    if rank_order {
        bytes_list(py, &host::reference_in_rank_order(&req, &inputs))
    } else {
        bytes_list(py, &host::reference(&req, &inputs))
    }
}

/// Predicted time of a request in microseconds on a topology's link model.
#[pyfunction]
#[pyo3(signature = (collective, algorithm, world, nbytes, dtype="f32", op="sum", channels=None, topology="nvlink", root=0, src=0, dst=None))]
#[allow(clippy::too_many_arguments)]
fn predict(
    collective: &str,
    algorithm: &str,
    world: i64,
    nbytes: i64,
    dtype: &str,
    op: &str,
    channels: Option<i64>,
    topology: &str,
    root: i64,
    src: i64,
    dst: Option<i64>,
) -> PyResult<f64> {
    let req = Args {
        collective,
        algorithm,
        world,
        nbytes,
        dtype,
        op,
        channels,
        root,
        src,
        dst,
    }
    .request()?;
    Ok(cost::predict(&req, &self::topology(topology)?.link()))
}

/// A request for `collective` with a placeholder algorithm the collective implements, for the
/// functions that choose the algorithm themselves.
fn any_algorithm(collective: &str, world: i64) -> PyResult<&'static str> {
    let w = u16::try_from(world).unwrap_or(1).max(1);
    let c = self::collective(collective, w, 0, 0, None)?;
    Ok(symm_core::sched::algorithms(c)
        .first()
        .map(|a| a.name())
        .unwrap_or("direct"))
}

/// The algorithm with the lowest predicted time (multicast only when `multicast`).
#[pyfunction]
#[pyo3(signature = (collective, world, nbytes, dtype="f32", op="sum", channels=None, topology="nvlink", multicast=false, root=0, src=0, dst=None))]
#[allow(clippy::too_many_arguments)]
fn select(
    collective: &str,
    world: i64,
    nbytes: i64,
    dtype: &str,
    op: &str,
    channels: Option<i64>,
    topology: &str,
    multicast: bool,
    root: i64,
    src: i64,
    dst: Option<i64>,
) -> PyResult<&'static str> {
    let req = Args {
        collective,
        algorithm: any_algorithm(collective, world)?,
        world,
        nbytes,
        dtype,
        op,
        channels,
        root,
        src,
        dst,
    }
    .request()?;
    let link = self::topology(topology)?.link();
    Ok(cost::select(&req, &link, multicast).name())
}

/// symm's default choice on a topology: (algorithm, channels, where it came from:
/// "calibrated" or "model").
#[pyfunction]
#[pyo3(signature = (collective, world, nbytes, dtype="f32", op="sum", topology="nvlink", root=0, src=0, dst=None))]
#[allow(clippy::too_many_arguments)]
fn tune(
    collective: &str,
    world: i64,
    nbytes: i64,
    dtype: &str,
    op: &str,
    topology: &str,
    root: i64,
    src: i64,
    dst: Option<i64>,
) -> PyResult<(&'static str, u16, &'static str)> {
    let req = Args {
        collective,
        algorithm: any_algorithm(collective, world)?,
        world,
        nbytes,
        dtype,
        op,
        channels: None,
        root,
        src,
        dst,
    }
    .request()?;
    let (r, choice) = cost::tune_on(req, self::topology(topology)?);
    let choice = match choice {
        Choice::Calibrated => "calibrated",
        Choice::Model => "model",
    };
    Ok((r.algorithm.name(), r.channels, choice))
}

/// The byte offset a trace error names, if any.
fn trace_offset(e: &TraceError) -> Option<usize> {
    match *e {
        TraceError::BadMagic => Some(0),
        TraceError::Truncated { offset }
        | TraceError::MissingEnd { offset }
        | TraceError::Corrupt { offset }
        | TraceError::UnknownOp { offset, .. }
        | TraceError::InvalidHeader { offset, .. }
        | TraceError::OutOfRange { offset, .. }
        | TraceError::BadCount { offset, .. }
        | TraceError::BadChecksum { offset }
        | TraceError::TrailingBytes { offset } => Some(offset),
        _ => None,
    }
}

/// `symm.errors.TraceError(message, offset)`.
fn trace_error(py: Python<'_>, e: &TraceError) -> PyErr {
    let offset = trace_offset(e);
    let build = || -> PyResult<PyErr> {
        let cls = py.import("symm.errors")?.getattr("TraceError")?;
        let obj = cls.call1((e.to_string(), offset))?;
        Ok(PyErr::from_value(obj))
    };
    build().unwrap_or_else(|err| err)
}

/// Decodes a trace. Returns a dict: `version`, `layout`, `header` (a dict), `count`, the event
/// columns as packed little-endian `bytes` (`time` u64, `rank` u16, `channel` u16, `op_index`
/// u32, `kind` u8: 0 begin, 1 end, 2 stall; `op` u8: the op's trace tag), `op_names` (tag to name)
/// and `warning` (a message when the trace was cut short, else None). Anything else wrong is a
/// `symm.TraceError` naming the byte offset.
#[pyfunction]
fn decode_trace<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyDict>> {
    let reader = Reader::new(data).map_err(|e| trace_error(py, &e))?;
    let h = reader.header().clone();
    let (version, layout) = (reader.version(), reader.layout().name());
    let (mut time, mut rank, mut channel) = (Vec::new(), Vec::new(), Vec::new());
    let (mut index, mut kind, mut op) = (Vec::new(), Vec::new(), Vec::new());
    let mut warning = None;
    let mut count = 0u64;
    for e in reader {
        match e {
            Ok(e) => {
                time.extend_from_slice(&e.time.to_le_bytes());
                rank.extend_from_slice(&e.rank.to_le_bytes());
                channel.extend_from_slice(&e.channel.to_le_bytes());
                index.extend_from_slice(&e.index.to_le_bytes());
                kind.push(match e.kind {
                    EventKind::Begin => 0u8,
                    EventKind::End => 1,
                    EventKind::Stall { .. } => 2,
                });
                op.push(e.op.trace_tag());
                count += 1;
            }
            Err(e) if e.is_truncation() => warning = Some(e.to_string()),
            Err(e) => return Err(trace_error(py, &e)),
        }
    }
    let header = PyDict::new(py);
    let r = &h.request;
    header.set_item("collective", r.collective.name())?;
    header.set_item("algorithm", r.algorithm.name())?;
    header.set_item("world", h.world)?;
    header.set_item("channels", h.channels)?;
    header.set_item("bytes", r.bytes)?;
    header.set_item("dtype", r.dtype.name())?;
    header.set_item("op", r.op.name())?;
    header.set_item("time_unit_ns", h.time_unit_ns)?;
    let source = match &h.source {
        symm_core::trace::Source::Host { simulated: true } => "simulator".to_string(),
        symm_core::trace::Source::Host { simulated: false } => "host".to_string(),
        symm_core::trace::Source::Gpu { devices } => {
            let names: Vec<&str> = devices.iter().map(|d| d.as_str()).collect();
            format!("gpu: {}", names.join(", "))
        }
    };
    header.set_item("source", source)?;
    let d = PyDict::new(py);
    d.set_item("version", version)?;
    d.set_item("layout", layout)?;
    d.set_item("header", header)?;
    d.set_item("count", count)?;
    d.set_item("time", PyBytes::new(py, &time))?;
    d.set_item("rank", PyBytes::new(py, &rank))?;
    d.set_item("channel", PyBytes::new(py, &channel))?;
    d.set_item("op_index", PyBytes::new(py, &index))?;
    d.set_item("kind", PyBytes::new(py, &kind))?;
    d.set_item("op", PyBytes::new(py, &op))?;
    let op_names = PyDict::new(py);
    for t in 0..=u8::MAX {
        if let Some(name) = OpKind::trace_tag_name(t) {
            op_names.set_item(t, name)?;
        }
    }
    d.set_item("op_names", op_names)?;
    d.set_item("warning", warning)?;
    Ok(d)
}

/// The extension module.
/// Names the folder of the kernels this package ships (the first call wins: the package's
/// own `symm/kernels`); returns whether `path` is the folder in use.
#[pyfunction]
fn set_bundled_kernels(path: std::path::PathBuf) -> bool {
    symm_driver::kernel_cache::bundled::set_dir(path)
}

#[pymodule]
fn _symm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(names, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_size, m)?)?;
    m.add_function(wrap_pyfunction!(buffer_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(reference, m)?)?;
    m.add_function(wrap_pyfunction!(predict, m)?)?;
    m.add_function(wrap_pyfunction!(select, m)?)?;
    m.add_function(wrap_pyfunction!(tune, m)?)?;
    m.add_function(wrap_pyfunction!(decode_trace, m)?)?;
    m.add_function(wrap_pyfunction!(set_bundled_kernels, m)?)?;
    m.add("MAX_SIM_BYTES", MAX_SIM_BYTES)?;
    m.add("NORM_MAX_ROWS", symm_core::norm::MAX_ROWS)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<request::PyRequest>()?;
    m.add_class::<gpu::GpuComm>()?;
    m.add_class::<gpu::Block>()?;
    m.add_class::<gpu::AllReduces>()?;
    m.add_function(wrap_pyfunction!(gpu::sums::all_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::sums::all_reduce_paths, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::sums::all_reduce_job, m)?)?;
    m.add_class::<gpu::PyMoeLayer>()?;
    m.add_class::<gpu::PyA2avLayer>()?;
    m.add_function(wrap_pyfunction!(gpu::pool::pool_serve, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::pool::pool_stop, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::pool::pool_refusal, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::pool::pool_unlatch, m)?)?;
    m.add_function(wrap_pyfunction!(gpu::norm::fused_norm, m)?)?;
    m.add_function(wrap_pyfunction!(norm::norm_reference, m)?)?;
    m.add_class::<gpu::norm::PyFusedNorm>()?;
    Ok(())
}
