//! The binding against the fake driver: the guard's refusals, the exact calls of a setup and of
//! its teardown, teardown after a failure at every step, and the budget.

use std::sync::Arc;

use super::budget::{Ledger, McBudget};
use super::fake::{Call, Fake, FAIL, MC, VA};
use super::*;
use crate::cuda::ffi::driver::{
    ACCESS_READWRITE, ATTR_MULTICAST_SUPPORTED, LOCATION_DEVICE, MC_GRANULARITY_MINIMUM,
};
use crate::cuda::CudaError;

const MIB: usize = 1 << 20;
const SIZE: usize = 4 * MIB;

fn opted_in(k: &str) -> Option<String> {
    (k == ENV_ENABLE).then(|| "1".to_string())
}

fn ledger() -> Arc<Ledger> {
    Ledger::new(Ok(McBudget {
        max_objects: 4,
        max_bytes: 1 << 30,
    }))
}

fn spec(devices: &[i32]) -> McSpec {
    McSpec {
        members: devices
            .iter()
            .map(|&d| McMember {
                device: d,
                mem: 0xa0 + d as u64,
                mem_offset: 0,
            })
            .collect(),
        size: SIZE,
    }
}

fn permit(fake: &Arc<Fake>, devices: &[i32]) -> Permit {
    permit_with(fake.clone(), opted_in, devices).unwrap()
}

fn prop(n: u32) -> crate::cuda::ffi::driver::MulticastObjectProp {
    crate::cuda::ffi::driver::MulticastObjectProp {
        num_devices: n,
        size: SIZE,
        handle_types: 0,
        flags: 0,
    }
}

/// The calls of a successful setup of devices 0 and 1.
fn setup_calls() -> Vec<Call> {
    vec![
        Call::Granularity {
            prop: prop(2),
            option: MC_GRANULARITY_MINIMUM,
        },
        Call::Create { prop: prop(2) },
        Call::AddDevice { mc: MC, dev: 0 },
        Call::AddDevice { mc: MC, dev: 1 },
        Call::BindMem {
            mc: MC,
            mc_offset: 0,
            mem: 0xa0,
            mem_offset: 0,
            size: SIZE,
        },
        Call::BindMem {
            mc: MC,
            mc_offset: 0,
            mem: 0xa1,
            mem_offset: 0,
            size: SIZE,
        },
        Call::Reserve {
            size: SIZE,
            align: 2 * MIB,
        },
        Call::Map {
            ptr: VA,
            size: SIZE,
            handle: MC,
        },
        Call::SetAccess {
            ptr: VA,
            size: SIZE,
            access: vec![
                (LOCATION_DEVICE, 0, ACCESS_READWRITE),
                (LOCATION_DEVICE, 1, ACCESS_READWRITE),
            ],
        },
    ]
}

/// What undoes a setup call (None: nothing to undo).
fn undo(c: &Call) -> Option<Call> {
    match *c {
        Call::Create { .. } => Some(Call::Release { handle: MC }),
        Call::BindMem { mem, .. } => Some(Call::Unbind {
            mc: MC,
            dev: (mem - 0xa0) as i32,
            mc_offset: 0,
            size: SIZE,
        }),
        Call::Reserve { size, .. } => Some(Call::Free { ptr: VA, size }),
        Call::Map { ptr, size, .. } => Some(Call::Unmap { ptr, size }),
        _ => None,
    }
}

/// The teardown of the first `n` setup calls having succeeded: their undos, last first.
fn teardown_of(n: usize) -> Vec<Call> {
    setup_calls()[..n].iter().rev().filter_map(undo).collect()
}

#[test]
fn the_guard_refuses_without_opt_in() {
    for v in [None, Some("0"), Some("true"), Some(" 1"), Some("")] {
        let fake = Fake::new();
        let env = |k: &str| (k == ENV_ENABLE).then(|| v.map(str::to_string)).flatten();
        assert_eq!(
            permit_with(fake.clone(), env, &[0]).unwrap_err(),
            CudaError::Multicast(McError::NotEnabled),
            "{v:?}"
        );
        assert!(fake.calls().is_empty());
    }
}

