//! `symm-bench check` with one process per GPU (the default mode).
//!
//! The parent starts one process per rank of this same binary (`symm-bench comm-rank PHASE ...`) through
//! the launcher behind `symm-run` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `SYMM_JOB`, `SYMM_TOKEN`
//! and the multicast-off variables set, output prefixed `[r]`, the job ended when a rank fails).
//! Each rank writes its checks to `OUT/PHASE-rankR.tsv`; the parent turns rank 0's lines into
//! rows and fails a row that any rank failed or did not report.
//!
//! * `correct` ([`correct`]): the shared conformance matrix on the `Comm` backend, graph replay,
//!   the device-API example on the Comm's heap, per-process traces merged and compared with the
//!   simulator, the host time of a cached call ([`host_cost`]), poison and reset, hostile
//!   calls, the caller's context.
//! * `deterministic` ([`deterministic`]): a job in deterministic mode; every algorithm that
//!   honours it, on every channel count and size, eager, on plain buffers and in graphs, gives
//!   the rank-order reference's bits.
//! * `faults` ([`faults`]): calls that differ across ranks (before and after first use), a
//!   skipped or doubled call, a rank that abandons the job or is stopped past the deadline; each
//!   named, then reset and 100 sums bit exact.
//! * `leak` ([`life::leak`]): symmetric-heap create/destroy cycles across processes (POSIX fds
//!   through SCM_RIGHTS each cycle), then collectives on a `Comm`: free memory, live
//!   handles/maps/ranges and open file descriptors must end where they started.
//! * `death` ([`life::death`]): rank 1 is killed (SIGKILL) inside a collective. The launcher
//!   would end the job at once (that is its job), so this phase starts the ranks directly with
//!   the same environment.

mod correct;
mod deterministic;
mod engines;
mod faults;
mod fold;
mod host_cost;
mod in_place;
mod life;
mod moe;
mod moe_a2av;
mod plain;
mod plans;
mod refused;
mod streams;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use std::time::{Duration, Instant};
use symm_driver::safety_env;

use symm_driver::bootstrap::Token;
use symm_driver::cuda::{CommOptions, CudaError};
use symm_driver::launcher;

use super::Row;

/// What the parent passes to every rank.
#[derive(Clone, Debug, Default)]
pub struct Params {
    /// Largest message of the matrix.
    pub max_bytes: u64,
    /// Cycles of the leak check.
    pub cycles: u32,
    /// Where reports and traces go.
    pub out: PathBuf,
    /// The bench's sizes.
    pub sizes: Vec<u64>,
    /// The bench's timed iterations per measurement (0: about 20 ms' worth).
    pub iters: u32,
    /// The bench's warm-up iterations before each measurement.
    pub warmup: u32,
    /// The bench's collectives by name (empty: every one).
    pub collectives: Vec<String>,
}

/// One check as a rank reports it.
pub(crate) struct Check {
    name: String,
    cases: usize,
    seconds: f64,
    result: Result<String, String>,
}

/// This rank's report, to which every check appends its line as it ends (so a phase cut short
/// still shows what passed), and which ends with [`DONE`] once every check ran.
static REPORT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The last line of a report whose checks all ran.
const DONE: &str = "#done";

impl Check {
    /// Runs `f` as the check `name` of `cases` cases, timed, and appends its line to the report.
    fn timed(name: &str, cases: usize, f: impl FnOnce() -> Result<String, String>) -> Check {
        let t = Instant::now();
        let result = f();
        let c = Check {
            name: name.into(),
            cases,
            seconds: t.elapsed().as_secs_f64(),
            result,
        };
        let (ok, note) = match &c.result {
            Ok(n) => ("ok", n.as_str()),
            Err(m) => ("FAIL", m.as_str()),
        };
        let note = note.replace(['\t', '\n'], " ");
        println!("{}: {ok}: {note}", c.name);
        if let Some(path) = REPORT.get() {
            append(
                path,
                &format!("{}\t{}\t{ok}\t{:.1}\t{note}\n", c.name, c.cases, c.seconds),
            );
        }
        c
    }
}

/// Appends `line` to the report at `path` (a report that cannot be written shows as missing).
fn append(path: &Path, line: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Runs `phases` at world `w` and returns their rows.
pub fn run(w: u16, phases: &[&str], p: &Params) -> Vec<Row> {
    let _ = std::fs::create_dir_all(&p.out);
    let mut rows = Vec::new();
    let bar = crate::progress::bar(phases.len() as u64, &format!("world {w}"));
    for &phase in phases {
        bar.set_message(phase.to_string());
        let t = Instant::now();
        let code = if phase == "death" {
            spawn(w, phase, p)
        } else {
            launch(w, phase, p)
        };
        let mut got = collect(w, phase, &p.out);
        let secs = t.elapsed().as_secs_f64();
        match code {
            Err(m) => {
                let mut r = Row::new(&format!("process per GPU: {phase}"), w);
                r.cases = 1;
                r.fail(m);
                got.push(r);
            }
            Ok(c) if c != 0 && got.iter().all(|r| r.failed == 0) => {
                let mut r = Row::new(&format!("process per GPU: {phase}"), w);
                r.cases = 1;
                r.fail(format!("the job exited {c}"));
                got.push(r);
            }
            Ok(_) => {}
        }
        if got.iter().all(|r| r.seconds == 0.0) {
            let n = got.len().max(1) as f64;
            for r in &mut got {
                r.seconds = secs / n;
            }
        }
        rows.extend(got);
        bar.inc(1);
    }
    bar.finish_and_clear();
    rows
}

fn rank_args(phase: &str, p: &Params) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["comm-rank".into(), phase.into()];
    v.extend([
        "--max-bytes".into(),
        p.max_bytes.to_string().into(),
        "--leak-cycles".into(),
        p.cycles.to_string().into(),
        "--out".into(),
        p.out.clone().into_os_string(),
        "--iters".into(),
        p.iters.to_string().into(),
        "--warmup".into(),
        p.warmup.to_string().into(),
    ]);
    if !p.sizes.is_empty() {
        let s: Vec<String> = p.sizes.iter().map(u64::to_string).collect();
        v.extend(["--sizes".into(), s.join(",").into()]);
    }
    if !p.collectives.is_empty() {
        v.extend(["--collectives".into(), p.collectives.join(",").into()]);
    }
    v
}

