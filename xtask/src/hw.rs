//! `cargo xtask hw`.

use std::path::PathBuf;
use std::time::Instant;

use symm_driver::cuda::compile::Compiler;

use symm_core::dtype::{DType, ReduceOp};

use crate::{codegen, util};

mod bench;
mod checks;
mod comm;
mod data;
mod perf;
mod safety;
mod wheel;

/// Checks for `cargo xtask test`: the generated header is fresh and every kernel variant compiles
/// for sm_90 with NVRTC from the pinned pip wheel (installed under target/ when missing, checked
/// by SHA-256, see [`wheel`]).
pub fn ci_checks() -> Result<(), String> {
    codegen::check()?;
    let lib = wheel::nvrtc()?;
    let t = Instant::now();
    let compiler = Compiler::load(Some(&lib)).map_err(|e| e.to_string())?;
    let (maj, min) = compiler.version();
    let mut n = 0;
    for v in symm_kernels::ALL {
        let cubin = compiler.compile(&v, 90).map_err(|e| e.to_string())?;
        if cubin.len() < 16 || &cubin[..4] != b"\x7fELF" {
            return Err(format!("{}: NVRTC returned no ELF cubin", v.name));
        }
        n += 1;
    }
    println!(
        "kernels: {n} variants compiled for sm_90 with NVRTC {maj}.{min} in {:.1} s; plan.cuh fresh",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One line of the final table.
pub struct Row {
    /// What was checked.
    pub check: String,
    /// World size.
    pub world: u16,
    /// Cases run.
    pub cases: usize,
    /// Cases failed.
    pub failed: usize,
    /// Wall seconds.
    pub seconds: f64,
    /// A remark.
    pub note: String,
}

impl Row {
    fn new(check: &str, world: u16) -> Row {
        Row {
            check: check.into(),
            world,
            cases: 0,
            failed: 0,
            seconds: 0.0,
            note: String::new(),
        }
    }

    fn fail(&mut self, why: String) {
        self.failed += 1;
        if self.failed <= 10 {
            eprintln!("FAIL [{} w{}] {why}", self.check, self.world);
        }
        if self.note.is_empty() {
            self.note = why.chars().take(100).collect();
        }
    }
}

const USAGE: &str = "usage: cargo xtask hw [--worlds 2,4] [--max-bytes N] [--out DIR] [--leak-cycles N]
                     [--one-process] [--bench-quick] [--selftest-timeout] [--all] [--ci-checks]
  (no flag)            correctness with one process per GPU, started through symm-run's launcher:
                       the conformance matrix (every collective x algorithm, multicast never, x size
                       x dtype x op) bit exact on every rank, CUDA graph replay on the caller's
                       stream, the device-API example on the Comm's heap, per-process traces merged
                       and diffed against the simulator, forced timeout / poison / reset, hostile
                       calls, the caller's context, a leak check across processes, and a rank
                       killed inside a collective (PeerLost within 2 s, memory returned)
  --one-process        every GPU driven from this process (World) instead: the same matrix plus
                       dtype semantics, graph replay, device API, trace diff, safety (buffer
                       bounds, graphs pin buffers, two launching threads, poison and reset) and
                       the VMM leak check
  --bench-quick        one process per GPU: `hw bench --quick` (every collective at 1 KiB, 1 MiB,
                       256 MiB beside NCCL in the same processes); with --one-process: all-reduce
                       from one process
  bench ...            every collective and size beside NCCL and PyTorch (`hw bench --help`)
  --selftest-timeout   a Wait with no Signal must fail within the deadline, naming the slot
  --all                correctness, bench and selftest in one run
  --max-bytes N        largest message of the matrix (default 256 MiB)
  --leak-cycles N      heap create/destroy cycles of the leak check (default 10000, 1000 per process)
  --out DIR            traces and per-rank reports (default hw-out)
  --ci-checks          no GPU: plan.cuh is fresh and every kernel variant compiles with NVRTC";

/// Flags `hw` takes, and whether each takes a value.
const FLAGS: [(&str, bool); 10] = [
    ("--worlds", true),
    ("--max-bytes", true),
    ("--out", true),
    ("--leak-cycles", true),
    ("--one-process", false),
    ("--bench-quick", false),
    ("--selftest-timeout", false),
    ("--all", false),
    ("--ci-checks", false),
    ("--help", false),
];

fn check_flags(args: &[String]) -> Result<(), String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match FLAGS.iter().find(|(f, _)| f == a) {
            Some((_, true)) => {
                if it.next().is_none() {
                    return Err(format!("{a} needs a value\n{USAGE}"));
                }
            }
            Some((_, false)) => {}
            None => return Err(format!("unknown argument {a:?}\n{USAGE}")),
        }
    }
    Ok(())
}

