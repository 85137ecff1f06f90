//! `libsymm_nccl.so`: the NCCL API over symm's collectives.
//!
//! Loaded before the real library (`LD_PRELOAD=libsymm_nccl.so` under torchrun), or named where a
//! program looks for NCCL by path (vLLM's `VLLM_NCCL_SO_PATH`), it exports the NCCL entry points
//! symm serves and hands every call it does not serve to the real `libnccl.so.2`, found as the
//! runtime finds NCCL (`SYMM_NCCL`, then the loader path), and only with the multicast-off
//! variables set. Entry points it does not export reach the real library directly.
//!
//! The protocol:
//! * **The id.** `ncclGetUniqueId` draws the real id and writes a symm job (name and secret) into
//!   its unused tail ([`id`]). `ncclCommInitRank` (and `…Config`) gives the real library its own
//!   id back, makes the real communicator, then joins the symm job on the calling thread's
//!   current GPU. The ranks agree, through one NCCL all-reduce, that every rank joined; if any
//!   did not, the communicator runs on NCCL alone and the others leave symm's job. The handle
//!   the caller gets is the real communicator's, so every entry point the shim does not export
//!   works unchanged.
//! * **The calls.** `ncclAllReduce`, `ncclAllGather`, `ncclReduceScatter`, `ncclBroadcast` and
//!   `ncclReduce` on a communicator with a symm job run on symm's kernels, on the caller's
//!   stream, over the caller's device buffers (staged through the heap where they must be),
//!   when the runtime has a request for them ([`route`]). Everything else is forwarded:
//!   point-to-point calls, element types and reductions symm lacks, calls inside
//!   `ncclGroupStart`/`End` (NCCL defers those to the group's end), and communicators made
//!   inside a group or non-blocking. `ncclCommSplit` of a served communicator gives each color
//!   a symm job of its own ([`split`]).
//! * **Modes** (`SYMM_NCCL_SHIM`, read when an id is drawn or a communicator made): `on` (the
//!   default), `off` (a pass-through) and `alone` (no real library: symm serves what it can and
//!   refuses the rest; for ranks sharing a GPU, which NCCL refuses).
//! * **Errors** are NCCL's codes: symm's error kinds map to `ncclInvalidArgument`,
//!   `ncclInvalidUsage`, `ncclRemoteError` (a peer lost, a deadline, a poisoned job) or
//!   `ncclUnhandledCudaError`, and `ncclGetLastError` gives symm's message. No call panics
//!   across the boundary.
//!
//! Limits: one process per rank on one host (the symm job meets over a host-local socket); a
//! communicator's calls come from one thread at a time, as NCCL asks.

pub mod calls;
pub mod exports;
pub mod id;
pub mod route;
pub mod split;
pub mod state;