/// Through the launcher; returns its exit code.
pub(super) fn launch(w: u16, phase: &str, p: &Params) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = vec![exe.into_os_string()];
    command.extend(rank_args(phase, p));
    let o = launcher::Options {
        ranks: w,
        timeout: Some(Duration::from_secs(900)),
        grace: Duration::from_secs(5),
        job: None,
        prefix: true,
        command,
    };
    launcher::run(&o).map_err(|e| e.to_string())
}

/// Directly, with the environment the launcher would set; returns rank 0's exit code (rank 1
/// is meant to die).
fn spawn(w: u16, phase: &str, p: &Params) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let token = Token::random().map_err(|e| e.to_string())?;
    let job = format!("hw-{}-{phase}", std::process::id());
    let children: Vec<_> = (0..w)
        .map(|r| {
            safety_env::command(&exe)
                .args(rank_args(phase, p))
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", w.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("SYMM_JOB", &job)
                .env("SYMM_TOKEN", token.to_hex())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("rank {r}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut code0 = 0;
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        for l in String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
        {
            println!("[{r}] {l}");
        }
        if r == 0 {
            code0 = out.status.code().unwrap_or(-1);
        }
    }
    Ok(code0)
}

fn report_path(out: &Path, phase: &str, rank: u16) -> PathBuf {
    out.join(format!("{phase}-rank{rank}.tsv"))
}

/// Rows from every rank's report: rank 0's names and cases, failed where any rank failed.
fn collect(w: u16, phase: &str, out: &Path) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let ranks: Vec<u16> = if phase == "death" {
        vec![0]
    } else {
        (0..w).collect()
    };
    for r in ranks {
        let path = report_path(out, phase, r);
        let Ok(text) = std::fs::read_to_string(&path) else {
            let mut row = Row::new(&format!("process per GPU: {phase}"), w);
            row.cases = 1;
            row.fail(format!("rank {r} wrote no report ({})", path.display()));
            rows.push(row);
            continue;
        };
        if !text.lines().any(|l| l == DONE) {
            let mut row = Row::new(&format!("process per GPU: {phase}"), w);
            row.cases = 1;
            row.fail(format!(
                "rank {r}'s report ends after {} check(s): the phase did not finish",
                text.lines().count()
            ));
            rows.push(row);
        }
        for line in text.lines() {
            let f: Vec<&str> = line.splitn(5, '\t').collect();
            let [name, cases, ok, secs, note] = f[..] else {
                continue;
            };
            let i = match rows.iter().position(|x| x.check == name) {
                Some(i) => i,
                None => {
                    let mut row = Row::new(name, w);
                    row.cases = cases.parse().unwrap_or(0);
                    row.seconds = secs.parse().unwrap_or(0.0);
                    rows.push(row);
                    rows.len() - 1
                }
            };
            if ok == "ok" {
                if r == 0 {
                    rows[i].note = note.to_string();
                }
            } else {
                rows[i].fail(format!("rank {r}: {note}"));
            }
        }
    }
    rows
}

/// The child: one rank of `phase`; writes its report and fails when any check failed.
pub fn rank(a: &crate::RankArgs) -> Result<(), String> {
    let phase = a.phase.as_str();
    let p = Params {
        max_bytes: a.max_bytes.unwrap_or(u64::MAX),
        cycles: a.leak_cycles,
        out: a.out.clone(),
        sizes: a.sizes.clone(),
        iters: a.iters,
        warmup: a.warmup,
        collectives: a.collectives.clone(),
    };
    let rank: u16 = std::env::var("RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("RANK is not set")?;
    let report = report_path(&p.out, phase, rank);
    std::fs::write(&report, "").map_err(|e| e.to_string())?;
    let _ = REPORT.set(report.clone());
    let checks = match phase {
        "correct" => correct::run(&p)?,
        "moe" => moe::run(&p)?,
        "deterministic" => deterministic::run(&p)?,
        "faults" => faults::run(&p)?,
        "leak" => vec![Check::timed("leak check across processes", 1, || {
            life::leak(&p)
        })],
        "death" => vec![Check::timed(
            "rank killed inside a collective",
            1,
            life::death,
        )],
        "perf" | "perf-cal" => {
            vec![Check::timed("bench", 1, || {
                super::perf::rank_main(phase, &p)
            })]
        }
        other => return Err(format!("unknown phase {other:?}")),
    };
    append(&report, &format!("{DONE}\n"));
    let failed = checks.iter().filter(|c| c.result.is_err()).count();
    if failed > 0 {
        return Err(format!("{failed} check(s) failed"));
    }
    Ok(())
}

/// Communicator options of the phases.
fn opts(timeout: Duration, heap_bytes: u64) -> CommOptions {
    CommOptions {
        heap_bytes,
        timeout,
        ..CommOptions::default()
    }
}

fn e(e: CudaError) -> String {
    e.to_string()
}
