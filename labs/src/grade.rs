//! Grading a lab: which schedule runs (the student's or the reference solution), what passed,
//! and the first failure with its hint.

use crate::evidence::{evidence, Cause};
use crate::problem::Problem;
use crate::run::{self, Case, Passed, Plan};
use std::path::PathBuf;
use symm_core::op::Op;
use symm_core::sched::Request;

/// Whose code a check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// The file the student edits (`skeleton.rs`).
    Student,
    /// The reference solution (`solution.rs`).
    Solution,
}

/// The first thing that failed.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The case ("world 3, 5 elements per block").
    pub case: String,
    /// Its request (names slots and buffers in the words).
    pub req: Request,
    /// What went wrong.
    pub problem: Problem,
    /// The lab's hint, or the problem's general one.
    pub hint: Option<String>,
    /// The cause the hint names, when it came from the evidence ([`crate::evidence`]).
    pub cause: Option<Cause>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "FAIL  {}", self.case)?;
        for line in self.problem.words(&self.req).to_string().lines() {
            writeln!(f, "      {line}")?;
        }
        if let Some(h) = &self.hint {
            writeln!(f, "hint: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// What a lab's check returns: its value, or the first failure.
pub type Graded<T = ()> = Result<T, Box<Failure>>;

/// Runs one lab's checks and collects what passed.
pub struct Grader {
    /// Whose code runs.
    pub which: Which,
    /// Where traces are written (`None`: not written).
    pub out: Option<PathBuf>,
    /// Passed cases and notes, in order.
    pub passed: Vec<String>,
    /// Scratch slots asked for on the command line (`check 3 --slots S`): a lab with scratch
    /// slots then runs the schedule with that many only, to show what happens.
    pub slots: Option<u64>,
    /// Set by `run N --gpu`: the showcase case ([`Grader::traces`]) also runs on the GPU.
    pub gpu: Option<GpuRun>,
    /// The case that failed and where its trace was written ([`FAILED_TRACE`]).
    pub failed: Option<(String, PathBuf)>,
}

/// The file a failing case's trace is written to, in the output folder: the trace of what was
/// graded, beside the showcase case's `yours.trace`.
pub const FAILED_TRACE: &str = "failed.trace";

/// The GPU run of a lab's showcase case ([`crate::gpu`]): its summary line or what failed.
#[derive(Debug, Default)]
pub struct GpuRun {
    /// `None` until the lab's checker reached its showcase case.
    pub result: Option<Result<String, String>>,
}

/// A lab's hints: a specific hint for a problem, or `None` for the general one.
pub type Hints<'a> = &'a dyn Fn(&Problem) -> Option<String>;

impl Grader {
    /// A grader of `which` writing traces to `out`.
    pub fn new(which: Which, out: Option<PathBuf>) -> Grader {
        Grader {
            which,
            out,
            passed: Vec::new(),
            slots: None,
            gpu: None,
            failed: None,
        }
    }

    /// The student's or the solution's version of something.
    pub fn pick<'a, T: ?Sized>(&self, student: &'a T, solution: &'a T) -> &'a T {
        match self.which {
            Which::Student => student,
            Which::Solution => solution,
        }
    }

    /// A failure of `case` with the hint its evidence gives ([`crate::evidence`], from the
    /// failing `streams`: empty when they could not be built), else the lab's hint, else the
    /// general one.
    pub fn fail(case: &Case, problem: Problem, hints: Hints, streams: &[Vec<Op>]) -> Box<Failure> {
        let found = evidence(&problem, &case.req, streams);
        let cause = found.as_ref().map(|e| e.cause);
        let hint = found
            .map(|e| e.words)
            .or_else(|| hints(&problem))
            .or_else(|| problem.hint().map(String::from));
        Box::new(Failure {
            case: case.label.clone(),
            req: case.req,
            problem,
            hint,
            cause,
        })
    }

    /// A failure of one of the lab's own checks (`check` names it) on `case`.
    pub fn lab_failure(case: &Case, check: &str, message: String, hint: &str) -> Box<Failure> {
        Box::new(Failure {
            case: format!("{}: {check}", case.label),
            req: case.req,
            problem: Problem::Lab(message),
            hint: Some(hint.to_string()),
            cause: None,
        })
    }

    /// Runs every check of `case` on `plan`.
    pub fn case(&mut self, case: &Case, plan: Plan, hints: Hints) -> Graded<Passed> {
        match run::check_case(case, plan) {
            Ok(p) => {
                self.passed.push(format!("pass  {}", case.label));
                Ok(p)
            }
            Err(problem) => {
                self.failed_trace(case, plan);
                let streams = run::build(case, plan).unwrap_or_default();
                Err(Self::fail(case, problem, hints, &streams))
            }
        }
    }

    /// Writes the failing `case`'s trace of `plan` to [`FAILED_TRACE`] (up to the failure,
    /// with stalls at a deadlock) and remembers it.
    fn failed_trace(&mut self, case: &Case, plan: Plan) {
        let Some(path) = self.out.as_ref().map(|d| d.join(FAILED_TRACE)) else {
            return;
        };
        self.trace(FAILED_TRACE, case, plan);
        if path.exists() {
            self.failed = Some((case.label.clone(), path));
        }
    }

    /// Counts a failure of the check `key` and returns how many times it had failed before:
    /// kept in `failures.txt` in the output folder, one `count key` per line (always 0 without
    /// an output folder, or when the file cannot be read or written).
    pub fn failed_before(&mut self, key: &str) -> u32 {
        let Some(dir) = &self.out else {
            return 0;
        };
        let path = dir.join("failures.txt");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut counts: Vec<(u32, String)> = text
            .lines()
            .filter_map(|l| {
                let (n, k) = l.split_once(' ')?;
                Some((n.parse().ok()?, k.to_string()))
            })
            .collect();
        let before = match counts.iter_mut().find(|(_, k)| k == key) {
            Some((n, _)) => {
                let b = *n;
                *n = n.saturating_add(1);
                b
            }
            None => {
                counts.push((1, key.to_string()));
                0
            }
        };
        let body: String = counts.iter().map(|(n, k)| format!("{n} {k}\n")).collect();
        let _ = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, body));
        before
    }

    /// A note shown with the passed cases.
    pub fn note(&mut self, s: impl Into<String>) {
        self.passed.push(s.into());
    }

    /// Writes `yours.trace` (`plan` on `case`) and `reference.trace` (`reference` on `case`) to
    /// the output folder, when there is one. Yours is written even when it fails (up to the
    /// failure, with stalls at a deadlock).
    pub fn traces(&mut self, case: &Case, plan: Plan, reference: Plan) {
        #[cfg(not(loom))]
        if let (Some(run), Some(out)) = (self.gpu.as_mut(), self.out.as_ref()) {
            run.result = Some(crate::gpu::run_case(case, plan, out));
        }
        self.keep_previous("yours.trace", "yours.previous.trace");
        self.trace("yours.trace", case, plan);
        self.trace("reference.trace", case, reference);
    }

    /// Renames `name` in the output folder to `previous` (replacing an older one) and says so:
    /// a re-run never overwrites the student's last trace without a word.
    fn keep_previous(&mut self, name: &str, previous: &str) {
        let Some(dir) = self.out.clone() else {
            return;
        };
        let (from, to) = (dir.join(name), dir.join(previous));
        if from.exists() {
            match std::fs::rename(&from, &to) {
                Ok(()) => self.note(format!(
                    "note  the last run's {name} is now {} (this run writes a new {name})",
                    to.display()
                )),
                Err(e) => self.note(format!("note  cannot keep {}: {e}", from.display())),
            }
        }
    }

    /// Writes `plan`'s trace on `case` as `name` in the output folder, when there is one.
    pub fn trace(&mut self, name: &str, case: &Case, plan: Plan) {
        let Some(dir) = self.out.clone() else {
            return;
        };
        let path = dir.join(name);
        let written =
            std::fs::create_dir_all(&dir).and_then(|()| match run::trace_of(case, plan) {
                Some(t) => std::fs::write(&path, t),
                None => std::fs::remove_file(&path).or(Ok(())),
            });
        if let Err(e) = written {
            self.note(format!("note  cannot write {}: {e}", path.display()));
        }
    }
}
