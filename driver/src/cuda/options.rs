//! How a [`Comm`] is set up, and the one way a process joins its job.
//!
//! [`CommOptions`] holds every setting; [`CommOptions::from_env`] (or
//! [`CommOptions::with_env`] over options a program chose) reads the environment variables
//! that configure a Comm, each checked with a typed error ([`CudaError::BadEnv`]):
//!
//! | variable | field | takes |
//! |---|---|---|
//! | `SYMM_PLANS` | [`CommOptions::plans`] | `auto`, `interpreted`, `compiled` |
//! | `SYMM_COPY_ENGINE` | [`CommOptions::copy_engine`] | `off`, `on`, `always` |
//! | `SYMM_NVRTC` | [`CommOptions::nvrtc`] (when not set by the program) | a path to libnvrtc |
//! | `SYMM_DETERMINISTIC` | [`CommOptions::deterministic`] | `0`, `1` |
//!
//! [`CommOptions::join`] then joins the job (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `SYMM_JOB`,
//! `SYMM_TOKEN`, as a [`JobEnv`]), places the rank on its GPU (`SYMM_DEVICES`,
//! [`crate::cuda::placement`]) and opens the Comm; a rank that fails before the Comm exists
//! aborts the bootstrap, so its peers fail at once instead of at their deadline.
//! [`Comm::from_env`], the Python binding and the C ABI all open a Comm this way.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use super::bounds as guard;
use super::comm::Comm;
use super::compiled::PlanPath;
use super::copy_engine::CopyEngine;
use super::error::{CudaError, Result};
use super::rendezvous::{Bootstrap, SocketRendezvous};
use crate::bootstrap::{BootstrapError, JobEnv, SocketBootstrap};

/// The variable that picks the kernel running plans ([`CommOptions::plans`]).
pub const SYMM_PLANS: &str = "SYMM_PLANS";
/// The variable that sends requests to copy engines ([`CommOptions::copy_engine`]).
pub const SYMM_COPY_ENGINE: &str = "SYMM_COPY_ENGINE";
/// The variable that names libnvrtc ([`CommOptions::nvrtc`]).
pub const SYMM_NVRTC: &str = "SYMM_NVRTC";
/// The variable that puts the job in deterministic mode ([`CommOptions::deterministic`]).
pub const SYMM_DETERMINISTIC: &str = "SYMM_DETERMINISTIC";

/// The longest `SYMM_NVRTC` path taken, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;

/// Characters of a refused value kept in its error.
const SHOWN: usize = 32;

/// How a [`Comm`] is set up.
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// Buffer bytes of the symmetric heap per rank (the signal pad comes on top).
    pub heap_bytes: u64,
    /// Deadline of every device wait.
    pub timeout: Duration,
    /// Deadline of every bootstrap exchange (joining the job included).
    pub bootstrap_timeout: Duration,
    /// NVRTC library path (default: `$SYMM_NVRTC`, then the usual names).
    pub nvrtc: Option<PathBuf>,
    /// Trace events kept per channel by a [`crate::cuda::Tracer`].
    pub trace_cap: u32,
    /// Which kernel runs plans: compiled plans for small requests by default
    /// ([`crate::cuda::compiled`]); [`CommOptions::with_env`] takes `SYMM_PLANS`.
    pub plans: PlanPath,
    /// Which requests run on copy engines instead of a kernel ([`crate::cuda::copy_engine`]);
    /// every rank of a job must give the same. [`CommOptions::with_env`] takes
    /// `SYMM_COPY_ENGINE`.
    pub copy_engine: CopyEngine,
    /// Deterministic mode for the whole job (`symm_core::sched::Request::is_deterministic`):
    /// automatic requests honour it, and admission refuses a request that does not; every rank
    /// of a job must give the same. [`CommOptions::with_env`] takes `SYMM_DETERMINISTIC`.
    pub deterministic: bool,
}

impl CommOptions {
    /// Fails when an option is out of its range: every deadline more than 0 and at most
    /// [`crate::cuda::MAX_WAIT`], the heap at most [`crate::cuda::MAX_HEAP_BYTES`].
    pub fn validate(&self) -> Result<()> {
        guard::check_heap("CommOptions::heap_bytes", self.heap_bytes)?;
        guard::check_wait("CommOptions::timeout", self.timeout)?;
        guard::check_wait("CommOptions::bootstrap_timeout", self.bootstrap_timeout)
    }

