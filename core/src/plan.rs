//! The fixed-size encoding of ops that the GPU interpreter reads.
//!
//! A plan is an array of [`PlanOp`], 64 bytes each, `repr(C)`, little-endian, naturally aligned,
//! so a kernel reads an op with four 16-byte loads. The driver builds it from a schedule once per
//! request and caches it; `kernels/` has a header generated from the constants here
//! (`cargo xtask codegen`), and a test fails when that header is stale.
//!
//! Each field of an op sits at a place of the flat form ([`OpFields`]) that its row of the ops
//! table names (`core/src/op.rs`); the places sit in the plan's fields as follows (unused fields
//! are zero):
//!
//! | place | plan fields |
//! |---|---|
//! | `a` | `a_rank`, `a_buf`, `a_off` (a multicast location or a k-way reduce's sources: rank 0) |
//! | `b` | `b_rank`, `b_buf`, `b_off` |
//! | `dst` | `dst_rank`, `dst_buf`, `dst_off` |
//! | `peer` | `dst_rank` |
//! | `fanin.n`, `fanin.lo`, `fanin.hi` | `b_rank`, `b_off`, `reserved` (a k-way reduce's source count and up to 8 ranks, u16 each, little-endian; a low-latency reduce's region count and stride, a low-latency op's half offset `flip`) |
//! | `count`, `slot`, `div`, `dtype`, `redop`, `sigop`, `format` | the fields of the same names |

use crate::op::{Fanin, FieldError, Op, OpFields, OpKind, RawLoc};

pub use crate::op::code::*;

/// Every op kind by name, in wire order: what the generated headers (`plan.cuh`, `symm.h`) list.
/// It comes from the ops table ([`OpKind::CODES`]).
pub const KINDS: [(&str, u8); OpKind::COUNT] = OpKind::CODES;
/// Size of one encoded op in bytes.
pub const OP_BYTES: usize = 64;

/// One encoded op.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanOp {
    /// One of [`COPY`], [`REDUCE`], [`SIGNAL`], [`WAIT`], [`MC_REDUCE`], [`MC_STORE`],
    /// [`REDUCE_N`], [`LL_PUT`], [`LL_REDUCE`].
    pub kind: u8,
    /// [`DType`](crate::dtype::DType) wire value.
    pub dtype: u8,
    /// [`ReduceOp`](crate::dtype::ReduceOp) wire value.
    pub redop: u8,
    /// [`SignalOp`](crate::op::SignalOp) wire value.
    pub sigop: u8,
    /// [`Buf`](crate::op::Buf) of operand a.
    pub a_buf: u8,
    /// [`Buf`](crate::op::Buf) of operand b.
    pub b_buf: u8,
    /// [`Buf`](crate::op::Buf) of the destination.
    pub dst_buf: u8,
    /// [`Format`](crate::ll::Format) wire value of a low-latency op's lines; otherwise zero.
    pub format: u8,
    /// Rank of operand a.
    pub a_rank: u16,
    /// Rank of operand b.
    pub b_rank: u16,
    /// Rank of the destination (the peer of a signal).
    pub dst_rank: u16,
    /// Zero.
    pub pad1: u16,
    /// Signal-pad slot.
    pub slot: u32,
    /// Divisor of the last averaging step.
    pub div: u32,
    /// Byte offset of operand a.
    pub a_off: u64,
    /// Byte offset of operand b.
    pub b_off: u64,
    /// Byte offset of the destination.
    pub dst_off: u64,
    /// Bytes, elements, signal value or wait count.
    pub count: u64,
    /// Source ranks 4..8 of a k-way reduce; the half offset (`flip`) of a low-latency op;
    /// otherwise zero.
    pub reserved: u64,
}

const _: () = assert!(core::mem::size_of::<PlanOp>() == OP_BYTES);

/// Why bytes are not a valid plan op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// The kind byte is unknown.
    BadKind(u8),
    /// The dtype byte is unknown.
    BadDType(u8),
    /// The reduce-op byte is unknown.
    BadReduceOp(u8),
    /// The signal-op byte is unknown.
    BadSignalOp(u8),
    /// A buffer byte is unknown.
    BadBuf(u8),
    /// A k-way reduce names no source, more than [`crate::op::MAX_FANIN`], or has ranks past
    /// its count; or a low-latency reduce names no region.
    BadFanin(u16),
    /// The line-format byte is unknown.
    BadFormat(u8),
    /// Fewer than [`OP_BYTES`] bytes.
    Short,
}

