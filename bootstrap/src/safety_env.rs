//! The multicast-off environment: what keeps NVLink multicast off in every library symm loads
//! and every program symm starts.
//!
//! NCCL, PyTorch's SymmetricMemory and NVSHMEM each create NVLink multicast objects on NVSwitch
//! machines unless their own variable says not to, and each reads it when it initialises:
//!
//! | library | variable | value |
//! |---|---|---|
//! | NCCL | `NCCL_NVLS_ENABLE` | `0` |
//! | torch | `TORCH_SYMM_MEM_DISABLE_MULTICAST` | `1` |
//! | NVSHMEM | `NVSHMEM_DISABLE_NVLS` | `1` |
//!
//! The rule symm keeps:
//!
//! * **In this process**, every entry point that loads one of those libraries calls [`check`]
//!   first and refuses with [`MulticastEnvError`] unless all three variables hold their values
//!   (NCCL's loader, symm-driver's `cuda::ffi::nccl::api`, is the one such entry point). A
//!   program that wants them set for itself calls [`set_for_process`] at the top of `main`,
//!   before any thread starts.
//! * **In a child**, every program symm starts that may load one of them (a rank, a Python
//!   script, torchrun) is built by [`command`] or passed through [`apply`], which set the three
//!   variables whatever the parent's environment says.
//!
//! `bootstrap/tests/multicast_env.rs` fails when a source file of the workspace starts such a
//! program or names such a library without going through this module.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::process::Command;

/// The variables, with the values that keep multicast off.
pub const SAFETY_ENV: [(&str, &str); 3] = [
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
];

/// Why the environment does not keep multicast off.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MulticastEnvError {
    /// A variable is not set.
    Missing {
        /// The variable.
        var: &'static str,
        /// The value it must hold.
        want: &'static str,
    },
    /// A variable holds another value.
    Different {
        /// The variable.
        var: &'static str,
        /// The value found (lossily decoded, at most 64 characters).
        found: String,
        /// The value it must hold.
        want: &'static str,
    },
}

impl fmt::Display for MulticastEnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MulticastEnvError::Missing { var, want } => write!(
                f,
                "{var} is not set: symm loads NCCL, torch or NVSHMEM only with {var}={want} \
                 (and {}), so that NVLink multicast stays off",
                all_vars()
            ),
            MulticastEnvError::Different { var, found, want } => write!(
                f,
                "{var}={found:?}: symm loads NCCL, torch or NVSHMEM only with {var}={want} \
                 (and {}), so that NVLink multicast stays off",
                all_vars()
            ),
        }
    }
}

impl std::error::Error for MulticastEnvError {}

fn all_vars() -> String {
    SAFETY_ENV
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Fails unless this process's environment holds every variable of [`SAFETY_ENV`] with its value.
pub fn check() -> Result<(), MulticastEnvError> {
    check_with(|k| std::env::var_os(k))
}

/// [`check`] over the variables `get` returns.
pub fn check_with(get: impl Fn(&str) -> Option<OsString>) -> Result<(), MulticastEnvError> {
    for (var, want) in SAFETY_ENV {
        match get(var) {
            None => return Err(MulticastEnvError::Missing { var, want }),
            Some(v) if v == OsStr::new(want) => {}
            Some(v) => {
                return Err(MulticastEnvError::Different {
                    var,
                    found: v.to_string_lossy().chars().take(64).collect(),
                    want,
                })
            }
        }
    }
    Ok(())
}

/// Sets every variable of [`SAFETY_ENV`] that is absent in this process's environment, then
/// [`check`]s: a variable the caller set to another value is refused, never overwritten.
///
/// # Safety
///
/// No other thread may read or write the environment during the call (`getenv` and `setenv`
/// are not thread safe): call it at the top of `main`, before any thread starts and before any
/// library is loaded.
pub unsafe fn set_for_process() -> Result<(), MulticastEnvError> {
    for (var, want) in SAFETY_ENV {
        if std::env::var_os(var).is_none() {
            std::env::set_var(var, want);
        }
    }
    check()
}

/// Sets the three variables on `cmd`, whatever the parent's environment holds.
pub fn apply(cmd: &mut Command) -> &mut Command {
    cmd.envs(SAFETY_ENV)
}

/// A command for `program` with the three variables set ([`apply`]): how symm starts any
/// program that may load NCCL, torch or NVSHMEM.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    apply(&mut cmd);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn every_variable_must_hold_its_value() {
        assert_eq!(check_with(env(&SAFETY_ENV)), Ok(()));
        for (i, (var, want)) in SAFETY_ENV.iter().enumerate() {
            let mut others: Vec<(&str, &str)> = SAFETY_ENV.to_vec();
            others.remove(i);
            assert_eq!(
                check_with(env(&others)),
                Err(MulticastEnvError::Missing { var, want })
            );
            let mut wrong = SAFETY_ENV.to_vec();
            wrong[i].1 = "";
            let e = check_with(env(&wrong)).unwrap_err();
            assert!(
                matches!(&e, MulticastEnvError::Different { var: v, .. } if v == var),
                "{e:?}"
            );
            assert!(e.to_string().contains(var), "{e}");
        }
        // A long hostile value is cut in the error.
        let long = "1".repeat(10_000);
        let mut wrong = SAFETY_ENV.to_vec();
        wrong[0].1 = &long;
        let e = check_with(env(&wrong)).unwrap_err();
        assert!(e.to_string().len() < 400, "{e}");
    }

    #[test]
    fn a_child_gets_the_variables_whatever_the_parent_holds() {
        let mut cmd = command("true");
        cmd.env("NCCL_NVLS_ENABLE", "1");
        apply(&mut cmd);
        let envs: Vec<_> = cmd.get_envs().collect();
        for (var, want) in SAFETY_ENV {
            assert!(
                envs.contains(&(OsStr::new(var), Some(OsStr::new(want)))),
                "{var} in {envs:?}"
            );
        }
    }
}
