//! The fixed-size encoding of ops that the GPU interpreter reads.
//!
//! A plan is an array of [`PlanOp`], 64 bytes each, `repr(C)`, little-endian, naturally aligned,
//! so a kernel reads an op with four 16-byte loads. The driver builds it from a schedule once per
//! request and caches it; `kernels/` has a header generated from the constants here
//! (`cargo xtask codegen`), and a test fails when that header is stale.
//!
//! Field use per kind (unused fields are zero):
//!
//! | kind | a | b | dst | count | slot | div |
//! |---|---|---|---|---|---|---|
//! | `COPY` | src | - | dst | bytes | - | - |
//! | `REDUCE` | a | b | dst | elems | - | div |
//! | `SIGNAL` | - | - | rank = peer | value | slot | - |
//! | `WAIT` | - | - | - | count | slot | - |
//! | `REDUCE_N` | src (buf, off) | rank = source count, off and `reserved` = up to 8 source ranks (u16 each, little-endian) | dst | elems | - | div |
//! | `MC_REDUCE` | src (buf, off) | - | dst | elems | - | div |
//! | `LL_PUT` | src | - | dst | bytes | epoch slot | - |, `reserved` = flip
//! | `LL_REDUCE` | first region | rank = regions, off = stride | dst | elems | epoch slot | div |, `reserved` = flip
//! | `MC_STORE` | src | - | dst (buf, off) | bytes | - | - |

use crate::dtype::{DType, ReduceOp};
use crate::op::{Buf, Loc, McLoc, Op, Ranks, SignalOp};

/// Op kind: copy.
pub const COPY: u8 = 0;
/// Op kind: reduce.
pub const REDUCE: u8 = 1;
/// Op kind: signal.
pub const SIGNAL: u8 = 2;
/// Op kind: wait.
pub const WAIT: u8 = 3;
/// Op kind: multicast load-reduce.
pub const MC_REDUCE: u8 = 4;
/// Op kind: multicast store.
pub const MC_STORE: u8 = 5;
/// Op kind: k-way reduce.
pub const REDUCE_N: u8 = 6;
/// Op kind: low-latency put.
pub const LL_PUT: u8 = 7;
/// Op kind: low-latency k-way reduce.
pub const LL_REDUCE: u8 = 8;
/// Every op kind by name, in wire order: what the generated headers (`plan.cuh`, `symm.h`) list.
pub const KINDS: [(&str, u8); 9] = [
    ("COPY", COPY),
    ("REDUCE", REDUCE),
    ("SIGNAL", SIGNAL),
    ("WAIT", WAIT),
    ("MC_REDUCE", MC_REDUCE),
    ("MC_STORE", MC_STORE),
    ("REDUCE_N", REDUCE_N),
    ("LL_PUT", LL_PUT),
    ("LL_REDUCE", LL_REDUCE),
];
/// Size of one encoded op in bytes.
pub const OP_BYTES: usize = 64;

/// One encoded op.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanOp {
    /// One of [`COPY`], [`REDUCE`], [`SIGNAL`], [`WAIT`], [`MC_REDUCE`], [`MC_STORE`],
    /// [`REDUCE_N`], [`LL_PUT`], [`LL_REDUCE`].
    pub kind: u8,
    /// [`DType`] wire value.
    pub dtype: u8,
    /// [`ReduceOp`] wire value.
    pub redop: u8,
    /// [`SignalOp`] wire value.
    pub sigop: u8,
    /// [`Buf`] of operand a.
    pub a_buf: u8,
    /// [`Buf`] of operand b.
    pub b_buf: u8,
    /// [`Buf`] of the destination.
    pub dst_buf: u8,
    /// Zero.
    pub pad0: u8,
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
    /// Fewer than [`OP_BYTES`] bytes.
    Short,
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
            PlanError::Short => write!(f, "fewer than {OP_BYTES} bytes"),
        }
    }
}

impl core::error::Error for PlanError {}

