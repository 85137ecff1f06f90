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
//! * [`Op::ReduceN`] is the fused k-way reduce: the same symmetric location on up to
//!   [`MAX_FANIN`] ranks, combined in one pass with one accumulator (`f32` for 16-bit floats,
//!   rounded once, see [`crate::dtype::fold`]) and written once. A one-shot all-reduce over k
//!   ranks is one of them instead of k - 1 binary `Reduce`s, each a full pass over the data.
//! * [`Op::LlPut`] / [`Op::LlReduce`] are the low-latency protocol ([`crate::ll`]): data written
//!   as lines that carry the call's flag, and a k-way reduce that waits for the flags of the
//!   lines it reads instead of for a signal. Their flag comes from the executor's counter of
//!   the op's `slot` (the rank's own `Epoch` slot); their `format` field is the line format
//!   (16-byte or 128-byte lines, [`crate::ll::Format`]).
//! * [`Op::McReduce`] / [`Op::McStore`] model NVLink multicast (NVLS): a load-reduce over every
//!   rank's copy of a symmetric location, and a store broadcast to every rank's copy.
//!
//! All ranks' buffers are symmetric: the same [`Buf`] and offset name the same bytes on every rank.
//!
//! Each op has a kind ([`OpKind`]) with a stable number from an append-only table: traces tag
//! ops with it, never with the position of the variant in [`Op`]. Every op is one row of the ops
//! table below (see `op/table.rs`), from which the enums, the location and slot mappings, the
//! plan and C encodings, the trace record's fields, the generated header constants and the
//! per-op facts (the columns [`OpKind::reduces`], [`Op::line_format`]) come. [`Op::footprint`]
//! says what an op reads and writes; consumers ask it instead of taking ops apart.

#[macro_use]
pub(crate) mod table;
mod fields;
mod footprint;

pub use fields::{Fanin, FieldError, OpFields, RawLoc};
pub use footprint::{Access, At, Footprint, Lines, Range, Slot, MAX_RANGES};

use crate::dtype::{DType, ReduceOp};
use crate::ll::Format;
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

/// The most sources one [`Op::ReduceN`] combines.
pub const MAX_FANIN: usize = 8;

/// The ranks a k-way reduce reads, in the order it combines them: 1 to [`MAX_FANIN`] of them.
///
/// Unused entries are zero, so equal lists compare equal; a decoded value is checked the same
/// way ([`Ranks::new`]), so a hostile trace cannot make one that indexes past its list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RanksWire")]
pub struct Ranks {
    len: u8,
    ranks: [u16; MAX_FANIN],
}

/// The wire form of [`Ranks`], checked on the way in.
#[derive(Deserialize)]
struct RanksWire {
    len: u8,
    ranks: [u16; MAX_FANIN],
}

/// A [`Ranks`] list that is empty, too long or has entries past its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadRanks;

impl core::fmt::Display for BadRanks {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "a k-way reduce names 1 to {MAX_FANIN} ranks")
    }
}

impl core::error::Error for BadRanks {}

impl TryFrom<RanksWire> for Ranks {
    type Error = BadRanks;
    fn try_from(w: RanksWire) -> Result<Ranks, BadRanks> {
        let n = w.len as usize;
        if n == 0 || n > MAX_FANIN || w.ranks[n..].iter().any(|&r| r != 0) {
            return Err(BadRanks);
        }
        Ok(Ranks {
            len: w.len,
            ranks: w.ranks,
        })
    }
}

impl Ranks {
    /// The list, or `None` when it is empty or longer than [`MAX_FANIN`].
    pub fn new(list: &[u16]) -> Option<Ranks> {
        if list.is_empty() || list.len() > MAX_FANIN {
            return None;
        }
        let mut ranks = [0u16; MAX_FANIN];
        ranks[..list.len()].copy_from_slice(list);
        Some(Ranks {
            len: list.len() as u8,
            ranks,
        })
    }

    /// Ranks `0..n` in order (`None` when `n` is 0 or over [`MAX_FANIN`]).
    pub fn first(n: u16) -> Option<Ranks> {
        let mut ranks = [0u16; MAX_FANIN];
        for (i, r) in ranks.iter_mut().enumerate().take(n as usize) {
            *r = i as u16;
        }
        if n == 0 || n as usize > MAX_FANIN {
            return None;
        }
        Some(Ranks {
            len: n as u8,
            ranks,
        })
    }

