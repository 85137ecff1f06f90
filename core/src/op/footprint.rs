//! What an op reads and writes: its footprint.
//!
//! Every consumer that asks "which bytes does this op touch?" asks [`Op::footprint`] instead of
//! taking the op apart: the GPU plan's bounds check, the simulator's ports, the viz's buffer
//! view. An op touches up to [`MAX_RANGES`] ranges of symmetric buffers, each read or written,
//! on one rank or on every rank (multicast), and at most one signal-pad slot.
//!
//! A range of low-latency lines ([`Range::lines`]) lies in the scratch buffer and is the region
//! of both halves of every source ([`Range::span`], what a bounds check needs); what one call
//! moves there is [`Range::bytes`] (one half). Plain ranges have `bytes == span`.

use super::{Buf, Loc, McLoc, Op, MAX_FANIN};
use crate::ll::{self, Format};

/// The most ranges one op touches: a k-way reduce's sources and its destination.
pub const MAX_RANGES: usize = MAX_FANIN + 1;

/// Whether an op reads or writes a range or a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// The op reads it.
    Read,
    /// The op writes it.
    Write,
}

/// Whose bytes a range names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum At {
    /// One rank's buffer.
    Rank(Loc),
    /// The same bytes of every rank's buffer (a multicast op).
    Every(McLoc),
}

impl At {
    /// The buffer.
    pub fn buf(&self) -> Buf {
        match self {
            At::Rank(l) => l.buf,
            At::Every(m) => m.buf,
        }
    }

    /// The byte offset of the start.
    pub fn offset(&self) -> u64 {
        match self {
            At::Rank(l) => l.offset,
            At::Every(m) => m.offset,
        }
    }
}

/// Low-latency lines in a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lines {
    /// Their format.
    pub format: Format,
    /// Whether the range's start and the distances between its regions (the half offset, a
    /// reduce's stride) are multiples of [`ll::ALIGN`].
    pub aligned: bool,
}

/// One range an op touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Range {
    /// Read or written.
    pub access: Access,
    /// Where it starts.
    pub at: At,
    /// Bytes one call moves (saturating).
    pub bytes: u64,
    /// Bytes from the start that calls may touch (saturating): `bytes`, or for lines every
    /// region over both halves.
    pub span: u64,
    /// The low-latency lines the range holds, when it holds lines.
    pub lines: Option<Lines>,
}

impl Range {
    fn plain(access: Access, at: At, bytes: u64) -> Range {
        Range {
            access,
            at,
            bytes,
            span: bytes,
            lines: None,
        }
    }

    /// The ranks whose bytes it names: one, or each of `0..world` for a multicast range.
    pub fn ranks(&self, world: u16) -> core::ops::Range<u16> {
        match self.at {
            At::Rank(l) => l.rank..l.rank.saturating_add(1),
            At::Every(_) => 0..world,
        }
    }
}

/// A signal-pad slot an op touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The rank whose pad holds it: `None` for the executing rank's own.
    pub peer: Option<u16>,
    /// The slot index.
    pub slot: u32,
    /// A signal writes its slot; a wait reads it; a low-latency op reads its epoch's counter.
    pub access: Access,
}

/// What an op reads and writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    ranges: heapless::Vec<Range, MAX_RANGES>,
    /// The signal-pad slot, when the op uses one.
    pub slot: Option<Slot>,
}

impl Footprint {
    /// Every range, reads first, in the op's operand order.
    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    /// The ranges read.
    pub fn reads(&self) -> impl Iterator<Item = &Range> {
        self.ranges.iter().filter(|r| r.access == Access::Read)
    }

    /// The ranges written.
    pub fn writes(&self) -> impl Iterator<Item = &Range> {
        self.ranges.iter().filter(|r| r.access == Access::Write)
    }

    fn push(&mut self, r: Range) {
        // At most MAX_RANGES per op by construction (a k-way reduce's sources and its
        // destination).
        let _ = self.ranges.push(r);
    }
}

