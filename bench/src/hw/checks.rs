//! The GPU correctness checks of `cargo xtask hw`.

use std::path::Path;
use std::time::{Duration, Instant};

use symm_core::dtype::{combine, decode_f64, DType, ReduceOp};
use symm_core::op::{Buf, Loc, Op};
use symm_core::sched::{Algorithm, BufferSizes, Collective, Request};
use symm_core::signal::SlotKind;
use symm_driver::cuda::device::Device;
use symm_driver::cuda::plan::RankPlan;
use symm_driver::cuda::rendezvous::ThreadBootstrap;
use symm_driver::cuda::{self, vmm, Buffers, CudaError};
use symm_driver::host;
use symm_harness::{Options, World};

use super::data;
use super::Row;
use symm_tests::matrix::{Compare, Matrix};

/// Channels used for a size: one block for the smallest messages, two up to 256 KiB (the
/// low-latency schedules split over both), more for large ones (the teams check's split heaps
/// are sized for four channels at 1 MiB).
pub fn channels_for(bytes: u64) -> u16 {
    match bytes {
        0..=1023 => 1,
        1024..=262_143 => 2,
        262_144..=16_777_215 => 4,
        _ => 16,
    }
}

/// The matrix every GPU check runs (`symm_tests::matrix`): every collective x algorithm
/// (multicast never) at `world` x `sizes` x {f32, bf16, i32} x {sum, max}, channels by size,
/// bit exact.
pub fn hw_matrix(world: u16, sizes: &[u64]) -> Matrix {
    Matrix {
        worlds: vec![world],
        sizes: sizes.to_vec(),
        dtypes: vec![DType::F32, DType::Bf16, DType::I32],
        ops: vec![ReduceOp::Sum, ReduceOp::Max],
        multicast: false,
        shape: |r: Request| r.with_channels(channels_for(r.bytes)),
        keep: |_| true,
        inputs: data::inputs,
        compare: Compare::Exact,
    }
}

/// The shared conformance matrix (`symm_tests::matrix`) on the GPU world: every collective x
/// algorithm (multicast never) x size x dtype x operator, bit exact against `host::reference`.
pub fn matrix(
    world: &World,
    sizes: &[u64],
    dtypes: &[DType],
    ops: &[ReduceOp],
    seed: &mut u64,
) -> Row {
    let t = Instant::now();
    let mut row = Row::new("collectives x algorithms", world.world());
    let m = Matrix {
        dtypes: dtypes.to_vec(),
        ops: ops.to_vec(),
        ..hw_matrix(world.world(), sizes)
    };
    let mut backend: &World = world;
    let rep = symm_tests::matrix::run(&mut backend, &m, seed);
    row.cases = rep.cases;
    for f in rep.failures {
        row.fail(f);
    }
    if rep.stopped.is_some() {
        row.note = "stopped after a device error".into();
    }
    row.seconds = t.elapsed().as_secs_f64();
    row
}

/// Every dtype x operator x divisor, aligned and not, on random bit patterns: one Reduce op on
/// rank 0 must give `symm_core::dtype::combine`'s bits (NaN matches any NaN).
pub fn dtype_semantics(world: &World, seed: &mut u64) -> Row {
    let t = Instant::now();
    let mut row = Row::new("dtype semantics (bit exact)", world.world());
    let n = 4099u64;
    let sizes = BufferSizes {
        input: (n + 16) * 8,
        output: (n + 16) * 8,
        scratch: (n + 16) * 8,
    };
    let b = match world.alloc_sizes(sizes) {
        Ok(b) => b,
        Err(e) => {
            row.fail(format!("alloc: {e}"));
            return row;
        }
    };
    for dt in DType::ALL {
        for op in ReduceOp::ALL {
            for div in [1u32, 3] {
                for shift in [0u64, 1] {
                    row.cases += 1;
                    *seed += 1;
                    let name = format!("{} {} div {div} shift {shift}", dt.name(), op.name());
                    if let Err(e) = one_reduce(world, &b, dt, op, div, shift, n, *seed) {
                        row.fail(format!("{name}: {e}"));
                    }
                }
            }
        }
    }
    let _ = world.free(&b);
    row.seconds = t.elapsed().as_secs_f64();
    row
}

