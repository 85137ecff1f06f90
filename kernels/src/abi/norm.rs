//! The parameter block of the fused all-reduce, residual add and RMSNorm (`symm/norm.cu`),
//! passed by value to every launch. Heap offsets are relative to the world's base; the caller's
//! tensors are device addresses.

use core::mem::{offset_of, size_of};

use super::{Field, SymmWorld};

/// `symm_norm_params`: the op's regions and the call's tensors and shape.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NormParams {
    /// The device API's world.
    pub w: SymmWorld,
    /// This rank's input, rows x hidden bf16 (read, copied into its staging half).
    pub x: u64,
    /// The residual, rows x hidden bf16.
    pub residual: u64,
    /// The new residual, rows x hidden bf16 (may be the residual itself).
    pub residual_out: u64,
    /// The norm's weight, hidden bf16.
    pub weight: u64,
    /// The output, rows x hidden bf16.
    pub out: u64,
    /// Heap offset of the staging halves: 2 x max_rows x hidden bf16, read by peers.
    pub stage: u64,
    /// Heap offset of the flag words: blocks x world u64, word (b, r) written by rank r.
    pub flags: u64,
    /// Heap offset of this rank's state: the call epoch (u64), then blocks finished (u32).
    pub state: u64,
    /// Deadline of every wait, ns.
    pub deadline_ns: u64,
    /// The timeout record (host-mapped).
    pub record: u64,
    /// Rows of this call.
    pub rows: u32,
    /// Elements per row (a multiple of 8).
    pub hidden: u32,
    /// Rows each staging half holds.
    pub max_rows: u32,
    /// The norm's epsilon.
    pub eps: f32,
}

/// Bytes of `symm_norm_params`.
pub const NORM_PARAMS_BYTES: usize = size_of::<NormParams>();
const _: () = assert!(NORM_PARAMS_BYTES == 128);

/// `symm_norm_params`, field by field.
pub const NORM_PARAMS: [Field; 15] = [
    field!(NormParams, w, "w", "symm_world", "the device API's world"),
    field!(
        NormParams,
        x,
        "x",
        "const unsigned short*",
        "rows x hidden bf16, this rank's input"
    ),
    field!(
        NormParams,
        residual,
        "residual",
        "const unsigned short*",
        "rows x hidden bf16"
    ),
    field!(
        NormParams,
        residual_out,
        "residual_out",
        "unsigned short*",
        "rows x hidden bf16, may be the residual"
    ),
    field!(
        NormParams,
        weight,
        "weight",
        "const unsigned short*",
        "hidden bf16"
    ),
    field!(
        NormParams,
        out,
        "out",
        "unsigned short*",
        "rows x hidden bf16"
    ),
    field!(
        NormParams,
        stage,
        "stage",
        "unsigned long long",
        "2 halves x max_rows x hidden bf16, read by peers"
    ),
    field!(
        NormParams,
        flags,
        "flags",
        "unsigned long long",
        "blocks x world u64, word (b, r) written by rank r"
    ),
    field!(
        NormParams,
        state,
        "state",
        "unsigned long long",
        "epoch u64, then blocks finished u32, local"
    ),
    field!(
        NormParams,
        deadline_ns,
        "deadline_ns",
        "unsigned long long",
        "every wait's"
    ),
    field!(
        NormParams,
        record,
        "record",
        "symm_timeout_record*",
        "host-mapped"
    ),
    field!(
        NormParams,
        rows,
        "rows",
        "unsigned int",
        "rows of this call"
    ),
    field!(
        NormParams,
        hidden,
        "hidden",
        "unsigned int",
        "elements per row, a multiple of 8"
    ),
    field!(
        NormParams,
        max_rows,
        "max_rows",
        "unsigned int",
        "rows a staging half holds"
    ),
    field!(NormParams, eps, "eps", "float", "the norm's epsilon"),
];
