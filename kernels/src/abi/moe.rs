//! The parameter blocks of the MoE kernels (`symm/moe.cu`: dispatch and combine) and of the
//! all-to-allv with device counts (`symm/a2av.cu`), passed by value to every launch. Heap
//! offsets are relative to the world's base; user tensors are device addresses.

use core::mem::{offset_of, size_of};

use super::{Field, SymmWorld};

/// `symm_moe_params`: one MoE layer's regions and the call's tensors and shape.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeParams {
    /// The device API's world.
    pub w: SymmWorld,
    /// Heap offsets of the layer's regions, in [`MOE_PARAMS`]' order: `hdr`, `chdr`, `stage`,
    /// `cstage`, `state`, `slots`, `cin`, `cmeta`, `totals`, `xout`, `spans`.
    pub at: [u64; 11],
    /// Tokens x hidden elements.
    pub x: u64,
    /// Tokens x topk expert indices (i64).
    pub idx: u64,
    /// Tokens x topk weights (f32).
    pub weights: u64,
    /// Rows_max x hidden elements: the experts' outputs.
    pub expert_out: u64,
    /// Tokens x hidden elements.
    pub out: u64,
    /// Bytes of a dispatch staging row.
    pub row_bytes: u64,
    /// Bytes of a token's data.
    pub data_bytes: u64,
    /// Bytes of a combine staging row.
    pub pbytes: u64,
    /// Deadline of every wait, ns.
    pub deadline_ns: u64,
    /// The timeout record (host-mapped).
    pub record: u64,
    /// Tokens of the call.
    pub tokens: u32,
    /// Most tokens of any call.
    pub tokens_max: u32,
    /// Elements per token.
    pub hidden: u32,
    /// Experts per token.
    pub topk: u32,
    /// Experts in the world.
    pub experts: u32,
    /// Experts per rank.
    pub local: u32,
    /// Most expert rows a rank receives.
    pub rows_max: u32,
    /// Bytes per element: 2 (bf16) or 4 (f32).
    pub elem: u32,
    /// `SYMM_MOE_SEND | SYMM_MOE_RECV`.
    pub phase: u32,
    /// Padding to 8 bytes.
    pub pad: u32,
}

/// Bytes of `symm_moe_params`.
pub const MOE_PARAMS_BYTES: usize = size_of::<MoeParams>();
const _: () = assert!(MOE_PARAMS_BYTES == 240);

/// One of the region offsets of [`MoeParams::at`].
macro_rules! at {
    ($i:expr, $name:expr, $doc:expr) => {
        Field {
            name: $name,
            c_type: "unsigned long long",
            offset: offset_of!(MoeParams, at) + $i * 8,
            doc: $doc,
        }
    };
}

/// `symm_moe_params`, field by field.
pub const MOE_PARAMS: [Field; 32] = [
    field!(MoeParams, w, "w", "symm_world", "the device API's world"),
    at!(
        0,
        "hdr",
        "dispatch headers: 2 halves x world senders x (1 + L) words"
    ),
    at!(1, "chdr", "combine headers: 2 halves x world words"),
    at!(
        2,
        "stage",
        "dispatch staging: 2 halves x stage_rows x row_bytes"
    ),
    at!(
        3,
        "cstage",
        "combine staging: 2 halves x stage_rows x pbytes"
    ),
    at!(4, "state", "SYMM_MOE_STATE_WORDS u32, local"),
    at!(
        5,
        "slots",
        "tokens_max x world u32, local: this rank's slot(t, q)"
    ),
    at!(6, "cin", "world u32, local: rows received from each sender"),
    at!(
        7,
        "cmeta",
        "stage_rows x topk x 2 u32 (expert row, weight bits), local"
    ),
    at!(
        8,
        "totals",
        "world + experts u32, local: the last chunk's totals"
    ),
    at!(
        9,
        "xout",
        "rows_max x hidden elements, local: the expert rows"
    ),
    at!(
        10,
        "spans",
        "L x 2 u32, local: (first row, rows) per local expert"
    ),
    field!(MoeParams, x, "x", "const void*", "tokens x hidden elements"),
    field!(MoeParams, idx, "idx", "const long long*", "tokens x topk"),
    field!(
        MoeParams,
        weights,
        "weights",
        "const float*",
        "tokens x topk"
    ),
    field!(
        MoeParams,
        expert_out,
        "expert_out",
        "const void*",
        "rows_max x hidden elements"
    ),
    field!(MoeParams, out, "out", "void*", "tokens x hidden elements"),
    field!(
        MoeParams,
        row_bytes,
        "row_bytes",
        "unsigned long long",
        "dispatch staging row"
    ),
    field!(
        MoeParams,
        data_bytes,
        "data_bytes",
        "unsigned long long",
        "a token's data"
    ),
    field!(
        MoeParams,
        pbytes,
        "pbytes",
        "unsigned long long",
        "combine staging row"
    ),
    field!(
        MoeParams,
        deadline_ns,
        "deadline_ns",
        "unsigned long long",
        "every wait's"
    ),
    field!(
        MoeParams,
        record,
        "record",
        "symm_timeout_record*",
        "host-mapped"
    ),
    field!(
        MoeParams,
        tokens,
        "tokens",
        "unsigned int",
        "tokens of the call"
    ),
    field!(
        MoeParams,
        tokens_max,
        "tokens_max",
        "unsigned int",
        "most tokens of any call"
    ),
    field!(
        MoeParams,
        hidden,
        "hidden",
        "unsigned int",
        "elements per token"
    ),
    field!(MoeParams, topk, "topk", "unsigned int", "experts per token"),
    field!(
        MoeParams,
        experts,
        "experts",
        "unsigned int",
        "experts in the world"
    ),
    field!(
        MoeParams,
        local,
        "local",
        "unsigned int",
        "experts per rank"
    ),
    field!(
        MoeParams,
        rows_max,
        "rows_max",
        "unsigned int",
        "most expert rows a rank receives"
    ),
    field!(MoeParams, elem, "elem", "unsigned int", "2: bf16, 4: f32"),
    field!(
        MoeParams,
        phase,
        "phase",
        "unsigned int",
        "SYMM_MOE_SEND | SYMM_MOE_RECV"
    ),
    field!(MoeParams, pad, "pad_", "unsigned int", "padding"),
];