    /// The ranks as two little-endian words, four `u16` each (ranks 0..4, ranks 4..8): how the
    /// plan encoding and the C ABI carry them.
    pub fn pack(&self) -> (u64, u64) {
        let mut w = [0u64; 2];
        for (i, &x) in self.as_slice().iter().enumerate() {
            w[i / 4] |= (x as u64) << (16 * (i % 4));
        }
        (w[0], w[1])
    }

    /// The inverse of [`Ranks::pack`] for `n` ranks, checked: `None` unless `n` is 1 to
    /// [`MAX_FANIN`] and the words hold nothing past the `n`th rank.
    pub fn unpack(n: u16, lo: u64, hi: u64) -> Option<Ranks> {
        let k = n as usize;
        if k == 0 || k > MAX_FANIN {
            return None;
        }
        let mut list = [0u16; MAX_FANIN];
        for (i, x) in list.iter_mut().enumerate() {
            let w = if i < 4 { lo } else { hi };
            *x = (w >> (16 * (i % 4))) as u16;
        }
        if list[k..].iter().any(|&x| x != 0) {
            return None;
        }
        Ranks::new(&list[..k])
    }

    /// The ranks, in combining order.
    pub fn as_slice(&self) -> &[u16] {
        &self.ranks[..(self.len as usize).min(MAX_FANIN)]
    }

