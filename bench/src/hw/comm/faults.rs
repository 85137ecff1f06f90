//! The fault suite (`symm-bench check --faults`), one process per rank, on plain device buffers
//! through [`Tensors`] (the path a framework's tensors take).
//!
//! Each fault is injected on the last rank. Every rank records the error it got, its kind, and
//! how long after its call it came (the check's note); then `Tensors::reset` on every rank, 100
//! all-reduces bit exact, and this process's open descriptors as before the fault.
//! The faults, and what each rank must see:
//! * a size, element type, reduction, collective or root that differs on one rank, on the shape's
//!   first use: `RanksDiffer` on every rank, from the agreement of first uses, well inside the
//!   deadline;
//! * the same after every rank used both versions: `RanksDiffer` from the call's signature on
//!   the device, within 10 ms (root excepted: a broadcast's other ranks only read the root);
//! * one rank skipping a call, or calling twice, before a shape's first use: `RanksDiffer` on
//!   every rank within 10 ms, from the count of calls the agreement of first uses compares;
//! * one rank abandoning the job between two collectives (an error of the application);
//! * one rank stopped (SIGSTOP) past the deadline, then continued by rank 0: `Timeout` on every
//!   other rank, between one and three deadlines.
//!
//! The Python suite (`python/tests_gpu/test_faults.py`) injects the same faults through the
//! binding; the killed rank is the `death` phase.

use std::process::Command;
use std::time::{Duration, Instant};

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Collective, Forced, Request};
use symm_driver::cuda::device::DevBuf;
use symm_driver::cuda::{AutoRequests, Comm, CudaError, ErrorKind, Span, Stream, Tensors};

use super::{e, opts, Check, Params};

/// The device wait's deadline in this phase.
const DEADLINE: Duration = Duration::from_secs(2);
/// Elements of the recovery sums.
const N: usize = 1000;
/// Bytes of the phase's buffer (every call's input and output, in place).
const BUF: usize = 256 << 10;

/// What differs in a call.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Size,
    Dtype,
    Op,
    Collective,
    Root,
}

const KINDS: [Kind; 5] = [
    Kind::Size,
    Kind::Dtype,
    Kind::Op,
    Kind::Collective,
    Kind::Root,
];

/// One rank's job in this phase.
struct Job {
    comm: Comm,
    tensors: Tensors,
    auto: AutoRequests,
    stream: Stream,
    buf: DevBuf,
    /// The next shape no call used yet (the same on every rank: they run the same faults).
    fresh: usize,
}

/// A fault's outcome on this rank: its error (`None`: nothing seen), after how long.
type Outcome = (Option<CudaError>, Duration);

impl Job {
    fn last(&self) -> bool {
        self.comm.rank() + 1 == self.comm.world()
    }

    fn fresh(&mut self) -> usize {
        self.fresh += 24;
        self.fresh
    }

    /// The request of `kind`'s call over `n` elements; `variant` 1 is the differing version.
    fn request(&self, kind: Kind, variant: u16, n: usize) -> Result<Request, CudaError> {
        let n = n as u64;
        let (c, bytes, t, op) = match kind {
            Kind::Size => (
                Collective::AllReduce,
                4 * (n + 8 * u64::from(variant)),
                DType::F32,
                ReduceOp::Sum,
            ),
            // The same bytes in another type.
            Kind::Dtype if variant == 1 => {
                (Collective::AllReduce, 4 * n, DType::Bf16, ReduceOp::Sum)
            }
            Kind::Dtype => (Collective::AllReduce, 4 * n, DType::F32, ReduceOp::Sum),
            Kind::Op if variant == 1 => (Collective::AllReduce, 4 * n, DType::F32, ReduceOp::Max),
            Kind::Op => (Collective::AllReduce, 4 * n, DType::F32, ReduceOp::Sum),
            Kind::Collective if variant == 1 => (
                Collective::Broadcast { root: 0 },
                4 * n,
                DType::F32,
                ReduceOp::Sum,
            ),
            Kind::Collective => (Collective::AllReduce, 4 * n, DType::F32, ReduceOp::Sum),
            Kind::Root => (
                Collective::Broadcast { root: variant },
                4 * n,
                DType::F32,
                ReduceOp::Sum,
            ),
        };
        self.auto
            .get(c, bytes, t, op, Forced::default())
            .map_err(CudaError::Sched)
    }

    /// Enqueues `req` in place over the start of the buffer.
    fn call(&self, req: &Request) -> Result<(), CudaError> {
        let s = Span {
            ptr: self.buf.ptr(),
            len: req.buffer_sizes().input,
        };
        // SAFETY: the span lies in this job's device buffer (the requests here are at most a
        // few tens of KiB), which outlives the work: every fault ends with a synchronisation
        // or a reset, which waits for the device.
        unsafe { self.tensors.enqueue(&self.comm, req, s, s, &self.stream) }
    }

