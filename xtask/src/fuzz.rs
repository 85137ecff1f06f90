//! `cargo xtask fuzz`: fuzz campaigns (see [`USAGE`]), with `-s none` (no sanitizer), which
//! works on a stable toolchain. Each campaign fuzzes a scratch copy of the committed corpus
//! (`<target>/fuzz-corpus/`), so runs never rewrite the seeds; a crash, timeout or out-of-memory
//! input lands in `fuzz/artifacts/<target>/` and counts as a crash. `cargo xtask test` replays
//! the committed seeds (`tests/tests/fuzz_corpus.rs`).

use crate::util::{self, cargo, run as sh};
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

const TARGETS: [&str; 4] = [
    "trace_decode",
    "trace_pipeline",
    "heap_ops",
    "sched_request",
];

/// Findings in a target's artifact folder.
fn artifacts(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    ["crash-", "oom-", "timeout-", "leak-"]
                        .iter()
                        .any(|p| n.starts_with(p))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The number after `key` in libFuzzer's final statistics (`stat::number_of_executed_units: N`).
fn stat(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|v| v.trim_start_matches(':').trim().parse().ok())
}

/// Usage of `cargo xtask fuzz`.
pub const USAGE: &str =
    "usage: cargo xtask fuzz [--seconds N] [--runs N] [--target T] [--jobs N] [--merge]
  runs each cargo-fuzz target (trace_decode, trace_pipeline, heap_ops, sched_request) on a scratch
  copy of its committed corpus and prints executions and crashes per target; fails on a crash.
  Installs cargo-fuzz from crates.io (cargo install, into ~/.cargo/bin) when it is missing.
  --seconds N   seconds per target (default 10)
  --runs N      stop a target after N executions
  --target T    only this target
  --jobs N      libFuzzer -fork=N
  --merge       add the scratch corpus's new coverage to fuzz/corpus/ (minimised)";

const FLAGS: &util::Flags = &[
    ("--seconds", true),
    ("--runs", true),
    ("--target", true),
    ("--jobs", true),
    ("--merge", false),
];

/// Runs every target.
pub fn run(args: &[String]) -> Result<(), String> {
    let Some(args) = util::command_args(args, FLAGS, USAGE)? else {
        return Ok(());
    };
    let secs = args.num::<u64>("--seconds")?.unwrap_or(10);
    let runs = args.num::<u64>("--runs")?;
    let jobs = args.num::<u64>("--jobs")?.unwrap_or(1).max(1);
    let only = args.value("--target");
    if let Some(t) = only {
        if !TARGETS.contains(&t) {
            return Err(format!(
                "unknown target {t:?}; targets: {}",
                TARGETS.join(", ")
            ));
        }
    }
    let have = util::cargo_with("fuzz --version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!(
            "fuzz: installing cargo-fuzz from crates.io with `cargo install` (into ~/.cargo/bin)"
        );
        sh(&mut util::cargo_with("install cargo-fuzz --locked"))?;
    }
    let root = util::root();
    let mut rows = Vec::new();
    for t in TARGETS.iter().filter(|t| only.is_none_or(|o| o == **t)) {
        // Fuzz a scratch copy of the corpus so runs do not rewrite the committed seeds.
        let work = util::target_dir().join("fuzz-corpus").join(t);
        std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
        let seeds = root.join("fuzz/corpus").join(t);
        let art = root.join("fuzz/artifacts").join(t);
        let before = artifacts(&art);
        let mut cmd = cargo();
        cmd.current_dir(&root)
            .args(["fuzz", "run", "--release", "-s", "none", t])
            .arg(&work)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={secs}"))
            .arg("-rss_limit_mb=4096")
            .arg("-print_final_stats=1")
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped());
        if let Some(n) = runs {
            cmd.arg(format!("-runs={n}"));
        }
        if jobs > 1 {
            cmd.arg(format!("-fork={jobs}")).arg("-ignore_crashes=1");
        }
        eprintln!("$ {cmd:?}");
        let t0 = Instant::now();
        let out = cmd.output().map_err(|e| format!("cargo fuzz: {e}"))?;
        let took = t0.elapsed().as_secs_f64();
        let err = String::from_utf8_lossy(&out.stderr);
        // Keep libFuzzer's last lines visible (the final stats, or the crash report).
        for l in err
            .lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            eprintln!("  {l}");
        }
        let execs = stat(&err, "stat::number_of_executed_units")
            .or_else(|| {
                // Fork mode and crash reports print `#N ...` progress lines instead.
                err.lines()
                    .filter_map(|l| l.strip_prefix('#'))
                    .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                    .max()
            })
            .unwrap_or(0);
        let found: Vec<String> = artifacts(&art)
            .into_iter()
            .filter(|a| !before.contains(a))
            .collect();
        let crashed = found.len() as u64 + u64::from(!out.status.success() && found.is_empty());
        for f in &found {
            eprintln!("  finding: {}", art.join(f).display());
        }
        // libFuzzer's own clock ("Done N runs in S second(s)"), without the build.
        let fuzzed = err
            .lines()
            .find_map(|l| {
                let rest = l.trim().strip_prefix("Done ")?;
                let (_, secs) = rest.split_once(" runs in ")?;
                secs.split_whitespace().next()?.parse::<f64>().ok()
            })
            .unwrap_or(took);
        rows.push((*t, fuzzed, execs, crashed));
        if args.flag("--merge") {
            sh(cargo()
                .current_dir(&root)
                .args(["fuzz", "run", "--release", "-s", "none", t])
                .arg(&seeds)
                .arg(&work)
                .arg("--")
                .arg("-merge=1"))?;
        }
    }
    println!(
        "\n{:<16} {:>9} {:>14} {:>10} {:>8}",
        "target", "seconds", "executions", "exec/s", "crashes"
    );
    for (t, took, execs, crashes) in &rows {
        println!(
            "{t:<16} {took:>9.0} {execs:>14} {:>10.0} {crashes:>8}",
            *execs as f64 / took.max(1e-9)
        );
    }
    let crashes: u64 = rows.iter().map(|r| r.3).sum();
    if crashes > 0 {
        return Err(format!(
            "{crashes} crash(es); inputs in fuzz/artifacts/ (replay with `cargo fuzz run -s none TARGET FILE`)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_final_stats() {
        let text =
            "#1024 pulse cov: 10\nstat::number_of_executed_units: 123456\nstat::peak_rss_mb: 40\n";
        assert_eq!(stat(text, "stat::number_of_executed_units"), Some(123456));
        assert_eq!(stat(text, "stat::missing"), None);
    }
}
