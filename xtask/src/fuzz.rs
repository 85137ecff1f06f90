//! `cargo xtask fuzz [--seconds N]`: runs every cargo-fuzz target for N seconds each.
//!
//! Installs `cargo-fuzz` from crates.io when it is missing and runs with `-s none` (no sanitizer),
//! which works on a stable toolchain. New findings land in `fuzz/artifacts/`; the committed seed
//! corpora in `fuzz/corpus/` are replayed by `cargo xtask test` (tests/tests/fuzz_corpus.rs).

use crate::util::{self, cargo, run as sh};

const TARGETS: [&str; 4] = [
    "trace_decode",
    "trace_pipeline",
    "heap_ops",
    "sched_request",
];

/// Runs every target.
pub fn run(args: &[String]) -> Result<(), String> {
    let secs: u64 = util::value(args, "--seconds")
        .map(|s| s.parse().map_err(|e| format!("--seconds: {e}")))
        .transpose()?
        .unwrap_or(10);
    let have =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["fuzz", "--version"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !have {
        sh(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    for t in TARGETS {
        // Fuzz a scratch copy of the corpus so runs do not rewrite the committed seeds.
        let work = util::root().join("target/fuzz-corpus").join(t);
        std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
        let seeds = util::root().join("fuzz/corpus").join(t);
        sh(cargo()
            .args(["fuzz", "run", "-s", "none", t])
            .arg(&work)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={secs}"))
            .arg("-rss_limit_mb=4096"))?;
        println!("fuzz {t}: {secs} s, no findings");
    }
    Ok(())
}