    /// How many ranks.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether the list is empty (never, for a checked value).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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

impl SignalOp {
    /// Decodes a wire value.
    pub const fn from_u8(v: u8) -> Option<SignalOp> {
        match v {
            0 => Some(SignalOp::Set),
            1 => Some(SignalOp::Add),
            _ => None,
        }
    }
}

// The ops table: one row per op (see `table`). A row is
// `Variant = trace tag[ | tag of its 128-byte line form], PLAN_CODE_NAME = plan code,
// "short name"[ | "name of its 128-byte line form"], unicast | multicast[ reduces][, locs = f]`
// and the fields, each `name: Type => place` (a place of `OpFields`), with an optional
// `[check]` run on decode. A field at the `format` place is the op's line format
// (`line_format`), which traces carry in the tag. Rows go in tag order; tags and plan codes
// never change. The next free trace tag is 11 (9 and 10 are the 128-byte line forms'); plan
// codes 9 and 10 are retired (the 128-byte line ops' before the format became a field), so the
// next free plan code is 11.
ops! {
    /// Copy `bytes` bytes from `src` to `dst`.
    Copy = 0, COPY = 0, "copy", unicast {
        /// Source.
        src: Loc => a,
        /// Destination.
        dst: Loc => dst,
        /// Byte count.
        bytes: u64 => count,
    }
    /// `dst[i] = a[i] (op) b[i]` for `elems` elements, then divided by `div` when `div > 1`.
    Reduce = 1, REDUCE = 1, "reduce", unicast reduces {
        /// First operand.
        a: Loc => a,
        /// Second operand.
        b: Loc => b,
        /// Destination (may alias `a` or `b` exactly).
        dst: Loc => dst,
        /// Element count.
        elems: u64 => count,
        /// Element type.
        dtype: DType => dtype,
        /// Operator.
        op: ReduceOp => redop,
        /// Divisor applied after combining (the last step of an average); 0 or 1: none.
        div: u32 => div,
    }
    /// Update slot `slot` of `peer`'s signal pad (release, system scope).
    Signal = 2, SIGNAL = 2, "signal", unicast {
        /// Rank whose pad is updated.
        peer: u16 => peer,
        /// Slot index in that pad.
        slot: u32 => slot,
        /// Set or add.
        op: SignalOp => sigop,
        /// Operand.
        value: u64 => count,
    }
    /// Wait until own slot `slot` reaches `expected[slot] + count`, then advance `expected[slot]`.
    Wait = 3, WAIT = 3, "wait", unicast {
        /// Own slot index.
        slot: u32 => slot,
        /// How many more signals to wait for.
        count: u64 => count,
    }
    /// k-way reduce: `dst[i] = (op) over r in ranks of (buf, offset)@r[i]`, combined in list
    /// order with one accumulator (`f32` for 16-bit floats), rounded once, then divided by `div`
    /// when `div > 1` ([`crate::dtype::fold`]). `dst` may be one of the sources exactly.
    ReduceN = 4, REDUCE_N = 6, "reduce_n", unicast reduces, locs = reduce_n_locs {
        /// The symmetric buffer read on every listed rank.
        buf: Buf => a.buf,
        /// Byte offset read on every listed rank.
        offset: u64 => a.offset,
        /// Ranks read, in combining order.
        ranks: Ranks => fanin,
        /// Destination.
        dst: Loc => dst,
        /// Element count.
        elems: u64 => count,
        /// Element type.
        dtype: DType => dtype,
        /// Operator.
        op: ReduceOp => redop,
        /// Divisor applied after combining; 0 or 1: none.
        div: u32 => div,
    }
    /// Low-latency put: `bytes` of `src` written as lines of `format` ([`crate::ll`]) at `dst`,
    /// plus `flip` when this call's epoch (the executor's counter of `slot`) is odd, each line
    /// carrying the call's flag (a 128-byte line's flag word stored after its data, with
    /// release). `dst` takes [`crate::ll::Format::line_bytes`] of `bytes`.
    LlPut = 5 | 9, LL_PUT = 7, "ll_put" | "ll128_put", unicast {
        /// The line format.
        format: Format => format,
        /// Source (plain bytes).
        src: Loc => a,
        /// Destination of the lines (half 0).
        dst: Loc => dst,
        /// Data bytes.
        bytes: u64 => count,
        /// The slot whose counter is the call's epoch.
        slot: u32 => slot,
        /// Offset of half 1 from half 0.
        flip: u64 => fanin.hi,
    }
    /// Low-latency k-way reduce: waits until the lines of `format` of `sources` regions, region
    /// `s` at `src.offset + s * stride` (plus `flip` when the epoch is odd), carry this call's
    /// flag (a 128-byte line's flag word loaded with acquire before its data), then folds their
    /// data in region order into `dst` as [`Op::ReduceN`] does.
    LlReduce = 6 | 10, LL_REDUCE = 8, "ll_reduce" | "ll128_reduce", unicast reduces {
        /// The line format.
        format: Format => format,
        /// The first region (half 0), on the executing rank in every schedule.
        src: Loc => a,
        /// Bytes from one region to the next.
        stride: u64 => fanin.lo,
        /// Number of regions (at least 1).
        sources: u16 => fanin.n [fields::regions],
        /// Destination (plain elements).
        dst: Loc => dst,
        /// Element count.
        elems: u64 => count,
        /// Element type.
        dtype: DType => dtype,
        /// Operator.
        op: ReduceOp => redop,
        /// Divisor applied after combining; 0 or 1: none.
        div: u32 => div,
        /// The slot whose counter is the call's epoch.
        slot: u32 => slot,
        /// Offset of half 1 from half 0.
        flip: u64 => fanin.hi,
    }
    /// Multicast load-reduce: `dst[i] = (op) over ranks r of src@r[i]`, in rank order.
    McReduce = 7, MC_REDUCE = 4, "mc_reduce", multicast reduces {
        /// The symmetric location read on every rank.
        src: McLoc => a,
        /// Destination.
        dst: Loc => dst,
        /// Element count.
        elems: u64 => count,
        /// Element type.
        dtype: DType => dtype,
        /// Operator.
        op: ReduceOp => redop,
        /// Divisor applied after combining; 0 or 1: none.
        div: u32 => div,
    }
    /// Multicast store: copy `bytes` from `src` to `dst` on every rank.
    McStore = 8, MC_STORE = 5, "mc_store", multicast {
        /// Source.
        src: Loc => a,
        /// The symmetric destination written on every rank.
        dst: McLoc => dst,
        /// Byte count.
        bytes: u64 => count,
    }
}

/// [`Op::map_locs`] of a k-way reduce: each source `(rank, buf, offset)` through `f`, the
/// first one's mapped buffer and offset kept; then the destination.
fn reduce_n_locs<E>(op: Op, f: &mut impl FnMut(Loc) -> Result<Loc, E>) -> Result<Op, E> {
    let Op::ReduceN {
        buf,
        offset,
        ranks,
        dst,
        elems,
        dtype,
        op,
        div,
    } = op
    else {
        return Ok(op);
    };
    let mut list = [0u16; MAX_FANIN];
    let mut at = (buf, offset);
    for (i, &r) in ranks.as_slice().iter().enumerate() {
        let l = f(Loc::new(r, buf, offset))?;
        if i == 0 {
            at = (l.buf, l.offset);
        }
        list[i] = l.rank;
    }
    Ok(Op::ReduceN {
        buf: at.0,
        offset: at.1,
        ranks: Ranks::new(&list[..ranks.len()]).unwrap_or(ranks),
        dst: f(dst)?,
        elems,
        dtype,
        op,
        div,
    })
}

impl OpKind {
    /// The short name of the ops trace tag `tag` names ([`Op::kind_name`] of each of them).
    pub fn trace_tag_name(tag: u8) -> Option<&'static str> {
        let (kind, format) = OpKind::from_trace_tag(tag)?;
        Some(Op::example(kind).with_line_format(format).kind_name())
    }
}