    fn kind_call(&self, kind: Kind, variant: u16, n: usize) -> Result<(), CudaError> {
        self.call(&self.request(kind, variant, n)?)
    }

    /// Runs this rank's part of a fault, then waits for the stream.
    fn fault(&self, run: impl FnOnce(&Job) -> Result<(), CudaError>) -> Outcome {
        let t = Instant::now();
        let r = run(self).and_then(|()| self.comm.synchronize(&self.stream));
        (r.err(), t.elapsed())
    }

    /// The fault `run`, then the recovery every fault needs whatever it did: reset, 100 sums
    /// bit exact, descriptors as before. Returns this rank's outcome and what each rank saw:
    /// 0 nothing, 1 `RanksDiffer`, 2 another error (or, with `app`, a failure of its own).
    fn survive(
        &mut self,
        run: impl FnOnce(&Job) -> Result<(), CudaError>,
        app: bool,
    ) -> Result<(Outcome, Vec<u8>), String> {
        let before = fds();
        let (err, took) = self.fault(run);
        let mine = match &err {
            Some(x) if x.kind() == ErrorKind::RanksDiffer => 1,
            Some(_) => 2,
            None => u8::from(app && self.last()) * 2,
        };
        self.tensors
            .reset(&self.comm)
            .map_err(|x| format!("reset: {x}"))?;
        let seen: Vec<u8> = self
            .comm
            .exchange(&[mine])
            .map_err(e)?
            .iter()
            .map(|v| v.first().copied().unwrap_or(0))
            .collect();
        self.sums_are_right(100)?;
        let after = fds();
        if after != before {
            return Err(format!("{before} open descriptors before, {after} after"));
        }
        Ok(((err, took), seen))
    }

    /// `calls` all-reduces of `N + i % 17` f32 elements, each checked exactly.
    fn sums_are_right(&self, calls: usize) -> Result<(), String> {
        let (w, r) = (self.comm.world() as usize, self.comm.rank() as usize);
        for i in 0..calls {
            let n = N + i % 17;
            let mine = (i % 5 + r) as f32;
            let bytes: Vec<u8> = (0..n).flat_map(|_| mine.to_ne_bytes()).collect();
            self.buf.upload(&bytes).map_err(e)?;
            let req = self
                .auto
                .get(
                    Collective::AllReduce,
                    4 * n as u64,
                    DType::F32,
                    ReduceOp::Sum,
                    Forced::default(),
                )
                .map_err(|x| x.to_string())?;
            self.call(&req).map_err(|x| format!("sum {i}: {x}"))?;
            self.comm
                .synchronize(&self.stream)
                .map_err(|x| format!("sum {i}: {x}"))?;
            let want = (w * (i % 5) + w * (w - 1) / 2) as f32;
            let got = self.buf.read_at(0, 4 * n).map_err(e)?;
            if let Some(j) = got
                .chunks_exact(4)
                .position(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) != want)
            {
                return Err(format!(
                    "after the reset, sum {i} element {j} is not {want}"
                ));
            }
        }
        Ok(())
    }
}

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// `err`, said with its kind and time.
fn said(o: &Outcome) -> String {
    match &o.0 {
        None => format!("nothing after {:.1} ms", o.1.as_secs_f64() * 1e3),
        Some(x) => format!(
            "{:?} after {:.1} ms ({})",
            x.kind(),
            o.1.as_secs_f64() * 1e3,
            x.to_string().chars().take(90).collect::<String>()
        ),
    }
}

fn named(o: &Outcome, within: Duration) -> Result<(), String> {
    match &o.0 {
        Some(x) if x.kind() == ErrorKind::RanksDiffer && o.1 < within => Ok(()),
        _ => Err(format!(
            "expected RanksDiffer within {within:?}: {}",
            said(o)
        )),
    }
}

