//! The buffers view: for every rank a grid of its output (and scratch) chunks, each coloured by
//! the ranks whose contributions it holds.
//!
//! Contents come from the trace (`Event::contents`, recorded by the simulator for worlds up to
//! 64): after an op ends, its destination holds exactly the set of ranks it names. The chunks are
//! the natural pieces the schedule writes (the distinct boundaries of every write into an output
//! buffer) when there are few of them, else equal cells. Per (rank, cell) the history is a run of
//! (position, contents) in one flat table, so any playback position is a binary search away.
//!
//! A write may cover many cells on many ranks (a multicast store covers every rank), so the
//! history is capped at [`ENTRIES_PER_SPAN`] entries per span on average (plus one full sweep of
//! the grid): a trace's buffer history stays a small multiple of its size.

use symm_core::op::{Buf, Op};
use symm_core::perfetto::Span;
use symm_core::trace::Header;

/// Most cells per rank.
pub const MAX_CELLS: usize = 64;

/// History entries allowed per span, on average over the trace.
pub const ENTRIES_PER_SPAN: usize = 8;

/// Buffer contents over time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cells {
    /// Ranks drawn.
    pub world: u16,
    /// Cell boundaries in bytes (cells + 1 entries).
    pub bounds: Vec<u64>,
    /// Where the history of (rank, cell) starts in `entries`, at `rank * cells + cell`
    /// (`world * cells + 1` values; empty when nothing was written).
    starts: Vec<u32>,
    /// (rank * cells + cell, position after which it holds, contents), ascending.
    entries: Vec<(u32, u32, u64)>,
    /// Whether the trace records contents at all.
    pub recorded: bool,
    /// Whether any op wrote into the buffer.
    pub written: bool,
}

/// The writes of `op` into buffer `buf`, from its footprint: (rank, offset, bytes). Lines of
/// the low-latency protocol are not data the view colours (their region is the protocol's);
/// the data they carry is counted where a reduce writes it.
fn writes(op: &Op, world: u16, buf: Buf) -> Vec<(u16, u64, u64)> {
    let fp = op.footprint();
    let mut v = Vec::new();
    for w in fp.writes() {
        if w.lines.is_some() || w.at.buf() != buf {
            continue;
        }
        let at = w.at.offset();
        v.extend(w.ranks(world).map(|r| (r, at, w.bytes)));
    }
    v
}

/// Whether the header's request has well-defined buffers. A request refused only for too few
/// scratch slots has: the trace of a one-slot run that deadlocks shows its single slot.
fn sized(header: &Header) -> bool {
    match header.request.validate() {
        Ok(()) | Err(symm_core::sched::SchedError::TooFewSlots { .. }) => true,
        Err(_) => false,
    }
}

