//! # symm-bootstrap
//!
//! How the processes of a job start and meet, with std and libc only: no CUDA.
//!
//! * The bootstrap (Linux; its items are at the crate root): the job environment, a Unix-socket
//!   rendezvous checked by uid and token, collectives that carry file descriptors, lost peers.
//!   See [`SocketBootstrap`].
//! * [`launcher`] (Linux): `symm-run`, which starts a job's ranks and ends the job when one fails.
//! * [`safety_env`]: the multicast-off variables: checked before NCCL loads, set for every
//!   program symm starts.
//!
//! The CUDA runtime (symm-driver) builds its job on this crate and re-exports it as
//! `symm_driver::bootstrap`; nothing here may name the runtime, which Cargo enforces.
#![deny(missing_docs)]

#[cfg(target_os = "linux")]
mod job;
#[cfg(target_os = "linux")]
pub mod launcher;
pub mod safety_env;

#[cfg(target_os = "linux")]
pub use job::*;