#[allow(clippy::too_many_arguments)]
fn one_reduce(
    world: &World,
    b: &cuda::Buffers,
    dt: DType,
    op: ReduceOp,
    div: u32,
    shift: u64,
    n: u64,
    seed: u64,
) -> Result<(), String> {
    let es = dt.size();
    let off = shift * es;
    let mut rng = symm_core::symbolic::Rng::new(seed);
    let mut bytes = |len: u64| (0..len).map(|_| rng.next_u64() as u8).collect::<Vec<u8>>();
    let (x, y) = (bytes(n * es), bytes(n * es));
    let e = |e: CudaError| e.to_string();
    world.write(0, b.input + off, &x).map_err(e)?;
    world.write(0, b.scratch + off, &y).map_err(e)?;
    world
        .fill(0, b.output, b.sizes.output, host::POISON)
        .map_err(e)?;
    let red = Op::Reduce {
        a: Loc::new(0, Buf::Input, off),
        b: Loc::new(0, Buf::Scratch, off),
        dst: Loc::new(0, Buf::Output, off),
        elems: n,
        dtype: dt,
        op,
        div,
    };
    let mut plans = vec![RankPlan::from_channels(&[vec![red]]).map_err(e)?];
    for _ in 1..world.world() {
        plans.push(RankPlan::from_channels(&[]).map_err(e)?);
    }
    let dev = world.user_plans(plans, &b.sizes).map_err(e)?;
    world.launch(&dev, b, false).map_err(e)?;
    world.wait().map_err(e)?;
    let got = world.read(0, b.output + off, n * es).map_err(e)?;
    let es = es as usize;
    let mut want = [0u8; 8];
    for i in 0..n as usize {
        let r = i * es..(i + 1) * es;
        combine(dt, op, div, &x[r.clone()], &y[r.clone()], &mut want[..es]);
        if got[r.clone()] != want[..es] {
            let (g, w) = (decode_f64(dt, &got[r.clone()]), decode_f64(dt, &want[..es]));
            if !(g.is_nan() && w.is_nan()) {
                return Err(format!(
                    "element {i}: gpu {:02x?} ({g}) host {:02x?} ({w})",
                    &got[r],
                    &want[..es]
                ));
            }
        }
    }
    Ok(())
}

/// A collective captured in a CUDA graph per rank and replayed `n` times on fresh inputs.
pub fn graph_replay(world: &World, n: u32, seed: &mut u64) -> Row {
    let t = Instant::now();
    let w = world.world();
    let mut row = Row::new("CUDA graph replay", w);
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        w,
        65536,
        DType::Bf16,
        ReduceOp::Sum,
    )
    .with_channels(2);
    let r = (|| -> Result<(), String> {
        let e = |e: CudaError| e.to_string();
        let b = world.alloc(&req).map_err(e)?;
        let graphs = world.capture(&req, &b).map_err(e)?;
        for i in 0..n {
            row.cases += 1;
            *seed += 1;
            let inputs = data::inputs(&req, *seed);
            let want = host::reference(&req, &inputs);
            for (r, inp) in inputs.iter().enumerate() {
                world.write(r as u16, b.input, inp).map_err(e)?;
                world
                    .fill(r as u16, b.output, b.sizes.output, host::POISON)
                    .map_err(e)?;
            }
            world.replay(&graphs).map_err(e)?;
            let found: Vec<Vec<u8>> = (0..w)
                .map(|r| world.read(r, b.output, b.sizes.output))
                .collect::<Result<_, _>>()
                .map_err(e)?;
            if let Err(m) = symm_tests::matrix::exact(&req, &found, &want) {
                row.fail(format!("replay {i}: {m}"));
            }
        }
        drop(graphs);
        world.free(&b).map_err(e)
    })();
    if let Err(m) = r {
        row.cases += 1;
        row.fail(m);
    }
    row.seconds = t.elapsed().as_secs_f64();
    row
}

/// Ops of each (rank, channel) with their indices.
/// The first difference between two traces' op streams, per (rank, channel)
/// ([`symm_driver::trace_diff`]); the number of ops compared when there is none.
pub fn semantic_diff(gpu: &[u8], sim: &[u8]) -> Result<usize, String> {
    symm_driver::trace_diff::first_difference(gpu, sim).map_err(|e| e.to_string())
}