impl PlanOp {
    /// Encodes an op.
    pub fn encode(op: &Op) -> PlanOp {
        let mut p = PlanOp::default();
        let set_a = |p: &mut PlanOp, l: Loc| {
            p.a_rank = l.rank;
            p.a_buf = l.buf as u8;
            p.a_off = l.offset;
        };
        let set_dst = |p: &mut PlanOp, l: Loc| {
            p.dst_rank = l.rank;
            p.dst_buf = l.buf as u8;
            p.dst_off = l.offset;
        };
        match *op {
            Op::Copy { src, dst, bytes } => {
                p.kind = COPY;
                set_a(&mut p, src);
                set_dst(&mut p, dst);
                p.count = bytes;
            }
            Op::Reduce {
                a,
                b,
                dst,
                elems,
                dtype,
                op,
                div,
            } => {
                p.kind = REDUCE;
                set_a(&mut p, a);
                p.b_rank = b.rank;
                p.b_buf = b.buf as u8;
                p.b_off = b.offset;
                set_dst(&mut p, dst);
                p.count = elems;
                p.dtype = dtype as u8;
                p.redop = op as u8;
                p.div = div;
            }
            Op::Signal {
                peer,
                slot,
                op,
                value,
            } => {
                p.kind = SIGNAL;
                p.dst_rank = peer;
                p.slot = slot;
                p.sigop = op as u8;
                p.count = value;
            }
            Op::Wait { slot, count } => {
                p.kind = WAIT;
                p.slot = slot;
                p.count = count;
            }
            Op::ReduceN {
                buf,
                offset,
                ranks,
                dst,
                elems,
                dtype,
                op,
                div,
            } => {
                p.kind = REDUCE_N;
                p.a_buf = buf as u8;
                p.a_off = offset;
                p.b_rank = ranks.len() as u16;
                let (lo, hi) = ranks.pack();
                p.b_off = lo;
                p.reserved = hi;
                set_dst(&mut p, dst);
                p.count = elems;
                p.dtype = dtype as u8;
                p.redop = op as u8;
                p.div = div;
            }
            Op::LlPut {
                src,
                dst,
                bytes,
                slot,
                flip,
            } => {
                p.kind = LL_PUT;
                set_a(&mut p, src);
                set_dst(&mut p, dst);
                p.count = bytes;
                p.slot = slot;
                p.reserved = flip;
            }
            Op::LlReduce {
                src,
                stride,
                sources,
                dst,
                elems,
                dtype,
                op,
                div,
                slot,
                flip,
            } => {
                p.kind = LL_REDUCE;
                set_a(&mut p, src);
                p.b_rank = sources;
                p.b_off = stride;
                set_dst(&mut p, dst);
                p.count = elems;
                p.dtype = dtype as u8;
                p.redop = op as u8;
                p.div = div;
                p.slot = slot;
                p.reserved = flip;
            }
            Op::McReduce {
                src,
                dst,
                elems,
                dtype,
                op,
                div,
            } => {
                p.kind = MC_REDUCE;
                p.a_buf = src.buf as u8;
                p.a_off = src.offset;
                set_dst(&mut p, dst);
                p.count = elems;
                p.dtype = dtype as u8;
                p.redop = op as u8;
                p.div = div;
            }
            Op::McStore { src, dst, bytes } => {
                p.kind = MC_STORE;
                set_a(&mut p, src);
                p.dst_buf = dst.buf as u8;
                p.dst_off = dst.offset;
                p.count = bytes;
            }
        }
        p
    }

    /// Decodes an op.
    pub fn decode(&self) -> Result<Op, PlanError> {
        let buf = |b: u8| Buf::from_u8(b).ok_or(PlanError::BadBuf(b));
        let dtype = || DType::from_u8(self.dtype).ok_or(PlanError::BadDType(self.dtype));
        let redop = || ReduceOp::from_u8(self.redop).ok_or(PlanError::BadReduceOp(self.redop));
        let a = || Ok::<_, PlanError>(Loc::new(self.a_rank, buf(self.a_buf)?, self.a_off));
        let dst = || Ok::<_, PlanError>(Loc::new(self.dst_rank, buf(self.dst_buf)?, self.dst_off));
        Ok(match self.kind {
            COPY => Op::Copy {
                src: a()?,
                dst: dst()?,
                bytes: self.count,
            },
            REDUCE => Op::Reduce {
                a: a()?,
                b: Loc::new(self.b_rank, buf(self.b_buf)?, self.b_off),
                dst: dst()?,
                elems: self.count,
                dtype: dtype()?,
                op: redop()?,
                div: self.div,
            },
            SIGNAL => Op::Signal {
                peer: self.dst_rank,
                slot: self.slot,
                op: match self.sigop {
                    0 => SignalOp::Set,
                    1 => SignalOp::Add,
                    x => return Err(PlanError::BadSignalOp(x)),
                },
                value: self.count,
            },
            WAIT => Op::Wait {
                slot: self.slot,
                count: self.count,
            },
            REDUCE_N => Op::ReduceN {
                buf: buf(self.a_buf)?,
                offset: self.a_off,
                ranks: Ranks::unpack(self.b_rank, self.b_off, self.reserved)
                    .ok_or(PlanError::BadFanin(self.b_rank))?,
                dst: dst()?,
                elems: self.count,
                dtype: dtype()?,
                op: redop()?,
                div: self.div,
            },
            LL_PUT => Op::LlPut {
                src: a()?,
                dst: dst()?,
                bytes: self.count,
                slot: self.slot,
                flip: self.reserved,
            },
            LL_REDUCE => Op::LlReduce {
                src: a()?,
                stride: self.b_off,
                sources: if self.b_rank == 0 {
                    return Err(PlanError::BadFanin(0));
                } else {
                    self.b_rank
                },
                dst: dst()?,
                elems: self.count,
                dtype: dtype()?,
                op: redop()?,
                div: self.div,
                slot: self.slot,
                flip: self.reserved,
            },
            MC_REDUCE => Op::McReduce {
                src: McLoc {
                    buf: buf(self.a_buf)?,
                    offset: self.a_off,
                },
                dst: dst()?,
                elems: self.count,
                dtype: dtype()?,
                op: redop()?,
                div: self.div,
            },
            MC_STORE => Op::McStore {
                src: a()?,
                dst: McLoc {
                    buf: buf(self.dst_buf)?,
                    offset: self.dst_off,
                },
                bytes: self.count,
            },
            k => return Err(PlanError::BadKind(k)),
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
            pad0: 0,
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
                kind: 9,
                ..Default::default()
            }
            .decode(),
            Err(PlanError::BadKind(9))
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
