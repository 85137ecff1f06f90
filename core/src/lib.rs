//! # symm-core
//!
//! The executable specification of symm: everything about GPU symmetric memory and GPU-initiated
//! collectives that does not depend on a particular machine.
//!
//! * [`heap`]: the collective, deterministic symmetric-heap allocator and the peer layout.
//! * [`signal`]: the signal protocol (monotone counters, slot layout, barriers).
//! * [`flag`]: the flag form of a plan, which the copy-engine path runs.
//! * [`op`] and [`dtype`]: the instruction set every executor runs.
//! * [`sched`]: collective schedules as lazy, allocation-free state machines.
//! * [`exec`]: a non-blocking executor generic over a [`exec::Fabric`].
//! * [`moe`]: mixture-of-experts dispatch and combine: the layout, the routing, the bounds.
//! * [`cost`]: the alpha-beta cost model and algorithm selection.
//! * [`name`]: the names of collectives, algorithms, dtypes, operators and topologies, parsed.
//! * [`trace`]: the trace format shared by the simulator and the GPU.
//! * [`plan`]: the fixed-size encoding of ops that the GPU interpreter reads.
//! * `symbolic` (feature `alloc`): runs schedules on contribution sets to prove them correct.
//!
//! The crate is `#![no_std]`; the `alloc` feature (on by default) adds the symbolic checker and
//! owned trace buffers.
#![no_std]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod cost;
pub mod dtype;
pub mod exec;
pub mod flag;
pub mod heap;
pub mod ll;
pub mod moe;
pub mod name;
pub mod norm;
pub mod op;
#[cfg(feature = "alloc")]
pub mod perfetto;
pub mod plan;
pub mod sched;
pub mod signal;
#[cfg(feature = "alloc")]
pub mod symbolic;
pub mod team;
pub mod trace;
