//! One interface over every way to run a request: [`Backend`].
//!
//! A backend takes a request and one input buffer per rank and returns one output buffer per
//! rank (and, when asked, a trace). The simulator ([`Simulator`]), real host threads
//! ([`Threads`]), the CUDA runtime (`cuda::Comm`, feature `cuda`) and the test harness's
//! one-process `World` (symm-harness) implement it, so one
//! conformance matrix (`symm-tests`' `matrix`) checks any of them against the one sequential
//! reference (`host::reference`): a new backend gets every check by implementing [`Backend`].
//!
//! Outputs a collective does not define (a non-root's output of a reduce) are whatever the
//! backend left there; the reference marks them with `host::POISON` and every backend starts
//! outputs and scratch poisoned with the same byte, so they compare equal too.

use crate::host::{self, HostError, SimOptions, ThreadOptions};
use symm_core::sched::Request;

/// What a run returns.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Each rank's output buffer.
    pub outputs: Vec<Vec<u8>>,
    /// The trace, when one was asked for.
    pub trace: Option<Vec<u8>>,
}

/// Why a backend could not run a request.
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// The host backends (simulator, threads) refused or failed.
    Host(HostError),
    /// The backend runs a fixed world and the request names another.
    WrongWorld {
        /// The backend's world.
        backend: u16,
        /// The request's world.
        request: u16,
    },
    /// The CUDA backend failed.
    #[cfg(all(feature = "cuda", not(loom)))]
    Cuda(crate::cuda::CudaError),
    /// A collective running at the same time on another team produced wrong output.
    Beside {
        /// The other team's id.
        team: u16,
        /// The first difference.
        message: String,
    },
}

impl BackendError {
    /// Whether the backend is unusable after this error (a device timeout or a driver failure):
    /// a test matrix stops instead of running more cases on it.
    pub fn is_fatal(&self) -> bool {
        match self {
            #[cfg(all(feature = "cuda", not(loom)))]
            BackendError::Cuda(e) => matches!(
                e,
                crate::cuda::CudaError::Timeout { .. } | crate::cuda::CudaError::Driver { .. }
            ),
            _ => false,
        }
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Host(e) => write!(f, "{e}"),
            BackendError::WrongWorld { backend, request } => write!(
                f,
                "this backend runs {backend} ranks; the request has {request}"
            ),
            #[cfg(all(feature = "cuda", not(loom)))]
            BackendError::Cuda(e) => write!(f, "{e}"),
            BackendError::Beside { team, message } => {
                write!(
                    f,
                    "the collective beside on team {team} was wrong: {message}"
                )
            }
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BackendError::Host(e) => Some(e),
            #[cfg(all(feature = "cuda", not(loom)))]
            BackendError::Cuda(e) => Some(e),
            _ => None,
        }
    }
}

impl From<HostError> for BackendError {
    fn from(e: HostError) -> Self {
        BackendError::Host(e)
    }
}

/// Checks `inputs` for a backend whose world is `world` (`None`: any): the request validates, the
/// worlds agree, and there is one input of the request's size per rank. Every backend calls it
/// before touching memory.
pub fn check_inputs(
    world: Option<u16>,
    req: &Request,
    inputs: &[Vec<u8>],
) -> Result<(), BackendError> {
    if let Some(w) = world.filter(|&w| w != req.world) {
        return Err(BackendError::WrongWorld {
            backend: w,
            request: req.world,
        });
    }
    host::check_inputs(req, inputs).map_err(BackendError::Host)
}

/// A way to run requests.
///
/// Code written against the trait runs on every backend: here one check on the simulator and on
/// real threads (on a GPU machine, the CUDA `World` and `Comm` too).
///
/// ```
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::sched::{Algorithm, Collective, Request};
/// use symm_driver::backend::{Backend, Simulator, Threads};
/// use symm_driver::host;
///
/// fn broadcast_is_right(b: &mut dyn Backend) -> bool {
///     let (c, a) = (Collective::Broadcast { root: 2 }, Algorithm::Tree);
///     let req = Request::new(c, a, 5, 512, DType::F32, ReduceOp::Sum);
///     let inputs = host::random_inputs(&req, 3);
///     let out = b.run(&req, &inputs, true).unwrap();
///     out.trace.is_some() && out.outputs == host::reference(&req, &inputs)
/// }
///
/// assert!(broadcast_is_right(&mut Simulator::default()));
/// assert!(broadcast_is_right(&mut Threads::default()));
/// assert_eq!(Simulator::default().fixed_world(), None); // runs any world size
/// ```
///
/// A new backend implements [`Backend::run`] (and [`Backend::fixed_world`] when it runs one
/// world size) and gets the shared conformance matrix (`symm_tests::matrix::run`).
pub trait Backend {
    /// A short name for reports ("simulator", "threads", "cuda w2").
    fn name(&self) -> String;

    /// The one world size this backend runs, or `None` when it runs any.
    fn fixed_world(&self) -> Option<u16> {
        None
    }

    /// Runs `req` over `inputs` (one buffer of `req.buffer_sizes().input` bytes per rank) and
    /// returns every rank's output, with a trace when `trace` is true.
    fn run(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        trace: bool,
    ) -> Result<Outcome, BackendError>;

