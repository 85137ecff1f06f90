//! The synchronisation primitives of the host backend, switched to loom's model-checked versions
//! under `cfg(loom)` so the signal protocol's models run against the same code.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(loom)]
pub use loom::sync::{Arc, Mutex};
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
#[cfg(not(loom))]
pub use std::sync::{Arc, Mutex};
