//! A multicast object: created, joined by every device, bound to each device's memory and mapped,
//! one RAII value per acquired resource so that any failure releases exactly what was acquired,
//! in reverse order, and a dropped object does the same.

use std::sync::Arc;

use crate::cuda::error::{CudaError, Result};
use crate::cuda::ffi::driver::{self as ffi, DevPtr, Device, MemHandle, MulticastObjectProp};

use super::budget::{self, Ledger, Reservation};
use super::error::McError;
use super::sys::{McDriver, Raw};
use super::Permit;

/// One device of a multicast team and the memory it binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McMember {
    /// The device (`CUdevice`, the ordinal).
    pub device: Device,
    /// Its physical allocation (a `cuMemCreate` handle, for example its symmetric heap's).
    pub mem: MemHandle,
    /// Where in `mem` the bound bytes start (a multiple of the multicast granularity).
    pub mem_offset: usize,
}

/// What to create: every member binds `size` bytes at offset 0 of the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McSpec {
    /// The team, one member per device; each device once.
    pub members: Vec<McMember>,
    /// Bytes per device, a multiple of the minimum multicast granularity.
    pub size: usize,
}

type Drv = Arc<dyn McDriver>;

fn named<T>(drv: &Drv, call: &'static str, r: Raw<T>) -> Result<T> {
    r.map_err(|code| CudaError::Driver {
        call,
        code,
        name: drv.error_name(code),
    })
}

/// The object's handle; released on drop, and only then is its budget returned.
struct Handle {
    drv: Drv,
    handle: MemHandle,
    budget: Option<Reservation>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from `create`, is released once, after every binding and
        // mapping of it is gone (they are dropped before this value).
        if unsafe { self.drv.release(self.handle) }.is_err() {
            // The object may still exist: it keeps its share of the budget.
            core::mem::forget(self.budget.take());
        }
    }
}

/// One device's binding; unbound on drop.
struct Bound {
    drv: Drv,
    mc: MemHandle,
    device: Device,
    size: usize,
}

impl Drop for Bound {
    fn drop(&mut self) {
        // SAFETY: the binding made at offset 0 with this size, undone once while the object's
        // handle is still alive.
        let _ = unsafe { self.drv.unbind(self.mc, self.device, 0, self.size) };
    }
}

/// Every binding, undone last-bound first.
struct Bindings(Vec<Bound>);

impl Drop for Bindings {
    fn drop(&mut self) {
        while let Some(b) = self.0.pop() {
            drop(b);
        }
    }
}

/// The reserved virtual range; freed on drop.
struct Range {
    drv: Drv,
    ptr: DevPtr,
    size: usize,
}

impl Drop for Range {
    fn drop(&mut self) {
        // SAFETY: the range from `address_reserve`, freed once after its mapping is gone.
        let _ = unsafe { self.drv.address_free(self.ptr, self.size) };
    }
}

/// The object mapped into the range; unmapped on drop.
struct Mapped {
    drv: Drv,
    ptr: DevPtr,
    size: usize,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `map` over this range, unmapped once.
        let _ = unsafe { self.drv.unmap(self.ptr, self.size) };
    }
}

/// A multicast object bound to every member's memory and mapped at [`Multicast::addr`]: a
/// `multimem` access there reaches every member's bound bytes. Dropping it unmaps, frees the
/// range, unbinds every member (last first), releases the object and returns its budget.
pub struct Multicast {
    // Dropped in declaration order: the reverse of setup.
    map: Mapped,
    range: Range,
    bindings: Bindings,
    handle: Handle,
    devices: Vec<Device>,
    granularity: usize,
}

impl core::fmt::Debug for Multicast {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Multicast")
            .field("addr", &self.map.ptr)
            .field("size", &self.map.size)
            .field("devices", &self.devices)
            .field("granularity", &self.granularity)
            .finish()
    }
}

impl Multicast {
    /// Creates the object for `spec` on the devices `permit` was given for, against the
    /// process's budget. A context of one of the devices must be current on this thread.
    pub fn create(permit: &Permit, spec: &McSpec) -> Result<Multicast> {
        Self::create_in(permit, budget::process(), spec)
    }

