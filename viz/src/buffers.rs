//! The buffers view: for every rank a grid of its output (and scratch) chunks, each coloured by
//! the ranks whose contributions it holds.
//!
//! Contents come from the trace (`Event::contents`, recorded by the simulator for worlds up to
//! 64): after an op ends, its destination holds exactly the set of ranks it names. The chunks are
//! the natural pieces the schedule writes (the distinct boundaries of every write into an output
//! buffer) when there are few of them, else equal cells. Per (rank, cell) the history is a list of
//! (position, contents), so any playback position is a binary search away.

use symm_core::op::{Buf, Op};
use symm_core::perfetto::Span;
use symm_core::trace::Header;

/// Most cells per rank.
pub const MAX_CELLS: usize = 64;

/// Buffer contents over time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cells {
    /// Ranks drawn.
    pub world: u16,
    /// Cell boundaries in bytes (cells + 1 entries).
    pub bounds: Vec<u64>,
    /// Per rank, per cell: (position after which it holds, contents), ascending.
    pub history: Vec<Vec<Vec<(u32, u64)>>>,
    /// Whether the trace records contents at all.
    pub recorded: bool,
    /// Whether any op wrote into the buffer.
    pub written: bool,
}

/// A write into buffer `buf`: (rank, offset, bytes).
fn writes(op: &Op, world: u16, buf: Buf) -> Vec<(u16, u64, u64)> {
    match *op {
        Op::Copy { dst, bytes, .. } if dst.buf == buf => {
            vec![(dst.rank, dst.offset, bytes)]
        }
        Op::Reduce { dst, .. } | Op::McReduce { dst, .. } if dst.buf == buf => {
            vec![(dst.rank, dst.offset, op.bytes())]
        }
        Op::McStore { dst, bytes, .. } if dst.buf == buf => {
            (0..world).map(|r| (r, dst.offset, bytes)).collect()
        }
        _ => Vec::new(),
    }
}

impl Cells {
    /// Builds the history of every cell of buffer `buf` (output or scratch).
    ///
    /// `end_pos[s]` is the playback position just after span `s` ended (0: it never did).
    pub fn build(header: &Header, spans: &[Span], end_pos: &[u32], buf: Buf) -> Cells {
        let world = header.world.min(64);
        if header.request.validate().is_err() {
            return Cells {
                world,
                ..Cells::default()
            };
        }
        let sizes = header.request.buffer_sizes();
        let out_bytes = match buf {
            Buf::Input => sizes.input,
            Buf::Output => sizes.output,
            Buf::Scratch => sizes.scratch,
        }
        .max(1);
        let recorded = spans.iter().any(|s| s.contents.is_some());
        if !recorded || world == 0 {
            return Cells {
                world,
                recorded,
                ..Cells::default()
            };
        }
        let mut bounds: Vec<u64> = vec![0, out_bytes];
        for (s, sp) in spans.iter().enumerate() {
            if sp.contents.is_none() || end_pos.get(s).is_none_or(|p| *p == 0) {
                continue;
            }
            for (_, off, bytes) in writes(&sp.op, world, buf) {
                bounds.push(off.min(out_bytes));
                bounds.push(off.saturating_add(bytes).min(out_bytes));
            }
            if bounds.len() > 8 * MAX_CELLS {
                bounds.sort_unstable();
                bounds.dedup();
                if bounds.len() > MAX_CELLS + 1 {
                    break;
                }
            }
        }
        bounds.sort_unstable();
        bounds.dedup();
        if bounds.len() > MAX_CELLS + 1 {
            let n = MAX_CELLS as u64;
            bounds = (0..=n).map(|i| out_bytes * i / n).collect();
            bounds.dedup();
        }
        let cells = bounds.len().saturating_sub(1);
        let mut history = vec![vec![Vec::new(); cells]; world as usize];
        let mut any = false;
        for (s, sp) in spans.iter().enumerate() {
            let (Some(c), Some(&pos)) = (sp.contents, end_pos.get(s)) else {
                continue;
            };
            if pos == 0 {
                continue;
            }
            for (rank, off, bytes) in writes(&sp.op, world, buf) {
                let Some(h) = history.get_mut(rank as usize) else {
                    continue;
                };
                let end = off.saturating_add(bytes);
                let first = bounds.partition_point(|b| *b <= off).saturating_sub(1);
                for (cell, hist) in h.iter_mut().enumerate().skip(first) {
                    if bounds[cell] >= end {
                        break;
                    }
                    hist.push((pos, c));
                    any = true;
                }
            }
        }
        for rank in &mut history {
            for hist in rank.iter_mut() {
                hist.sort_by_key(|(p, _)| *p);
            }
        }
        Cells {
            world,
            bounds,
            history,
            recorded,
            written: any,
        }
    }

    /// Contents of a rank's cell after `pos` events (0: nothing yet).
    pub fn at(&self, rank: usize, cell: usize, pos: usize) -> u64 {
        let Some(h) = self.history.get(rank).and_then(|r| r.get(cell)) else {
            return 0;
        };
        let i = h.partition_point(|(p, _)| *p as usize <= pos);
        i.checked_sub(1).map_or(0, |i| h[i].1)
    }

    /// Number of cells per rank.
    pub fn cells(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{tests::small, Trace};

    #[test]
    fn output_cell_fills_when_the_reduce_ends() {
        let t = Trace::decode("small", small(false)).unwrap();
        assert!(t.cells.recorded);
        assert_eq!(t.cells.cells(), 2);
        assert_eq!(t.cells.at(1, 0, 0), 0);
        assert_eq!(t.cells.at(1, 0, t.events.len()), 3);
        assert_eq!(t.cells.at(1, 1, t.events.len()), 0);
    }
}
