//! `cargo xtask hw bench`: every collective at every size, one process per GPU, symm beside
//! NCCL (same processes, same buffers, same streams) and PyTorch SymmetricMemory (when torch is
//! importable), eager and in CUDA graphs, in one run.
//!
//! The parent starts the ranks through the launcher (phase `perf`, [`rank`]); rank 0 writes its
//! samples to `OUT/perf-samples.tsv`. When `python3 -c "import torch"` works, the parent then
//! runs the project's own PyTorch script (`xtask/py/torch_bench.py`, one-shot and two-shot
//! all-reduce and NCCL through torch, eager and in a graph) with `torch.distributed.run` in the
//! same machine call. [`report`] prints the nccl-tests columns (size count type redop root time
//! algbw busbw #wrong) per system, writes a JSON record and SVG plots of time and bus bandwidth
//! against size (one line per system) to `--out` (default `docs/perf`).

mod profile;
pub(super) mod rank;
mod report;

use std::path::{Path, PathBuf};
use std::time::Instant;
use symm_driver::safety_env;

use crate::util;

/// The collectives measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    /// The device API's put (kernel, or the copy engine) of `size` bytes to the next rank.
    Put,
    /// One signal from one rank to another, one way (`size`: the 8-byte slot).
    Signal,
}

/// Everything the report shows, in order.
pub(super) const REPORTED: [Kind; 7] = [
    Kind::AllReduce,
    Kind::AllGather,
    Kind::ReduceScatter,
    Kind::AllToAll,
    Kind::Broadcast,
    Kind::Put,
    Kind::Signal,
];

/// Every collective, in report order.
pub(super) const COLLECTIVES: [Kind; 5] = [
    Kind::AllReduce,
    Kind::AllGather,
    Kind::ReduceScatter,
    Kind::AllToAll,
    Kind::Broadcast,
];

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllToAll => "alltoall",
            Kind::Broadcast => "broadcast",
            Kind::Put => "put",
            Kind::Signal => "signal",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        REPORTED.into_iter().find(|k| k.name() == s)
    }

    /// nccl-tests' bus-bandwidth factor at `world` ranks.
    pub(super) fn bus_factor(self, world: u16) -> f64 {
        let n = world as f64;
        match self {
            Kind::AllReduce => 2.0 * (n - 1.0) / n,
            Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => (n - 1.0) / n,
            Kind::Broadcast | Kind::Put | Kind::Signal => 1.0,
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Sample {
    pub kind: Kind,
    /// nccl-tests size in bytes.
    pub size: u64,
    /// "symm", "nccl", "torch-one-shot", ...
    pub system: String,
    /// "eager" or "graph".
    pub mode: String,
    /// Microseconds per operation (slowest rank).
    pub us: f64,
    /// Elements that differ from the reference (`u64::MAX`: not checked).
    pub wrong: u64,
    /// What ran (algorithm and channels for symm).
    pub label: String,
}

impl Sample {
    pub(super) fn new(
        kind: Kind,
        size: u64,
        system: &str,
        mode: &str,
        us: f64,
        wrong: u64,
        label: &str,
    ) -> Sample {
        Sample {
            kind,
            size,
            system: system.into(),
            mode: mode.into(),
            us,
            wrong,
            label: label.into(),
        }
    }

    fn line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{:.3}\t{}\t{}",
            self.kind.name(),
            self.size,
            self.system,
            self.mode,
            self.us,
            self.wrong,
            self.label
        )
    }

    fn parse(l: &str) -> Option<Sample> {
        let f: Vec<&str> = l.split('\t').collect();
        let [k, size, system, mode, us, wrong, label] = f[..] else {
            return None;
        };
        Some(Sample {
            kind: Kind::parse(k)?,
            size: size.parse().ok()?,
            system: system.into(),
            mode: mode.into(),
            us: us.parse().ok()?,
            wrong: wrong.parse().ok()?,
            label: label.into(),
        })
    }
}

/// Usage of `cargo xtask hw bench`.
pub const USAGE: &str =
    "usage: cargo xtask hw bench [--worlds 2] [--quick] [--out DIR] [--no-torch]
  every collective (all-reduce, all-gather, reduce-scatter, all-to-all, broadcast; bf16, sum) at
  1 KiB .. 1 GiB in x4 steps, one process per GPU: symm (best of its candidates) beside NCCL in the
  same processes on the same buffers, eager and in CUDA graphs, and PyTorch SymmetricMemory
  one-shot / two-shot all-reduce when torch is importable; prints nccl-tests columns and writes
  bench-wN.json and SVG plots to DIR (default docs/perf)
  --quick      sizes 1 KiB, 1 MiB, 256 MiB only
  --no-torch   skip the PyTorch script
  --calibrate FILE
               also try a quarter and four times the default channels, and write the fastest
               (algorithm, channels) per collective and size as symm-core's calibration table
               (commit it as core/src/cost/calibration.rs; cost::tune reads it)";

