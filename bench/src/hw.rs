//! `symm-bench check` (`cargo xtask hw`): the checks on real GPUs and the final table.

use std::time::Instant;

use symm_core::dtype::{DType, ReduceOp};

use crate::{progress, BenchArgs, CheckArgs};

mod bench;
mod checks;
pub mod comm;
mod data;
pub mod perf;
mod safety;

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

/// `symm-bench check`.
pub fn run(a: &CheckArgs) -> Result<(), String> {
    let all = a.all;
    let bench_flag = a.bench_quick;
    let selftest_flag = a.selftest_timeout;
    let one_process = a.one_process;
    let bench_on = all || bench_flag;
    let selftest_on = all || selftest_flag;
    let moe_only = a.moe && !all;
    let det_only = a.deterministic && !all;
    let faults_only = a.faults && !all;
    let correctness =
        all || (!bench_flag && !selftest_flag && !moe_only && !det_only && !faults_only);
    let max_bytes = a.max_bytes.unwrap_or(u64::MAX);
    let cycles = a
        .leak_cycles
        .unwrap_or(if one_process { 10_000 } else { 1_000 });
    let out = a.out.clone();
    let count = symm_driver::cuda::device::device_count().map_err(|e| e.to_string())?;
    let worlds = a.worlds.clone();
    // Rank r's GPU as every rank places itself (LOCAL_RANK, or SYMM_DEVICES to share GPUs).
    let place = |w: u16| -> Option<Vec<i32>> {
        (0..w)
            .map(|r| symm_driver::cuda::comm::placement(r).ok())
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
    println!("check: {count} GPUs visible, worlds {worlds:?}");
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
            return Err(
                "this binary was built with the `multicast` feature: symm-bench refuses to run it"
                    .into(),
            );
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
                phases.extend(["correct", "deterministic", "faults", "moe", "leak", "death"]);
            } else {
                if moe_only {
                    phases.push("moe");
                }
                if det_only {
                    phases.push("deterministic");
                }
                if faults_only {
                    phases.push("faults");
                }
            }
            let p = comm::Params {
                max_bytes,
                cycles,
                out: out.clone(),
                ..comm::Params::default()
            };
            rows.extend(comm::run(w, &phases, &p));
            if bench_on {
                // The quick bench is `bench --quick`: every collective at 1 KiB, 1 MiB and
                // 256 MiB beside NCCL, one process per GPU.
                let t = Instant::now();
                let mut r = Row::new("bench --quick beside NCCL", w);
                r.cases = 1;
                let dir = out.join("bench");
                let args = BenchArgs {
                    minbytes: 1 << 10,
                    maxbytes: 256 << 20,
                    stepfactor: 4,
                    iters: 0,
                    warmup_iters: 1,
                    worlds: vec![w],
                    quick: true,
                    out: dir.clone(),
                    no_torch: true,
                    calibrate: None,
                    from_samples: false,
                    collectives: Vec::new(),
                };
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
            let opts = symm_harness::Options {
                heap_bytes: heap,
                ..Default::default()
            };
            let world = match symm_harness::World::open(&devices, opts) {
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
                let bar = progress::bar(6, &format!("world {w}, one process"));
                let step = |name: &str| {
                    bar.set_message(name.to_string());
                    bar.inc(1);
                };
                step("dtype semantics");
                rows.push(checks::dtype_semantics(&world, &mut seed));
                step("conformance matrix");
                rows.push(checks::matrix(
                    &world,
                    &sizes,
                    &[DType::F32, DType::Bf16, DType::I32],
                    &[ReduceOp::Sum, ReduceOp::Max],
                    &mut seed,
                ));
                step("graph replay");
                rows.push(checks::graph_replay(&world, 100, &mut seed));
                step("device API");
                rows.push(checks::device_api(&world, 10, &mut seed));
                step("trace diff");
                rows.push(checks::trace_diff(&world, &out, &mut seed));
                step("safety");
                rows.extend(safety::run(&world, &devices, &mut seed));
                bar.finish_and_clear();
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
    println!("check: all checks passed");
    Ok(())
}

/// Sizes of the correctness matrix (64 KiB + 2 B is rounded up to the element size).
pub(crate) const MATRIX_SIZES: [u64; 6] = [4, 1024, 65538, 1 << 20, 64 << 20, 256 << 20];

/// Heap bytes per rank for the largest request of the matrix at world `w`.
pub(crate) fn heap_for(w: u16, sizes: &[u64]) -> u64 {
    let mut most = 1u64 << 20;
    for c in symm_core::sched::collectives(w) {
        for &a in symm_core::sched::algorithms(c) {
            for &b in sizes
                .iter()
                .filter(|&&b| a.takes_on(b, checks::channels_for(b)))
            {
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
