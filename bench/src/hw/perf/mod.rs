//! `symm-bench bench` (`cargo xtask hw bench`): every collective at every size, one process per GPU, symm beside
//! NCCL (same processes, same buffers, same streams) and PyTorch SymmetricMemory (when torch is
//! importable), eager and in CUDA graphs, in one run.
//!
//! The parent starts the ranks through the launcher (phase `perf`, [`rank`]); rank 0 writes its
//! samples to `OUT/perf-samples.tsv`. When `python3 -c "import torch"` works, the parent then
//! runs the project's own PyTorch script (`bench/py/torch_bench.py`, one-shot and two-shot
//! all-reduce and NCCL through torch, eager and in a graph) with `torch.distributed.run` in the
//! same machine call. [`report`] prints the nccl-tests columns (size count type redop root time
//! algbw busbw #wrong) per system, writes a JSON record and SVG plots of time and bus bandwidth
//! against size (one line per system) and symm's ratio to the best peer to `--out` (default
//! `docs/perf`). Every sample, the calibration's candidates included, also goes to
//! `samples-wN.tsv` there: a run with `--collectives` measures only those and keeps the others'
//! samples from that file, so a run too long for one machine call splits into several whose
//! last writes tables, plots and calibration of every collective.

mod fit;
mod plot;
mod profile;
pub(super) mod rank;
mod report;

use std::path::Path;
use std::time::Instant;
use symm_driver::safety_env;

use super::comm::Params;
use crate::{progress, BenchArgs};

/// The system of the calibration run's samples of every candidate (algorithm, channels), beside
/// the fastest one's `symm` sample: the link fit's input, kept out of the tables and plots.
pub(super) const CANDIDATE: &str = "symm-candidate";

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
            us: us
                .parse()
                .ok()
                .filter(|u: &f64| u.is_finite() && *u >= 0.0)?,
            wrong: wrong.parse().ok()?,
            label: label.into(),
        })
    }
}

/// The collectives named (every one when none is), or which name is unknown.
pub(super) fn selected(names: &[String]) -> Result<Vec<Kind>, String> {
    if names.is_empty() {
        return Ok(COLLECTIVES.to_vec());
    }
    let mut kinds = Vec::new();
    for n in names {
        match Kind::parse(n.trim()).filter(|k| COLLECTIVES.contains(k)) {
            Some(k) if !kinds.contains(&k) => kinds.push(k),
            Some(_) => {}
            None => {
                let known: Vec<&str> = COLLECTIVES.iter().map(|k| k.name()).collect();
                return Err(format!(
                    "unknown collective {n:?}: choose from {}",
                    known.join(", ")
                ));
            }
        }
    }
    Ok(kinds)
}

/// The samples of an earlier run into the same directory (`samples-wN.tsv`) that this run
/// does not measure again: those of the collectives not in `kinds` (the device API's are
/// measured by every run). Lines that do not parse are skipped.
fn earlier(path: &Path, kinds: &[Kind]) -> Vec<Sample> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(Sample::parse)
        .filter(|s| COLLECTIVES.contains(&s.kind) && !kinds.contains(&s.kind))
        .collect()
}

/// `symm-bench bench ...`.
pub fn run(a: &BenchArgs) -> Result<(), String> {
    if a.from_samples {
        return from_samples(a);
    }
    let out = a.out.clone();
    let sizes = a.sizes();
    if sizes.is_empty() {
        return Err(format!(
            "no sizes between -b {} and -e {}",
            a.minbytes, a.maxbytes
        ));
    }
    let kinds = selected(&a.collectives)?;
    let names: Vec<String> = kinds.iter().map(|k| k.name().to_string()).collect();
    let cal = a.calibrate.clone();
    let count = symm_driver::cuda::device::device_count().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let bar = progress::bar(a.worlds.len() as u64, "bench");
    if cfg!(feature = "binary-reduce") {
        bar.println(
            "bench: a binary-reduce build: every direct reduction is a chain of binary reduces, \
             not one k-way reduce (the measurement of what the k-way reduce gains)",
        );
    }
    for &w in &a.worlds {
        // More ranks than GPUs only where the ranks are placed on shared GPUs.
        let shared_ok = std::env::var("SYMM_DEVICES").as_deref() == Ok("mod") && count > 0;
        if w < 2 || (w as i32 > count && !shared_ok) {
            bar.println(format!("bench: world {w} skipped ({count} GPUs visible)"));
            bar.inc(1);
            continue;
        }
        bar.set_message(format!("world {w}: symm and NCCL, {} sizes", sizes.len()));
        let t = Instant::now();
        let p = super::comm::Params {
            max_bytes: sizes.iter().copied().max().unwrap_or(0),
            cycles: 0,
            out: out.clone(),
            sizes: sizes.clone(),
            iters: a.iters,
            warmup: a.warmup_iters,
            collectives: names.clone(),
        };
        let phase = if cal.is_some() { "perf-cal" } else { "perf" };
        let code = super::comm::launch(w, phase, &p)?;
        if code != 0 {
            return Err(format!("the bench job exited {code}"));
        }
        let text = std::fs::read_to_string(out.join("perf-samples.tsv"))
            .map_err(|e| format!("rank 0 wrote no samples: {e}"))?;
        let mut samples: Vec<Sample> = text.lines().filter_map(Sample::parse).collect();
        bar.println(format!(
            "bench: {} symm/NCCL samples at world {w} in {:.0} s",
            samples.len(),
            t.elapsed().as_secs_f64()
        ));
        // PyTorch's script measures all-reduce only.
        if !a.no_torch && kinds.contains(&Kind::AllReduce) {
            bar.set_message(format!("world {w}: PyTorch"));
            match torch(w, &sizes, &out) {
                Ok(s) => samples.extend(s),
                Err(m) => bar.println(format!("bench: PyTorch not measured: {m}")),
            }
        }
        bar.inc(1);
        // Every sample of this run and the earlier ones it did not measure again: the input
        // of a later run with --collectives.
        let record = out.join(format!("samples-w{w}.tsv"));
        if kinds.len() < COLLECTIVES.len() {
            let kept = earlier(&record, &kinds);
            bar.println(format!(
                "bench: {} samples of other collectives kept from {}",
                kept.len(),
                record.display()
            ));
            samples.extend(kept);
        }
        let text: String = samples.iter().map(|s| s.line() + "\n").collect();
        std::fs::write(&record, text).map_err(|e| format!("{}: {e}", record.display()))?;
        let _ = std::fs::remove_file(out.join("perf-samples.tsv"));
        for r in 0..w {
            let _ = std::fs::remove_file(out.join(format!("{phase}-rank{r}.tsv")));
        }
        // Ranks placed on the same GPU measure a shared device, not NVLink.
        let devices: Vec<i32> = (0..w)
            .filter_map(|r| symm_driver::cuda::comm::placement(r).ok())
            .collect();
        let shared = devices
            .iter()
            .enumerate()
            .any(|(i, d)| devices[..i].contains(d));
        let topology = if shared {
            symm_core::cost::Topology::SharedDevice
        } else {
            symm_core::cost::Topology::Nvlink
        };
        finish(w, topology, &samples, &out, cal.as_deref())?;
    }
    bar.finish_and_clear();
    Ok(())
}