/// The sizes of a run.
fn sizes(quick: bool) -> Vec<u64> {
    if quick {
        vec![1 << 10, 1 << 20, 256 << 20]
    } else {
        (0..11).map(|i| 1u64 << (10 + 2 * i)).collect()
    }
}

/// `cargo xtask hw bench ...`.
pub fn run(args: &[String]) -> Result<(), String> {
    let Some(a) = util::command_args(
        args,
        &[
            ("--worlds", true),
            ("--quick", false),
            ("--out", true),
            ("--no-torch", false),
            ("--calibrate", true),
        ],
        USAGE,
    )?
    else {
        return Ok(());
    };
    let out = PathBuf::from(a.value("--out").unwrap_or("docs/perf"));
    let quick = a.flag("--quick");
    let cal = a.value("--calibrate").map(PathBuf::from);
    let worlds: Vec<u16> = a
        .value("--worlds")
        .unwrap_or("2")
        .split(',')
        .map(|x| x.parse().map_err(|e| format!("--worlds: {e}")))
        .collect::<Result<_, _>>()?;
    let count = symm_driver::cuda::device::device_count().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for w in worlds {
        if w < 2 || w as i32 > count {
            println!("bench: world {w} skipped ({count} GPUs visible)");
            continue;
        }
        let t = Instant::now();
        let p = super::comm::Params {
            max_bytes: *sizes(quick).last().unwrap_or(&0),
            cycles: 0,
            out: out.clone(),
        };
        let phase = match (quick, cal.is_some()) {
            (true, true) => "perf-quick-cal",
            (true, false) => "perf-quick",
            (false, true) => "perf-cal",
            (false, false) => "perf",
        };
        let code = super::comm::launch(w, phase, &p)?;
        if code != 0 {
            return Err(format!("the bench job exited {code}"));
        }
        let text = std::fs::read_to_string(out.join("perf-samples.tsv"))
            .map_err(|e| format!("rank 0 wrote no samples: {e}"))?;
        let mut samples: Vec<Sample> = text.lines().filter_map(Sample::parse).collect();
        println!(
            "bench: {} symm/NCCL samples at world {w} in {:.0} s",
            samples.len(),
            t.elapsed().as_secs_f64()
        );
        if !a.flag("--no-torch") {
            match torch(w, &sizes(quick), &out) {
                Ok(s) => samples.extend(s),
                Err(m) => println!("bench: PyTorch not measured: {m}"),
            }
        }
        report::write(w, &samples, &out)?;
        let _ = std::fs::remove_file(out.join("perf-samples.tsv"));
        for r in 0..w {
            let _ = std::fs::remove_file(out.join(format!("{phase}-rank{r}.tsv")));
        }
        if let Some(path) = &cal {
            let text = report::calibration(w, &samples);
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            println!("bench: calibration table written to {}", path.display());
        }
    }
    Ok(())
}

/// The child's part: measures and (rank 0) writes the samples.
pub(super) fn rank_main(phase: &str, out: &Path) -> Result<String, String> {
    let (samples, profile) = rank::run(&sizes(phase.contains("quick")), phase.contains("cal"))?;
    let rank0 = std::env::var("RANK").as_deref() == Ok("0");
    if rank0 {
        let text: String = samples.iter().map(|s| s.line() + "\n").collect();
        std::fs::write(out.join("perf-samples.tsv"), text).map_err(|e| e.to_string())?;
        let w = std::env::var("WORLD_SIZE").unwrap_or_default();
        std::fs::write(out.join(format!("profile-w{w}.md")), profile).map_err(|e| e.to_string())?;
    }
    Ok(format!("{} samples", samples.len()))
}

/// Runs the PyTorch script with `torch.distributed.run` and parses its samples.
fn torch(world: u16, sizes: &[u64], out: &Path) -> Result<Vec<Sample>, String> {
    let ok = safety_env::command("python3")
        .args(["-c", "import torch, torch.distributed"])
        .status()
        .map_err(|e| format!("python3: {e}"))?;
    if !ok.success() {
        return Err("torch is not importable".into());
    }
    let script = out.join("torch_bench.py");
    std::fs::write(&script, TORCH_SCRIPT).map_err(|e| e.to_string())?;
    let sizes: Vec<String> = sizes.iter().map(u64::to_string).collect();
    let o = safety_env::command("python3")
        .args([
            "-m",
            "torch.distributed.run",
            &format!("--nproc_per_node={world}"),
        ])
        .arg(&script)
        .arg(sizes.join(","))
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&script);
    let text = String::from_utf8_lossy(&o.stdout);
    let samples: Vec<Sample> = text
        .lines()
        .filter_map(|l| l.strip_prefix("SAMPLE\t"))
        .filter_map(Sample::parse)
        .collect();
    if samples.is_empty() {
        let err = String::from_utf8_lossy(&o.stderr);
        let tail: String = err.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(format!("the script gave no samples: {tail}"));
    }
    Ok(samples)
}

/// The project's PyTorch script.
const TORCH_SCRIPT: &str = include_str!("../../../py/torch_bench.py");
