//! `cargo xtask demo` and `cargo xtask bench`: what each does is its usage text ([`USAGE`],
//! [`BENCH_USAGE`]).

use crate::util;
use std::fmt::Write as _;
use std::time::Instant;
use symm_core::cost::{predict, Link};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, alltoallv_capacity, Algorithm, Collective, Request, Schedule};
use symm_driver::host::{
    alltoallv_reference, compare, random_inputs, reference, simulate, simulate_streams, HostError,
    Run, SimOptions,
};

/// An all-to-allv with uneven counts: rank r sends `((r + 2q) % 5) * 2048` f32 to rank q.
fn alltoallv_run(world: u16) -> Result<(Request, Run, bool), String> {
    let w = world as u64;
    let counts: Vec<u64> = (0..w * w)
        .map(|i| ((i / w + 2 * (i % w)) % 5) * 2048)
        .collect();
    let cap = alltoallv_capacity(world, &counts).unwrap_or(0);
    let req = Request::new(
        Collective::AllToAllV,
        Algorithm::Pairwise,
        world,
        cap * 4,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(2);
    let inputs = random_inputs(&req, 7);
    let opts = SimOptions {
        contents: false,
        ..Default::default()
    };
    let make = |r, c| symm_core::sched::alltoallv(req, r, c, &counts).map_err(HostError::Sched);
    let run = simulate_streams(&req, &inputs, &opts, make).map_err(|e| format!("{req:?}: {e}"))?;
    let ok = compare(
        &req,
        &run.outputs,
        &alltoallv_reference(&req, &inputs, &counts),
    )
    .is_ok();
    Ok((req, run, ok))
}

/// A mixture-of-experts dispatch at world 4 (`symm_core::moe::sched`): 8 experts, top-2, 24
/// tokens of 512 f32 per rank, routed at random; the staging and expert rows are checked against
/// the layout (each token in its staging row on every rank it goes to, and in the expert row of
/// each of its entries there).
pub(crate) fn moe_dispatch_run() -> Result<(Request, Run, bool), String> {
    use symm_core::moe::sched::{expert_elem, stage_elem, token_elem, MoePlan, Routing};
    use symm_core::moe::{MoeConfig, NONE};
    let cfg = MoeConfig::new(4, 8, 2, 24, 512).map_err(|e| e.to_string())?;
    let mut rng = symm_core::symbolic::Rng::new(7);
    let routings = (0..cfg.world)
        .map(|_| {
            let idx: Vec<i64> = (0..24 * 2).map(|_| rng.below(8) as i64).collect();
            Routing::new(&cfg, &idx).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let plan = MoePlan::new(cfg, &routings).map_err(|e| e.to_string())?;
    let req = plan.dispatch_request();
    let inputs = random_inputs(&req, 7);
    let opts = SimOptions {
        contents: true,
        ..Default::default()
    };
    let make = |r: u16, _| Ok::<_, HostError>(plan.dispatch(r).into_iter());
    let run = simulate_streams(&req, &inputs, &opts, make).map_err(|e| format!("{req:?}: {e}"))?;
    let row = |buf: &[u8], elem: u64| buf[elem as usize * 4..(elem + 512) as usize * 4].to_vec();
    let mut ok = true;
    for q in 0..cfg.world {
        let out = &run.outputs[q as usize];
        for (p, r) in routings.iter().enumerate() {
            for t in 0..r.tokens(&cfg) {
                let slot = r.slots[t as usize * 4 + q as usize];
                if slot != NONE {
                    let token = row(&inputs[p], token_elem(&cfg, t));
                    ok &= row(out, stage_elem(&cfg, p as u16, slot)) == token;
                }
            }
        }
        for a in plan.arrivals(q) {
            let token = row(&inputs[a.sender as usize], token_elem(&cfg, a.token));
            ok &= a
                .row
                .is_some_and(|i| row(out, expert_elem(&cfg, i)) == token);
        }
    }
    Ok((req, run, ok))
}

fn collectives(world: u16) -> Vec<Collective> {
    // Core's one list, send-receive from the first rank to the last.
    Collective::ALL
        .into_iter()
        .map(|c| match c {
            Collective::SendRecv { .. } => Collective::SendRecv {
                src: 0,
                dst: world - 1,
            },
            c => c,
        })
        .collect()
}

/// Usage of `cargo xtask demo`.
pub const USAGE: &str = "usage: cargo xtask demo [--no-serve]
  runs every collective x algorithm (world 4 and 8, 256 KiB f32, two channels) and an MoE
  dispatch (world 4, top-2) on the host simulator, checks each against a sequential reference, writes one trace per run to
  <target>/symm/traces/ and prints a table; then builds the viz and serves it with those traces
  on http://127.0.0.1:8000/ (another free port, with a line saying so, when 8000 is taken) until
  interrupted.
  Building the viz installs what is missing, and says so first: the wasm32-unknown-unknown target
  (rustup target add) and wasm-bindgen-cli at the version in Cargo.lock (cargo install, into
  ~/.cargo/bin). <target> is $CARGO_TARGET_DIR when set, else target/.
  --no-serve   stop after the table (nothing is installed)";

/// Usage of `cargo xtask bench`.
pub const BENCH_USAGE: &str = "usage: cargo xtask bench
  builds the ring all-reduce plan of 8 ranks x 8 channels, 1 GiB bf16, and fails when it costs
  1 us or more per op";

/// `cargo xtask demo [--no-serve]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let Some(args) = util::command_args(args, &[("--no-serve", false)], USAGE)? else {
        return Ok(());
    };
    let dir = util::target_dir().join("symm/traces");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let t0 = Instant::now();
    println!(
        "demo: simulating every collective and algorithm at worlds 4 and 8 on the host, each \
         checked against the reference, traces into {} (about a minute)...",
        dir.display()
    );
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{:<15} {:<14} {:>5} {:>9} {:>7} {:>11} {:>11}  check",
        "collective", "algorithm", "world", "bytes", "ops", "model us", "sim us"
    );
    let (mut passed, mut failed) = (0u32, 0u32);
    for world in [4u16, 8] {
        for c in collectives(world) {
            for &a in algorithms(c) {
                let (req, run, ok) = if c == Collective::AllToAllV {
                    alltoallv_run(world)?
                } else {
                    // The low-latency algorithm takes small messages only.
                    let bytes = if a.takes(256 << 10) {
                        256 << 10
                    } else {
                        16 << 10
                    };
                    let req = Request::new(c, a, world, bytes, DType::F32, ReduceOp::Sum)
                        .with_channels(2)
                        .with_pipeline(32 << 10, 2);
                    let inputs = random_inputs(&req, 7);
                    let opts = SimOptions {
                        contents: true,
                        ..Default::default()
                    };
                    let run =
                        simulate(&req, &inputs, &opts).map_err(|e| format!("{req:?}: {e}"))?;
                    let ok = compare(&req, &run.outputs, &reference(&req, &inputs)).is_ok();
                    (req, run, ok)
                };
                (passed, failed) = (passed + u32::from(ok), failed + u32::from(!ok));
                let name = format!("{}-{}-w{world}.trace", c.name(), a.name());
                std::fs::write(dir.join(&name), &run.trace).map_err(|e| format!("{name}: {e}"))?;
                let _ = writeln!(
                    table,
                    "{:<15} {:<14} {:>5} {:>9} {:>7} {:>11.1} {:>11.1}  {}",
                    c.name(),
                    a.name(),
                    world,
                    req.bytes,
                    run.ops,
                    predict(&req, &Link::NVLINK4) - Link::NVLINK4.launch_us,
                    run.time_us - Link::NVLINK4.launch_us,
                    if ok { "pass" } else { "FAIL" }
                );
            }
        }
    }
    let (req, run, ok) = moe_dispatch_run()?;
    (passed, failed) = (passed + u32::from(ok), failed + u32::from(!ok));
    let name = "moe_dispatch-w4.trace";
    std::fs::write(dir.join(name), &run.trace).map_err(|e| format!("{name}: {e}"))?;
    let _ = writeln!(
        table,
        "{:<15} {:<14} {:>5} {:>9} {:>7} {:>11} {:>11.1}  {}",
        "moe_dispatch",
        "staging",
        req.world,
        req.bytes,
        run.ops,
        "-",
        run.time_us - Link::NVLINK4.launch_us,
        if ok { "pass" } else { "FAIL" }
    );
    print!("{table}");
    println!(
        "{passed} passed, {failed} failed ({:.1?}); traces in {}",
        t0.elapsed(),
        dir.display()
    );
    println!(
        "model us: cost::predict on NVLink 4; sim us: the simulator's virtual time on the same link \
         model (first to last event); both exclude the {} us launch, as the viewer shows them",
        Link::NVLINK4.launch_us
    );
    if failed > 0 {
        return Err(format!("{failed} runs did not match the reference"));
    }
    if args.flag("--no-serve") {
        return Ok(());
    }
    let dist = crate::viz::build()?;
    crate::viz::serve(&dist, &dir, None)
}

/// `cargo xtask bench`: schedule-building cost per op and host-backend throughput, side by side.
pub fn bench(args: &[String]) -> Result<(), String> {
    if util::command_args(args, &[], BENCH_USAGE)?.is_none() {
        return Ok(());
    }
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        8,
        1 << 30,
        DType::Bf16,
        ReduceOp::Sum,
    )
    .with_channels(8)
    .with_pipeline(512 << 10, 2);
    let t = Instant::now();
    let mut ops = 0u64;
    for rank in 0..req.world {
        for ch in 0..req.channels {
            let s = Schedule::new(req, rank, ch).map_err(|e| e.to_string())?;
            for op in s {
                std::hint::black_box(op);
                ops += 1;
            }
        }
    }
    let dt = t.elapsed();
    let per_op_ns = dt.as_nanos() as f64 / ops as f64;
    println!("ring all-reduce plan, 8 ranks x 8 channels, 1 GiB bf16: {ops} ops in {dt:.2?} = {per_op_ns:.1} ns/op (goal < 1000 ns/op)");
    if per_op_ns >= 1000.0 {
        return Err(format!("{per_op_ns:.1} ns per op is above 1 us"));
    }
    Ok(())
}