/// The same all-reduces traced on the GPU and simulated on the host: same op sequence per
/// (rank, channel). GPU traces are written to `out`.
pub fn trace_diff(world: &World, out: &Path, seed: &mut u64) -> Row {
    let t = Instant::now();
    let w = world.world();
    let mut row = Row::new("trace diff GPU vs host", w);
    let _ = std::fs::create_dir_all(out);
    for a in [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Rhd,
    ] {
        row.cases += 1;
        let req = Request::new(
            Collective::AllReduce,
            a,
            w,
            1 << 20,
            DType::F32,
            ReduceOp::Sum,
        )
        .with_channels(2);
        *seed += 1;
        let inputs = data::inputs(&req, *seed);
        let r = (|| -> Result<usize, String> {
            let e = |e: CudaError| e.to_string();
            let b = world.alloc(&req).map_err(e)?;
            for (r, inp) in inputs.iter().enumerate() {
                world.write(r as u16, b.input, inp).map_err(e)?;
                world
                    .fill(r as u16, b.output, b.sizes.output, host::POISON)
                    .map_err(e)?;
                world
                    .fill(r as u16, b.scratch, b.sizes.scratch.max(16), host::POISON)
                    .map_err(e)?;
            }
            let plans = world.plans(&req).map_err(e)?;
            world.launch(&plans, &b, true).map_err(e)?;
            world.wait().map_err(e)?;
            let gpu = symm_harness::trace::read(world, &req, &plans).map_err(e)?;
            let found: Vec<Vec<u8>> = (0..w)
                .map(|r| world.read(r, b.output, b.sizes.output))
                .collect::<Result<_, _>>()
                .map_err(e)?;
            world.free(&b).map_err(e)?;
            symm_tests::matrix::exact(&req, &found, &host::reference(&req, &inputs))?;
            let _ = std::fs::write(
                out.join(format!("gpu-w{w}-all_reduce-{}.trace", a.name())),
                &gpu,
            );
            let sim = host::simulate(&req, &inputs, &host::SimOptions::default())
                .map_err(|e| e.to_string())?;
            semantic_diff(&gpu, &sim.trace)
        })();
        match r {
            Ok(n) => row.note = format!("{n} ops compared (last)"),
            Err(m) => row.fail(format!("{}: {m}", a.name())),
        }
    }
    row.seconds = t.elapsed().as_secs_f64();
    row
}

/// A Wait with no matching Signal must come back within the deadline, naming the slot.
pub fn selftest_timeout(devices: &[i32], deadline: Duration) -> Row {
    let t = Instant::now();
    let mut row = Row::new("selftest timeout", devices.len() as u16);
    row.cases = 1;
    let r = (|| -> Result<String, String> {
        let e = |e: CudaError| e.to_string();
        let opts = Options {
            heap_bytes: 1 << 20,
            timeout: deadline,
            ..Options::default()
        };
        let world = World::open(devices, opts).map_err(e)?;
        let (dev, b) = hang(&world).map_err(e)?;
        let start = Instant::now();
        world.launch(&dev, &b, false).map_err(e)?;
        let res = world.wait();
        let took = start.elapsed();
        match res {
            Err(
                err @ CudaError::Timeout {
                    rank: 0,
                    peer: 1,
                    expected: 1,
                    found: 0,
                    ..
                },
            ) => {
                if took > deadline + Duration::from_secs(2) {
                    return Err(format!("returned after {took:?}, deadline {deadline:?}"));
                }
                Ok(format!(
                    "{err} [after {:.2} s, deadline {:.1} s]",
                    took.as_secs_f64(),
                    deadline.as_secs_f64()
                ))
            }
            Err(other) => Err(format!("wrong error: {other}")),
            Ok(()) => Err("the broken plan completed".into()),
        }
    })();
    match r {
        Ok(m) => {
            println!("selftest-timeout: {m}");
            row.note = m;
        }
        Err(m) => row.fail(m),
    }
    row.seconds = t.elapsed().as_secs_f64();
    row
}

/// Buffers and plans in which rank 0 waits for a signal rank 1 never sends (every other rank
/// runs nothing): launched, rank 0 times out.
pub fn hang(world: &World) -> Result<(Vec<symm_driver::cuda::DevicePlan>, Buffers), CudaError> {
    let layout = symm_core::signal::SlotLayout {
        teams: 1,
        channels: 1,
        world: world.world(),
    };
    let slot = layout.index_unchecked(0, 0, SlotKind::Data, 1);
    let sizes = BufferSizes {
        input: 4096,
        output: 4096,
        scratch: 16,
    };
    let b = world.alloc_sizes(sizes)?;
    let mut plans = vec![RankPlan::from_channels(&[vec![Op::Wait {
        slot,
        count: 1,
    }]])?];
    for _ in 1..world.world() {
        plans.push(RankPlan::from_channels(&[vec![]])?);
    }
    Ok((world.user_plans(plans, &sizes)?, b))
}