impl From<FieldError> for PlanError {
    fn from(e: FieldError) -> PlanError {
        match e {
            FieldError::BadBuf(v) => PlanError::BadBuf(v),
            FieldError::BadDType(v) => PlanError::BadDType(v),
            FieldError::BadReduceOp(v) => PlanError::BadReduceOp(v),
            FieldError::BadSignalOp(v) => PlanError::BadSignalOp(v),
            FieldError::BadFanin(n) => PlanError::BadFanin(n),
            FieldError::BadFormat(v) => PlanError::BadFormat(v),
        }
    }
}

impl core::fmt::Display for PlanError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlanError::BadKind(b) => write!(f, "unknown op kind {b}"),
            PlanError::BadDType(b) => write!(f, "unknown dtype {b}"),
            PlanError::BadReduceOp(b) => write!(f, "unknown reduce op {b}"),
            PlanError::BadSignalOp(b) => write!(f, "unknown signal op {b}"),
            PlanError::BadBuf(b) => write!(f, "unknown buffer {b}"),
            PlanError::BadFanin(n) => write!(f, "a reduce with a bad fan-in ({n})"),
            PlanError::BadFormat(b) => write!(f, "unknown line format {b}"),
            PlanError::Short => write!(f, "fewer than {OP_BYTES} bytes"),
        }
    }
}

impl core::error::Error for PlanError {}

impl PlanOp {
    /// Encodes an op.
    pub fn encode(op: &Op) -> PlanOp {
        PlanOp::from_fields(&op.to_fields())
    }

    /// Decodes an op.
    pub fn decode(&self) -> Result<Op, PlanError> {
        Ok(Op::from_fields(&self.to_fields()?)?)
    }

    /// Lays out an op's places. Three words are shared by places that no op uses together
    /// (the second operand and the source list, the destination's rank and a signal's peer):
    /// the unused one is zero, so the word is their union.
    pub fn from_fields(w: &OpFields) -> PlanOp {
        PlanOp {
            kind: w.kind.code(),
            dtype: w.dtype,
            redop: w.redop,
            sigop: w.sigop,
            a_buf: w.a.buf,
            b_buf: w.b.buf,
            dst_buf: w.dst.buf,
            format: w.format,
            a_rank: w.a.rank,
            b_rank: w.b.rank | w.fanin.n,
            dst_rank: w.dst.rank | w.peer,
            pad1: 0,
            slot: w.slot,
            div: w.div,
            a_off: w.a.offset,
            b_off: w.b.offset | w.fanin.lo,
            dst_off: w.dst.offset,
            count: w.count,
            reserved: w.fanin.hi,
        }
    }

    /// The places of the encoded op (a shared word is read into each of its places).
    pub fn to_fields(&self) -> Result<OpFields, PlanError> {
        let kind = OpKind::from_code(self.kind).ok_or(PlanError::BadKind(self.kind))?;
        Ok(OpFields {
            kind,
            a: RawLoc {
                rank: self.a_rank,
                buf: self.a_buf,
                offset: self.a_off,
            },
            b: RawLoc {
                rank: self.b_rank,
                buf: self.b_buf,
                offset: self.b_off,
            },
            dst: RawLoc {
                rank: self.dst_rank,
                buf: self.dst_buf,
                offset: self.dst_off,
            },
            count: self.count,
            slot: self.slot,
            div: self.div,
            dtype: self.dtype,
            redop: self.redop,
            sigop: self.sigop,
            peer: self.dst_rank,
            fanin: Fanin {
                n: self.b_rank,
                lo: self.b_off,
                hi: self.reserved,
            },
            format: self.format,
        })
    }

    /// The op as 64 little-endian bytes.
    pub fn to_bytes(&self) -> [u8; OP_BYTES] {
        let mut b = [0u8; OP_BYTES];
        b[0] = self.kind;
        b[1] = self.dtype;
        b[2] = self.redop;
        b[3] = self.sigop;
        b[4] = self.a_buf;
        b[5] = self.b_buf;
        b[6] = self.dst_buf;
        b[7] = self.format;
        b[8..10].copy_from_slice(&self.a_rank.to_le_bytes());
        b[10..12].copy_from_slice(&self.b_rank.to_le_bytes());
        b[12..14].copy_from_slice(&self.dst_rank.to_le_bytes());
        b[16..20].copy_from_slice(&self.slot.to_le_bytes());
        b[20..24].copy_from_slice(&self.div.to_le_bytes());
        b[24..32].copy_from_slice(&self.a_off.to_le_bytes());
        b[32..40].copy_from_slice(&self.b_off.to_le_bytes());
        b[40..48].copy_from_slice(&self.dst_off.to_le_bytes());
        b[48..56].copy_from_slice(&self.count.to_le_bytes());
        b[56..64].copy_from_slice(&self.reserved.to_le_bytes());
        b
    }

