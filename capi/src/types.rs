//! The `repr(C)` types of the ABI and the codes their fields hold.
//!
//! Each struct is declared through `c_struct!`, which also records its fields, their C types,
//! offsets and docs for the header generator ([`crate::header`]), so the header cannot describe a
//! layout other than the one compiled here. Codes come from symm-core's own lists (element types
//! and operators keep their wire values, op kinds the plan encoding's), in [`codes`].

#![allow(non_camel_case_types)]

use std::mem::{offset_of, size_of};
use std::os::raw::{c_char, c_int};

use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::Buf;
use symm_core::plan;
use symm_core::sched::{Algorithm, Collective};

/// A C type as the header spells it: `[const ]base*...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CTy {
    /// The base type's name.
    pub base: &'static str,
    /// Whether the base type is `const` (only behind one pointer).
    pub base_const: bool,
    /// Levels of pointer.
    pub ptrs: u8,
}

impl CTy {
    /// A type by name.
    pub const fn named(base: &'static str) -> CTy {
        CTy {
            base,
            base_const: false,
            ptrs: 0,
        }
    }

    /// A pointer to this type; `konst` makes the pointee `const` (only for a pointer to a
    /// non-pointer, which is all the ABI uses).
    pub const fn pointer(self, konst: bool) -> CTy {
        assert!(!konst || self.ptrs == 0, "const pointer to a pointer");
        CTy {
            base: self.base,
            base_const: self.base_const || konst,
            ptrs: self.ptrs + 1,
        }
    }

    /// The C spelling.
    pub fn spell(&self) -> String {
        let mut s = String::new();
        if self.base_const {
            s.push_str("const ");
        }
        s.push_str(self.base);
        for _ in 0..self.ptrs {
            s.push('*');
        }
        s
    }
}

/// A Rust type with a C spelling.
pub trait CType {
    /// The spelling.
    const TY: CTy;
}

macro_rules! c_scalar {
    ($($t:ty => $n:literal),* $(,)?) => {
        $(impl CType for $t {
            const TY: CTy = CTy::named($n);
        })*
    };
}

c_scalar! {
    () => "void",
    u8 => "uint8_t",
    u16 => "uint16_t",
    u32 => "uint32_t",
    u64 => "uint64_t",
    c_int => "int",
    c_char => "char",
    usize => "size_t",
    f64 => "double",
}

impl<T: CType> CType for *const T {
    const TY: CTy = T::TY.pointer(true);
}

impl<T: CType> CType for *mut T {
    const TY: CTy = T::TY.pointer(false);
}

/// A field of a C struct.
#[derive(Clone, Copy, Debug)]
pub struct CField {
    /// Name.
    pub name: &'static str,
    /// C type.
    pub ty: CTy,
    /// Byte offset.
    pub offset: usize,
    /// Doc lines.
    pub doc: &'static [&'static str],
}

/// A C struct: name, size, fields and docs.
#[derive(Clone, Copy, Debug)]
pub struct CStruct {
    /// Name (also the typedef).
    pub name: &'static str,
    /// Size in bytes.
    pub size: usize,
    /// Doc lines.
    pub doc: &'static [&'static str],
    /// Fields in order.
    pub fields: &'static [CField],
}