impl Op {
    /// Bytes this op moves (reads of remote or written data), for cost accounting.
    pub fn bytes(&self) -> u64 {
        match *self {
            Op::Copy { bytes, .. } | Op::McStore { bytes, .. } => bytes,
            Op::Reduce { elems, dtype, .. } | Op::McReduce { elems, dtype, .. } => {
                elems.saturating_mul(dtype.size())
            }
            Op::ReduceN {
                elems,
                dtype,
                ranks,
                ..
            } => elems
                .saturating_mul(dtype.size())
                .saturating_mul(ranks.len() as u64),
            Op::LlPut { format, bytes, .. } => format.line_bytes(bytes),
            Op::LlReduce {
                format,
                elems,
                dtype,
                sources,
                ..
            } => format
                .line_bytes(elems.saturating_mul(dtype.size()))
                .saturating_mul(sources as u64),
            Op::Signal { .. } | Op::Wait { .. } => 0,
        }
    }

    /// The slot whose counter is the epoch of a low-latency op ([`crate::ll`]).
    pub fn ll_slot(&self) -> Option<u32> {
        match *self {
            Op::LlPut { slot, .. } | Op::LlReduce { slot, .. } => Some(slot),
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Signal { .. }
            | Op::Wait { .. }
            | Op::ReduceN { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => None,
        }
    }

    /// The op with its line format set to `format` (ops without one are unchanged).
    pub fn with_line_format(mut self, format: Format) -> Op {
        match &mut self {
            Op::LlPut { format: f, .. } | Op::LlReduce { format: f, .. } => *f = format,
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Signal { .. }
            | Op::Wait { .. }
            | Op::ReduceN { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => {}
        }
        self
    }

    /// The op's kind (its stable tag in traces).
    pub const fn kind(&self) -> OpKind {
        OpKind::of(self)
    }

    /// Whether the op is a multicast op.
    pub fn is_multicast(&self) -> bool {
        self.kind().is_multicast()
    }

    /// Whether the op combines elements (its kind's column of the ops table).
    pub fn reduces(&self) -> bool {
        self.kind().reduces()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A k-way reduce's rank list read from untrusted bytes (a trace): an empty list, one
    /// longer than `MAX_FANIN`, or ranks past its length are refused, never indexed.
    #[test]
    fn hostile_rank_lists_are_refused_on_decode() {
        let mut buf = [0u8; 64];
        for (len, tail, ok) in [
            (3u8, 0u16, true),
            (0, 0, false),
            (9, 0, false),
            (255, 0, false),
            (2, 7, false),
        ] {
            let mut ranks = [1u16; MAX_FANIN];
            for r in ranks.iter_mut().skip(len.min(8) as usize) {
                *r = tail;
            }
            let bytes = postcard::to_slice(&(len, ranks), &mut buf).unwrap();
            let got = postcard::from_bytes::<Ranks>(bytes);
            assert_eq!(got.is_ok(), ok, "len {len} tail {tail}");
            if let Ok(r) = got {
                assert_eq!(r.as_slice(), &[1, 1, 1]);
            }
        }
        assert_eq!(Ranks::new(&[]), None);
        assert_eq!(Ranks::new(&[0; 9]), None);
        assert_eq!(Ranks::unpack(9, 0, 0), None);
        assert_eq!(Ranks::unpack(1, 0x0005_0000, 0), None);
        assert_eq!(Ranks::first(0), None);
    }
}
