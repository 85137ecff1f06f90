//! Phases `leak` and `death`: what a job's processes leave behind.

use std::process::Command;
use std::time::{Duration, Instant};

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::bootstrap::SocketBootstrap;
use symm_driver::cuda::device::{Device, Stream};
use symm_driver::cuda::rendezvous::{Bootstrap, SocketRendezvous};
use symm_driver::cuda::{vmm, Comm, CudaError};

use super::super::data;
use super::{e, opts, Params};

/// Heap of the death phase: large enough that a heap left mapped cannot hide in the context's
/// own reservations.
const DEATH_HEAP: u64 = 1 << 30;

fn local_rank() -> Result<i32, String> {
    let local: u16 = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "LOCAL_RANK is not set".to_string())?;
    symm_driver::cuda::comm::placement(local).map_err(|m| m.to_string())
}

fn open_fds() -> Result<usize, String> {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .map_err(|m| format!("/proc/self/fd: {m}"))
}

/// `p.cycles` symmetric-heap create/destroy cycles of one granule across the job's processes
/// (each cycle exports a POSIX fd per rank and imports every peer's through SCM_RIGHTS), then
/// `p.cycles / 10` collectives on fresh allocations of a `Comm`: free memory (within a
/// granule), live handles/maps/ranges and this process's open file descriptors end where they
/// started.
pub(super) fn leak(p: &Params) -> Result<String, String> {
    let dev = Device::open(local_rank()?).map_err(e)?;
    let boot = SocketBootstrap::from_env(Duration::from_secs(60)).map_err(|m| m.to_string())?;
    let rank = boot.rank();
    let rdv = SocketRendezvous::new(boot, Duration::from_secs(60));
    let g = vmm::granularity(&dev).map_err(e)? as u64;
    let cycle = |n: u32| -> Result<(), String> {
        for _ in 0..n {
            drop(vmm::SymmetricHeap::create(&dev, rank, g, &rdv).map_err(e)?);
        }
        dev.synchronize().map_err(e)
    };
    // Free memory is the device's: ranks that share it measure between two barriers, when no
    // rank allocates or frees.
    let quiet = |barrier: &dyn Fn() -> Result<(), String>| -> Result<_, String> {
        barrier()?;
        let m = (dev.mem_info().map_err(e)?.0, vmm::live(), open_fds()?);
        barrier()?;
        Ok(m)
    };
    let boot_barrier = || rdv.barrier(rank).map_err(e);
    cycle(1)?;
    let (free0, live0, fds0) = quiet(&boot_barrier)?;
    let t = Instant::now();
    cycle(p.cycles)?;
    let heap_secs = t.elapsed().as_secs_f64();
    let (free1, live1, fds1) = quiet(&boot_barrier)?;
    // Collectives on a communicator over the same job: allocation, launch and free cycles.
    let comm = Comm::open(
        rdv.into_inner(),
        dev.ordinal(),
        opts(Duration::from_secs(10), 64 << 20),
    )
    .map_err(e)?;
    let stream = Stream::new(comm.device()).map_err(e)?;
    let runs = (p.cycles / 10).max(10);
    let req = |i: u32| {
        Request::new(
            Collective::AllReduce,
            [Algorithm::Ring, Algorithm::OneShot, Algorithm::TwoShot][i as usize % 3],
            comm.world(),
            64 << 10,
            DType::F32,
            ReduceOp::Sum,
        )
    };
    let inputs = data::inputs(&req(0), 1);
    let one = |i: u32| -> Result<(), String> {
        let r = req(i);
        let b = comm.alloc(&r).map_err(e)?;
        comm.memory()
            .write(b.input, &inputs[comm.rank() as usize])
            .map_err(e)?;
        comm.enqueue(&r, &b, &stream).map_err(e)?;
        comm.synchronize(&stream).map_err(e)?;
        comm.free(&b).map_err(e)
    };
    for i in 0..3 {
        one(i)?;
    }
    let comm_barrier = || comm.exchange(&[]).map(|_| ()).map_err(e);
    let (free2, live2, fds2) = quiet(&comm_barrier)?;
    for i in 0..runs {
        one(i)?;
    }
    let (free3, live3, fds3) = quiet(&comm_barrier)?;
    drop(stream);
    comm.finish().map_err(e)?;
    let heap_drift = free1 as i64 - free0 as i64;
    let comm_drift = free3 as i64 - free2 as i64;
    let msg = format!(
        "{} heap cycles across processes ({heap_secs:.1} s): free-memory drift {heap_drift} B (granule {g}), live {live1:?} (before {live0:?}), fds {fds1} (before {fds0}); {runs} collectives with alloc/free on a Comm: drift {comm_drift} B, live {live3:?} (before {live2:?}), fds {fds3} (before {fds2})",
        p.cycles
    );
    if heap_drift.unsigned_abs() > g
        || comm_drift.unsigned_abs() > g
        || live1 != live0
        || live3 != live2
        // A leak grows the count; one fewer is a transient descriptor (a kernel-cache file of
        // a compile in flight) that was open at the first count.
        || fds1 > fds0
        || fds3 > fds2
    {
        return Err(msg);
    }
    Ok(msg)
}