/// Declares a `repr(C)` struct and its [`CStruct`] description (`Self::C`).
macro_rules! c_struct {
    (
        $(#[doc = $doc:literal])*
        pub struct $name:ident {
            $(
                $(#[doc = $fdoc:literal])*
                pub $field:ident: $ty:ty,
            )*
        }
    ) => {
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct $name {
            $(
                $(#[doc = $fdoc])*
                pub $field: $ty,
            )*
        }

        impl CType for $name {
            const TY: CTy = CTy::named(stringify!($name));
        }

        impl $name {
            /// The struct as the header describes it.
            pub const C: CStruct = CStruct {
                name: stringify!($name),
                size: size_of::<$name>(),
                doc: &[$($doc),*],
                fields: &[$(CField {
                    name: stringify!($field),
                    ty: <$ty as CType>::TY,
                    offset: offset_of!($name, $field),
                    doc: &[$($fdoc),*],
                }),*],
            };
        }
    };
}

c_struct! {
    /// A collective request: what a schedule, a buffer size, a cost or a trace depends on.
    /// Codes are `SYMM_COLL_*`, `SYMM_ALG_*`, `SYMM_DTYPE_*` and `SYMM_REDOP_*`.
    pub struct symm_request {
        /// The collective (`SYMM_COLL_*`).
        pub collective: u32,
        /// The algorithm (`SYMM_ALG_*`).
        pub algorithm: u32,
        /// The element type (`SYMM_DTYPE_*`).
        pub dtype: u32,
        /// The reduction operator (`SYMM_REDOP_*`; ignored by collectives that do not reduce).
        pub redop: u32,
        /// Ranks in the world (1..=1024).
        pub world: u16,
        /// Channels (1..=64; a GPU runs one thread block per channel).
        pub channels: u16,
        /// Root of broadcast, reduce, scatter and gather (ignored otherwise).
        pub root: u16,
        /// Sender of send_recv (ignored otherwise).
        pub src: u16,
        /// Receiver of send_recv (ignored otherwise).
        pub dst: u16,
        /// `SYMM_REQUEST_*` flags, or zero.
        pub flags: u16,
        /// Scratch slots per stream (0: the default; at most 255).
        pub slots: u32,
        /// Byte count (per rank, or per block for the collectives that move blocks).
        pub bytes: u64,
        /// Pipelining chunk in bytes (0: the default).
        pub chunk_bytes: u64,
    }
}

c_struct! {
    /// What each rank must provide for a request, in bytes.
    pub struct symm_buffer_sizes {
        /// Input buffer.
        pub input: u64,
        /// Output buffer.
        pub output: u64,
        /// Scratch buffer.
        pub scratch: u64,
    }
}

c_struct! {
    /// A byte location: (rank, buffer, offset).
    pub struct symm_loc {
        /// Rank that owns the bytes (0 for a multicast location, which names every rank).
        pub rank: u16,
        /// Zero.
        pub reserved: u16,
        /// The symmetric buffer (`SYMM_BUF_*`).
        pub buf: u32,
        /// Byte offset in the buffer.
        pub offset: u64,
    }
}

c_struct! {
    /// One op of a schedule, its kind's fields flattened (unused fields are zero on output and
    /// ignored on input). `COPY`: `a` -> `dst`, `count` bytes. `REDUCE`:
    /// `dst = a (redop) b`, `count` elements of `dtype`, then divided by `div` when above 1.
    /// `SIGNAL`: update slot `slot` of `peer`'s pad with `count` (`sigop`). `WAIT`: wait for
    /// `count` more signals on own slot `slot`. `MC_REDUCE`: `dst = (redop)` over every rank of
    /// `a` (buf, offset), `count` elements. `MC_STORE`: `a` to `dst` (buf, offset) on every
    /// rank, `count` bytes. `REDUCE_N`: `dst = (redop)` over `a` (buf, offset) on each of the
    /// `nsources` ranks in `sources` (in that order; one accumulator, f32 for 16-bit floats,
    /// rounded once), `count` elements. `LL_PUT`: `count` bytes of `a` as low-latency lines at
    /// `dst` (plus `sources_hi` for odd epochs of slot `slot`). `LL_REDUCE`: `nsources` line
    /// regions from `a` on, `sources_lo` bytes apart (plus `sources_hi` for odd epochs of slot
    /// `slot`), folded into `dst`, `count` elements. Both in lines of `format`.
    pub struct symm_op {
        /// The op kind (`SYMM_OP_*`).
        pub kind: u32,
        /// Element type of a reduction (`SYMM_DTYPE_*`).
        pub dtype: u32,
        /// Operator of a reduction (`SYMM_REDOP_*`).
        pub redop: u32,
        /// How a signal updates its slot (`SYMM_SIGNAL_*`).
        pub sigop: u32,
        /// Source, or first operand of a reduction.
        pub a: symm_loc,
        /// Second operand of a reduction.
        pub b: symm_loc,
        /// Destination.
        pub dst: symm_loc,
        /// Bytes (copy, multicast store), elements (reductions), signal value or wait count.
        pub count: u64,
        /// Signal-pad slot (signal, wait).
        pub slot: u32,
        /// Divisor of the last averaging step (0 or 1: none).
        pub div: u32,
        /// Rank whose pad a signal updates.
        pub peer: u16,
        /// Number of source ranks of a k-way reduce (1 to 8), or regions of a low-latency
        /// reduce.
        pub nsources: u16,
        /// Line format of a low-latency op (`SYMM_LL_FORMAT_*`).
        pub format: u32,
        /// Source ranks 0..4 of a k-way reduce, 16 bits each from the low end; the region
        /// stride of a low-latency reduce.
        pub sources_lo: u64,
        /// Source ranks 4..8 of a k-way reduce, 16 bits each from the low end; the half
        /// offset of a low-latency op.
        pub sources_hi: u64,
    }
}

c_struct! {
    /// Link and launch parameters of a machine for the cost model (`symm_link_preset` fills
    /// the named ones).
    pub struct symm_link {
        /// Fixed cost of launching a collective, in microseconds.
        pub launch_us: f64,
        /// Latency of one signalled hop, in microseconds.
        pub alpha_us: f64,
        /// Bandwidth of one rank's link per direction, in bytes per microsecond (positive).
        pub beta_bytes_per_us: f64,
        /// Multicast bandwidth in bytes per microsecond; 0 when unavailable.
        pub multicast_bytes_per_us: f64,
    }
}

c_struct! {
    /// One trace event: an op of (rank, channel) began, ended, or stalled.
    pub struct symm_event {
        /// Time in the writer's units.
        pub time: u64,
        /// Rank (below the request's world).
        pub rank: u16,
        /// Channel (below the request's channels).
        pub channel: u16,
        /// Position of the op in the (rank, channel) stream.
        pub index: u32,
        /// What the event marks (`SYMM_EVENT_*`).
        pub kind: u32,
        /// Nonzero when `contents` is set.
        pub has_contents: u32,
        /// Ranks whose contributions the op's destination holds afterwards (bit r: rank r).
        pub contents: u64,
        /// For a stall: the value the slot had to reach.
        pub stall_target: u64,
        /// For a stall: the value the slot held.
        pub stall_found: u64,
        /// The op.
        pub op: symm_op,
    }
}

c_struct! {
    /// How `symm_comm_from_env` opens a communicator; a zero field takes the default.
    pub struct symm_comm_options {
        /// Buffer bytes of each rank's symmetric heap (0: 256 MiB; at most 2^48).
        pub heap_bytes: u64,
        /// Deadline of every device wait, in milliseconds (0: 10 s; at most an hour).
        pub timeout_ms: u64,
        /// Deadline of every bootstrap exchange, joining the job included, in milliseconds
        /// (0: 60 s; at most an hour).
        pub bootstrap_timeout_ms: u64,
        /// `SYMM_COMM_*` flags, or zero (`SYMM_DETERMINISTIC` in the environment wins).
        pub flags: u64,
    }
}

c_struct! {
    /// Buffers in a communicator's symmetric heap: offsets (the same on every rank) and sizes.
    pub struct symm_buffers {
        /// Input offset.
        pub input: u64,
        /// Output offset.
        pub output: u64,
        /// Scratch offset.
        pub scratch: u64,
        /// Bytes of each.
        pub sizes: symm_buffer_sizes,
    }
}

/// Every struct of the ABI, in the order the header declares them.
pub const STRUCTS: [CStruct; 8] = [
    symm_request::C,
    symm_buffer_sizes::C,
    symm_loc::C,
    symm_op::C,
    symm_link::C,
    symm_event::C,
    symm_comm_options::C,
    symm_buffers::C,
];

/// A schedule being iterated: one (request, rank, channel)'s ops.
pub struct symm_schedule(pub(crate) symm_core::sched::Schedule);

/// A trace being written.
pub struct symm_trace_writer(pub(crate) crate::api::TraceWriter);

/// One rank's communicator of a job on its GPU.
pub struct symm_comm(pub(crate) symm_driver::cuda::Comm);

impl CType for symm_comm {
    const TY: CTy = CTy::named("symm_comm");
}

impl CType for symm_schedule {
    const TY: CTy = CTy::named("symm_schedule");
}

impl CType for symm_trace_writer {
    const TY: CTy = CTy::named("symm_trace_writer");
}

/// The opaque handles: name and doc.
pub const OPAQUE: [(&str, &str); 3] = [
    (
        "symm_schedule",
        "A schedule being iterated (symm_schedule_new; free with symm_schedule_free).",
    ),
    (
        "symm_trace_writer",
        "A trace being written (symm_trace_writer_new; ends with symm_trace_writer_finish or \
         symm_trace_writer_free).",
    ),
    (
        "symm_comm",
        "One rank's communicator of a job on its GPU (symm_comm_from_env; ends with \
         symm_comm_finish or symm_comm_free).",
    ),
];

/// The codes of each enumeration.
pub mod codes {
    use super::*;

    /// The collectives, the code of each its index (core's one list).
    pub const COLLECTIVES: [Collective; 10] = Collective::ALL;

    /// Op kinds (the plan encoding's).
    pub const OP_KINDS: [(&str, u8); plan::KINDS.len()] = plan::KINDS;

    /// Signal operations: name and wire value.
    pub const SIGNAL_OPS: [(&str, u8); 2] = [("SET", 0), ("ADD", 1)];

    /// Trace event kinds.
    pub const EVENT_BEGIN: u32 = 0;
    /// An op finished.
    pub const EVENT_END: u32 = 1;
    /// A wait that never finished.
    pub const EVENT_STALL: u32 = 2;

    /// A request flag: run it in deterministic mode, refused where its algorithm cannot
    /// honour it (`symm_core::sched::Request::deterministic`).
    pub const REQUEST_DETERMINISTIC: u16 = 1;
    /// A communicator flag: the job runs in deterministic mode
    /// (`symm_driver::cuda::CommOptions::deterministic`).
    pub const COMM_DETERMINISTIC: u64 = 1;

    /// Cost-model link presets.
    pub const LINK_NVLINK4: u32 = 0;
    /// Host threads over shared memory.
    pub const LINK_HOST: u32 = 1;

    /// Trace sources: the deterministic host simulator.
    pub const SOURCE_HOST_SIMULATED: u32 = 0;
    /// Host threads.
    pub const SOURCE_HOST_THREADS: u32 = 1;
    /// GPUs (no device names).
    pub const SOURCE_GPU: u32 = 2;

    /// One value of a C enumeration.
    pub struct Value {
        /// Name without the enumeration's prefix.
        pub name: String,
        /// Value.
        pub value: i64,
        /// Doc.
        pub doc: String,
    }

    /// A C enumeration: typedef name, value prefix, doc, values.
    pub struct Enum {
        /// The typedef name.
        pub name: &'static str,
        /// Prefix of every value's name.
        pub prefix: &'static str,
        /// Doc.
        pub doc: &'static str,
        /// Values.
        pub values: Vec<Value>,
    }

    fn value(name: &str, value: i64, doc: impl Into<String>) -> Value {
        Value {
            name: name.to_ascii_uppercase(),
            value,
            doc: doc.into(),
        }
    }

    /// Every enumeration of the ABI (the header's `typedef enum`s).
    pub fn enums() -> Vec<Enum> {
        let statuses = crate::error::STATUSES
            .iter()
            .map(|(n, v, d)| {
                let n = n.to_str().unwrap_or_default();
                value(n.trim_start_matches("SYMM_"), *v as i64, *d)
            })
            .collect();
        vec![
            Enum {
                name: "symm_status",
                prefix: "SYMM_",
                doc: "What a call returns: SYMM_OK or a negative error (symm_last_error says why).",
                values: statuses,
            },
            Enum {
                name: "symm_collective",
                prefix: "SYMM_COLL_",
                doc: "Collectives (symm_request.collective).",
                values: (COLLECTIVES.iter().enumerate())
                    .map(|(i, c)| value(c.name(), i as i64, c.name()))
                    .collect(),
            },
            Enum {
                name: "symm_algorithm",
                prefix: "SYMM_ALG_",
                doc: "Algorithms (symm_request.algorithm).",
                values: (Algorithm::ALL.iter().enumerate())
                    .map(|(i, a)| value(a.name(), i as i64, a.name()))
                    .collect(),
            },
            Enum {
                name: "symm_dtype",
                prefix: "SYMM_DTYPE_",
                doc: "Element types (symm_request.dtype, symm_op.dtype).",
                values: (DType::ALL.iter())
                    .map(|&d| {
                        value(
                            d.name(),
                            d as u8 as i64,
                            format!("element size {}", d.size()),
                        )
                    })
                    .collect(),
            },
            Enum {
                name: "symm_redop",
                prefix: "SYMM_REDOP_",
                doc: "Reduction operators (symm_request.redop, symm_op.redop).",
                values: (ReduceOp::ALL.iter())
                    .map(|&o| value(o.name(), o as u8 as i64, o.name()))
                    .collect(),
            },
            Enum {
                name: "symm_op_kind",
                prefix: "SYMM_OP_",
                doc: "Op kinds (symm_op.kind), the plan encoding's.",
                values: (OP_KINDS.iter())
                    .map(|&(n, v)| value(n, v as i64, n.to_ascii_lowercase()))
                    .collect(),
            },
            Enum {
                name: "symm_ll_format",
                prefix: "SYMM_LL_FORMAT_",
                doc: "Line formats of the low-latency ops (symm_op.format).",
                values: (symm_core::ll::Format::ALL.iter())
                    .map(|&f| value(f.name(), f as u8 as i64, format!("{}-byte lines", f.line())))
                    .collect(),
            },
            Enum {
                name: "symm_buf",
                prefix: "SYMM_BUF_",
                doc: "Symmetric buffers (symm_loc.buf).",
                values: (Buf::ALL.iter())
                    .map(|&b| value(b.name(), b as u8 as i64, b.name()))
                    .collect(),
            },
            Enum {
                name: "symm_signal_op",
                prefix: "SYMM_SIGNAL_",
                doc: "How a signal updates its slot (symm_op.sigop).",
                values: (SIGNAL_OPS.iter())
                    .map(|&(n, v)| value(n, v as i64, n.to_ascii_lowercase()))
                    .collect(),
            },
            Enum {
                name: "symm_event_kind",
                prefix: "SYMM_EVENT_",
                doc: "Trace event kinds (symm_event.kind).",
                values: vec![
                    value("BEGIN", EVENT_BEGIN as i64, "the op started"),
                    value("END", EVENT_END as i64, "the op finished"),
                    value("STALL", EVENT_STALL as i64, "a wait that never finished"),
                ],
            },
            Enum {
                name: "symm_request_flag",
                prefix: "SYMM_REQUEST_",
                doc: "Flags of a request (symm_request.flags).",
                values: vec![value(
                    "DETERMINISTIC",
                    REQUEST_DETERMINISTIC as i64,
                    "deterministic mode: the rank-order sum, refused where the algorithm cannot give it",
                )],
            },
            Enum {
                name: "symm_comm_flag",
                prefix: "SYMM_COMM_",
                doc: "Flags of a communicator (symm_comm_options.flags).",
                values: vec![value(
                    "DETERMINISTIC",
                    COMM_DETERMINISTIC as i64,
                    "deterministic mode for every request of the job",
                )],
            },
            Enum {
                name: "symm_link_kind",
                prefix: "SYMM_LINK_",
                doc: "Named links of the cost model (symm_link_preset).",
                values: vec![
                    value("NVLINK4", LINK_NVLINK4 as i64, "NVLink 4 through NVSwitch"),
                    value("HOST", LINK_HOST as i64, "host threads over shared memory"),
                ],
            },
            Enum {
                name: "symm_trace_source",
                prefix: "SYMM_SOURCE_",
                doc: "Where a trace was recorded (symm_trace_writer_new).",
                values: vec![
                    value(
                        "HOST_SIMULATED",
                        SOURCE_HOST_SIMULATED as i64,
                        "the host simulator",
                    ),
                    value("HOST_THREADS", SOURCE_HOST_THREADS as i64, "host threads"),
                    value("GPU", SOURCE_GPU as i64, "GPUs"),
                ],
            },
        ]
    }
}
