//! The communicators that have a symm job, and how one call runs on it.
//!
//! A table maps a communicator handle (the real library's, or in [`Mode::Alone`] one the shim
//! allocates) to its [`Entry`]: the symm runtime joined for it, the requests it has decided,
//! and the real communicator when there is one. A handle absent from the table is the real
//! library's alone. Groups are counted per thread, as NCCL counts them.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use symm_core::sched::Collective;
use symm_driver::bootstrap::JobEnv;
use symm_driver::cuda::ffi::driver::Handle;
use symm_driver::cuda::ffi::nccl::Comm as RealComm;
use symm_driver::cuda::{ctx, AutoRequests, Comm, CommOptions, CudaError, Span, Stream, Tensors};

use crate::id::Job;
use crate::route::{self, Call, Refusal};

#[cfg(doc)]
use crate::route::Mode;

/// A communicator served by symm.
pub struct Entry {
    /// The runtime joined for it.
    pub comm: Comm,
    /// Its calls over device addresses.
    pub tensors: Tensors,
    /// Its requests, decided once per shape.
    pub auto: AutoRequests,
    /// The real communicator, when the real library made one.
    pub real: Option<Real>,
    /// The symm job it joined (a split's job is named after it).
    pub job: Job,
    /// Splits made from it so far (the same count on every rank: splitting is collective).
    pub splits: AtomicU32,
}

/// A real NCCL communicator handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Real(pub RealComm);

// SAFETY: an NCCL communicator handle may be used from any thread (NCCL asks only that one
// thread at a time call into a communicator, which the caller of the NCCL API guarantees).
unsafe impl Send for Real {}
// SAFETY: as for `Send`; the handle itself is never written through here.
unsafe impl Sync for Real {}

/// Why a served call did not run.
#[derive(Debug)]
pub enum Failure {
    /// symm does not serve it: forward it, or refuse it when there is no real library.
    Refused(Refusal),
    /// symm took it and failed.
    Failed(CudaError),
}

fn table() -> &'static Mutex<HashMap<usize, Arc<Entry>>> {
    static TABLE: OnceLock<Mutex<HashMap<usize, Arc<Entry>>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

fn with_table<R>(f: impl FnOnce(&mut HashMap<usize, Arc<Entry>>) -> R) -> R {
    // A poisoned lock only means a panic elsewhere while it was held: the map is whole.
    f(&mut table().lock().unwrap_or_else(|e| e.into_inner()))
}

/// The entry of `handle`, if symm serves it.
pub fn get(handle: usize) -> Option<Arc<Entry>> {
    with_table(|t| t.get(&handle).cloned())
}

/// Serves `handle` with `entry` from now on.
pub fn insert(handle: usize, entry: Entry) {
    with_table(|t| t.insert(handle, Arc::new(entry)));
}

/// Serves `entry` under a handle of the shim's own (a communicator with no real one): a fresh
/// allocation, so no other handle is ever equal to it, which [`free_own`] frees.
pub fn insert_own(entry: Entry) -> RealComm {
    let h = Box::into_raw(Box::new(0u8)).cast::<std::ffi::c_void>();
    insert(h as usize, entry);
    h
}

/// Frees a handle [`insert_own`] made, after its entry left the table.
///
/// # Safety
/// `handle` must come from [`insert_own`], be out of the table, and be freed once.
pub unsafe fn free_own(handle: RealComm) {
    // SAFETY: the caller's contract: a `Box<u8>` of `insert_own`'s, freed once.
    drop(unsafe { Box::from_raw(handle.cast::<u8>()) });
}

/// Collectives the shim served on symm, and those it handed to the real library, since the
/// library loaded (every communicator of the process).
static COUNTS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Who ran a collective, for [`count`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// symm's kernels.
    Symm,
    /// The real library.
    Nccl,
}

/// Counts one collective that `path` ran.
pub fn count(path: Path) {
    COUNTS[path as usize].fetch_add(1, Ordering::Relaxed);
}

/// `(served by symm, forwarded to the real library)` so far.
pub fn counts() -> (u64, u64) {
    (
        COUNTS[Path::Symm as usize].load(Ordering::Relaxed),
        COUNTS[Path::Nccl as usize].load(Ordering::Relaxed),
    )
}

/// Stops serving `handle`, returning its entry.
pub fn remove(handle: usize) -> Option<Arc<Entry>> {
    with_table(|t| t.remove(&handle))
}

/// Bytes of the last-error text a thread keeps, its NUL included.
const LAST_BYTES: usize = 512;