    /// The default options with the environment's settings (see the module doc).
    pub fn from_env() -> Result<CommOptions> {
        CommOptions::default().with_env()
    }

    /// These options with the environment's settings over them (see the module doc): a
    /// variable that is set wins; `SYMM_NVRTC` fills [`CommOptions::nvrtc`] only when the
    /// program left it empty.
    pub fn with_env(self) -> Result<CommOptions> {
        self.with_vars(|k| std::env::var_os(k))
    }

    /// [`CommOptions::with_env`] reading variables through `get` (tests pass a map).
    pub fn with_vars(mut self, get: impl Fn(&str) -> Option<OsString>) -> Result<CommOptions> {
        if let Some(v) = get(SYMM_PLANS) {
            self.plans = parse_var(SYMM_PLANS, &v, "auto, interpreted or compiled", |s| {
                PlanPath::parse(s)
            })?;
        }
        if let Some(v) = get(SYMM_COPY_ENGINE) {
            self.copy_engine =
                parse_var(SYMM_COPY_ENGINE, &v, "off, on or always", CopyEngine::parse)?;
        }
        if let (None, Some(v)) = (&self.nvrtc, get(SYMM_NVRTC)) {
            if v.is_empty() || v.len() > MAX_PATH_BYTES {
                return Err(bad_env(
                    SYMM_NVRTC,
                    &v,
                    "the path of libnvrtc (at most 4096 bytes)",
                ));
            }
            self.nvrtc = Some(PathBuf::from(v));
        }
        if let Some(v) = get(SYMM_DETERMINISTIC) {
            self.deterministic = parse_var(SYMM_DETERMINISTIC, &v, "0 or 1", |s| match s {
                "0" => Some(false),
                "1" => Some(true),
                _ => None,
            })?;
        }
        Ok(self)
    }

    /// Joins `job` with these options: the bootstrap (every rank of the job calls this), this
    /// rank's GPU ([`crate::cuda::comm::placement`]), then [`Comm::open`]. Options are checked before
    /// anything starts; a rank whose GPU cannot be placed aborts the bootstrap, so its peers
    /// fail at once. Collective.
    pub fn join(self, job: &JobEnv) -> Result<Comm> {
        self.join_on(job, None)
    }

    /// [`CommOptions::join`] on GPU `device` when given (a job whose local ranks are not the
    /// process's own: a sub-group of a larger job keeps the GPU its process already uses),
    /// else where the placement puts `LOCAL_RANK`. Collective.
    pub fn join_on(self, job: &JobEnv, device: Option<i32>) -> Result<Comm> {
        self.validate()?;
        let boot =
            SocketBootstrap::join(job, self.bootstrap_timeout).map_err(CudaError::Bootstrap)?;
        let placed = match device {
            Some(d) => super::device::device_count().and_then(|n| {
                if (0..n).contains(&d) {
                    Ok(d)
                } else {
                    Err(CudaError::Placement(
                        super::placement::PlacementError::PastVisible {
                            local_rank: u16::try_from(d).unwrap_or(u16::MAX),
                            visible: n,
                        },
                    ))
                }
            }),
            None => super::comm::placement(boot.local_rank()),
        };
        let ordinal = match placed {
            Ok(o) => o,
            Err(e) => {
                let boot = SocketRendezvous::new(boot, self.bootstrap_timeout);
                boot.abort(boot.bootstrap().rank(), &e.to_string());
                return Err(e);
            }
        };
        Comm::open(boot, ordinal, self)
    }

    /// [`CommOptions::join`] for the job the environment describes (`RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `SYMM_JOB`, `SYMM_TOKEN`; the token is scrubbed from the environment).
    pub fn join_env(self) -> Result<Comm> {
        let job = JobEnv::from_env().map_err(|e| CudaError::Bootstrap(BootstrapError::Env(e)))?;
        self.join(&job)
    }
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            heap_bytes: 256 << 20,
            timeout: Duration::from_secs(10),
            bootstrap_timeout: Duration::from_secs(60),
            nvrtc: None,
            trace_cap: 1 << 14,
            plans: PlanPath::Auto,
            copy_engine: CopyEngine::Off,
            deterministic: false,
        }
    }
}

