//! The kernels' ABI, defined once: the interpreter's parameter block, the timeout record a
//! stopped block writes to host-mapped memory, the trace event the traced variant appends, the
//! device API's world (`symm_world`), and the parameter blocks of the MoE kernels and the
//! all-to-allv with device counts ([`moe`]), and of the fused all-reduce + RMSNorm ([`norm`]).
//!
//! Each struct is `#[repr(C)]` here and described field by field ([`Field`]: C name, C type,
//! byte offset taken with `offset_of!` from the Rust struct, a comment). `cargo xtask codegen`
//! writes the C++ structs into `symm/plan.cuh` from these tables, with `static_assert`s on
//! every offset and size, and its `--check` (run by `cargo xtask test`) fails when the header
//! is stale; the driver fills [`InterpParams`] (and the other blocks) and reads records and
//! events through the same offsets. Neither side can drift from the other: no kernel source
//! defines a parameter block by hand.

use core::mem::{offset_of, size_of};

/// One field of an ABI struct as C sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// C name (with `[N]` for arrays).
    pub name: &'static str,
    /// C type.
    pub c_type: &'static str,
    /// Byte offset.
    pub offset: usize,
    /// What it holds.
    pub doc: &'static str,
}

/// The interpreter's parameter block (`symm_interp_params`), passed by value to every launch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterpParams {
    /// Encoded ops of every channel, back to back.
    pub plan: u64,
    /// Channel offsets into `plan` (channels + 1 entries).
    pub chan_start: u64,
    /// This rank's heap range: peer p at base + p * stride.
    pub base: u64,
    /// Bytes between peers.
    pub stride: u64,
    /// Heap offsets of input, output, scratch.
    pub buf_off: [u64; 3],
    /// Heap offset of the signal pad.
    pub pad_off: u64,
    /// This rank's expected counters (device memory).
    pub expected: u64,
    /// Multicast view of the heap (multimem variant only; 0 otherwise).
    pub mc_base: u64,
    /// Timeout records (host-mapped), one per channel.
    pub records: u64,
    /// Abort word (host-mapped), shared by every block of the launch.
    pub abort_word: u64,
    /// Trace events (`channels * trace_cap`), or 0.
    pub trace: u64,
    /// Events written per channel (may exceed `trace_cap`), or 0.
    pub trace_len: u64,
    /// Deadline of every wait, ns.
    pub timeout_ns: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks.
    pub world: u32,
    /// Channels (the grid size).
    pub channels: u32,
    /// Trace events per channel.
    pub trace_cap: u32,
    /// The call's signature with sequence number 0 (`symm_core::sched::Request::signature`),
    /// or 0: no signature check (a team's call).
    pub sig: u64,
    /// Heap offset of the signature words: per channel, two (by the call's parity).
    pub sig_off: u64,
    /// This rank's call counters, one per channel (device memory): the sequence numbers.
    pub calls: u64,
}

macro_rules! field {
    ($s:ty, $f:ident, $name:expr, $c:expr, $doc:expr) => {
        Field {
            name: $name,
            c_type: $c,
            offset: offset_of!($s, $f),
            doc: $doc,
        }
    };
}

pub mod moe;
pub mod norm;
pub use moe::{A2avParams, MoeParams};
pub use norm::NormParams;

/// `symm_interp_params`, field by field.
pub const PARAMS: [Field; 20] = [
    field!(
        InterpParams,
        plan,
        "plan",
        "const symm_plan_op*",
        "every channel's ops back to back"
    ),
    field!(
        InterpParams,
        chan_start,
        "chan_start",
        "const unsigned int*",
        "channels + 1 entries"
    ),
    field!(
        InterpParams,
        base,
        "base",
        "char*",
        "this rank's heap range: peer p at base + p * stride"
    ),
    field!(
        InterpParams,
        stride,
        "stride",
        "unsigned long long",
        "bytes between peers"
    ),
    field!(
        InterpParams,
        buf_off,
        "buf_off[SYMM_BUFS]",
        "unsigned long long",
        "heap offsets of input, output, scratch"
    ),
    field!(
        InterpParams,
        pad_off,
        "pad_off",
        "unsigned long long",
        "heap offset of the signal pad"
    ),
    field!(
        InterpParams,
        expected,
        "expected",
        "unsigned long long*",
        "this rank's expected counters (device memory)"
    ),
    field!(
        InterpParams,
        mc_base,
        "mc_base",
        "char*",
        "multicast view of the heap (multimem variant only)"
    ),
    field!(
        InterpParams,
        records,
        "records",
        "symm_timeout_record*",
        "host-mapped, one per channel"
    ),
    field!(
        InterpParams,
        abort_word,
        "abort_word",
        "volatile unsigned int*",
        "host-mapped, shared by every block of the launch"
    ),
    field!(
        InterpParams,
        trace,
        "trace",
        "symm_trace_event*",
        "channels * trace_cap events, or null"
    ),
    field!(
        InterpParams,
        trace_len,
        "trace_len",
        "unsigned int*",
        "events written per channel (may exceed trace_cap)"
    ),
    field!(
        InterpParams,
        timeout_ns,
        "timeout_ns",
        "unsigned long long",
        "deadline of every wait"
    ),
    field!(InterpParams, rank, "rank", "unsigned int", "this rank"),
    field!(InterpParams, world, "world", "unsigned int", "ranks"),
    field!(
        InterpParams,
        channels,
        "channels",
        "unsigned int",
        "channels (the grid size)"
    ),
    field!(
        InterpParams,
        trace_cap,
        "trace_cap",
        "unsigned int",
        "trace events per channel"
    ),
    field!(
        InterpParams,
        sig,
        "sig",
        "unsigned long long",
        "the call's signature with sequence 0, or 0: no signature check"
    ),
    field!(
        InterpParams,
        sig_off,
        "sig_off",
        "unsigned long long",
        "heap offset of the signature words: two per channel, by the call's parity"
    ),
    field!(
        InterpParams,
        calls,
        "calls",
        "unsigned long long*",
        "this rank's call counters, one per channel (device memory)"
    ),
];

