//! Event records: the bytes of one [`Event`], and the op tables of every format version.
//!
//! An event record's body is, in order (postcard: integers are varints, a `u8` is one byte):
//!
//! ```text
//! time u64, rank u16, channel u16, index u32
//! kind      0 Begin | 1 End | 2 Stall, target u64, found u64
//! op        tag, then the op's fields in declaration order
//! contents  0 (none) | 1, then the set u64
//! ```
//!
//! Version 4 writes the op tag as one byte from [`OpKind`]'s append-only table. Versions 1 to 3
//! wrote the [`Op`] enum through serde, whose tag is the variant's position (a varint, one byte
//! below 128). That enum grew in the middle twice while the format stayed at version 3, so a
//! version 3 tag means one of three things ([`OpLayout`]):
//!
//! ```text
//! tag  Original   KWay       LowLatency = version 4
//!  0   copy       copy       copy
//!  1   reduce     reduce     reduce
//!  2   signal     signal     signal
//!  3   wait       wait       wait
//!  4   mc_reduce  reduce_n   reduce_n
//!  5   mc_store   mc_reduce  ll_put
//!  6              mc_store   ll_reduce
//!  7                         mc_reduce
//!  8                         mc_store
//! ```
//!
//! The fields of each kind are the same in every layout. Versions 1 and 2 were only ever
//! written with the original layout. Version 4 also tags the 128-byte line form of the
//! low-latency ops apart (9: `ll_put`, 10: `ll_reduce` in 128-byte lines), and a record of a
//! low-latency op carries no format field: the tag names it ([`crate::op::Op::trace_tag`]).

use super::{Event, EventKind, TraceError};
use crate::ll::Format;
use crate::op::table::{FieldSink, FieldSource};
use crate::op::{Op, OpKind};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Which op table a trace's tags come from (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpLayout {
    /// Versions 1 and 2, and version 3 before the k-way reduce: copy, reduce, signal, wait,
    /// mc_reduce, mc_store.
    Original,
    /// Version 3 with the k-way reduce and without the low-latency ops: copy, reduce, signal,
    /// wait, reduce_n, mc_reduce, mc_store.
    KWay,
    /// Version 3 with the low-latency ops: copy, reduce, signal, wait, reduce_n, ll_put,
    /// ll_reduce, mc_reduce, mc_store (frozen: the numbers version 4 started from).
    LowLatency,
    /// Version 4: [`OpKind`]'s stable tags, one byte.
    Stable,
}

const ORIGINAL: [OpKind; 6] = [
    OpKind::Copy,
    OpKind::Reduce,
    OpKind::Signal,
    OpKind::Wait,
    OpKind::McReduce,
    OpKind::McStore,
];

const KWAY: [OpKind; 7] = [
    OpKind::Copy,
    OpKind::Reduce,
    OpKind::Signal,
    OpKind::Wait,
    OpKind::ReduceN,
    OpKind::McReduce,
    OpKind::McStore,
];

const LOW_LATENCY: [OpKind; 9] = [
    OpKind::Copy,
    OpKind::Reduce,
    OpKind::Signal,
    OpKind::Wait,
    OpKind::ReduceN,
    OpKind::LlPut,
    OpKind::LlReduce,
    OpKind::McReduce,
    OpKind::McStore,
];

impl OpLayout {
    /// The layouts a version 3 trace may use, in the order a reader prefers them when more than
    /// one reads a trace in full: the low-latency layout (written longest), then the original,
    /// then the k-way layout.
    pub const V3: [OpLayout; 3] = [OpLayout::LowLatency, OpLayout::Original, OpLayout::KWay];

    /// The layout of a format version, or `None` for version 3 (ambiguous: one of
    /// [`OpLayout::V3`]) and for versions this crate does not read.
    pub const fn of_version(version: u16) -> Option<OpLayout> {
        match version {
            1 | 2 => Some(OpLayout::Original),
            4 => Some(OpLayout::Stable),
            _ => None,
        }
    }

    /// The op kind tag `tag` stands for, if any.
    pub fn kind(self, tag: u32) -> Option<OpKind> {
        self.entry(tag).map(|(k, _)| k)
    }