/// The value of `var` parsed by `parse`, else [`CudaError::BadEnv`].
fn parse_var<T>(
    var: &'static str,
    v: &OsString,
    expected: &'static str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T> {
    v.to_str()
        .and_then(parse)
        .ok_or_else(|| bad_env(var, v, expected))
}

/// The error for `var` holding `v` (shown cut to a few characters).
fn bad_env(var: &'static str, v: &OsString, expected: &'static str) -> CudaError {
    CudaError::BadEnv {
        var,
        value: v.to_string_lossy().chars().take(SHOWN).collect(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<CommOptions> {
        let m: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        CommOptions::default().with_vars(|k| m.get(k).cloned())
    }

    /// Every variable sets its field; unset ones leave the options as they are.
    #[test]
    fn variables_set_their_options() {
        let o = with(&[]).unwrap();
        assert_eq!(
            (o.plans, o.copy_engine, o.nvrtc, o.deterministic),
            (PlanPath::Auto, CopyEngine::Off, None, false)
        );
        let o = with(&[
            (SYMM_PLANS, "interpreted"),
            (SYMM_COPY_ENGINE, "always"),
            (SYMM_NVRTC, "/opt/nvrtc.so"),
            (SYMM_DETERMINISTIC, "1"),
        ])
        .unwrap();
        assert!(o.deterministic);
        let program = CommOptions {
            deterministic: true,
            ..CommOptions::default()
        };
        assert!(program.clone().with_vars(|_| None).unwrap().deterministic);
        let off = program.with_vars(|k| (k == SYMM_DETERMINISTIC).then(|| "0".into()));
        assert!(!off.unwrap().deterministic);
        assert_eq!(o.plans, PlanPath::Interpreted);
        assert_eq!(o.copy_engine, CopyEngine::Always);
        assert_eq!(o.nvrtc, Some(PathBuf::from("/opt/nvrtc.so")));
        assert_eq!(
            with(&[(SYMM_PLANS, "compiled")]).unwrap().plans,
            PlanPath::Compiled
        );
        assert_eq!(
            with(&[(SYMM_COPY_ENGINE, "on")]).unwrap().copy_engine,
            CopyEngine::On
        );
        // A path the program chose stays.
        let mine = CommOptions {
            nvrtc: Some(PathBuf::from("/mine")),
            ..CommOptions::default()
        };
        let o = mine
            .with_vars(|k| (k == SYMM_NVRTC).then(|| "/env".into()))
            .unwrap();
        assert_eq!(o.nvrtc, Some(PathBuf::from("/mine")));
    }

    /// A bad value is a typed error naming the variable, what it takes and the value, cut.
    #[test]
    fn bad_values_are_typed_errors() {
        let long = "x".repeat(10_000);
        for (var, value, expected) in [
            (SYMM_PLANS, "fast", "auto, interpreted or compiled"),
            (SYMM_PLANS, "", "auto, interpreted or compiled"),
            (SYMM_COPY_ENGINE, long.as_str(), "off, on or always"),
            (SYMM_DETERMINISTIC, "yes", "0 or 1"),
            (SYMM_DETERMINISTIC, "", "0 or 1"),
            (SYMM_NVRTC, "", "the path of libnvrtc (at most 4096 bytes)"),
            (
                SYMM_NVRTC,
                long.as_str(),
                "the path of libnvrtc (at most 4096 bytes)",
            ),
        ] {
            let e = with(&[(var, value)]).unwrap_err();
            let shown: String = value.chars().take(SHOWN).collect();
            assert_eq!(
                e,
                CudaError::BadEnv {
                    var,
                    value: shown,
                    expected
                }
            );
            assert!(e.to_string().starts_with(var), "{e}");
        }
    }

    /// Joining checks the options before it touches the bootstrap.
    #[test]
    fn join_checks_the_options_first() {
        let job = JobEnv::from_vars(|k| {
            Some(OsString::from(match k {
                "RANK" => "0",
                "WORLD_SIZE" => "1",
                "SYMM_JOB" => "symm-options-test",
                "SYMM_TOKEN" => "0123456789abcdef0123456789abcdef",
                _ => return None,
            }))
        })
        .unwrap();
        let bad = CommOptions {
            timeout: Duration::ZERO,
            ..CommOptions::default()
        };
        assert!(matches!(bad.join(&job), Err(CudaError::BadOption(_))));
    }
}