/// Rank 1 is killed (SIGKILL) while rank 0 waits inside an all-reduce; rank 0 must see
/// `PeerLost { rank: 1 }` within 2 s, and its GPU's free memory must return to its starting
/// value once the communicator is dropped.
pub(super) fn death() -> Result<String, String> {
    let dev = Device::open(local_rank()?).map_err(e)?;
    let (free_before, _) = dev.mem_info().map_err(e)?;
    let comm = Comm::from_env(opts(Duration::from_secs(30), DEATH_HEAP)).map_err(e)?;
    let stream = Stream::new(comm.device()).map_err(e)?;

    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        comm.world(),
        1 << 20,
        DType::F32,
        ReduceOp::Sum,
    );
    let b = comm.alloc(&req).map_err(e)?;
    // Both ranks build (and, with compiled plans, compile) the plan first, and meet after it (a
    // cold compile can take one rank longer than the other), so rank 0 enqueues well inside
    // the 300 ms before rank 1 dies.
    comm.prepare(&[req]).map_err(e)?;
    comm.exchange(&[]).map_err(e)?;
    if comm.rank() == 1 {
        std::thread::sleep(Duration::from_millis(300));
        let _ = Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::thread::sleep(Duration::from_secs(10));
        return Err("still alive after kill -9".into());
    }
    comm.enqueue(&req, &b, &stream).map_err(e)?;
    let t = Instant::now();
    let lost = loop {
        match comm.check() {
            Err(CudaError::PeerLost { rank }) => break rank,
            Err(other) => return Err(format!("expected PeerLost, got {other}")),
            Ok(()) if t.elapsed() > Duration::from_secs(20) => {
                return Err("no PeerLost after 20 s".into())
            }
            Ok(()) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    let seen = t.elapsed();
    // The kernel stops at its next wait once the abort word is up.
    let stopped = stream.synchronize();
    drop(stream);
    let after = Instant::now();
    drop(comm);
    let drop_took = after.elapsed();
    // The dead peer's process still holds an import of this heap until the driver has torn it
    // down, which it does after the process ends: wait for it, briefly.
    let (mut free_after, _) = dev.mem_info().map_err(e)?;
    let waited = Instant::now();
    while free_before.saturating_sub(free_after) as u64 > DEATH_HEAP / 2
        && waited.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
        free_after = dev.mem_info().map_err(e)?.0;
    }
    let returned_after = waited.elapsed();
    if lost != 1 {
        return Err(format!("PeerLost named rank {lost}"));
    }
    // The kill comes 300 ms after the collective was enqueued.
    if seen > Duration::from_millis(2300) {
        return Err(format!("PeerLost after {seen:?}"));
    }
    // The heap is 1 GiB: anything of it left mapped shows. What the context reserves at its first
    // kernel launch (local memory for every thread the GPU can hold, tens of MiB) stays with the
    // context and is reported, not counted.
    let drift = free_before as i64 - free_after as i64;
    if drift > (DEATH_HEAP / 2) as i64 {
        return Err(format!(
            "free memory {free_before} B before the job, {free_after} B after drop"
        ));
    }
    Ok(format!(
        "PeerLost {{ rank: 1 }} {:.0} ms after enqueue (kill at 300 ms); kernel stopped: {}; drop {:.0} ms; 1 GiB heap returned {:.0} ms after drop (drift {drift} B)",
        seen.as_secs_f64() * 1e3,
        stopped.is_ok(),
        drop_took.as_secs_f64() * 1e3,
        returned_after.as_secs_f64() * 1e3,
    ))
}
