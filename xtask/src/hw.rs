//! `cargo xtask hw`: builds `symm-bench` (the GPU checks and benchmarks) in release and runs it;
//! `--ci-checks`, the kernels' compile check that `cargo xtask test` runs, stays here.

use std::time::Instant;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::compile::Compiler;
use symm_driver::cuda::compiled;
use symm_driver::cuda::plan::RankPlan;

use crate::{codegen, util};

pub mod bundle;
mod wheel;

const USAGE: &str = "usage: cargo xtask hw [ARGS]
  builds symm-bench in release (cargo build --release -p symm-bench) and runs it with ARGS:
  `hw bench ...` runs `symm-bench bench ...`; `hw [FLAGS]` runs `symm-bench check [FLAGS]`
  (correctness on GPUs; --one-process, --bench-quick, --selftest-timeout, --all, --worlds,
  --max-bytes, --out, --leak-cycles); `symm-bench --help` says more
  --ci-checks   no GPU: plan.cuh is fresh and every kernel variant compiles with NVRTC";

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
        elf(&cubin, v.name)?;
        if bundle::shipped(&v) {
            bundle::store(&v, &cubin)?;
        }
        n += 1;
    }
    let variants_s = t.elapsed().as_secs_f64();
    // Compiled plans: generated sources of real schedules (ring, tree, one-shot, two-shot, the
    // low-latency all-reduce and all-to-all with their fused steps, the 128-byte-line all-reduce
    // and reduce-scatter, pairwise all-to-all, direct ones of 32 and 64 channels whose channels share
    // one shape) compile too, plain and
    // traced.
    let t = Instant::now();
    let mut plans = 0;
    for (coll, alg, bytes, ch) in [
        (Collective::AllReduce, Algorithm::Ring, 64 << 10, 2),
        (Collective::AllReduce, Algorithm::Tree, 4096, 1),
        (Collective::AllReduce, Algorithm::OneShot, 1024, 1),
        (Collective::AllReduce, Algorithm::TwoShot, 16 << 10, 4),
        (Collective::AllReduce, Algorithm::TwoShot, 1 << 20, 64),
        (Collective::ReduceScatter, Algorithm::Direct, 1 << 20, 32),
        (Collective::AllGather, Algorithm::Direct, 1 << 20, 32),
        (Collective::AllGather, Algorithm::Ring, 4096, 1),
        (Collective::AllToAll, Algorithm::Pairwise, 4096, 2),
        (Collective::AllReduce, Algorithm::OneShotLl, 96 << 10, 2),
        (Collective::AllToAll, Algorithm::DirectLl, 1024, 1),
        (Collective::AllReduce, Algorithm::OneShotLl128, 200 << 10, 2),
        (
            Collective::ReduceScatter,
            Algorithm::DirectLl128,
            16 << 10,
            1,
        ),
    ] {
        let req = Request::new(coll, alg, 4, bytes, DType::Bf16, ReduceOp::Sum).with_channels(ch);
        let plan = RankPlan::schedule(&req, 1).map_err(|e| e.to_string())?;
        let src = compiled::checked_source(&plan, 1, 4, &req.buffer_sizes(), 1 << 16)
            .map_err(|e| e.to_string())?;
        for defines in [
            ["SYMM_TRACE=0", "SYMM_MULTIMEM=0"],
            ["SYMM_TRACE=1", "SYMM_MULTIMEM=0"],
        ] {
            let cubin = compiler
                .compile_source("plan", "symm/compiled_plan.cu", &src, &defines, 90)
                .map_err(|e| format!("compiled {} {}: {e}", coll.name(), alg.name()))?;
            elf(&cubin, alg.name())?;
            plans += 1;
        }
    }
    let plans_s = t.elapsed().as_secs_f64();
    println!(
        "kernels: {n} variants ({variants_s:.1} s) and {plans} compiled plans ({plans_s:.1} s, \
         {:.2} s each) built for sm_90 with NVRTC {maj}.{min}; plan.cuh fresh",
        plans_s / plans.max(1) as f64
    );
    Ok(())
}

/// Fails unless NVRTC gave `what` an ELF cubin.
fn elf(cubin: &[u8], what: &str) -> Result<(), String> {
    match cubin.get(..4) {
        Some(b"\x7fELF") if cubin.len() >= 16 => Ok(()),
        _ => Err(format!("{what}: NVRTC returned no ELF cubin")),
    }
}

/// The `symm-bench` command line for `cargo xtask hw ARGS`.
fn bench_args(args: &[String]) -> Vec<String> {
    match args.first().map(String::as_str) {
        Some("bench" | "check" | "comm-rank" | "help" | "--version" | "-V") => args.to_vec(),
        _ => std::iter::once("check".to_string())
            .chain(args.iter().cloned())
            .collect(),
    }
}

/// `cargo xtask hw`.
pub fn run(args: &[String]) -> Result<(), String> {
    if matches!(args, [h] if h == "--help" || h == "-h") {
        println!("{USAGE}");
    }
    if args.iter().any(|a| a == "--ci-checks") {
        return match args {
            [_] => ci_checks(),
            _ => Err(format!("--ci-checks takes no other argument\n{USAGE}")),
        };
    }
    util::run(util::cargo().args(["build", "--release", "-p", "symm-bench"]))?;
    let exe = util::target_dir()
        .join("release")
        .join(format!("symm-bench{}", std::env::consts::EXE_SUFFIX));
    let args = if matches!(args, [h] if h == "--help" || h == "-h") {
        args.to_vec()
    } else {
        bench_args(args)
    };
    let st = symm_driver::safety_env::command(&exe)
        .args(&args)
        .status()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("symm-bench {} failed: {st}", args.join(" ")))
    }
}

#[cfg(test)]
mod tests {
    use super::bench_args;

    #[test]
    fn hw_flags_become_symm_bench_commands() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(bench_args(&[]), v(&["check"]));
        assert_eq!(
            bench_args(&v(&["--all", "--worlds", "2"])),
            v(&["check", "--all", "--worlds", "2"])
        );
        assert_eq!(
            bench_args(&v(&["bench", "--quick"])),
            v(&["bench", "--quick"])
        );
    }
}