    /// [`Multicast::create`] against `ledger`, through the permit's driver.
    ///
    /// Before any driver call: the request is checked and the budget reserved. Then: the
    /// minimum granularity query (size and offsets must be multiples of it), create, add every
    /// device, bind every member at offset 0, reserve a range, map, grant every device access.
    pub(crate) fn create_in(
        permit: &Permit,
        ledger: &Arc<Ledger>,
        spec: &McSpec,
    ) -> Result<Multicast> {
        check_spec(permit, spec)?;
        let budget = ledger.reserve(spec.size as u64)?;
        let drv = permit.driver().clone();
        let prop = MulticastObjectProp {
            num_devices: spec.members.len() as u32,
            size: spec.size,
            handle_types: 0,
            flags: 0,
        };
        // SAFETY: a query over a property struct; no handle involved.
        let g = unsafe { drv.granularity(&prop, ffi::MC_GRANULARITY_MINIMUM) };
        let g = named(&drv, "cuMulticastGetGranularity", g)?;
        if g == 0 {
            return Err(CudaError::Unsupported(
                "the driver reports a multicast granularity of 0".into(),
            ));
        }
        let aligned = |what, v: usize| {
            if v.is_multiple_of(g) {
                Ok(())
            } else {
                Err(McError::Misaligned {
                    what,
                    value: v as u64,
                    granularity: g as u64,
                })
            }
        };
        aligned("size", spec.size)?;
        for m in &spec.members {
            aligned("memory offset", m.mem_offset)?;
        }
        // SAFETY: creation over a property struct; the handle is owned by `handle` at once.
        let h = unsafe { drv.create(&prop) };
        let handle = Handle {
            handle: named(&drv, "cuMulticastCreate", h)?,
            drv: drv.clone(),
            budget: Some(budget),
        };
        for m in &spec.members {
            // SAFETY: `handle` is alive; adding a device has nothing to undo (it ends with the
            // object).
            let r = unsafe { drv.add_device(handle.handle, m.device) };
            named(&drv, "cuMulticastAddDevice", r)?;
        }
        let mut bindings = Bindings(Vec::with_capacity(spec.members.len()));
        for m in &spec.members {
            // SAFETY: `handle` is alive; `m.mem` is the caller's allocation; the binding is owned
            // by `bindings` at once.
            let r = unsafe { drv.bind_mem(handle.handle, 0, m.mem, m.mem_offset, spec.size) };
            named(&drv, "cuMulticastBindMem", r)?;
            bindings.0.push(Bound {
                drv: drv.clone(),
                mc: handle.handle,
                device: m.device,
                size: spec.size,
            });
        }
        // SAFETY: a fresh reservation, owned by `range` at once.
        let p = unsafe { drv.address_reserve(spec.size, g) };
        let range = Range {
            ptr: named(&drv, "cuMemAddressReserve", p)?,
            size: spec.size,
            drv: drv.clone(),
        };
        // SAFETY: maps the live object over the whole of our own fresh range.
        let r = unsafe { drv.map(range.ptr, range.size, handle.handle) };
        named(&drv, "cuMemMap", r)?;
        let map = Mapped {
            drv: drv.clone(),
            ptr: range.ptr,
            size: range.size,
        };
        let access: Vec<ffi::MemAccessDesc> = spec
            .members
            .iter()
            .map(|m| ffi::MemAccessDesc {
                location: ffi::MemLocation {
                    kind: ffi::LOCATION_DEVICE,
                    id: m.device,
                },
                flags: ffi::ACCESS_READWRITE,
            })
            .collect();
        // SAFETY: our own mapping; the descriptors live across the call.
        let r = unsafe { drv.set_access(map.ptr, map.size, &access) };
        named(&drv, "cuMemSetAccess", r)?;
        Ok(Multicast {
            map,
            range,
            bindings,
            handle,
            devices: spec.members.iter().map(|m| m.device).collect(),
            granularity: g,
        })
    }

    /// The multicast view: the object mapped, readable and writable by every member.
    pub fn addr(&self) -> DevPtr {
        self.map.ptr
    }

    /// Bytes of the view (and bound on each member).
    pub fn size(&self) -> usize {
        self.range.size
    }

    /// The members' devices, in the order of the spec.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The minimum multicast granularity the object was created with.
    pub fn granularity(&self) -> usize {
        self.granularity
    }

    /// Members bound (all of them, for a created object).
    pub fn bound(&self) -> usize {
        self.bindings.0.len()
    }

    /// The object's handle.
    pub fn handle(&self) -> MemHandle {
        self.handle.handle
    }
}

/// The request's own checks (no driver call): members, devices, size.
fn check_spec(permit: &Permit, spec: &McSpec) -> core::result::Result<(), McError> {
    let bad = |s: &str| Err(McError::BadRequest(s.into()));
    if spec.members.is_empty() {
        return bad("a multicast team needs at least one device");
    }
    if u32::try_from(spec.members.len()).is_err() {
        return bad("more devices than a multicast team can hold");
    }
    if spec.size == 0 {
        return bad("a multicast object needs a size above 0");
    }
    for (i, m) in spec.members.iter().enumerate() {
        if !permit.devices().contains(&m.device) {
            return Err(McError::NotPermitted { device: m.device });
        }
        if spec.members[..i].iter().any(|o| o.device == m.device) {
            return Err(McError::BadRequest(format!(
                "device {} is in the team twice",
                m.device
            )));
        }
        if m.mem_offset.checked_add(spec.size).is_none() {
            return bad("memory offset + size overflows");
        }
    }
    Ok(())
}