/// `cycles` create/destroy cycles of a one-granule symmetric heap on every device: free memory
/// must end where it started (within a granule) with no handle, mapping or range alive.
pub fn leak_check(devices: &[i32], cycles: u32) -> Row {
    let t = Instant::now();
    let w = devices.len() as u16;
    let mut row = Row::new("VMM alloc/free leak check", w);
    row.cases = 1;
    let r = (|| -> Result<String, String> {
        let e = |e: CudaError| e.to_string();
        let devs: Vec<Device> = devices
            .iter()
            .map(|&d| Device::open(d))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        let g = vmm::granularity(&devs[0]).map_err(e)? as u64;
        let boot = ThreadBootstrap::new(w, Duration::from_secs(60));
        let cycle = |n: u32| -> Result<(), String> {
            std::thread::scope(|s| {
                let hs: Vec<_> = devs
                    .iter()
                    .enumerate()
                    .map(|(r, d)| {
                        let boot = &boot;
                        s.spawn(move || -> Result<(), CudaError> {
                            for _ in 0..n {
                                drop(vmm::SymmetricHeap::create(d, r as u16, g, boot)?);
                            }
                            d.synchronize()
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .map_err(|_| "thread panicked".to_string())?
                            .map_err(e)
                    })
                    .collect::<Result<Vec<()>, String>>()
                    .map(|_| ())
            })
        };
        cycle(1)?;
        let live_before = vmm::live();
        let before: Vec<usize> = devs
            .iter()
            .map(|d| d.mem_info().map(|m| m.0))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        cycle(cycles)?;
        let after: Vec<usize> = devs
            .iter()
            .map(|d| d.mem_info().map(|m| m.0))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        let live = vmm::live();
        let drift: Vec<i64> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| *a as i64 - *b as i64)
            .collect();
        let msg = format!("{cycles} cycles, granule {g} B, free-memory drift per device {drift:?} B, live (handles, maps, ranges) {live:?} (before {live_before:?})");
        if drift.iter().any(|d| d.unsigned_abs() > g) || live != live_before {
            return Err(msg);
        }
        Ok(msg)
    })();
    match r {
        Ok(m) => row.note = m,
        Err(m) => row.fail(m),
    }
    row.seconds = t.elapsed().as_secs_f64();
    row
}

/// The device-API example (put_signal, wait_until, barrier from a user kernel): `passes` ring
/// passes of fresh data, each checked on every rank.
pub fn device_api(world: &World, passes: u32, seed: &mut u64) -> Row {
    let t = Instant::now();
    let w = world.world();
    let mut row = Row::new("device API ring pass", w);
    let bytes = 1u64 << 20;
    let r = (|| -> Result<(), String> {
        let e = |e: CudaError| e.to_string();
        let sizes = BufferSizes {
            input: bytes,
            output: bytes,
            scratch: 4096,
        };
        let b = world.alloc_sizes(sizes).map_err(e)?;
        for r in 0..w {
            world.fill(r, b.scratch, 4096, 0).map_err(e)?;
        }
        let mut ex = symm_harness::examples::RingPass::new(world).map_err(e)?;
        for p in 0..passes {
            row.cases += 1;
            *seed += 1;
            let mut rng = symm_core::symbolic::Rng::new(*seed);
            let data: Vec<Vec<u8>> = (0..w)
                .map(|_| (0..bytes).map(|_| rng.next_u64() as u8).collect())
                .collect();
            for r in 0..w {
                world.write(r, b.input, &data[r as usize]).map_err(e)?;
                world.fill(r, b.output, bytes, host::POISON).map_err(e)?;
            }
            let a = symm_harness::examples::PassArgs {
                pad: b.scratch,
                src: b.input,
                dst: b.output,
                bytes,
                deadline_ns: 5_000_000_000,
            };
            ex.run(world, &a).map_err(e)?;
            for r in 0..w {
                let got = world.read(r, b.output, bytes).map_err(e)?;
                if got != data[((r + w - 1) % w) as usize] {
                    row.fail(format!(
                        "pass {p}: rank {r} did not receive its predecessor's data"
                    ));
                }
            }
        }
        world.free(&b).map_err(e)
    })();
    if let Err(m) = r {
        row.cases += 1;
        row.fail(m);
    }
    row.seconds = t.elapsed().as_secs_f64();
    row
}
