//! The safety checks of `cargo xtask hw`: what a safe call cannot make the GPU do, and how the
//! world recovers from a failed collective.
//!
//! * bounds: buffers smaller than the plan, in the signal pad or past the heap are refused before
//!   any launch, and the world stays usable;
//! * poison and reset: after a forced device timeout every launch fails fast with `Poisoned`;
//!   after `reset()` 100 collectives over every all-reduce algorithm are bit exact;
//! * graphs: `free` refuses buffers a live capture names, and accepts them once it is dropped;
//! * two threads launching on one world at once: every result correct;
//! * foreign plans: plans another world validated, or validated for another rank, are refused
//!   with `ForeignPlan` before any launch;
//! * context lifetime: a stream, events and plans made from a world still work, and drop
//!   cleanly, after the world (and with it its devices) is dropped.

use std::time::{Duration, Instant};

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, Algorithm, BufferSizes, Collective, Request};
use symm_driver::cuda::CudaError;
use symm_driver::host;
use symm_harness::{Options, World};
use symm_tests::matrix::exact;

use super::{data, Row};

fn request(a: Algorithm, w: u16) -> Request {
    Request::new(
        Collective::AllReduce,
        a,
        w,
        64 << 10,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(2)
}

/// Runs `req` on `b` with fresh inputs and compares with the reference.
fn checked_run(
    world: &World,
    req: &Request,
    b: &symm_driver::cuda::Buffers,
    seed: u64,
) -> Result<(), String> {
    let e = |e: CudaError| e.to_string();
    let inputs = data::inputs(req, seed);
    for (r, inp) in inputs.iter().enumerate() {
        world.write(r as u16, b.input, inp).map_err(e)?;
        world
            .fill(r as u16, b.output, b.sizes.output, host::POISON)
            .map_err(e)?;
    }
    world.run(req, b, false).map_err(e)?;
    let found: Vec<Vec<u8>> = (0..req.world)
        .map(|r| world.read(r, b.output, b.sizes.output))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    exact(req, &found, &host::reference(req, &inputs))
}

/// `Ok` when `r` is the refusal `want` accepts.
fn expect_refused(
    what: &str,
    r: Result<(), CudaError>,
    want: impl Fn(&CudaError) -> bool,
) -> Result<(), String> {
    match r {
        Err(e) if want(&e) => Ok(()),
        Err(other) => Err(format!("{what}: wrong error {other}")),
        Ok(()) => Err(format!("{what}: was accepted")),
    }
}

fn bounds(world: &World, seed: &mut u64) -> Result<String, String> {
    let e = |e: CudaError| e.to_string();
    let req = request(Algorithm::Ring, world.world());
    let b = world.alloc(&req).map_err(e)?;
    let r = (|| {
        let mut small = b;
        small.sizes.output -= 4;
        expect_refused(
            "an output 4 bytes short",
            world.run(&req, &small, false),
            |e| matches!(e, CudaError::TooSmall { what: "output", .. }),
        )?;
        let mut pad = b;
        pad.output = 0;
        expect_refused(
            "an output over the signal pad",
            world.run(&req, &pad, false),
            |e| matches!(e, CudaError::OutOfBounds { what: "output", .. }),
        )?;
        let mut past = b;
        // 16-byte aligned, so the refusal is for the range, not the alignment.
        past.scratch = world.stride() - 16;
        expect_refused(
            "scratch past the heap",
            world.run(&req, &past, false),
            |e| {
                matches!(
                    e,
                    CudaError::OutOfBounds {
                        what: "scratch",
                        ..
                    }
                )
            },
        )?;
        let mut wrap = b;
        wrap.input = u64::MAX - 15;
        expect_refused(
            "an input offset that wraps",
            world.run(&req, &wrap, false),
            |e| matches!(e, CudaError::OutOfBounds { what: "input", .. }),
        )?;
        if let Some(p) = world.poisoned() {
            return Err(format!("a refused launch poisoned the world: {p}"));
        }
        *seed += 1;
        checked_run(world, &req, &b, *seed).map_err(|m| format!("after the refusals: {m}"))
    })();
    world.free(&b).map_err(e)?;
    r.map(|()| "4 bad buffer sets refused before launch; the next run bit exact".into())
}

fn poison_and_reset(devices: &[i32], seed: &mut u64) -> Result<String, String> {
    let e = |e: CudaError| e.to_string();
    let opts = Options {
        heap_bytes: 8 << 20,
        timeout: Duration::from_secs(1),
        ..Options::default()
    };
    let world = World::open(devices, opts).map_err(e)?;
    let w = world.world();
    let (dev, hang) = super::checks::hang(&world).map_err(e)?;
    world.launch(&dev, &hang, false).map_err(e)?;
    match world.wait() {
        Err(CudaError::Timeout { .. }) => {}
        other => return Err(format!("the hanging plan gave {other:?}")),
    }
    let algos: Vec<Algorithm> = algorithms(Collective::AllReduce)
        .iter()
        .copied()
        .filter(|a| *a != Algorithm::Multicast)
        .collect();
    // Buffers large enough for every algorithm's scratch.
    let most = algos.iter().fold(BufferSizes::default(), |m, &a| {
        let s = request(a, w).buffer_sizes();
        BufferSizes {
            input: m.input.max(s.input),
            output: m.output.max(s.output),
            scratch: m.scratch.max(s.scratch),
        }
    });
    let req = request(Algorithm::Ring, w);
    let b = world.alloc_sizes(most).map_err(e)?;
    let t = Instant::now();
    match world.run(&req, &b, false) {
        Err(CudaError::Poisoned(_)) => {}
        other => {
            return Err(format!(
                "a run after the timeout gave {other:?}, not Poisoned"
            ))
        }
    }
    let fail_fast = t.elapsed();
    world.reset().map_err(e)?;
    let mut n = 0;
    for i in 0..100u64 {
        let req = request(algos[i as usize % algos.len()], w);
        *seed += 1;
        checked_run(&world, &req, &b, *seed).map_err(|m| format!("after reset, run {i}: {m}"))?;
        n += 1;
    }
    world.free(&b).map_err(e)?;
    world.free(&hang).map_err(e)?;
    Ok(format!(
        "timeout -> Poisoned in {:.0} us; after reset() {n} all-reduces bit exact",
        fail_fast.as_secs_f64() * 1e6
    ))
}

fn foreign_plans(world: &World, devices: &[i32]) -> Result<String, String> {
    let e = |e: CudaError| e.to_string();
    let req = request(Algorithm::Ring, world.world());
    let b = world.alloc(&req).map_err(e)?;
    let r = (|| {
        let other = World::open(
            devices,
            Options {
                heap_bytes: 8 << 20,
                ..Options::default()
            },
        )
        .map_err(e)?;
        let theirs = other.plans(&req).map_err(e)?;
        match world.launch(&theirs, &b, false) {
            Err(CudaError::ForeignPlan(_)) => {}
            other => return Err(format!("another world's plans gave {other:?}")),
        }
        let mut notes = vec!["another world's plans refused".to_string()];
        if world.world() > 1 {
            let mine = world.plans(&req).map_err(e)?;
            let hosts: Vec<_> = mine.iter().map(|p| p.host().clone()).collect();
            let mut swapped = world.user_plans(hosts, &req.buffer_sizes()).map_err(e)?;
            swapped.reverse();
            match world.launch(&swapped, &b, false) {
                Err(CudaError::ForeignPlan(_)) => {}
                other => return Err(format!("plans of swapped ranks gave {other:?}")),
            }
            notes.push("plans of swapped ranks refused".into());
        }
        if let Some(p) = world.poisoned() {
            return Err(format!("a refused launch poisoned the world: {p}"));
        }
        Ok(notes.join("; "))
    })();
    world.free(&b).map_err(e)?;
    r
}

fn graphs_pin_buffers(world: &World) -> Result<String, String> {
    let e = |e: CudaError| e.to_string();
    let req = request(Algorithm::TwoShot, world.world());
    let b = world.alloc(&req).map_err(e)?;
    let captured = world.capture(&req, &b).map_err(e)?;
    expect_refused("free while captured", world.free(&b), |e| {
        matches!(e, CudaError::Pinned)
    })?;
    world.replay(&captured).map_err(e)?;
    drop(captured);
    world.free(&b).map_err(e)?;
    Ok("free refused while a capture names the buffers, accepted after".into())
}

fn two_threads(world: &World, seed: u64) -> Result<String, String> {
    let e = |e: CudaError| e.to_string();
    let reqs = [
        request(Algorithm::Ring, world.world()),
        request(Algorithm::OneShot, world.world()),
    ];
    let bufs = [
        world.alloc(&reqs[0]).map_err(e)?,
        world.alloc(&reqs[1]).map_err(e)?,
    ];
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|t| {
                let (req, b) = (&reqs[t], &bufs[t]);
                s.spawn(move || {
                    for i in 0..50u64 {
                        checked_run(world, req, b, seed + 1000 * t as u64 + i)
                            .map_err(|m| format!("thread {t} run {i}: {m}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    for b in &bufs {
        world.free(b).map_err(e)?;
    }
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok("2 threads x 50 all-reduces on one world, all bit exact".into())
}

/// The caller's current context is the same after every kind of world call.
fn context_restored(world: &World, seed: u64) -> Result<String, String> {
    use symm_driver::cuda::device::current_context;
    let e = |e: CudaError| e.to_string();
    let req = request(Algorithm::Ring, world.world());
    let before = current_context().map_err(e)?;
    let b = world.alloc(&req).map_err(e)?;
    checked_run(world, &req, &b, seed)?;
    let captured = world.capture(&req, &b).map_err(e)?;
    world.replay(&captured).map_err(e)?;
    drop(captured);
    world.free(&b).map_err(e)?;
    let after = current_context().map_err(e)?;
    if before != after {
        return Err(format!(
            "the calling thread's context changed from {before:?} to {after:?}"
        ));
    }
    Ok(format!(
        "alloc, write, fill, run, read, capture, replay, free: the caller's context ({before:?}) kept"
    ))
}

/// Objects made from a world hold their own retain of the device's context: after the world is
/// dropped a stream and events made from its device still record, synchronise and time, and its
/// plans drop cleanly (each would bind a released context otherwise).
fn context_outlives_world(devices: &[i32]) -> Result<String, String> {
    use symm_driver::cuda::device::{Event, Stream};
    let e = |e: CudaError| e.to_string();
    let world = World::open(
        &devices[..1],
        Options {
            heap_bytes: 8 << 20,
            ..Options::default()
        },
    )
    .map_err(e)?;
    let req = request(Algorithm::Ring, 1);
    let plans = world.plans(&req).map_err(e)?;
    let dev = world.device(0).map_err(e)?;
    let stream = Stream::new(dev).map_err(e)?;
    let (start, end) = (Event::new(dev).map_err(e)?, Event::new(dev).map_err(e)?);
    drop(world);
    start.record(&stream).map_err(e)?;
    end.record(&stream).map_err(e)?;
    stream.synchronize().map_err(e)?;
    let ms = start.elapsed_ms(&end).map_err(e)?;
    if !(0.0..1e4).contains(&ms) {
        return Err(format!("an empty interval of {ms} ms"));
    }
    drop(plans);
    drop(stream);
    drop((start, end));
    // The context is released now; a fresh world on the same device works.
    let again = World::open(
        &devices[..1],
        Options {
            heap_bytes: 8 << 20,
            ..Options::default()
        },
    )
    .map_err(e)?;
    let b = again.alloc(&req).map_err(e)?;
    checked_run(&again, &req, &b, 7)?;
    again.free(&b).map_err(e)?;
    Ok("stream, events and plans used and dropped after their world; a new world runs".into())
}

/// One check: a note on success, the failure otherwise.
type Check<'a> = dyn Fn(&mut u64) -> Result<String, String> + 'a;

/// Every safety check, a row each.
pub fn run(world: &World, devices: &[i32], seed: &mut u64) -> Vec<Row> {
    let w = world.world();
    let mut rows = Vec::new();
    let checks: [(&str, &Check); 7] = [
        ("safety: foreign plans", &|_| foreign_plans(world, devices)),
        ("safety: caller's context kept", &|s| {
            context_restored(world, *s)
        }),
        ("safety: buffer bounds", &|s| bounds(world, s)),
        ("safety: graphs pin buffers", &|_| graphs_pin_buffers(world)),
        ("safety: two launching threads", &|s| two_threads(world, *s)),
        ("safety: poison and reset", &|s| {
            poison_and_reset(devices, s)
        }),
        ("safety: context outlives its world", &|_| {
            context_outlives_world(devices)
        }),
    ];
    for (name, f) in checks {
        let t = Instant::now();
        let mut row = Row::new(name, w);
        row.cases = 1;
        match f(seed) {
            Ok(m) => row.note = m,
            Err(m) => row.fail(m),
        }
        row.seconds = t.elapsed().as_secs_f64();
        rows.push(row);
    }
    rows
}
