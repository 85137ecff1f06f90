//! The NVLink multicast guard.
//!
//! Creating a multicast object can put shared GPUs out of service, so symm refuses it unless the
//! user opts in explicitly. [`guard`] runs before any multicast driver call (there are none in a
//! build without the `multicast` feature): it fails unless `SYMM_ENABLE_MULTICAST=1` is set and
//! none of `NCCL_NVLS_ENABLE=0`, `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`, `NVSHMEM_DISABLE_NVLS=1`
//! (the machine-wide "multicast off" switches of NCCL, PyTorch and NVSHMEM) is set.

use super::error::{CudaError, Result};

/// Checks the environment; `Err` says why multicast is refused. No driver call is made.
pub fn guard() -> Result<()> {
    guard_with(|k| std::env::var(k).ok())
}

/// [`guard`] over an arbitrary environment lookup (for tests).
pub fn guard_with(env: impl Fn(&str) -> Option<String>) -> Result<()> {
    if !cfg!(feature = "multicast") {
        return Err(CudaError::MulticastRefused(
            "this build has no `multicast` feature",
        ));
    }
    if env("SYMM_ENABLE_MULTICAST").as_deref() != Some("1") {
        return Err(CudaError::MulticastRefused(
            "SYMM_ENABLE_MULTICAST=1 is not set",
        ));
    }
    for (k, v, why) in [
        ("NCCL_NVLS_ENABLE", "0", "NCCL_NVLS_ENABLE=0 is set"),
        (
            "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "1",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is set",
        ),
        ("NVSHMEM_DISABLE_NVLS", "1", "NVSHMEM_DISABLE_NVLS=1 is set"),
    ] {
        if env(k).as_deref() == Some(v) {
            return Err(CudaError::MulticastRefused(why));
        }
    }
    Err(CudaError::MulticastRefused(
        "multicast objects are not implemented in this release",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_without_opt_in_and_with_any_off_switch() {
        assert!(guard_with(|_| None).is_err());
        let env = |k: &str| match k {
            "SYMM_ENABLE_MULTICAST" => Some("1".to_string()),
            "NVSHMEM_DISABLE_NVLS" => Some("1".to_string()),
            _ => None,
        };
        assert!(matches!(
            guard_with(env),
            Err(CudaError::MulticastRefused(_))
        ));
    }
}