thread_local! {
    static GROUP: Cell<u32> = const { Cell::new(0) };
    /// The shim's last error on this thread, NUL-terminated; empty when the last call the shim
    /// answered itself succeeded. A fixed buffer, so a pointer to it stays valid for the
    /// thread's life (as NCCL's own last-error text does).
    static LAST: UnsafeCell<[u8; LAST_BYTES]> = const { UnsafeCell::new([0; LAST_BYTES]) };
}

/// Opens (`+1`) or closes (`-1`) a group on this thread; returns the depth before.
pub fn group(step: i32) -> u32 {
    GROUP.with(|g| {
        let was = g.get();
        g.set(was.saturating_add_signed(step));
        was
    })
}

/// Whether this thread is inside a group.
pub fn in_group() -> bool {
    GROUP.with(|g| g.get() > 0)
}

/// Keeps `msg` (cut to the buffer, NULs as spaces) as this thread's last error
/// (`ncclGetLastError`); an empty `msg` clears it.
pub fn set_last(msg: &str) {
    let _ = LAST.try_with(|l| {
        let mut text = [0u8; LAST_BYTES];
        let mut n = msg.len().min(LAST_BYTES - 1);
        while !msg.is_char_boundary(n) {
            n -= 1;
        }
        for (d, s) in text.iter_mut().zip(msg.as_bytes()[..n].iter()) {
            *d = if *s == 0 { b' ' } else { *s };
        }
        // SAFETY: the buffer is this thread's own and no reference to it is alive: readers
        // take only its address (`last`), and C reads it between this thread's calls.
        unsafe { *l.get() = text };
    });
}

/// This thread's last error as a C string, when the shim's last answered call failed.
pub fn last() -> Option<*const c_char> {
    LAST.try_with(|l| {
        let p = l.get().cast::<c_char>();
        // SAFETY: the buffer is this thread's, and always holds a NUL at its end.
        (unsafe { *p } != 0).then_some(p.cast_const())
    })
    .ok()
    .flatten()
}

/// Joins `job` as rank `rank` of `world` on the calling thread's current GPU (GPU 0 when no
/// context is current, as NCCL's runtime would pick), with the options of the environment.
pub fn join(job: Job, world: u16, rank: u16, real: Option<Real>) -> Result<Entry, CudaError> {
    let device = ctx::current_device()?.unwrap_or(0);
    let env = JobEnv {
        rank,
        world,
        local_rank: rank,
        job: job.name.clone(),
        token: job.token.clone(),
    };
    let comm = CommOptions::from_env()?.join_on(&env, Some(device))?;
    Ok(Entry {
        tensors: Tensors::new(&comm),
        auto: AutoRequests::of(&comm),
        comm,
        real,
        job,
        splits: AtomicU32::new(0),
    })
}

/// Runs `call` over `count` elements of NCCL type `dtype` from `send` into `recv` on the
/// caller's stream `stream`.
///
/// # Safety
/// `stream` must be a live stream of the communicator's GPU (or null, the legacy default
/// stream). Buffers are checked to lie inside one device allocation each, and must stay
/// allocated until the enqueued work finishes, as for any NCCL call.
pub unsafe fn serve(
    e: &Entry,
    call: Call,
    (send, recv): (u64, u64),
    count: usize,
    dtype: c_int,
    stream: Handle,
) -> Result<(), Failure> {
    let req =
        route::request(call, count, dtype, e.comm.world(), &e.auto).map_err(Failure::Refused)?;
    let sizes = req.buffer_sizes();
    let me = e.comm.rank();
    // NCCL reads a broadcast's input only at its root and writes a reduce's output only at its
    // root; elsewhere the other buffer stands in (a reduce's input delivers nothing there).
    let (input, output) = match req.collective {
        Collective::Broadcast { root } if root != me => (recv, recv),
        Collective::Reduce { root } if root != me => (send, send),
        _ => (send, recv),
    };
    let spans = (
        Span {
            ptr: input,
            len: sizes.input,
        },
        Span {
            ptr: output,
            len: sizes.output,
        },
    );
    // SAFETY: the caller passes a live stream of the communicator's GPU's primary context (what
    // a CUDA runtime stream of the current device is), which outlives the enqueued work.
    let s = unsafe { Stream::lent(stream, e.comm.device()) };
    // SAFETY: the spans are the caller's device buffers, checked by the runtime to lie in one
    // allocation each; the caller keeps them allocated until the work finishes.
    unsafe { e.tensors.enqueue(&e.comm, &req, spans.0, spans.1, &s) }.map_err(Failure::Failed)
}
