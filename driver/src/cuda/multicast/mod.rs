//! NVLink multicast (NVLS): the guard, the budget and the binding. Every multicast driver call
//! symm makes is in this module (and its entry points in [`crate::cuda::ffi::driver`]).
//!
//! Creating a multicast object can put shared GPUs out of service, so multicast is refused unless
//! every one of these holds, checked in this order, each before any multicast driver call:
//!
//! 1. **The build.** The binding exists only with the cargo feature `multicast` ([`COMPILED`]);
//!    without it [`guard`] refuses with [`McError::NotCompiled`] and there is nothing to call.
//! 2. **The environment** ([`guard`], no driver call): `SYMM_ENABLE_MULTICAST=1` is set, and
//!    none of `NCCL_NVLS_ENABLE=0`, `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`,
//!    `NVSHMEM_DISABLE_NVLS=1` (the machine-wide "multicast off" switches of NCCL, PyTorch and
//!    NVSHMEM) is.
//! 3. **The devices** (`permit`): each reports `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`. Only
//!    then is a `Permit` returned, and the permit is the one way to create an object.
//! 4. **The budget** (`budget`): at most so many objects and bytes per process, reserved
//!    before the object's first driver call and returned when it is released.
//!
//! Then `Multicast::create` runs the protocol: minimum granularity query (size and memory
//! offsets must be multiples of it), create (`numDevices`, `size`, no exportable handle types,
//! flags 0), add every device, bind every member's memory at offset 0, reserve a virtual range,
//! map the object over it, grant every member read-write access. Each acquired resource is an
//! RAII value, so a failure at any step releases what was acquired, in reverse order (unmap,
//! free the range, unbind last-bound first, release the handle, return the budget), and so does
//! dropping the object. Plans with `McReduce` / `McStore` ops pass
//! [`RankPlan::validate`](crate::cuda::plan::RankPlan::validate) only as
//! `validate_multicast`, which takes the mapped object.
//!
//! The calls go through the crate's `McDriver` trait: production uses the loaded driver, the
//! tests a fake that records every call and fails at a chosen one.

mod error;

pub use error::McError;

#[cfg(feature = "multicast")]
pub mod budget;
#[cfg(feature = "multicast")]
mod object;
#[cfg(feature = "multicast")]
mod sys;

#[cfg(all(test, feature = "multicast"))]
pub(crate) mod fake;
#[cfg(all(test, feature = "multicast"))]
mod tests;

#[cfg(feature = "multicast")]
pub use budget::McBudget;
#[cfg(feature = "multicast")]
pub use object::{McMember, McSpec, Multicast};

use super::error::Result;

/// Whether this build has the multicast binding (the cargo feature `multicast`).
pub const COMPILED: bool = cfg!(feature = "multicast");

/// The variable that opts in to multicast (`=1`).
pub const ENV_ENABLE: &str = "SYMM_ENABLE_MULTICAST";

/// The machine-wide switches that turn multicast off: (variable, value).
pub const OFF_SWITCHES: [(&str, &str); 3] = [
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
];

/// Checks the build and the environment; `Err` says why multicast is refused. No driver call
/// is made.
pub fn guard() -> Result<()> {
    guard_with(|k| std::env::var(k).ok())
}

/// [`guard`] over an arbitrary environment lookup.
pub fn guard_with(env: impl Fn(&str) -> Option<String>) -> Result<()> {
    if !COMPILED {
        return Err(McError::NotCompiled.into());
    }
    if env(ENV_ENABLE).as_deref() != Some("1") {
        return Err(McError::NotEnabled.into());
    }
    for (var, value) in OFF_SWITCHES {
        if env(var).is_some_and(|v| v.trim() == value) {
            return Err(McError::SwitchedOff { var, value }.into());
        }
    }
    Ok(())
}

/// Proof that [`guard`] passed and that every device in it supports multicast: the only way to
/// create a [`Multicast`]. Made only by `permit`.
#[cfg(feature = "multicast")]
pub struct Permit {
    drv: std::sync::Arc<dyn sys::McDriver>,
    devices: Vec<super::ffi::driver::Device>,
}

#[cfg(feature = "multicast")]
impl core::fmt::Debug for Permit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Permit")
            .field("devices", &self.devices)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "multicast")]
impl Permit {
    /// The devices checked.
    pub fn devices(&self) -> &[super::ffi::driver::Device] {
        &self.devices
    }

    fn driver(&self) -> &std::sync::Arc<dyn sys::McDriver> {
        &self.drv
    }
}

/// Runs [`guard`], then asks the driver whether each of `devices` supports multicast.
#[cfg(feature = "multicast")]
pub fn permit(devices: &[super::ffi::driver::Device]) -> Result<Permit> {
    guard()?;
    let drv = std::sync::Arc::new(sys::Real::load()?);
    permit_with(drv, |k| std::env::var(k).ok(), devices)
}

/// [`permit`] through `drv` over an arbitrary environment lookup.
#[cfg(feature = "multicast")]
pub(crate) fn permit_with(
    drv: std::sync::Arc<dyn sys::McDriver>,
    env: impl Fn(&str) -> Option<String>,
    devices: &[super::ffi::driver::Device],
) -> Result<Permit> {
    guard_with(env)?;
    if devices.is_empty() {
        return Err(McError::BadRequest("a permit needs at least one device".into()).into());
    }
    if let Some(&device) = devices
        .iter()
        .enumerate()
        .find_map(|(i, d)| devices[..i].contains(d).then_some(d))
    {
        return Err(McError::SharedDevice { device }.into());
    }
    for &d in devices {
        // SAFETY: an attribute query; no handle involved.
        let r = unsafe { drv.device_attribute(super::ffi::driver::ATTR_MULTICAST_SUPPORTED, d) };
        let v = r.map_err(|code| super::CudaError::Driver {
            call: "cuDeviceGetAttribute",
            code,
            name: drv.error_name(code),
        })?;
        if v == 0 {
            return Err(McError::NoDeviceSupport { device: d }.into());
        }
    }
    Ok(Permit {
        drv,
        devices: devices.to_vec(),
    })
}

#[cfg(all(test, not(feature = "multicast")))]
mod refusal_tests {
    use super::*;
    use crate::cuda::CudaError;

    #[test]
    fn a_build_without_the_feature_refuses_whatever_the_environment() {
        let env = |k: &str| (k == ENV_ENABLE).then(|| "1".to_string());
        const { assert!(!COMPILED) };
        assert_eq!(
            guard_with(env),
            Err(CudaError::Multicast(McError::NotCompiled))
        );
        assert_eq!(
            guard_with(|_| None),
            Err(CudaError::Multicast(McError::NotCompiled))
        );
    }
}