/// The phase's checks.
pub(super) fn run(_p: &Params) -> Result<Vec<Check>, String> {
    let comm = Comm::from_env(opts(DEADLINE, 64 << 20)).map_err(e)?;
    let stream = Stream::new(comm.device()).map_err(e)?;
    let buf = DevBuf::zeroed(comm.device(), BUF).map_err(e)?;
    let mut job = Job {
        tensors: Tensors::new(&comm),
        auto: AutoRequests::of(&comm),
        comm,
        stream,
        buf,
        fresh: 7000,
    };
    let mut checks = Vec::new();
    for kind in KINDS {
        let name =
            format!("fault: {kind:?} differs on first use: named on every rank, reset recovers");
        checks.push(Check::timed(&name, 1, || {
            let n = job.fresh();
            let v = u16::from(job.last());
            let (o, _) = job.survive(|j| j.kind_call(kind, v, n), false)?;
            named(&o, DEADLINE / 2).map(|()| said(&o))
        }));
    }
    for kind in KINDS {
        let name =
            format!("fault: {kind:?} differs after use: named by the signature, reset recovers");
        checks.push(Check::timed(&name, 1, || {
            let n = used_before(&mut job, kind)?;
            let v = u16::from(job.last());
            let (o, _) = job.survive(|j| j.kind_call(kind, v, n), false)?;
            match kind {
                // A broadcast's other ranks only read the root: a root that differs may pass
                // unnoticed on some rank, and is put right by the reset.
                Kind::Root => Ok(said(&o)),
                _ => named(&o, Duration::from_millis(10)).map(|()| said(&o)),
            }
        }));
    }
    for twice in [false, true] {
        let name = if twice {
            "fault: one rank calls twice"
        } else {
            "fault: one rank skips a call"
        };
        checks.push(Check::timed(name, 1, || {
            let n = used_before(&mut job, Kind::Size)?;
            let m = job.fresh();
            let (o, seen) = job.survive(
                |j| {
                    let times = if !j.last() {
                        1
                    } else if twice {
                        2
                    } else {
                        0
                    };
                    for _ in 0..times {
                        j.kind_call(Kind::Size, 0, n)?;
                    }
                    j.kind_call(Kind::Size, 0, m)
                },
                false,
            )?;
            // The next call is a first use on every rank: the ranks' counts of calls before
            // it differ there, and every rank names it at once.
            if seen.iter().any(|&r| r != 1) {
                return Err(format!(
                    "not named on every rank (0 nothing, 1 RanksDiffer, 2 other): {seen:?}; {}",
                    said(&o)
                ));
            }
            named(&o, Duration::from_millis(10))
                .map(|()| format!("{}; ranks that saw it: {seen:?}", said(&o)))
        }));
    }
    checks.push(Check::timed(
        "fault: one rank abandons the job between two collectives",
        1,
        || {
            let n = N;
            let (o, seen) = job.survive(
                |j| {
                    j.kind_call(Kind::Size, 0, n)?;
                    if j.last() {
                        return Ok(()); // the application failed here
                    }
                    j.kind_call(Kind::Size, 0, n)
                },
                true,
            )?;
            if seen.contains(&0) {
                return Err(format!("not every rank saw it: {seen:?}; {}", said(&o)));
            }
            Ok(said(&o))
        },
    ));
    checks.push(Check::timed(
        "fault: one rank stopped past the deadline, then continued",
        1,
        || stopped(&mut job),
    ));
    let Job {
        comm,
        stream,
        buf,
        tensors,
        ..
    } = job;
    drop((stream, buf, tensors));
    comm.finish().map_err(e)?;
    Ok(checks)
}

/// Every rank calls both versions of `kind`'s call twice on a fresh shape, so neither meets the
/// agreement of first uses again.
fn used_before(job: &mut Job, kind: Kind) -> Result<usize, String> {
    let n = job.fresh();
    for v in [0, 1, 0, 1] {
        job.kind_call(kind, v, n).map_err(e)?;
    }
    job.comm.synchronize(&job.stream).map_err(e)?;
    Ok(n)
}

/// The last rank stops itself before a call; rank 0 continues it once its own call failed.
fn stopped(job: &mut Job) -> Result<String, String> {
    let pids = job
        .comm
        .exchange(&std::process::id().to_le_bytes())
        .map_err(e)?;
    let last_pid = pids
        .last()
        .and_then(|p| p.get(..4))
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or("no pid from the last rank")?;
    job.kind_call(Kind::Size, 0, N).map_err(e)?;
    job.comm.synchronize(&job.stream).map_err(e)?;
    job.comm.exchange(&[]).map_err(e)?;
    let rank0 = job.comm.rank() == 0;
    let (o, _) = job.survive(
        |j| {
            if j.last() {
                let _ = Command::new("kill")
                    .args(["-STOP", &std::process::id().to_string()])
                    .status();
                return j.kind_call(Kind::Size, 0, N);
            }
            let r = j
                .kind_call(Kind::Size, 0, N)
                .and_then(|()| j.comm.synchronize(&j.stream));
            if rank0 {
                // Twice, in case this rank's call failed before the last one stopped itself.
                for _ in 0..2 {
                    let _ = Command::new("kill")
                        .args(["-CONT", &last_pid.to_string()])
                        .status();
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            r
        },
        false,
    )?;
    if job.last() {
        // The stopped rank may still finish its call: its peers delivered before they gave up.
        return Ok(said(&o));
    }
    match &o.0 {
        Some(x) if x.kind() == ErrorKind::Timeout && o.1 >= DEADLINE && o.1 < 3 * DEADLINE => {
            Ok(said(&o))
        }
        _ => Err(format!(
            "expected Timeout between 1 and 3 deadlines: {}",
            said(&o)
        )),
    }
}