/// `symm_a2av_params`: the all-to-allv layer's regions and the call's counts and buffers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct A2avParams {
    /// The device API's world.
    pub w: SymmWorld,
    /// Heap offset of the headers: 2 halves x world senders x world words.
    pub hdr: u64,
    /// Heap offset of the done words: 2 halves x world words.
    pub done: u64,
    /// Heap offset of the output: `out_max` elements, written by peers.
    pub out: u64,
    /// Heap offset of the layer's state words (local).
    pub state: u64,
    /// World send counts in elements (i64).
    pub send_counts: u64,
    /// `in_max` elements, packed by destination.
    pub input: u64,
    /// World received counts in elements (i64, clipped to the output), or 0.
    pub recv_counts: u64,
    /// Elements of the input.
    pub in_max: u64,
    /// Elements of the output.
    pub out_max: u64,
    /// Deadline of every wait, ns.
    pub deadline_ns: u64,
    /// The timeout record (host-mapped).
    pub record: u64,
    /// Bytes per element.
    pub elem: u32,
    /// Padding to 8 bytes.
    pub pad: u32,
}

/// Bytes of `symm_a2av_params`.
pub const A2AV_PARAMS_BYTES: usize = size_of::<A2avParams>();
const _: () = assert!(A2AV_PARAMS_BYTES == 128);

/// `symm_a2av_params`, field by field.
pub const A2AV_PARAMS: [Field; 14] = [
    field!(A2avParams, w, "w", "symm_world", "the device API's world"),
    field!(
        A2avParams,
        hdr,
        "hdr",
        "unsigned long long",
        "2 halves x world senders x world words"
    ),
    field!(
        A2avParams,
        done,
        "done",
        "unsigned long long",
        "2 halves x world words"
    ),
    field!(
        A2avParams,
        out,
        "out",
        "unsigned long long",
        "out_max elements, written by peers"
    ),
    field!(
        A2avParams,
        state,
        "state",
        "unsigned long long",
        "SYMM_MOE_STATE_WORDS u32, local"
    ),
    field!(
        A2avParams,
        send_counts,
        "send_counts",
        "const long long*",
        "world, elements"
    ),
    field!(
        A2avParams,
        input,
        "input",
        "const void*",
        "in_max elements, packed by destination"
    ),
    field!(
        A2avParams,
        recv_counts,
        "recv_counts",
        "long long*",
        "world, elements (clipped to the output), may be null"
    ),
    field!(
        A2avParams,
        in_max,
        "in_max",
        "unsigned long long",
        "elements of the input"
    ),
    field!(
        A2avParams,
        out_max,
        "out_max",
        "unsigned long long",
        "elements of the output"
    ),
    field!(
        A2avParams,
        deadline_ns,
        "deadline_ns",
        "unsigned long long",
        "every wait's"
    ),
    field!(
        A2avParams,
        record,
        "record",
        "symm_timeout_record*",
        "host-mapped"
    ),
    field!(
        A2avParams,
        elem,
        "elem",
        "unsigned int",
        "bytes per element"
    ),
    field!(A2avParams, pad, "pad_", "unsigned int", "padding"),
];
