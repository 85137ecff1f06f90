//! The flat form of an op that both fixed-size encodings lay out: the plan ([`crate::plan`]) and
//! the C ABI's `symm_op`.
//!
//! Each field of each op names a *place* in the ops table (`op.rs`): one of the fields of
//! [`OpFields`]. An encoding maps these places to its own bytes once, for every op; an op maps
//! its fields to places through its row. The type of a field decides how it is held at its
//! place ([`Place`]), so a row that puts a field where its type cannot go does not compile.
//!
//! Every place an op does not use is zero. The plan encoding shares words between places that
//! no op uses together (see [`crate::plan::PlanOp::from_fields`]); the table's round-trip test
//! puts distinct values in every field of every op, so a row that used two of them together
//! would fail it.

use super::{Buf, Loc, McLoc, OpKind, Ranks, SignalOp};
use crate::dtype::{DType, ReduceOp};
use crate::ll::Format;

/// A location as an encoding holds it: the buffer code is not checked yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RawLoc {
    /// Rank (zero for a multicast location).
    pub rank: u16,
    /// [`Buf`] code.
    pub buf: u8,
    /// Byte offset.
    pub offset: u64,
}

/// A count and two words: the source list of a k-way reduce ([`Ranks::pack`]), or the
/// region count, stride and half offset of the low-latency ops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fanin {
    /// Number of source ranks, or of regions.
    pub n: u16,
    /// Source ranks 0..4, or the region stride.
    pub lo: u64,
    /// Source ranks 4..8, or the half offset (`flip`) of a low-latency op.
    pub hi: u64,
}

/// An op as its places (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpFields {
    /// Which op.
    pub kind: OpKind,
    /// The source, or the first operand.
    pub a: RawLoc,
    /// The second operand.
    pub b: RawLoc,
    /// The destination.
    pub dst: RawLoc,
    /// Bytes, elements, signal value or wait count.
    pub count: u64,
    /// Signal-pad slot.
    pub slot: u32,
    /// Divisor of the last averaging step.
    pub div: u32,
    /// [`DType`] code.
    pub dtype: u8,
    /// [`ReduceOp`] code.
    pub redop: u8,
    /// [`SignalOp`] code.
    pub sigop: u8,
    /// Rank whose signal pad a signal updates.
    pub peer: u16,
    /// Source list or low-latency regions.
    pub fanin: Fanin,
    /// [`Format`] code of a low-latency op's lines.
    pub format: u8,
}

impl OpFields {
    /// Every place zero.
    pub const fn new(kind: OpKind) -> OpFields {
        let zero = RawLoc {
            rank: 0,
            buf: 0,
            offset: 0,
        };
        OpFields {
            kind,
            a: zero,
            b: zero,
            dst: zero,
            count: 0,
            slot: 0,
            div: 0,
            dtype: 0,
            redop: 0,
            sigop: 0,
            peer: 0,
            fanin: Fanin { n: 0, lo: 0, hi: 0 },
            format: 0,
        }
    }
}

/// Why a place does not hold a valid field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FieldError {
    /// A buffer code is unknown.
    BadBuf(u8),
    /// The element-type code is unknown.
    BadDType(u8),
    /// The reduce-op code is unknown.
    BadReduceOp(u8),
    /// The signal-op code is unknown.
    BadSignalOp(u8),
    /// A k-way reduce names no source, more than [`super::MAX_FANIN`], or has ranks past its
    /// count; or a low-latency reduce names no region.
    BadFanin(u16),
    /// The line-format code is unknown.
    BadFormat(u8),
}

impl core::fmt::Display for FieldError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FieldError::BadBuf(v) => write!(f, "unknown buffer code {v}"),
            FieldError::BadDType(v) => write!(f, "unknown element type code {v}"),
            FieldError::BadReduceOp(v) => write!(f, "unknown reduce operator code {v}"),
            FieldError::BadSignalOp(v) => write!(f, "unknown signal operation code {v}"),
            FieldError::BadFanin(n) => write!(f, "bad source count {n}"),
            FieldError::BadFormat(v) => write!(f, "unknown line format code {v}"),
        }
    }
}

impl core::error::Error for FieldError {}

/// How a place holds a field of type `T`.
pub(crate) trait Place<T> {
    /// Stores `v`.
    fn put(&mut self, v: T);
    /// Reads the field back, checked.
    fn get(&self) -> Result<T, FieldError>;
}

fn buf(b: u8) -> Result<Buf, FieldError> {
    Buf::from_u8(b).ok_or(FieldError::BadBuf(b))
}

impl Place<Loc> for RawLoc {
    fn put(&mut self, l: Loc) {
        *self = RawLoc {
            rank: l.rank,
            buf: l.buf as u8,
            offset: l.offset,
        };
    }
    fn get(&self) -> Result<Loc, FieldError> {
        Ok(Loc::new(self.rank, buf(self.buf)?, self.offset))
    }
}

impl Place<McLoc> for RawLoc {
    fn put(&mut self, l: McLoc) {
        *self = RawLoc {
            rank: 0,
            buf: l.buf as u8,
            offset: l.offset,
        };
    }
    fn get(&self) -> Result<McLoc, FieldError> {
        Ok(McLoc {
            buf: buf(self.buf)?,
            offset: self.offset,
        })
    }
}

impl Place<Buf> for u8 {
    fn put(&mut self, v: Buf) {
        *self = v as u8;
    }
    fn get(&self) -> Result<Buf, FieldError> {
        buf(*self)
    }
}

impl Place<DType> for u8 {
    fn put(&mut self, v: DType) {
        *self = v as u8;
    }
    fn get(&self) -> Result<DType, FieldError> {
        DType::from_u8(*self).ok_or(FieldError::BadDType(*self))
    }
}

impl Place<ReduceOp> for u8 {
    fn put(&mut self, v: ReduceOp) {
        *self = v as u8;
    }
    fn get(&self) -> Result<ReduceOp, FieldError> {
        ReduceOp::from_u8(*self).ok_or(FieldError::BadReduceOp(*self))
    }
}

impl Place<SignalOp> for u8 {
    fn put(&mut self, v: SignalOp) {
        *self = v as u8;
    }
    fn get(&self) -> Result<SignalOp, FieldError> {
        SignalOp::from_u8(*self).ok_or(FieldError::BadSignalOp(*self))
    }
}

impl Place<Format> for u8 {
    fn put(&mut self, v: Format) {
        *self = v as u8;
    }
    fn get(&self) -> Result<Format, FieldError> {
        Format::from_u8(*self).ok_or(FieldError::BadFormat(*self))
    }
}

impl Place<Ranks> for Fanin {
    fn put(&mut self, r: Ranks) {
        let (lo, hi) = r.pack();
        *self = Fanin {
            n: r.len() as u16,
            lo,
            hi,
        };
    }
    fn get(&self) -> Result<Ranks, FieldError> {
        Ranks::unpack(self.n, self.lo, self.hi).ok_or(FieldError::BadFanin(self.n))
    }
}

macro_rules! plain_place {
    ($($t:ty),*) => {$(
        impl Place<$t> for $t {
            fn put(&mut self, v: $t) {
                *self = v;
            }
            fn get(&self) -> Result<$t, FieldError> {
                Ok(*self)
            }
        }
    )*};
}

plain_place!(u16, u32, u64);

/// The check of a low-latency reduce's region count: at least one.
pub(crate) fn regions(n: u16) -> Result<u16, FieldError> {
    if n == 0 {
        Err(FieldError::BadFanin(0))
    } else {
        Ok(n)
    }
}
