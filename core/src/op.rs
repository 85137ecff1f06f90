//! The instruction set that every executor runs.
//!
//! A schedule ([`crate::sched`]) yields one rank's ops for one channel; the host backend, the loom
//! model and the GPU interpreter all execute exactly these ops, and traces record them.
//!
//! * [`Op::Copy`] moves bytes between two locations. When `dst` is on another rank it is a put,
//!   when `src` is, a get.
//! * [`Op::Reduce`] combines two element runs, `dst = a (op) b`, element by element; `dst` may
//!   alias `a` or `b` exactly (in-place accumulation). A reduction over N inputs is N - 1 of them.
//! * [`Op::Signal`] updates a slot of a peer's signal pad with release semantics at system scope:
//!   everything the rank wrote before is visible to whoever observes the new value.
//! * [`Op::Wait`] blocks until the rank's own slot reaches `expected[slot] + count` (acquire), then
//!   advances the rank's private `expected[slot]` by `count` (see [`crate::signal`]).
//! * [`Op::McReduce`] / [`Op::McStore`] model NVLink multicast (NVLS): a load-reduce over every
//!   rank's copy of a symmetric location, and a store broadcast to every rank's copy.
//!
//! All ranks' buffers are symmetric: the same [`Buf`] and offset name the same bytes on every rank.

use crate::dtype::{DType, ReduceOp};
use serde::{Deserialize, Serialize};

/// A symmetric buffer of a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Buf {
    /// The user's input (send) buffer.
    Input = 0,
    /// The user's output (receive) buffer.
    Output = 1,
    /// The library-owned scratch buffer (staging for pipelined algorithms).
    Scratch = 2,
}

impl Buf {
    /// Every buffer.
    pub const ALL: [Buf; 3] = [Buf::Input, Buf::Output, Buf::Scratch];

    /// Decodes a wire value.
    pub const fn from_u8(v: u8) -> Option<Buf> {
        match v {
            0 => Some(Buf::Input),
            1 => Some(Buf::Output),
            2 => Some(Buf::Scratch),
            _ => None,
        }
    }

    /// Short name.
    pub const fn name(self) -> &'static str {
        match self {
            Buf::Input => "in",
            Buf::Output => "out",
            Buf::Scratch => "scratch",
        }
    }
}

/// A byte location: (rank, buffer, offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Loc {
    /// Rank that owns the bytes.
    pub rank: u16,
    /// Which symmetric buffer.
    pub buf: Buf,
    /// Byte offset in the buffer.
    pub offset: u64,
}

impl Loc {
    /// Shorthand constructor.
    pub const fn new(rank: u16, buf: Buf, offset: u64) -> Loc {
        Loc { rank, buf, offset }
    }
}

/// A location on every rank at once (the multicast view of a symmetric buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct McLoc {
    /// Which symmetric buffer.
    pub buf: Buf,
    /// Byte offset in the buffer.
    pub offset: u64,
}

/// How a signal updates its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum SignalOp {
    /// Overwrite the slot with the value.
    Set = 0,
    /// Add the value to the slot (wrapping).
    Add = 1,
}

/// One instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    /// Copy `bytes` bytes from `src` to `dst`.
    Copy {
        /// Source.
        src: Loc,
        /// Destination.
        dst: Loc,
        /// Byte count.
        bytes: u64,
    },
    /// `dst[i] = a[i] (op) b[i]` for `elems` elements, then divided by `div` when `div > 1`.
    Reduce {
        /// First operand.
        a: Loc,
        /// Second operand.
        b: Loc,
        /// Destination (may alias `a` or `b` exactly).
        dst: Loc,
        /// Element count.
        elems: u64,
        /// Element type.
        dtype: DType,
        /// Operator.
        op: ReduceOp,
        /// Divisor applied after combining (the last step of an average); 0 or 1: none.
        div: u32,
    },
    /// Update slot `slot` of `peer`'s signal pad (release, system scope).
    Signal {
        /// Rank whose pad is updated.
        peer: u16,
        /// Slot index in that pad.
        slot: u32,
        /// Set or add.
        op: SignalOp,
        /// Operand.
        value: u64,
    },
    /// Wait until own slot `slot` reaches `expected[slot] + count`, then advance `expected[slot]`.
    Wait {
        /// Own slot index.
        slot: u32,
        /// How many more signals to wait for.
        count: u64,
    },
    /// Multicast load-reduce: `dst[i] = (op) over ranks r of src@r[i]`, in rank order.
    McReduce {
        /// The symmetric location read on every rank.
        src: McLoc,
        /// Destination.
        dst: Loc,
        /// Element count.
        elems: u64,
        /// Element type.
        dtype: DType,
        /// Operator.
        op: ReduceOp,
        /// Divisor applied after combining; 0 or 1: none.
        div: u32,
    },
    /// Multicast store: copy `bytes` from `src` to `dst` on every rank.
    McStore {
        /// Source.
        src: Loc,
        /// The symmetric destination written on every rank.
        dst: McLoc,
        /// Byte count.
        bytes: u64,
    },
}

impl Op {
    /// The op with every rank-addressed location passed through `f` (the operands and the
    /// destination of copies and reductions, the destination of a multicast load-reduce and
    /// the source of a multicast store); signals, waits and multicast locations are unchanged.
    pub fn map_locs<E>(self, mut f: impl FnMut(Loc) -> Result<Loc, E>) -> Result<Op, E> {
        Ok(match self {
            Op::Copy { src, dst, bytes } => Op::Copy {
                src: f(src)?,
                dst: f(dst)?,
                bytes,
            },
            Op::Reduce {
                a,
                b,
                dst,
                elems,
                dtype,
                op,
                div,
            } => Op::Reduce {
                a: f(a)?,
                b: f(b)?,
                dst: f(dst)?,
                elems,
                dtype,
                op,
                div,
            },
            Op::McReduce {
                src,
                dst,
                elems,
                dtype,
                op,
                div,
            } => Op::McReduce {
                src,
                dst: f(dst)?,
                elems,
                dtype,
                op,
                div,
            },
            Op::McStore { src, dst, bytes } => Op::McStore {
                src: f(src)?,
                dst,
                bytes,
            },
            other @ (Op::Signal { .. } | Op::Wait { .. }) => other,
        })
    }

    /// Bytes this op moves (reads of remote or written data), for cost accounting.
    pub fn bytes(&self) -> u64 {
        match *self {
            Op::Copy { bytes, .. } | Op::McStore { bytes, .. } => bytes,
            Op::Reduce { elems, dtype, .. } | Op::McReduce { elems, dtype, .. } => {
                elems.saturating_mul(dtype.size())
            }
            Op::Signal { .. } | Op::Wait { .. } => 0,
        }
    }

    /// Short name of the op kind.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Op::Copy { .. } => "copy",
            Op::Reduce { .. } => "reduce",
            Op::Signal { .. } => "signal",
            Op::Wait { .. } => "wait",
            Op::McReduce { .. } => "mc_reduce",
            Op::McStore { .. } => "mc_store",
        }
    }

    /// Whether the op is a multicast op.
    pub fn is_multicast(&self) -> bool {
        matches!(self, Op::McReduce { .. } | Op::McStore { .. })
    }
}
