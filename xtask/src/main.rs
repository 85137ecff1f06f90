//! `cargo xtask ...`: the one command-line entry point of symm.
#![forbid(unsafe_code)]

mod codegen;
mod demo;
mod fuzz;
mod hw;
mod lab;
mod mutants;
mod python;
mod test;
mod trace;
mod util;
mod viz;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command> [options]
       cargo xtask <command> --help      (or: cargo xtask help <command>)

commands:
  demo [--no-serve]          run every collective x algorithm on the host backend, write traces,
                             build and serve the viz
  test [--no-browser]        everything CI runs
  fuzz [--seconds N] [--runs N] [--target T] [--jobs N] [--merge]
                             run every fuzz target for N seconds (default 10)
  bench                      the plan-building benchmark
  lab [N | check N [--solution] | view N | grade]
                             the teaching labs: list, show, grade, view in the viz
  viz [--serve [--port N] [--traces DIR]] [--test] [--screenshots]
                             build the browser replayer into viz/dist
  trace export --perfetto FILE [-o OUT]
                             convert a trace to Chrome/Perfetto JSON
  mutants                    weaken each ordering of the signal protocol to Relaxed, one at a
                             time, and check that the loom models catch every one
  python                     build the Python package's abi3 wheel in <target>/py-venv, install
                             it, run ruff and its pytest suite
  codegen [--check]          regenerate (or check) kernels/symm/plan.cuh from symm-core
  hw [--bench-quick] [--selftest-timeout] [...]
                             on a GPU machine: correctness and benchmarks on real GPUs
";

/// Runs subcommand `cmd` with its arguments.
fn dispatch(cmd: &str, rest: &[String]) -> Result<(), String> {
    match cmd {
        "demo" => demo::run(rest),
        "test" => test::run(rest),
        "fuzz" => fuzz::run(rest),
        "bench" => demo::bench(rest),
        "viz" => viz::run(rest),
        "trace" => trace::run(rest),
        "codegen" => codegen::run(rest),
        "hw" => hw::run(rest),
        "mutants" => mutants::run(rest),
        "lab" => lab::run(rest),
        "python" => python::run(rest),
        "help" | "--help" | "-h" => match rest.first().map(String::as_str) {
            Some(c) if !matches!(c, "help" | "--help" | "-h") => {
                dispatch(c, &["--help".to_string()])
            }
            _ => {
                print!("{USAGE}");
                Ok(())
            }
        },
        other => Err(format!("unknown command {other:?}\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::FAILURE;
    };
    let result = dispatch(cmd, &args[1..]);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