    /// Runs `req` over `inputs` untraced and checks every rank's output against `want` (one
    /// buffer per rank) with `check`, called as `check(rank, output, wanted)`. Returns the
    /// verdict: `Ok(())`, or the error of the lowest rank whose output `check` refused.
    ///
    /// The default runs [`Backend::run`] and checks every output here. A backend whose ranks
    /// are other processes checks each output in the process that wrote it and exchanges only
    /// the verdicts, so no output crosses between processes (a matrix case of 256 MiB at
    /// world 4 would otherwise move every rank's output to every rank).
    fn run_checked(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        want: &[Vec<u8>],
        check: &RankCheck<'_>,
    ) -> Result<Verdict, BackendError> {
        let out = self.run(req, inputs, false)?;
        if out.outputs.len() != want.len() {
            return Ok(Err(format!(
                "{} outputs, want {}",
                out.outputs.len(),
                want.len()
            )));
        }
        for (rank, (f, w)) in out.outputs.iter().zip(want).enumerate() {
            if let Err(e) = check(rank, f, w) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }
}

/// Checks one rank's output: `(rank, output, wanted)`, an error describing the first difference.
pub type RankCheck<'a> = dyn Fn(usize, &[u8], &[u8]) -> Verdict + 'a;

/// The outcome of checking outputs: `Err` describes the first difference found.
pub type Verdict = std::result::Result<(), String>;

/// The deterministic simulator as a [`Backend`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Simulator {
    /// Options of each run (its `trace` field is set per run).
    pub opts: SimOptions,
}

impl Backend for Simulator {
    fn name(&self) -> String {
        "simulator".into()
    }

    fn run(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        trace: bool,
    ) -> Result<Outcome, BackendError> {
        let opts = SimOptions {
            trace,
            data: true,
            ..self.opts
        };
        let run = host::simulate(req, inputs, &opts)?;
        Ok(Outcome {
            outputs: run.outputs,
            trace: trace.then_some(run.trace),
        })
    }
}

/// One OS thread per (rank, channel) as a [`Backend`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Threads {
    /// Options of each run (its `trace` field is set per run).
    pub opts: ThreadOptions,
}

impl Backend for Threads {
    fn name(&self) -> String {
        "threads".into()
    }

    fn run(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        trace: bool,
    ) -> Result<Outcome, BackendError> {
        let opts = ThreadOptions { trace, ..self.opts };
        let run = host::run_threads(req, inputs, &opts)?;
        Ok(Outcome {
            outputs: run.outputs,
            trace: trace.then_some(run.trace),
        })
    }
}

/// One team of a host world as a backend, with other teams' collectives running at the same
/// time on the same world (their outputs are checked against the reference too): what runs
/// the shared conformance matrix on teams. Traces (simulated mode) name the team in their
/// header.
pub struct HostTeam {
    /// Ranks in the world.
    pub world: u16,
    /// The team the requests run on.
    pub team: symm_core::team::Team,
    /// Jobs run beside every request, on other teams (or the same ranks with other ids).
    pub beside: Vec<host::TeamJob>,
    /// Simulated or threads.
    pub mode: host::TeamMode,
}

impl Backend for HostTeam {
    fn name(&self) -> String {
        format!(
            "team {:?} (id {}) of world {} with {} beside ({:?})",
            self.team.members(),
            self.team.id(),
            self.world,
            self.beside.len(),
            self.mode
        )
    }

    fn fixed_world(&self) -> Option<u16> {
        Some(self.team.size())
    }

    fn run(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        trace: bool,
    ) -> Result<Outcome, BackendError> {
        check_inputs(Some(self.team.size()), req, inputs)?;
        let mut jobs = vec![host::TeamJob {
            team: self.team.clone(),
            request: *req,
            inputs: inputs.to_vec(),
        }];
        jobs.extend(self.beside.iter().cloned());
        let (outs, traces) = host::run_teams_traced(self.world, &jobs, self.mode, trace)?;
        let mut outs = outs.into_iter();
        let mine = outs.next().unwrap_or_default();
        for (j, found) in self.beside.iter().zip(outs) {
            let want = host::reference(&j.request, &j.inputs);
            host::compare(&j.request, &found, &want).map_err(|e| BackendError::Beside {
                team: j.team.id(),
                message: format!("{e:?}"),
            })?;
        }
        Ok(Outcome {
            outputs: mine,
            trace: traces.into_iter().next(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::sched::{Algorithm, Collective};

    #[test]
    fn host_backends_agree_with_the_reference_and_refuse_bad_input() {
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            3,
            48,
            DType::I32,
            ReduceOp::Sum,
        );
        let inputs = host::random_inputs(&req, 3);
        let want = host::reference(&req, &inputs);
        let backends: [&mut dyn Backend; 2] = [&mut Simulator::default(), &mut Threads::default()];
        for b in backends {
            let out = b.run(&req, &inputs, true).unwrap();
            assert_eq!(out.outputs, want, "{}", b.name());
            assert!(out.trace.is_some_and(|t| !t.is_empty()));
            let short = &inputs[..2];
            assert!(matches!(
                b.run(&req, short, false),
                Err(BackendError::Host(HostError::BadWorld { .. }))
            ));
        }
    }
}