    /// Reads an op from 64 little-endian bytes (not validated: see [`PlanOp::decode`]).
    pub fn from_bytes(b: &[u8]) -> Result<PlanOp, PlanError> {
        if b.len() < OP_BYTES {
            return Err(PlanError::Short);
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        Ok(PlanOp {
            kind: b[0],
            dtype: b[1],
            redop: b[2],
            sigop: b[3],
            a_buf: b[4],
            b_buf: b[5],
            dst_buf: b[6],
            format: b[7],
            a_rank: u16_at(8),
            b_rank: u16_at(10),
            dst_rank: u16_at(12),
            pad1: 0,
            slot: u32_at(16),
            div: u32_at(20),
            a_off: u64_at(24),
            b_off: u64_at(32),
            dst_off: u64_at(40),
            count: u64_at(48),
            reserved: u64_at(56),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};
    use crate::op::{Buf, Loc, Ranks};
    use crate::sched::{algorithms, Collective, Request, Schedule};

    #[test]
    fn every_scheduled_op_round_trips() {
        for c in [
            Collective::AllReduce,
            Collective::Broadcast { root: 1 },
            Collective::AllToAll,
        ] {
            for &a in algorithms(c) {
                let req = Request::new(c, a, 3, 4096, DType::Bf16, ReduceOp::Avg);
                for op in Schedule::new(req, 1, 0).unwrap() {
                    let p = PlanOp::encode(&op);
                    let back = PlanOp::from_bytes(&p.to_bytes()).unwrap();
                    assert_eq!(back.decode().unwrap(), op);
                }
            }
        }
        assert_eq!(
            PlanOp {
                kind: u8::MAX,
                ..Default::default()
            }
            .decode(),
            Err(PlanError::BadKind(u8::MAX))
        );
        // A k-way reduce over eight ranks uses both rank words; bad counts and stray ranks fail.
        let seven = Op::ReduceN {
            buf: Buf::Input,
            offset: 64,
            ranks: Ranks::new(&[7, 6, 5, 4, 3, 2, 1, 0]).unwrap(),
            dst: Loc::new(3, Buf::Output, 16),
            elems: 5,
            dtype: DType::Bf16,
            op: ReduceOp::Max,
            div: 1,
        };
        let p = PlanOp::encode(&seven);
        assert_eq!(
            PlanOp::from_bytes(&p.to_bytes()).unwrap().decode(),
            Ok(seven)
        );
        for (n, hi) in [(0, p.reserved), (9, p.reserved), (4, p.reserved)] {
            let bad = PlanOp {
                b_rank: n,
                reserved: hi,
                ..p
            };
            assert_eq!(bad.decode(), Err(PlanError::BadFanin(n)));
        }
    }

    #[test]
    fn the_low_latency_algorithm_refuses_messages_above_its_bound() {
        let req = |bytes| {
            Request::new(
                Collective::AllReduce,
                crate::sched::Algorithm::OneShotLl,
                4,
                bytes,
                DType::U8,
                ReduceOp::Sum,
            )
        };
        assert!(req(crate::ll::MAX_BYTES).validate().is_ok());
        assert_eq!(
            req(crate::ll::MAX_BYTES + 1).validate(),
            Err(crate::sched::SchedError::AboveLimit {
                algorithm: crate::sched::Algorithm::OneShotLl,
                bytes: crate::ll::MAX_BYTES + 1,
                max: crate::ll::MAX_BYTES,
            })
        );
        assert!(Schedule::new(req(u64::MAX / 2), 0, 0).is_err());
    }

    #[test]
    fn direct_reductions_are_one_k_way_reduce_up_to_the_fanin() {
        for w in [2u16, 3, 8, 9] {
            let req = Request::new(
                Collective::AllReduce,
                crate::sched::Algorithm::OneShot,
                w,
                1024,
                DType::F32,
                ReduceOp::Sum,
            );
            let ops: alloc::vec::Vec<Op> = Schedule::new(req, 1, 0).unwrap().collect();
            let fused = ops
                .iter()
                .filter(|o| matches!(o, Op::ReduceN { .. }))
                .count();
            let binary = ops
                .iter()
                .filter(|o| matches!(o, Op::Reduce { .. }))
                .count();
            if w <= 8 {
                assert_eq!((fused, binary), (1, 0), "world {w}");
            } else {
                assert_eq!((fused, binary), (0, w as usize - 1), "world {w}");
            }
        }
    }
}
