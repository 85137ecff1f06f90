//! `cargo xtask ...`: the one command-line entry point of symm.

mod codegen;
mod demo;
mod fuzz;
mod hw;
mod mutants;
mod test;
mod trace;
mod util;
mod viz;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command> [options]

commands:
  demo [--no-serve]          run every collective x algorithm on the host backend, write traces,
                             build and serve the viz
  test                       everything CI runs
  fuzz [--seconds N]         run every fuzz target for N seconds (default 10)
  bench                      schedule-building and host-backend benchmarks
  viz [--serve]              build the browser replayer into viz/dist
  trace export --perfetto FILE [-o OUT]
                             convert a trace to Chrome/Perfetto JSON
  mutants                    weaken each ordering of the signal protocol to Relaxed, one at a
                             time, and check that the loom models catch every one
  codegen [--check]          regenerate (or check) kernels/symm/plan.cuh from symm-core
  hw [--bench-quick] [--selftest-timeout]
                             on a GPU machine: correctness and benchmarks on real GPUs
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::FAILURE;
    };
    let rest = &args[1..];
    let result = match cmd.as_str() {
        "demo" => demo::run(rest),
        "test" => test::run(rest),
        "fuzz" => fuzz::run(rest),
        "bench" => demo::bench(rest),
        "viz" => viz::run(rest),
        "trace" => trace::run(rest),
        "codegen" => codegen::run(rest),
        "hw" => hw::run(rest),
        "mutants" => mutants::run(rest),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command {other:?}\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