impl Op {
    /// What the op reads and writes (see the module documentation).
    pub fn footprint(&self) -> Footprint {
        use Access::{Read, Write};
        let mut f = Footprint {
            ranges: heapless::Vec::new(),
            slot: None,
        };
        let n = |elems: u64, dtype: crate::dtype::DType| elems.saturating_mul(dtype.size());
        match *self {
            Op::Copy { src, dst, bytes } => {
                f.push(Range::plain(Read, At::Rank(src), bytes));
                f.push(Range::plain(Write, At::Rank(dst), bytes));
            }
            Op::Reduce {
                a,
                b,
                dst,
                elems,
                dtype,
                ..
            } => {
                let n = n(elems, dtype);
                f.push(Range::plain(Read, At::Rank(a), n));
                f.push(Range::plain(Read, At::Rank(b), n));
                f.push(Range::plain(Write, At::Rank(dst), n));
            }
            Op::ReduceN {
                buf,
                offset,
                ranks,
                dst,
                elems,
                dtype,
                ..
            } => {
                let n = n(elems, dtype);
                for &r in ranks.as_slice() {
                    f.push(Range::plain(Read, At::Rank(Loc::new(r, buf, offset)), n));
                }
                f.push(Range::plain(Write, At::Rank(dst), n));
            }
            Op::Signal { peer, slot, .. } => {
                f.slot = Some(Slot {
                    peer: Some(peer),
                    slot,
                    access: Write,
                });
            }
            Op::Wait { slot, .. } => {
                f.slot = Some(Slot {
                    peer: None,
                    slot,
                    access: Read,
                });
            }
            Op::LlPut {
                format,
                src,
                dst,
                bytes,
                slot,
                flip,
            } => {
                f.push(Range::plain(Read, At::Rank(src), bytes));
                f.push(Range {
                    access: Write,
                    at: At::Rank(dst),
                    bytes: format.line_bytes(bytes),
                    span: ll::put_span_of(format, flip, bytes),
                    lines: Some(Lines {
                        format,
                        aligned: (dst.offset | flip).is_multiple_of(ll::ALIGN),
                    }),
                });
                f.slot = Some(Slot {
                    peer: None,
                    slot,
                    access: Read,
                });
            }
            Op::LlReduce {
                format,
                src,
                stride,
                sources,
                dst,
                elems,
                dtype,
                slot,
                flip,
                ..
            } => {
                let n = n(elems, dtype);
                f.push(Range {
                    access: Read,
                    at: At::Rank(src),
                    bytes: format.line_bytes(n).saturating_mul(sources as u64),
                    span: ll::reduce_span_of(format, sources, stride, flip, n),
                    lines: Some(Lines {
                        format,
                        aligned: (src.offset | stride | flip).is_multiple_of(ll::ALIGN),
                    }),
                });
                f.push(Range::plain(Write, At::Rank(dst), n));
                f.slot = Some(Slot {
                    peer: None,
                    slot,
                    access: Read,
                });
            }
            Op::McReduce {
                src,
                dst,
                elems,
                dtype,
                ..
            } => {
                let n = n(elems, dtype);
                f.push(Range::plain(Read, At::Every(src), n));
                f.push(Range::plain(Write, At::Rank(dst), n));
            }
            Op::McStore { src, dst, bytes } => {
                f.push(Range::plain(Read, At::Rank(src), bytes));
                f.push(Range::plain(Write, At::Every(dst), bytes));
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;

    /// Every location an op names (through `map_locs`) is the start of one of its ranges, and
    /// every op but a signal or a wait touches bytes; slots are the ones `map_slots` moves.
    #[test]
    fn the_footprint_covers_every_location_and_slot() {
        for k in OpKind::ALL {
            let op = Op::example(k);
            let fp = op.footprint();
            let mut locs = heapless::Vec::<Loc, 16>::new();
            let _ = op.map_locs(|l| {
                let _ = locs.push(l);
                Ok::<_, ()>(l)
            });
            for l in &locs {
                assert!(
                    fp.ranges().iter().any(|r| r.at == At::Rank(*l)),
                    "{k:?} {l:?}"
                );
            }
            let rank_ranges = fp.ranges().iter().filter(|r| matches!(r.at, At::Rank(_)));
            assert_eq!(rank_ranges.count(), locs.len(), "{k:?}");
            assert_eq!(
                fp.writes().count(),
                usize::from(!fp.ranges().is_empty()),
                "{k:?}"
            );
            let mut slots = heapless::Vec::<u32, 2>::new();
            let _ = op.map_slots(Ok::<_, ()>, |s| {
                let _ = slots.push(s);
                Ok(s)
            });
            assert_eq!(fp.slot.map(|s| s.slot), slots.first().copied(), "{k:?}");
            let mut lines = fp.ranges().iter().filter_map(|r| r.lines);
            assert_eq!(lines.next().map(|l| l.format), op.line_format(), "{k:?}");
            assert_eq!(lines.next(), None, "{k:?}");
            for r in fp.ranges().iter().filter(|r| r.lines.is_none()) {
                assert_eq!(r.span, r.bytes, "{k:?}");
            }
            assert_eq!(fp.ranges().is_empty(), op.bytes() == 0, "{k:?}");
        }
    }

    /// A low-latency op's line range spans both halves of every region, in its own format;
    /// a reduce writes its elements whatever the format.
    #[test]
    fn line_ranges_span_both_halves_in_their_format() {
        let src = Loc::new(0, Buf::Scratch, 256);
        let dst = Loc::new(1, Buf::Output, 64);
        for format in Format::ALL {
            let red = Op::LlReduce {
                format,
                src,
                stride: 4096,
                sources: 3,
                dst,
                elems: 30,
                dtype: crate::dtype::DType::F32,
                op: crate::dtype::ReduceOp::Sum,
                div: 0,
                slot: 5,
                flip: 1 << 20,
            };
            let fp = red.footprint();
            let read = fp.reads().next().unwrap();
            assert_eq!(read.span, 2 * 4096 + (1 << 20) + format.line_bytes(120));
            assert_eq!(
                read.lines.map(|l| (l.format, l.aligned)),
                Some((format, true))
            );
            let w: heapless::Vec<&Range, 2> = fp.writes().collect();
            assert_eq!(w.len(), 1);
            assert_eq!(
                (w[0].at, w[0].bytes, w[0].lines),
                (At::Rank(dst), 120, None)
            );
            let put = Op::LlPut {
                format,
                src: dst,
                dst: Loc::new(1, Buf::Scratch, 8),
                bytes: 121,
                slot: 5,
                flip: 1 << 20,
            };
            let w = put.footprint().writes().copied().next().unwrap();
            assert_eq!(w.bytes, format.line_bytes(121));
            assert_eq!(w.span, format.line_bytes(121) + (1 << 20));
            assert_eq!(w.lines.map(|l| l.aligned), Some(false));
        }
    }
}