    /// The op kind and line format tag `tag` stands for, if any: version 4 tags the 128-byte
    /// line form of a low-latency op apart ([`OpKind::from_trace_tag`]); older layouts know
    /// only 16-byte lines.
    pub fn entry(self, tag: u32) -> Option<(OpKind, Format)> {
        let table: &[OpKind] = match self {
            OpLayout::Original => &ORIGINAL,
            OpLayout::KWay => &KWAY,
            OpLayout::LowLatency => &LOW_LATENCY,
            OpLayout::Stable => {
                return u8::try_from(tag).ok().and_then(OpKind::from_trace_tag);
            }
        };
        let k = table.get(usize::try_from(tag).ok()?).copied()?;
        Some((k, Format::Ll))
    }

    /// The tag of `kind`, if the layout has one.
    pub fn tag(self, kind: OpKind) -> Option<u32> {
        (0..16u32).find(|&t| self.kind(t) == Some(kind))
    }

    /// The tag of `op` (its kind and line format), if the layout has one.
    pub fn tag_of(self, op: &Op) -> Option<u32> {
        let want = (op.kind(), op.line_format().unwrap_or(Format::Ll));
        (0..16u32).find(|&t| self.entry(t) == Some(want))
    }

    /// Short name.
    pub const fn name(self) -> &'static str {
        match self {
            OpLayout::Original => "original (before the k-way reduce)",
            OpLayout::KWay => "k-way (before the low-latency ops)",
            OpLayout::LowLatency => "low-latency",
            OpLayout::Stable => "stable",
        }
    }
}

/// Why an event record's body does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WireError {
    /// The input ends inside it.
    End,
    /// A field is out of range.
    Bad,
    /// The op tag names no op of the layout.
    UnknownOp(u32),
}

/// Writes into a slice.
struct Out<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Out<'_> {
    fn put<T: Serialize>(&mut self, v: &T) -> Result<(), TraceError> {
        let rest = self.buf.get_mut(self.at..).ok_or(TraceError::TooLarge)?;
        let n = postcard::to_slice(v, rest)
            .map_err(|_| TraceError::TooLarge)?
            .len();
        self.at += n;
        Ok(())
    }
}

/// Encodes `e`'s body (no record tag) into `out` with `layout`'s op tags; the length used.
pub(crate) fn encode(e: &Event, layout: OpLayout, out: &mut [u8]) -> Result<usize, TraceError> {
    let mut o = Out { buf: out, at: 0 };
    o.put(&(e.time, e.rank, e.channel, e.index, e.kind))?;
    let tag = layout.tag_of(&e.op).ok_or(TraceError::TooLarge)?;
    match layout {
        OpLayout::Stable => o.put(&(tag as u8))?,
        _ => o.put(&tag)?,
    }
    e.op.write_fields(&mut o)?;
    o.put(&e.contents)?;
    Ok(o.at)
}

impl FieldSink for Out<'_> {
    type Error = TraceError;
    fn field<T: Serialize>(&mut self, v: &T) -> Result<(), TraceError> {
        self.put(v)
    }
}

/// Reads from a slice.
struct In<'a> {
    rest: &'a [u8],
}

impl In<'_> {
    fn take<T: DeserializeOwned>(&mut self) -> Result<T, WireError> {
        match postcard::take_from_bytes::<T>(self.rest) {
            Ok((v, rest)) => {
                self.rest = rest;
                Ok(v)
            }
            Err(postcard::Error::DeserializeUnexpectedEnd) => Err(WireError::End),
            Err(_) => Err(WireError::Bad),
        }
    }
}

impl FieldSource for In<'_> {
    type Error = WireError;
    fn field<T: DeserializeOwned>(&mut self) -> Result<T, WireError> {
        self.take()
    }
}

/// Decodes an event body (after the record tag) with `layout`'s op tags: the event and the
/// bytes it took.
pub(crate) fn decode(bytes: &[u8], layout: OpLayout) -> Result<(Event, usize), WireError> {
    let mut i = In { rest: bytes };
    let (time, rank, channel, index, kind) = i.take::<(u64, u16, u16, u32, EventKind)>()?;
    let tag = match layout {
        OpLayout::Stable => u32::from(i.take::<u8>()?),
        _ => i.take::<u32>()?,
    };
    let (op_kind, format) = layout.entry(tag).ok_or(WireError::UnknownOp(tag))?;
    let op = Op::read_fields(op_kind, format, &mut i)?;
    let contents = i.take::<Option<u64>>()?;
    let used = bytes.len() - i.rest.len();
    let e = Event {
        time,
        rank,
        channel,
        index,
        kind,
        op,
        contents,
    };
    Ok((e, used))
}