/// `cargo xtask hw`.
pub fn run(args: &[String]) -> Result<(), String> {
    // Before anything loads NCCL (the bench, the ranks) or starts a program that may: NCCL's
    // loader refuses without these, and every child inherits them.
    // SAFETY: `cargo xtask hw` reaches here from `main` before it starts any thread.
    unsafe { symm_driver::safety_env::set_for_process() }
        .map_err(|e| format!("cargo xtask hw refuses to run: {e}"))?;
    if args.first().map(String::as_str) == Some("comm-rank") {
        return comm::rank(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("bench") {
        return perf::run(&args[1..]);
    }
    if util::flag(args, "--help") || util::flag(args, "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    check_flags(args)?;
    if util::flag(args, "--ci-checks") {
        return ci_checks();
    }
    let all = util::flag(args, "--all");
    let bench_flag = util::flag(args, "--bench-quick");
    let selftest_flag = util::flag(args, "--selftest-timeout");
    let one_process = util::flag(args, "--one-process");
    let bench_on = all || bench_flag;
    let selftest_on = all || selftest_flag;
    let correctness = all || (!bench_flag && !selftest_flag);
    let max_bytes: u64 = util::value(args, "--max-bytes")
        .map_or(Ok(u64::MAX), |v| v.parse())
        .map_err(|e| format!("--max-bytes: {e}"))?;
    let cycles: u32 = util::value(args, "--leak-cycles")
        .map_or(Ok(if one_process { 10_000 } else { 1_000 }), |v| v.parse())
        .map_err(|e| format!("--leak-cycles: {e}"))?;
    let out = PathBuf::from(util::value(args, "--out").unwrap_or("hw-out"));
    let count = symm_driver::cuda::device::device_count().map_err(|e| e.to_string())?;
    let worlds: Vec<u16> = match util::value(args, "--worlds") {
        Some(v) => v
            .split(',')
            .map(|x| x.parse().map_err(|e| format!("--worlds: {e}")))
            .collect::<Result<_, _>>()?,
        None => vec![2, 4],
    };
    // Rank r's GPU as every rank places itself (LOCAL_RANK, or SYMM_DEVICES to share GPUs).
    let place = |w: u16| -> Option<Vec<i32>> {
        (0..w)
            .map(|r| symm_driver::cuda::Comm::placement(r).ok())
            .collect()
    };
    let worlds: Vec<u16> = worlds
        .into_iter()
        .filter(|&w| w >= 2 && place(w).is_some())
        .collect();
    if worlds.is_empty() {
        return Err(format!(
            "{count} GPU(s) visible: need at least 2, or SYMM_DEVICES=mod to share them"
        ));
    }
    println!("hw: {count} GPUs visible, worlds {worlds:?}");
    let mut rows = Vec::new();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut bench_lines = Vec::new();
    {
        // Binaries for the shared GPU machines never contain the multicast binding.
        let mut r = Row::new("multicast: not compiled", 0);
        r.cases = 1;
        if symm_driver::cuda::multicast::COMPILED {
            return Err("this binary was built with the `multicast` feature: cargo xtask hw refuses to run it".into());
        }
        match symm_driver::cuda::multicast::guard() {
            Err(e) => r.note = format!("no `multicast` feature; the guard refuses: {e}"),
            Ok(()) => r.fail("the multicast guard allowed multicast".into()),
        }
        println!("multicast: not compiled");
        rows.push(r);
    }
    for &w in &worlds {
        let devices: Vec<i32> = place(w).unwrap_or_default();
        if !one_process {
            let mut phases = Vec::new();
            if correctness {
                phases.extend(["correct", "leak", "death"]);
            }
            let p = comm::Params {
                max_bytes,
                cycles,
                out: out.clone(),
            };
            rows.extend(comm::run(w, &phases, &p));
            if bench_on {
                // The quick bench is `hw bench --quick`: every collective at 1 KiB, 1 MiB and
                // 256 MiB beside NCCL, one process per GPU.
                let t = Instant::now();
                let mut r = Row::new("bench --quick beside NCCL", w);
                r.cases = 1;
                let dir = out.join("bench");
                let args: Vec<String> =
                    ["--worlds", &w.to_string(), "--quick", "--no-torch", "--out"]
                        .iter()
                        .map(|x| x.to_string())
                        .chain([dir.display().to_string()])
                        .collect();
                match perf::run(&args) {
                    Ok(()) => r.note = format!("tables and plots in {}", dir.display()),
                    Err(m) => r.fail(m),
                }
                r.seconds = t.elapsed().as_secs_f64();
                rows.push(r);
            }
        }
        if one_process && (correctness || bench_on) {
            let sizes: Vec<u64> = MATRIX_SIZES
                .iter()
                .copied()
                .filter(|&b| b <= max_bytes)
                .collect();
            let mut heap = if correctness { heap_for(w, &sizes) } else { 0 };
            if bench_on {
                // 256 MiB in and out plus the largest scratch of the timed algorithms.
                heap = heap.max((512 << 20) + (64 << 20));
            }
            let t = Instant::now();
            let opts = symm_driver::cuda::Options {
                heap_bytes: heap,
                ..Default::default()
            };
            let world = match symm_driver::cuda::World::open(&devices, opts) {
                Ok(x) => x,
                Err(e) => {
                    let mut r = Row::new("open world", w);
                    r.cases = 1;
                    r.fail(e.to_string());
                    rows.push(r);
                    continue;
                }
            };
            let c = &world.compile;
            println!(
                "world {w}: {:?}; heap {} MiB/rank; NVRTC {}.{} sm_{} driver {} ({} of 2 kernels cached, {:.1} s)",
                world.device_names(),
                world.stride() >> 20,
                c.nvrtc.0,
                c.nvrtc.1,
                c.arch,
                c.driver,
                c.cached,
                t.elapsed().as_secs_f64()
            );
            if let Some(why) = &c.uncached {
                println!("world {w}: kernel cache not used: {why}");
            }
            if correctness {
                rows.push(checks::dtype_semantics(&world, &mut seed));
                rows.push(checks::matrix(
                    &world,
                    &sizes,
                    &[DType::F32, DType::Bf16, DType::I32],
                    &[ReduceOp::Sum, ReduceOp::Max],
                    &mut seed,
                ));
                rows.push(checks::graph_replay(&world, 100, &mut seed));
                rows.push(checks::device_api(&world, 10, &mut seed));
                rows.push(checks::trace_diff(&world, &out, &mut seed));
                rows.extend(safety::run(&world, &devices, &mut seed));
            }
            if bench_on {
                bench_lines.push((w, bench::run(&world, &mut seed)));
            }
        }
        if one_process && correctness {
            rows.push(checks::leak_check(&devices, cycles));
        }
        if selftest_on {
            rows.push(checks::selftest_timeout(
                &devices,
                std::time::Duration::from_secs(2),
            ));
        }
    }
    for (w, lines) in &bench_lines {
        bench::print(*w, lines);
    }
    println!("\n| check | world | cases | failed | seconds | note |");
    println!("|---|---|---|---|---|---|");
    let mut failed = 0;
    for r in &rows {
        failed += r.failed;
        println!(
            "| {} | {} | {} | {} | {:.1} | {} |",
            r.check,
            if r.world == 0 {
                "-".to_string()
            } else {
                r.world.to_string()
            },
            r.cases,
            r.failed,
            r.seconds,
            r.note.replace('|', "/")
        );
    }
    if failed > 0 {
        return Err(format!("{failed} failure(s)"));
    }
    println!("hw: all checks passed");
    Ok(())
}

/// Sizes of the correctness matrix (64 KiB + 2 B is rounded up to the element size).
pub(crate) const MATRIX_SIZES: [u64; 6] = [4, 1024, 65538, 1 << 20, 64 << 20, 256 << 20];

/// Heap bytes per rank for the largest request of the matrix at world `w`.
pub(crate) fn heap_for(w: u16, sizes: &[u64]) -> u64 {
    let mut most = 1u64 << 20;
    for c in symm_core::sched::collectives(w) {
        for &a in symm_core::sched::algorithms(c) {
            for &b in sizes.iter().filter(|&&b| a.takes(b)) {
                let req = symm_core::sched::Request::new(
                    c,
                    a,
                    w,
                    b.div_ceil(8) * 8,
                    DType::F32,
                    ReduceOp::Sum,
                )
                .with_channels(checks::channels_for(b));
                let s = req.buffer_sizes();
                most = most.max(s.input + s.output + s.scratch + 3 * 4096);
            }
        }
    }
    most + (8 << 20)
}