#[test]
fn the_guard_refuses_with_each_off_switch() {
    for (var, value) in OFF_SWITCHES {
        for v in [value.to_string(), format!(" {value}\n")] {
            let fake = Fake::new();
            let env = |k: &str| {
                if k == ENV_ENABLE {
                    Some("1".to_string())
                } else {
                    (k == var).then(|| v.clone())
                }
            };
            assert_eq!(
                guard_with(env),
                Err(CudaError::Multicast(McError::SwitchedOff { var, value }))
            );
            assert_eq!(
                permit_with(fake.clone(), env, &[0]).unwrap_err(),
                CudaError::Multicast(McError::SwitchedOff { var, value })
            );
            assert!(fake.calls().is_empty(), "{var}");
        }
    }
    // The switches' other values leave multicast on.
    let env = |k: &str| match k {
        ENV_ENABLE | "NCCL_NVLS_ENABLE" => Some("1".to_string()),
        _ => Some("0".to_string()),
    };
    assert_eq!(guard_with(env), Ok(()));
}

#[test]
fn the_guard_refuses_without_device_support() {
    let fake = Fake::unsupported();
    assert_eq!(
        permit_with(fake.clone(), opted_in, &[3, 4]).unwrap_err(),
        CudaError::Multicast(McError::NoDeviceSupport { device: 3 })
    );
    assert_eq!(
        fake.calls(),
        vec![Call::Attribute {
            attr: ATTR_MULTICAST_SUPPORTED,
            dev: 3
        }]
    );
    let fake = Fake::new();
    fake.fail_at(1);
    match permit_with(fake.clone(), opted_in, &[3, 4]).unwrap_err() {
        CudaError::Driver { call, code, .. } => {
            assert_eq!((call, code), ("cuDeviceGetAttribute", FAIL))
        }
        e => panic!("{e}"),
    }
    let fake = Fake::new();
    assert!(matches!(
        permit_with(fake.clone(), opted_in, &[]),
        Err(CudaError::Multicast(McError::BadRequest(_)))
    ));
    assert!(fake.calls().is_empty());
    let p = permit(&fake, &[3, 4]);
    assert_eq!(p.devices(), &[3, 4]);
    assert_eq!(fake.calls().len(), 2);
}

#[test]
fn setup_and_teardown_make_exactly_these_calls() {
    let fake = Fake::new();
    let l = ledger();
    let p = permit(&fake, &[0, 1]);
    let n = fake.calls().len();
    let mc = Multicast::create_in(&p, &l, &spec(&[0, 1])).unwrap();
    assert_eq!(fake.calls_from(n), setup_calls());
    assert_eq!(
        (mc.addr(), mc.size(), mc.devices(), mc.bound(), mc.handle()),
        (VA, SIZE, &[0, 1][..], 2, MC)
    );
    assert_eq!(mc.granularity(), 2 * MIB);
    assert_eq!(l.held(), (1, SIZE as u64));
    drop(mc);
    assert_eq!(
        fake.calls_from(n + setup_calls().len()),
        teardown_of(setup_calls().len())
    );
    assert_eq!(
        fake.calls_from(n + setup_calls().len()),
        vec![
            Call::Unmap {
                ptr: VA,
                size: SIZE
            },
            Call::Free {
                ptr: VA,
                size: SIZE
            },
            Call::Unbind {
                mc: MC,
                dev: 1,
                mc_offset: 0,
                size: SIZE
            },
            Call::Unbind {
                mc: MC,
                dev: 0,
                mc_offset: 0,
                size: SIZE
            },
            Call::Release { handle: MC },
        ]
    );
    assert_eq!(l.held(), (0, 0));
}

#[test]
fn a_failure_at_each_step_releases_what_was_acquired_in_reverse() {
    let steps = setup_calls();
    for (i, step) in steps.iter().enumerate() {
        let fake = Fake::new();
        let l = ledger();
        let p = permit(&fake, &[0, 1]);
        let n = fake.calls().len();
        fake.fail_at(n + i);
        let e = Multicast::create_in(&p, &l, &spec(&[0, 1])).unwrap_err();
        match e {
            CudaError::Driver { code, ref name, .. } => {
                assert_eq!(code, FAIL);
                assert_eq!(name, "FAKE_ERROR_2");
            }
            e => panic!("step {i}: {e}"),
        }
        let mut want = steps[..=i].to_vec();
        want.extend(teardown_of(i));
        assert_eq!(fake.calls_from(n), want, "failure at step {i}: {step:?}");
        for u in steps.iter().filter_map(undo) {
            let times = fake.calls().iter().filter(|c| **c == u).count();
            assert!(times <= 1, "step {i}: {u:?} made {times} times");
        }
        assert_eq!(l.held(), (0, 0), "step {i}: the budget came back");
    }
}