/// `n` and a noun, singular for one: "1 chunk", "2 chunks".
pub fn count(n: u64, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// The scratch slots per rank a header's request allocates (every stream's slots, a chunk each),
/// `None` when its buffers are not well defined.
pub fn slots_per_rank(header: &Header) -> Option<u64> {
    let r = &header.request;
    let slot = r.chunk_elems().saturating_mul(r.dtype.size()).max(1);
    sized(header).then(|| r.buffer_sizes().scratch / slot)
}

/// The titles of the buffers view's output and scratch grids, from a trace's own header and
/// cells. Every trace goes through here, the played one and the compared one alike.
pub fn titles(header: &Header, output: &Cells, scratch: &Cells) -> [String; 2] {
    let cells = scratch.cells() as u64;
    let slots = match slots_per_rank(header) {
        Some(s) if s == cells => count(s, "slot"),
        Some(s) => format!("{}, drawn as {}", count(s, "slot"), count(cells, "cell")),
        None => count(cells, "cell"),
    };
    [
        format!(
            "output: {} per rank; a stripe per rank whose contribution the chunk holds",
            count(output.cells() as u64, "chunk")
        ),
        format!("scratch (staging): {slots} per rank"),
    ]
}

impl Cells {
    /// Builds the history of every cell of buffer `buf` (output or scratch).
    ///
    /// `end_pos[s]` is the playback position just after span `s` ended (0: it never did).
    pub fn build(header: &Header, spans: &[Span], end_pos: &[u32], buf: Buf) -> Cells {
        let world = header.world.min(64);
        if !sized(header) {
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
        let keys = cells * world as usize;
        let mut entries: Vec<(u32, u32, u64)> = Vec::new();
        let mut budget = spans
            .len()
            .saturating_mul(ENTRIES_PER_SPAN)
            .saturating_add(keys);
        'spans: for (s, sp) in spans.iter().enumerate() {
            let (Some(c), Some(&pos)) = (sp.contents, end_pos.get(s)) else {
                continue;
            };
            if pos == 0 {
                continue;
            }
            for (rank, off, bytes) in writes(&sp.op, world, buf) {
                if rank >= world {
                    continue;
                }
                let end = off.saturating_add(bytes);
                let first = bounds.partition_point(|b| *b <= off).saturating_sub(1);
                for (cell, &from) in bounds.iter().enumerate().take(cells).skip(first) {
                    if from >= end {
                        break;
                    }
                    if budget == 0 {
                        break 'spans;
                    }
                    budget -= 1;
                    // keys <= 64 * 64: fits in u32.
                    entries.push(((rank as usize * cells + cell) as u32, pos, c));
                }
            }
        }
        entries.sort_unstable_by_key(|&(k, p, _)| (k, p));
        let mut starts = Vec::new();
        if !entries.is_empty() {
            starts = Vec::with_capacity(keys + 1);
            for k in 0..=keys {
                starts.push(entries.partition_point(|e| (e.0 as usize) < k) as u32);
            }
        }
        Cells {
            world,
            bounds,
            written: !entries.is_empty(),
            starts,
            entries,
            recorded,
        }
    }

    /// Contents of a rank's cell after `pos` events (0: nothing yet).
    pub fn at(&self, rank: usize, cell: usize, pos: usize) -> u64 {
        let cells = self.cells();
        if rank >= self.world as usize || cell >= cells {
            return 0;
        }
        let k = rank * cells + cell;
        let (Some(&a), Some(&b)) = (self.starts.get(k), self.starts.get(k + 1)) else {
            return 0;
        };
        let h = self.entries.get(a as usize..b as usize).unwrap_or(&[]);
        let i = h.partition_point(|e| e.1 as usize <= pos);
        i.checked_sub(1).map_or(0, |i| h[i].2)
    }

    /// Number of history entries over every rank and cell.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Number of cells per rank.
    pub fn cells(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::writes;
    use crate::model::{tests::small, Trace};
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::ll::Format;
    use symm_core::op::{Buf, Loc, McLoc, Op};

    /// A low-latency reduce writes its elements into its destination in either line format
    /// (the 128-byte form once recorded no write); a put's lines are not colour; a multicast
    /// store writes every rank.
    #[test]
    fn every_op_that_writes_data_records_its_write() {
        for format in Format::ALL {
            let red = Op::LlReduce {
                format,
                src: Loc::new(1, Buf::Scratch, 0),
                stride: 4096,
                sources: 2,
                dst: Loc::new(1, Buf::Output, 64),
                elems: 16,
                dtype: DType::F32,
                op: ReduceOp::Sum,
                div: 0,
                slot: 3,
                flip: 1 << 16,
            };
            assert_eq!(
                writes(&red, 2, Buf::Output),
                vec![(1, 64, 64)],
                "{format:?}"
            );
            assert_eq!(writes(&red, 2, Buf::Scratch), vec![], "{format:?}");
            let put = Op::LlPut {
                format,
                src: Loc::new(0, Buf::Input, 0),
                dst: Loc::new(1, Buf::Scratch, 0),
                bytes: 64,
                slot: 3,
                flip: 1 << 16,
            };
            assert_eq!(writes(&put, 2, Buf::Scratch), vec![], "{format:?}");
        }
        let store = Op::McStore {
            src: Loc::new(0, Buf::Input, 0),
            dst: McLoc {
                buf: Buf::Output,
                offset: 8,
            },
            bytes: 32,
        };
        assert_eq!(
            writes(&store, 3, Buf::Output),
            vec![(0, 8, 32), (1, 8, 32), (2, 8, 32)]
        );
        let copy = Op::Copy {
            src: Loc::new(0, Buf::Input, 0),
            dst: Loc::new(2, Buf::Scratch, 16),
            bytes: 8,
        };
        assert_eq!(writes(&copy, 3, Buf::Scratch), vec![(2, 16, 8)]);
    }

    /// The played and the compared trace read their own headers the same way: a one-slot run
    /// (its header names one slot, like the labs' `one-slot.trace`) beside a two-slot reference.
    #[test]
    fn titles_count_from_each_trace_s_own_header() {
        use super::{count, slots_per_rank, titles, Cells};
        assert_eq!(count(1, "chunk"), "1 chunk");
        assert_eq!(count(2, "chunk"), "2 chunks");
        assert_eq!(count(0, "slot"), "0 slots");
        let cells = |n: u64| Cells {
            world: 2,
            bounds: (0..=n).map(|i| i * 64).collect(),
            recorded: true,
            written: true,
            ..Cells::default()
        };
        let mut h = crate::model::tests::header(2);
        // Ring all-reduce: one stream of slots; a slot holds one chunk of 64 bytes.
        h.request = h.request.with_pipeline(64, 2);
        assert_eq!(slots_per_rank(&h), Some(2));
        let [out, scratch] = titles(&h, &cells(1), &cells(2));
        assert!(out.starts_with("output: 1 chunk per rank;"), "{out}");
        assert_eq!(scratch, "scratch (staging): 2 slots per rank");
        let mut one = h.clone();
        one.request = one.request.with_pipeline(64, 1);
        assert_eq!(slots_per_rank(&one), Some(1));
        let [out, scratch] = titles(&one, &cells(2), &cells(1));
        assert!(out.starts_with("output: 2 chunks per rank;"), "{out}");
        assert_eq!(scratch, "scratch (staging): 1 slot per rank");
        // Cells that are not the header's slots say both.
        let [_, scratch] = titles(&one, &cells(1), &cells(3));
        assert_eq!(
            scratch,
            "scratch (staging): 1 slot, drawn as 3 cells per rank"
        );
    }

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
