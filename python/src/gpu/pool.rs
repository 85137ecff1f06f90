//! The allocator behind `symm.mem_pool()`: torch's caching allocator takes its segments from
//! the symmetric heap.
//!
//! `torch.cuda.MemPool` accepts an allocator made of two C functions from a shared library
//! (`CUDAPluggableAllocator`): this module exports them from the extension itself. torch calls
//! [`symm_pool_alloc`] for a new segment of a pool (its caching allocator splits segments into
//! tensors, and keeps freed ones cached) and [`symm_pool_free`] when it gives a segment back.
//!
//! * **A segment is a heap block.** [`symm_pool_alloc`] is [`Tensors::alloc_block`]: collective,
//!   so every rank's caching allocator must ask for the same segments in the same order, which
//!   it does while the ranks run the same code on one stream. When the ranks' heaps differ
//!   after an allocation, every rank refuses it (`Diverged`) and takes its allocation back.
//!   During a graph capture it allocates without waiting for the device.
//! * **Giving back is local**, as for a tensor's block: [`symm_pool_free`] releases the block,
//!   which returns to the heap at a later collective allocation once every rank released it
//!   and no graph pins it.
//! * **Which job.** torch gives the functions no pool, so one slot of the process says which
//!   runtime serves new segments ([`pool_serve`], made by `symm.mem_pool()`; `symm.finalize`
//!   ends it with [`pool_stop`]), and each live segment remembers its own runtime, which stays
//!   mapped while torch holds the segment.
//! * **A refusal** (no job serving, a device other than the job's, a full or diverged heap)
//!   returns a null pointer, which torch raises as `torch.OutOfMemoryError`. The cause is
//!   written to stderr and kept for [`pool_refusal`]. Nothing here panics across the C
//!   boundary: a panic is caught and refused like any error.
//! * **torch's retries stay local.** After a null return torch frees what its cache holds and
//!   asks again for the same size, once or twice depending on what this rank had cached, so
//!   the ranks would run different numbers of collective allocations. A refused size is
//!   therefore latched: asked again, it is refused here with no collective, until torch gives
//!   up (its out-of-memory observer, attached by `symm.mem_pool()`, calls [`pool_unlatch`])
//!   or a segment of another size is asked for.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;

use super::args::stream;
use super::{GpuComm, Runtime};

/// The process's pool state (see the module doc).
#[derive(Default)]
struct Slot {
    /// The runtime new segments come from.
    serving: Option<Arc<Runtime>>,
    /// Segments torch holds, by device address: their runtime and heap offset.
    live: HashMap<u64, (Arc<Runtime>, u64)>,
    /// Why the last allocation was refused.
    refused: Option<String>,
    /// The size of a refused allocation torch may ask for again (see the module doc).
    latched: Option<usize>,
}

static SLOT: Mutex<Option<Slot>> = Mutex::new(None);

fn slot() -> MutexGuard<'static, Option<Slot>> {
    SLOT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes `comm`'s runtime the one that serves new pool segments (`symm.mem_pool()`).
#[pyfunction]
pub fn pool_serve(comm: &GpuComm) {
    slot().get_or_insert_with(Slot::default).serving = Some(comm.rt.clone());
}

/// No runtime serves new segments (`symm.finalize`); live ones keep theirs.
#[pyfunction]
pub fn pool_stop() {
    if let Some(s) = slot().as_mut() {
        s.serving = None;
    }
}

/// Why the last pool allocation was refused, taken (`None` when none was).
#[pyfunction]
pub fn pool_refusal() -> Option<String> {
    slot().as_mut().and_then(|s| s.refused.take())
}

/// Ends the latch of a refused size (torch raised its out-of-memory error: the next request
/// of any size is a new, collective one).
#[pyfunction]
pub fn pool_unlatch() {
    if let Some(s) = slot().as_mut() {
        s.latched = None;
    }
}

/// A segment of `size` bytes for torch's allocator on GPU `device` and `stream`: this rank's
/// address of a new heap block, or null (refused; see the module doc).
#[no_mangle]
pub extern "C" fn symm_pool_alloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    let got = catch_unwind(AssertUnwindSafe(|| {
        let latched = {
            let mut g = slot();
            let s = g.get_or_insert_with(Slot::default);
            s.latched.take() == Some(size)
        };
        let got = if latched {
            Err(
                "an allocation of this size was just refused (torch's retry stays local, \
                 so every rank runs the same collective allocations)"
                    .to_string(),
            )
        } else {
            alloc(size, device, stream as u64)
        };
        if let Err(why) = &got {
            let mut g = slot();
            let s = g.get_or_insert_with(Slot::default);
            s.latched = Some(size);
            if !latched {
                let _ = writeln!(
                    std::io::stderr(),
                    "symm: pool allocation of {size} bytes refused: {why}"
                );
                s.refused = Some(why.clone());
            }
        }
        got
    }))
    .unwrap_or_else(|_| {
        let why = "the allocator panicked".to_string();
        slot().get_or_insert_with(Slot::default).refused = Some(why.clone());
        Err(why)
    });
    match got {
        Ok(p) => p as usize as *mut c_void,
        Err(_) => std::ptr::null_mut(),
    }
}

/// torch gives back segment `ptr`: its block is released (local; see the module doc). An
/// address that is no live segment is ignored.
#[no_mangle]
pub extern "C" fn symm_pool_free(ptr: *mut c_void, _size: usize, _device: c_int, _s: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let seg = slot().as_mut().and_then(|s| s.live.remove(&(ptr as u64)));
        if let Some((rt, off)) = seg {
            rt.release(off);
        }
    }));
}

fn alloc(size: usize, device: c_int, raw: u64) -> Result<u64, String> {
    let rt = slot().as_ref().and_then(|s| s.serving.clone()).ok_or(
        "no symm job serves the pool (symm.finalize ran, or symm.mem_pool was not called)",
    )?;
    let mine = rt.comm.device().ordinal();
    if device != mine {
        return Err(format!(
            "the pool serves GPU {mine} (this rank's), asked for GPU {device}"
        ));
    }
    let s = stream(&rt.comm, raw);
    // The slot is not held here: the allocation is collective and may wait for the peers.
    let off = rt
        .tensors
        .alloc_block(&rt.comm, size as u64, &s)
        .map_err(|e| e.to_string())?;
    let ptr = match rt.comm.memory().ptr(rt.comm.rank(), off) {
        Ok(p) => p,
        Err(e) => {
            rt.release(off);
            return Err(e.to_string());
        }
    };
    slot()
        .get_or_insert_with(Slot::default)
        .live
        .insert(ptr, (rt, off));
    Ok(ptr)
}
