//! The symbolic model of the low-latency protocol (`crate::ll`): each element a line carries is
//! a cell holding the call's flag and the element's contribution; a reduce waits until every
//! cell of every region it reads holds this call's flag.

use alloc::vec;
use alloc::vec::Vec;

use super::{Sym, SymError, SymWorld};
use crate::exec::LlPoll;
use crate::ll::Format;
use crate::op::{Buf, Loc, Op};

impl SymWorld {
    /// The byte position of element `i` of the data whose lines of `format` start at `base`
    /// (data byte `b` sits in line `b / data` at `b % data`).
    fn ll_pos(&self, format: Format, base: u64, i: u64) -> u64 {
        let b = i * self.req.dtype.size();
        base + (b / format.data()) * format.line() + b % format.data()
    }

    /// Whether `len` bytes of lines at `l` lie inside its buffer.
    fn ll_range(&self, rank: u16, l: Loc, len: u64) -> Result<(), SymError> {
        let es = self.req.dtype.size();
        let size = match self.mem.get(l.rank as usize) {
            None => 0,
            Some(_) if l.buf == Buf::Scratch => self.scratch_bytes,
            Some(m) => m[l.buf as usize].len() as u64 * es,
        };
        if l.offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(SymError::OutOfBounds { rank, loc: l });
        }
        Ok(())
    }

    /// A low-latency op of `rank` in the call whose epoch is `epoch` ([`crate::ll`]): a put
    /// stores each element with the call's flag; a reduce waits until every element of every
    /// region carries it, then combines them in region order into `dst`. Returns the union of
    /// the destination's masks when the op ran.
    pub fn ll(
        &mut self,
        rank: u16,
        op: &Op,
        epoch: u64,
    ) -> Result<(LlPoll, Option<u64>), SymError> {
        let es = self.req.dtype.size();
        let flag = crate::ll::flag(epoch);
        let bad = SymError::OutOfBounds {
            rank,
            loc: Loc::new(rank, Buf::Scratch, 0),
        };
        match *op {
            Op::LlPut {
                format,
                src,
                dst,
                bytes,
                flip,
                ..
            } => {
                let v = self.get(rank, src, bytes / es)?;
                let at = crate::ll::at(dst, flip, epoch)
                    .ok_or(SymError::OutOfBounds { rank, loc: dst })?;
                self.ll_range(rank, at, format.line_bytes(bytes))?;
                let base = at.offset;
                for (i, x) in v.iter().enumerate() {
                    let pos = self.ll_pos(format, base, i as u64);
                    self.ll.insert((dst.rank, dst.buf as u8, pos), (flag, *x));
                    self.fold_ll_put(src, i, (dst.rank, dst.buf as u8, pos));
                }
                Ok((LlPoll::Done, None))
            }
            Op::LlReduce {
                format,
                src,
                stride,
                sources,
                dst,
                elems,
                flip,
                ..
            } => {
                let mut acc: Option<Vec<Sym>> = None;
                // Each element's folds, region by region (the order witness).
                let mut folds: Vec<Vec<super::Fold>> = vec![Vec::new(); elems as usize];
                for s in 0..sources as u64 {
                    let at = crate::ll::region(src, stride, s, flip, epoch)
                        .ok_or(SymError::OutOfBounds { rank, loc: src })?;
                    let base = at.offset;
                    self.ll_range(rank, at, format.line_bytes(elems.saturating_mul(es)))?;
                    let mut v = Vec::with_capacity(elems as usize);
                    for i in 0..elems {
                        let pos = self.ll_pos(format, base, i);
                        let key = (src.rank, src.buf as u8, pos);
                        match self.ll.get(&key) {
                            Some(&(f, x)) if f == flag => {
                                v.push(x);
                                if let Some(e) = folds.get_mut(i as usize) {
                                    e.push(self.fold_ll(key));
                                }
                            }
                            other => return Ok((LlPoll::Waiting(other.map_or(0, |c| c.0)), None)),
                        }
                    }
                    match acc.as_mut() {
                        None => acc = Some(v),
                        Some(a) => Self::combine(rank, dst, a, &v)?,
                    }
                }
                let x = acc.ok_or(SymError::OutOfBounds { rank, loc: src })?;
                let combined: Vec<super::Fold> =
                    folds.iter().map(|f| super::Fold::combine(f)).collect();
                self.fold_put(dst, &combined);
                let m = self.put(rank, dst, &x)?;
                Ok((LlPoll::Done, Some(m)))
            }
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Signal { .. }
            | Op::Wait { .. }
            | Op::ReduceN { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => Err(bad),
        }
    }
}