/// `symm_world`, the device API's view of the heap (`symm/device.cuh` uses it), passed by value
/// to a user's kernel and to the signal, MoE and all-to-allv kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymmWorld {
    /// This rank's device address of rank 0's heap; peer `p` at `base + p * stride`.
    pub base: u64,
    /// Bytes between two peers' heaps.
    pub stride: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks.
    pub world: u32,
    /// Device address of this rank's abort word (every device-API wait stops when it is
    /// raised), or 0 for none.
    pub abort: u64,
}

/// `symm_world`, field by field.
pub const WORLD: [Field; 5] = [
    field!(SymmWorld, base, "base", "char*", "this rank's view of the heap range; peer p at base + p * stride"),
    field!(SymmWorld, stride, "stride", "unsigned long long", "bytes between two peers' heaps"),
    field!(SymmWorld, rank, "rank", "unsigned int", "this rank"),
    field!(SymmWorld, world, "world", "unsigned int", "ranks"),
    field!(SymmWorld, abort, "abort", "const volatile unsigned int*", "this rank's abort word (host-mapped); every wait stops when it is set; null: deadlines only"),
];

/// Why a block stopped early ([`TimeoutRecord::reason`]): a wait passed its deadline.
pub const STOP_TIMEOUT: u32 = 1;
/// The abort word was raised (another block or rank stopped, or a peer was lost).
pub const STOP_ABORTED: u32 = 2;
/// The interpreter met an op it cannot run.
pub const STOP_BAD_OP: u32 = 3;
/// A peer's call of the fused all-reduce + RMSNorm differs from this rank's: `expected` holds
/// this rank's rows, `found` the peer's (rank `peer`).
pub const STOP_DIFFER: u32 = 4;
/// A record's reason: a peer's call signature, read after it pushed it for this call, names a
/// call that differs (`expected` holds this rank's word, `found` the peer's).
pub const STOP_SIGNATURE: u32 = 5;

/// One per (rank, channel), in host-mapped memory: why the block stopped, where.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeoutRecord {
    /// 0: none, else a `STOP_*` code.
    pub reason: u32,
    /// The rank.
    pub rank: u32,
    /// The rank that signals the slot (the slot's peer index).
    pub peer: u32,
    /// The slot.
    pub slot: u32,
    /// The value the slot had to reach.
    pub expected: u64,
    /// The value it held.
    pub found: u64,
    /// Position in the (rank, channel) op stream.
    pub op_index: u32,
    /// The channel.
    pub channel: u32,
}

/// `symm_timeout_record`, field by field.
pub const RECORD: [Field; 8] = [
    field!(
        TimeoutRecord,
        reason,
        "reason",
        "unsigned int",
        "0: none, else SYMM_STOP_*"
    ),
    field!(TimeoutRecord, rank, "rank", "unsigned int", "the rank"),
    field!(
        TimeoutRecord,
        peer,
        "peer",
        "unsigned int",
        "the rank that signals the slot"
    ),
    field!(TimeoutRecord, slot, "slot", "unsigned int", "the slot"),
    field!(
        TimeoutRecord,
        expected,
        "expected",
        "unsigned long long",
        "the value the slot had to reach"
    ),
    field!(
        TimeoutRecord,
        found,
        "found",
        "unsigned long long",
        "the value it held"
    ),
    field!(
        TimeoutRecord,
        op_index,
        "op_index",
        "unsigned int",
        "position in the (rank, channel) op stream"
    ),
    field!(
        TimeoutRecord,
        channel,
        "channel",
        "unsigned int",
        "the channel"
    ),
];

/// Trace event kinds ([`TraceEvent::kind`]): an op began.
pub const EV_BEGIN: u32 = 0;
/// An op ended.
pub const EV_END: u32 = 1;
/// A wait stalled.
pub const EV_STALL: u32 = 2;