#[test]
fn the_budget_refuses_before_any_driver_call_and_comes_back() {
    let fake = Fake::new();
    let p = permit(&fake, &[0, 1]);
    let l = Ledger::new(Ok(McBudget {
        max_objects: 1,
        max_bytes: SIZE as u64,
    }));
    let first = Multicast::create_in(&p, &l, &spec(&[0, 1])).unwrap();
    let m = fake.calls().len();
    assert_eq!(
        Multicast::create_in(&p, &l, &spec(&[0, 1])).unwrap_err(),
        CudaError::Multicast(McError::TooManyObjects { held: 1, max: 1 })
    );
    assert_eq!(fake.calls().len(), m, "no driver call");
    drop(first);
    let second = Multicast::create_in(&p, &l, &spec(&[0, 1])).unwrap();
    drop(second);
    assert_eq!(l.held(), (0, 0));

    l.set_budget(McBudget {
        max_objects: 8,
        max_bytes: SIZE as u64 - 1,
    });
    let m = fake.calls().len();
    assert_eq!(
        Multicast::create_in(&p, &l, &spec(&[0, 1])).unwrap_err(),
        CudaError::Multicast(McError::TooManyBytes {
            held: 0,
            requested: SIZE as u64,
            max: SIZE as u64 - 1
        })
    );
    assert_eq!(fake.calls().len(), m, "no driver call");
}

#[test]
fn an_object_whose_release_failed_keeps_its_budget() {
    let fake = Fake::new();
    let l = ledger();
    let p = permit(&fake, &[0, 1]);
    let mc = Multicast::create_in(&p, &l, &spec(&[0, 1])).unwrap();
    fake.fail_release();
    drop(mc);
    assert_eq!(l.held(), (1, SIZE as u64));
}

#[test]
fn malformed_requests_are_refused_before_any_driver_call() {
    let fake = Fake::new();
    let l = ledger();
    let p = permit(&fake, &[0, 1]);
    let n = fake.calls().len();
    let mut dup = spec(&[0, 1]);
    dup.members[1].device = 0;
    let mut zero = spec(&[0]);
    zero.size = 0;
    let mut overflow = spec(&[0]);
    overflow.members[0].mem_offset = usize::MAX;
    for (s, want) in [
        (spec(&[]), "BadRequest"),
        (dup, "BadRequest"),
        (zero, "BadRequest"),
        (overflow, "BadRequest"),
        (spec(&[0, 2]), "NotPermitted"),
    ] {
        let e = Multicast::create_in(&p, &l, &s).unwrap_err();
        assert!(format!("{e:?}").contains(want), "{s:?}: {e:?}");
    }
    assert_eq!(fake.calls().len(), n);
    assert_eq!(l.held(), (0, 0));
}

#[test]
fn misaligned_sizes_and_offsets_stop_after_the_granularity_query() {
    let fake = Fake::new();
    let l = ledger();
    let p = permit(&fake, &[0, 1]);
    let mut odd = spec(&[0, 1]);
    odd.size = SIZE + 4096;
    let mut off = spec(&[0, 1]);
    off.members[1].mem_offset = MIB;
    for (s, what) in [(odd, "size"), (off, "memory offset")] {
        let n = fake.calls().len();
        match Multicast::create_in(&p, &l, &s).unwrap_err() {
            CudaError::Multicast(McError::Misaligned { what: w, .. }) => assert_eq!(w, what),
            e => panic!("{e}"),
        }
        let calls = fake.calls_from(n);
        assert_eq!(calls.len(), 1);
        assert!(matches!(calls[0], Call::Granularity { .. }));
        assert_eq!(l.held(), (0, 0));
    }
}

#[test]
fn the_feature_build_says_so() {
    const { assert!(COMPILED) };
    assert_eq!(guard_with(opted_in), Ok(()));
}

#[test]
fn ranks_that_share_a_device_get_no_permit_and_no_driver_call() {
    let fake = Fake::new();
    assert_eq!(
        permit_with(fake.clone(), opted_in, &[0, 1, 0]).unwrap_err(),
        CudaError::Multicast(McError::SharedDevice { device: 0 })
    );
    assert!(fake.calls().is_empty());
}
