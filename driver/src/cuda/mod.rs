//! The CUDA backend: a VMM symmetric heap over NVLink, rendezvous, and the plan interpreter.
//!
//! CUDA is reached at run time (libcuda, libnvrtc and libnccl are loaded when first used, through
//! cudarc's loader), so building this module needs no CUDA toolkit.
//!
//! * [`auto`]: automatic requests (`Request::auto`) of a job, cached per shape.
//! * [`ffi`]: every foreign call, one table per library, results kept as integers.
//! * [`error`]: [`CudaError`], the codes matched into named cases.
//! * [`ctx`]: retains of a device's primary context (every object holds its own) and the
//!   calling thread's binding.
//! * [`device`]: devices and their primary contexts, streams, events, device and host-mapped memory.
//! * [`vmm`]: the symmetric heap: one physical allocation per rank, exported as a POSIX file
//!   descriptor, every peer mapped at `base + r * stride` of one reserved range, torn down in order.
//! * [`rendezvous`]: the [`rendezvous::Bootstrap`] trait and its one-process, one-thread-per-GPU
//!   implementation.
//! * [`compile`]: NVRTC to a cubin for the device's architecture, cached on disk.
//! * [`options`]: [`CommOptions`], the environment that configures a Comm, and joining a job.
//! * [`placement`]: which GPU a rank opens (`LOCAL_RANK`, or `SYMM_DEVICES`).
//! * [`plan`]: encoded plans from schedules (or user ops), checked before upload.
//! * [`copy_engine`]: plans in flag form as stream copies, writes and waits (no SM).
//! * [`launch`]: modules, the interpreter's parameter block, launches and CUDA graphs.
//! * [`trace`]: GPU trace readback into symm-core's trace format.
//! * [`multicast`]: NVLink multicast: the guard that refuses it unless explicitly allowed, and
//!   (feature `multicast`) the budget and the binding, the one place of its driver calls.
//!
//! The test harness (the one-process `World`, NCCL beside symm, the device-API examples) is the
//! crate symm-harness, built on this module's public items; nothing here names it.

pub mod auto;
pub mod bounds;
pub mod comm;
pub mod compile;
pub mod compiled;
pub mod copy_engine;
pub mod ctx;
pub mod device;
pub mod device_plan;
pub mod error;
pub mod ffi;
mod hostmap;
pub mod launch;
pub mod multicast;
pub mod options;
pub mod placement;
pub mod plan;
pub mod records;
pub mod rendezvous;
mod stream;
pub mod trace;
pub mod vmm;

pub use auto::AutoRequests;
pub use bounds::{Buffers, MAX_HEAP_BYTES, MAX_WAIT};
pub use comm::{
    norm_rows, A2avLayer, Admitted, AllocSizes, Capture, Comm, CommGraph, CommOptions, CommTeam,
    Executor, FusedNorm, LaunchFloor, Memory, MoeLayer, MoeStatus, NormArgs, Signals, Span,
    Tensors, TokenType, Tracer, MAX_GPU_EXPERTS, NORM_MAX_BLOCKS,
};
pub use copy_engine::CopyEngine;
pub use device::{Stream, StreamRef};
pub use device_plan::DevicePlan;
pub use error::{CudaError, ErrorKind, HeapCall, Result};
pub use symm_kernels::abi::SymmWorld;