/// One traced event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// `%globaltimer`, ns.
    pub time: u64,
    /// Op index in the (rank, channel) stream.
    pub index: u32,
    /// An `EV_*` kind.
    pub kind: u32,
}

/// `symm_trace_event`, field by field.
pub const EVENT: [Field; 3] = [
    field!(
        TraceEvent,
        time,
        "time",
        "unsigned long long",
        "%globaltimer, ns"
    ),
    field!(
        TraceEvent,
        index,
        "index",
        "unsigned int",
        "op index in the (rank, channel) stream"
    ),
    field!(TraceEvent, kind, "kind", "unsigned int", "SYMM_EV_*"),
];

/// Bytes of the parameter block.
pub const PARAMS_BYTES: usize = size_of::<InterpParams>();
/// Bytes of one timeout record.
pub const RECORD_BYTES: usize = size_of::<TimeoutRecord>();
/// Bytes of one trace event.
pub const EVENT_BYTES: usize = size_of::<TraceEvent>();
/// Bytes of `symm_world`.
pub const WORLD_BYTES: usize = size_of::<SymmWorld>();

// The sizes the kernels were written for; a change here is a change of every kernel's ABI.
const _: () = assert!(PARAMS_BYTES == 160 && RECORD_BYTES == 40 && EVENT_BYTES == 16);
const _: () = assert!(WORLD_BYTES == 32);

/// The structs in the order the header defines them (a struct before any that holds it):
/// (C name, Rust size, fields).
pub const STRUCTS: [(&str, usize, &[Field]); 7] = [
    ("symm_timeout_record", RECORD_BYTES, &RECORD),
    ("symm_trace_event", EVENT_BYTES, &EVENT),
    ("symm_interp_params", PARAMS_BYTES, &PARAMS),
    ("symm_world", WORLD_BYTES, &WORLD),
    ("symm_moe_params", moe::MOE_PARAMS_BYTES, &moe::MOE_PARAMS),
    (
        "symm_a2av_params",
        moe::A2AV_PARAMS_BYTES,
        &moe::A2AV_PARAMS,
    ),
    (
        "symm_norm_params",
        norm::NORM_PARAMS_BYTES,
        &norm::NORM_PARAMS,
    ),
];

/// The stop reasons and event kinds, as (C name, value).
pub const CONSTANTS: [(&str, u32); 8] = [
    ("SYMM_STOP_TIMEOUT", STOP_TIMEOUT),
    ("SYMM_STOP_ABORTED", STOP_ABORTED),
    ("SYMM_STOP_BAD_OP", STOP_BAD_OP),
    ("SYMM_STOP_DIFFER", STOP_DIFFER),
    ("SYMM_STOP_SIGNATURE", STOP_SIGNATURE),
    ("SYMM_EV_BEGIN", EV_BEGIN),
    ("SYMM_EV_END", EV_END),
    ("SYMM_EV_STALL", EV_STALL),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every table lists its struct's fields in order, without gaps the C compiler would not
    /// also leave (each field starts where the previous one ends, rounded to its alignment).
    #[test]
    fn tables_cover_their_structs() {
        for (name, size, fields) in STRUCTS {
            let mut end: usize = 0;
            for f in fields {
                // A struct field (`symm_world w`) takes its struct's size, aligned to 8.
                let inner = STRUCTS.iter().find(|s| s.0 == f.c_type).map(|s| s.1);
                let elem: usize = if f.c_type.contains('*') || f.c_type.contains("long long") {
                    8
                } else {
                    inner.unwrap_or(4)
                };
                let n =
                    f.name
                        .find('[')
                        .map_or(1, |_| if f.name.contains("SYMM_BUFS") { 3 } else { 1 });
                let align = if inner.is_some() { 8 } else { elem };
                assert_eq!(f.offset, end.next_multiple_of(align), "{name}.{}", f.name);
                end = f.offset + elem * n;
            }
            assert_eq!(end.next_multiple_of(8), size, "{name}");
        }
        assert_eq!((PARAMS_BYTES, RECORD_BYTES, EVENT_BYTES), (160, 40, 16));
        assert_eq!(
            (WORLD_BYTES, moe::MOE_PARAMS_BYTES, moe::A2AV_PARAMS_BYTES),
            (32, 240, 128)
        );
    }

    /// Every struct a table names as a field's type is defined before the struct that holds it
    /// (the header defines them in [`STRUCTS`]' order), and no C name repeats in a struct.
    #[test]
    fn structs_come_before_their_users_and_names_are_unique() {
        for (i, (name, _, fields)) in STRUCTS.iter().enumerate() {
            for f in fields.iter() {
                let base = f.c_type.trim_start_matches("const ").trim_end_matches('*');
                if let Some(j) = STRUCTS.iter().position(|s| s.0 == base) {
                    assert!(j < i, "{name}.{} uses {base} before it is defined", f.name);
                }
                let n = fields.iter().filter(|g| g.name == f.name).count();
                assert_eq!(n, 1, "{name}.{} repeats", f.name);
            }
        }
    }
}
