//! A fake driver for the tests: it records every call with its arguments, hands out made-up
//! handles and addresses, and fails a chosen call. No real driver is reached.

use core::ffi::c_int;
use std::sync::{Arc, Mutex};

use crate::cuda::ffi::driver::{DevPtr, Device, MemAccessDesc, MemHandle, MulticastObjectProp};

use super::budget::{Ledger, McBudget};
use super::sys::{McDriver, Raw};
use super::{McMember, McSpec, Multicast};

/// The code a failing call returns (`CUDA_ERROR_OUT_OF_MEMORY`).
pub const FAIL: i32 = 2;
/// The handle `create` returns.
pub const MC: MemHandle = 0x4d43_0001;
/// The address `address_reserve` returns.
pub const VA: DevPtr = 0x7f00_0000_0000;

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Attribute {
        attr: c_int,
        dev: Device,
    },
    Granularity {
        prop: MulticastObjectProp,
        option: c_int,
    },
    Create {
        prop: MulticastObjectProp,
    },
    AddDevice {
        mc: MemHandle,
        dev: Device,
    },
    BindMem {
        mc: MemHandle,
        mc_offset: usize,
        mem: MemHandle,
        mem_offset: usize,
        size: usize,
    },
    Unbind {
        mc: MemHandle,
        dev: Device,
        mc_offset: usize,
        size: usize,
    },
    Release {
        handle: MemHandle,
    },
    Reserve {
        size: usize,
        align: usize,
    },
    Free {
        ptr: DevPtr,
        size: usize,
    },
    Map {
        ptr: DevPtr,
        size: usize,
        handle: MemHandle,
    },
    Unmap {
        ptr: DevPtr,
        size: usize,
    },
    SetAccess {
        ptr: DevPtr,
        size: usize,
        /// (location kind, device, flags) of each descriptor.
        access: Vec<(c_int, c_int, c_int)>,
    },
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    fail_at: Option<usize>,
    fail_release: bool,
}

/// The fake driver.
pub struct Fake {
    state: Mutex<State>,
    /// The value of the multicast-supported attribute.
    pub supported: c_int,
    /// The minimum granularity reported.
    pub granularity: usize,
}

impl Fake {
    /// A driver whose devices support multicast, with a 2 MiB granularity.
    pub fn new() -> Arc<Fake> {
        Arc::new(Fake {
            state: Mutex::default(),
            supported: 1,
            granularity: 2 << 20,
        })
    }

    /// A driver whose devices report no multicast support.
    pub fn unsupported() -> Arc<Fake> {
        Arc::new(Fake {
            state: Mutex::default(),
            supported: 0,
            granularity: 2 << 20,
        })
    }

    /// Fails the call with this index in the log (counted from the first call ever made).
    pub fn fail_at(&self, n: usize) {
        self.state.lock().unwrap().fail_at = Some(n);
    }

    /// Fails every release of the object's handle.
    pub fn fail_release(&self) {
        self.state.lock().unwrap().fail_release = true;
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    /// Calls made since the first `n`.
    pub fn calls_from(&self, n: usize) -> Vec<Call> {
        self.calls().split_off(n)
    }

    fn record<T>(&self, c: Call, ok: T) -> Raw<T> {
        let mut s = self.state.lock().unwrap();
        let fail = s.fail_at == Some(s.calls.len())
            || (s.fail_release && matches!(c, Call::Release { .. }));
        s.calls.push(c);
        if fail {
            Err(FAIL)
        } else {
            Ok(ok)
        }
    }
}

impl McDriver for Fake {
    unsafe fn device_attribute(&self, attr: c_int, dev: Device) -> Raw<c_int> {
        self.record(Call::Attribute { attr, dev }, self.supported)
    }

    unsafe fn granularity(&self, prop: &MulticastObjectProp, option: c_int) -> Raw<usize> {
        let c = Call::Granularity {
            prop: *prop,
            option,
        };
        self.record(c, self.granularity)
    }

    unsafe fn create(&self, prop: &MulticastObjectProp) -> Raw<MemHandle> {
        self.record(Call::Create { prop: *prop }, MC)
    }

    unsafe fn add_device(&self, mc: MemHandle, dev: Device) -> Raw<()> {
        self.record(Call::AddDevice { mc, dev }, ())
    }

    unsafe fn bind_mem(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        mem: MemHandle,
        mem_offset: usize,
        size: usize,
    ) -> Raw<()> {
        let c = Call::BindMem {
            mc,
            mc_offset,
            mem,
            mem_offset,
            size,
        };
        self.record(c, ())
    }

    unsafe fn unbind(&self, mc: MemHandle, dev: Device, mc_offset: usize, size: usize) -> Raw<()> {
        let c = Call::Unbind {
            mc,
            dev,
            mc_offset,
            size,
        };
        self.record(c, ())
    }

    unsafe fn release(&self, handle: MemHandle) -> Raw<()> {
        self.record(Call::Release { handle }, ())
    }

    unsafe fn address_reserve(&self, size: usize, align: usize) -> Raw<DevPtr> {
        self.record(Call::Reserve { size, align }, VA)
    }

    unsafe fn address_free(&self, ptr: DevPtr, size: usize) -> Raw<()> {
        self.record(Call::Free { ptr, size }, ())
    }

    unsafe fn map(&self, ptr: DevPtr, size: usize, handle: MemHandle) -> Raw<()> {
        self.record(Call::Map { ptr, size, handle }, ())
    }

    unsafe fn unmap(&self, ptr: DevPtr, size: usize) -> Raw<()> {
        self.record(Call::Unmap { ptr, size }, ())
    }

    unsafe fn set_access(&self, ptr: DevPtr, size: usize, access: &[MemAccessDesc]) -> Raw<()> {
        let access = access
            .iter()
            .map(|a| (a.location.kind, a.location.id, a.flags))
            .collect();
        self.record(Call::SetAccess { ptr, size, access }, ())
    }

    fn error_name(&self, code: i32) -> String {
        format!("FAKE_ERROR_{code}")
    }
}

/// A multicast object of `size` bytes over devices `0..world`, made through a fresh fake driver
/// against its own budget.
pub fn object(world: u16, size: usize) -> Multicast {
    let fake = Fake::new();
    let devices: Vec<Device> = (0..i32::from(world)).collect();
    let permit = super::permit_with(
        fake,
        |k| (k == super::ENV_ENABLE).then(|| "1".into()),
        &devices,
    )
    .expect("the fake driver grants a permit");
    let ledger = Ledger::new(Ok(McBudget {
        max_objects: 1,
        max_bytes: u64::MAX,
    }));
    let spec = McSpec {
        members: devices
            .iter()
            .map(|&d| McMember {
                device: d,
                mem: 0xa0 + d as u64,
                mem_offset: 0,
            })
            .collect(),
        size,
    };
    Multicast::create_in(&permit, &ledger, &spec).expect("the fake driver creates the object")
}