/// Tables, plots, the simulator's link fit and (with `cal`) the calibration table of world
/// `w` from `samples` (every sample of the run, candidates included), written to `out`.
fn finish(
    w: u16,
    topology: symm_core::cost::Topology,
    samples: &[Sample],
    out: &Path,
    cal: Option<&Path>,
) -> Result<(), String> {
    let shown: Vec<Sample> = samples
        .iter()
        .filter(|s| s.system != CANDIDATE)
        .cloned()
        .collect();
    report::write(w, &shown, out)?;
    // The simulator's link fitted to these samples, and its worst ratio to the GPU.
    let t = Instant::now();
    let fitted = match fit::fit(w, topology, samples) {
        Ok((f, md)) => {
            print!("\n{md}");
            let p = out.join(format!("sim-fit-w{w}.md"));
            std::fs::write(&p, &md).map_err(|e| format!("{}: {e}", p.display()))?;
            println!(
                "bench: {}; written to {} ({:.1} s)",
                fit::summary(&f),
                p.display(),
                t.elapsed().as_secs_f64()
            );
            Some(f)
        }
        Err(m) => {
            println!("bench: no simulator link fitted: {m}");
            None
        }
    };
    if let Some(dir) = cal {
        match report::calibration(w, topology, &shown, fitted.as_ref()) {
            Some(text) => {
                let path = report::write_calibration(dir, w, topology, &text)?;
                println!("bench: calibration table written to {}", path.display());
            }
            None => println!(
                "bench: no calibration table written: no symm eager sample names a plan symm runs"
            ),
        }
    }
    Ok(())
}

/// `symm-bench bench --from-samples`: [`finish`] for each world from `--out`'s
/// `samples-wN.tsv` of an earlier run, on any machine (no GPU): NVLink, or a shared GPU when
/// `SYMM_DEVICES=mod` (as in the run that measured them).
fn from_samples(a: &BenchArgs) -> Result<(), String> {
    let topology = match std::env::var("SYMM_DEVICES").as_deref() {
        Ok("mod") => symm_core::cost::Topology::SharedDevice,
        _ => symm_core::cost::Topology::Nvlink,
    };
    for &w in &a.worlds {
        let record = a.out.join(format!("samples-w{w}.tsv"));
        let text = std::fs::read_to_string(&record)
            .map_err(|e| format!("{}: {e} (no samples of world {w} there)", record.display()))?;
        let samples: Vec<Sample> = text.lines().filter_map(Sample::parse).collect();
        if samples.is_empty() {
            return Err(format!("{}: no sample parses", record.display()));
        }
        println!(
            "bench: {} samples of world {w} from {}",
            samples.len(),
            record.display()
        );
        finish(w, topology, &samples, &a.out, a.calibrate.as_deref())?;
    }
    Ok(())
}

/// The child's part: measures and (rank 0) writes the samples.
pub(super) fn rank_main(phase: &str, p: &Params) -> Result<String, String> {
    let out = p.out.as_path();
    let timing = rank::Timing {
        iters: p.iters,
        warmup: p.warmup,
    };
    let kinds = selected(&p.collectives)?;
    let (samples, profile) = rank::run(&p.sizes, &kinds, phase.contains("cal"), timing)?;
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

#[cfg(test)]
mod tests;
