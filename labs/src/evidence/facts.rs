//! The facts the evidence rules ask of a schedule's ops: who signals whom how often, who waits
//! for what, which ops write or read a place, and what a signal announces (the writes its sender
//! made since its previous signal on that slot).

use symm_core::op::{At, Buf, Loc, Op};
use symm_core::sched::Request;
use symm_core::signal::{SlotKind, SlotLayout};

/// A wait's slot and count.
pub fn wait_of(op: &Op) -> Option<(u32, u64)> {
    if let Op::Wait { slot, count } = *op {
        Some((slot, count))
    } else {
        None
    }
}

/// A signal's peer, slot and value.
pub fn signal_of(op: &Op) -> Option<(u16, u32, u64)> {
    if let Op::Signal {
        peer, slot, value, ..
    } = *op
    {
        Some((peer, slot, value))
    } else {
        None
    }
}

/// An op of a rank: (rank, op index).
type OpAt = (u16, usize);

/// The streams of a request, with the facts the rules ask of them.
pub(super) struct Ops<'a> {
    pub req: &'a Request,
    pub layout: SlotLayout,
    pub streams: &'a [Vec<Op>],
    pub channels: usize,
}

impl<'a> Ops<'a> {
    pub fn rank_of(&self, stream: usize) -> u16 {
        (stream / self.channels) as u16
    }

    /// Every (rank, op index, op) of every stream.
    pub fn all(&self) -> impl Iterator<Item = (usize, u16, usize, &'a Op)> + '_ {
        self.streams.iter().enumerate().flat_map(move |(s, ops)| {
            let r = self.rank_of(s);
            ops.iter().enumerate().map(move |(i, op)| (s, r, i, op))
        })
    }

    /// Signals of `kind` that `from` sends to `to`.
    pub fn sent(&self, from: u16, to: u16, kind: SlotKind) -> u64 {
        self.all()
            .filter(|&(_, r, _, _)| r == from)
            .filter_map(|(_, _, _, op)| {
                let (_, slot, value) = signal_of(op).filter(|s| s.0 == to)?;
                let k = self.layout.key(slot)?;
                (k.kind == kind).then_some(value)
            })
            .fold(0, u64::saturating_add)
    }

    /// What `rank` waits for in all on "`kind` from `from`".
    pub fn awaited(&self, rank: u16, from: u16, kind: SlotKind) -> u64 {
        self.all()
            .filter(|&(_, r, _, _)| r == rank)
            .filter_map(|(_, _, _, op)| {
                let (slot, count) = wait_of(op)?;
                let k = self.layout.key(slot)?;
                (k.kind == kind && k.peer == from).then_some(count)
            })
            .fold(0, u64::saturating_add)
    }

    pub fn locs(&self, op: &Op, write: bool) -> Vec<(Loc, u64)> {
        let f = op.footprint();
        let ranges: Vec<_> = if write {
            f.writes().copied().collect()
        } else {
            f.reads().copied().collect()
        };
        let mut v = Vec::new();
        for r in ranges {
            match r.at {
                At::Rank(l) => v.push((l, r.span)),
                At::Every(m) => {
                    v.extend((0..self.req.world).map(|q| (Loc::new(q, m.buf, m.offset), r.span)))
                }
            }
        }
        v
    }

    /// Ops that write (or read) the element at `l`.
    pub fn touching(&self, l: Loc, write: bool) -> Vec<(usize, u16, usize, Op)> {
        let covers = |(m, span): &(Loc, u64)| {
            m.rank == l.rank
                && m.buf == l.buf
                && m.offset <= l.offset
                && l.offset < m.offset.saturating_add(*span)
        };
        self.all()
            .filter(|(_, _, _, op)| self.locs(op, write).iter().any(covers))
            .map(|(s, r, i, op)| (s, r, i, *op))
            .collect()
    }

    /// The last wait before op `index` of stream `s` for an announcing signal, and its writer.
    pub fn last_wait(&self, s: usize, index: usize) -> Option<(usize, u32, u16)> {
        let ops = self.streams.get(s)?;
        (0..index.min(ops.len())).rev().find_map(|i| {
            let (slot, _) = wait_of(&ops[i])?;
            let k = self.layout.key(slot)?;
            (k.kind != SlotKind::Ready).then_some((i, slot, k.peer))
        })
    }

    /// Whether stream `s` waits, before `index`, on a slot `writer` signals (not its `Ready`),
    /// and the cumulative count it waits for on that slot by then.
    pub fn waits_for(&self, s: usize, index: usize, writer: u16) -> Option<(u32, u64)> {
        let ops = self.streams.get(s)?;
        let mut found: Option<(u32, u64)> = None;
        for op in ops.iter().take(index) {
            if let Op::Wait { slot, count } = *op {
                let Some(k) = self.layout.key(slot) else {
                    continue;
                };
                if k.peer == writer && k.kind != SlotKind::Ready {
                    let before = match found {
                        Some((s0, c)) if s0 == slot => c,
                        _ => 0,
                    };
                    found = Some((slot, before.saturating_add(count)));
                }
            }
        }
        found
    }

    /// Signals to `to` on `slot` in stream `s` before op `index`.
    pub fn signals_before(&self, s: usize, index: usize, to: u16, slot: u32) -> u64 {
        self.streams.get(s).map_or(0, |ops| {
            ops.iter()
                .take(index)
                .filter_map(signal_of)
                .filter(|&(peer, s2, _)| peer == to && s2 == slot)
                .map(|(_, _, value)| value)
                .fold(0, u64::saturating_add)
        })
    }

    /// The writes `writer` makes into `to`'s memory or its own just before its `n`-th signal
    /// (1-based) to `to` on `slot`: the range that signal announces.
    pub fn announced(&self, writer: u16, to: u16, slot: u32, n: u64) -> Vec<(Loc, u64, usize, Op)> {
        for (s, ops) in self.streams.iter().enumerate() {
            if self.rank_of(s) != writer {
                continue;
            }
            let mut seen = 0u64;
            let mut since = 0usize;
            for (i, op) in ops.iter().enumerate() {
                if let Op::Signal {
                    peer,
                    slot: s2,
                    value,
                    ..
                } = *op
                {
                    if peer == to && s2 == slot {
                        seen = seen.saturating_add(value);
                        if seen >= n {
                            let window = |into: u16| -> Vec<(Loc, u64, usize, Op)> {
                                ops[since..i]
                                    .iter()
                                    .enumerate()
                                    .flat_map(|(j, o)| {
                                        self.locs(o, true)
                                            .into_iter()
                                            .filter(move |(l, _)| l.rank == into)
                                            .map(move |(l, b)| (l, b, since + j, *o))
                                    })
                                    .collect()
                            };
                            // Data put into the waiter, else left in the writer's own buffers
                            // for the waiter to get.
                            let put = window(to);
                            return if put.is_empty() { window(writer) } else { put };
                        }
                        since = i + 1;
                    }
                }
            }
        }
        Vec::new()
    }

    /// Whether `writer` writes into `to`'s memory after its last signal to `to` on `slot`: a
    /// write no signal announces.
    pub fn unannounced(&self, writer: u16, to: u16, slot: u32) -> bool {
        self.streams.iter().enumerate().any(|(s, ops)| {
            if self.rank_of(s) != writer {
                return false;
            }
            let last = ops.iter().rposition(
                |o| matches!(*o, Op::Signal { peer, slot: s2, .. } if peer == to && s2 == slot),
            );
            last.is_some_and(|i| {
                ops[i + 1..]
                    .iter()
                    .any(|o| self.locs(o, true).iter().any(|(l, _)| l.rank == to))
            })
        })
    }

    pub fn elems(&self, l: Loc) -> u64 {
        l.offset / self.req.dtype.size().max(1)
    }

    pub fn range(&self, l: Loc, bytes: u64) -> String {
        let e = self.elems(l);
        let n = bytes / self.req.dtype.size().max(1);
        format!("rank {}'s {} [{e}..{})", l.rank, buf(l.buf), e + n)
    }

    /// A location of `rank`'s `b` written by two ops or more, with two of them.
    pub fn written_twice(&self, rank: u16, b: Buf) -> Option<(Loc, OpAt, OpAt)> {
        let es = self.req.dtype.size().max(1);
        let mut writes: Vec<(Loc, u64, u16, usize)> = Vec::new();
        for (_, r, i, op) in self.all() {
            for (l, span) in self.locs(op, true) {
                if l.rank == rank && l.buf == b {
                    writes.push((l, span, r, i));
                }
            }
        }
        for (x, &(l, span, r, i)) in writes.iter().enumerate() {
            for &(m, span2, r2, i2) in &writes[x + 1..] {
                let lo = l.offset.max(m.offset);
                let hi = (l.offset + span).min(m.offset + span2);
                if lo < hi && (r, i) != (r2, i2) {
                    let at = Loc::new(rank, b, lo / es * es);
                    return Some((at, (r, i), (r2, i2)));
                }
            }
        }
        None
    }
}

pub fn buf(b: Buf) -> &'static str {
    match b {
        Buf::Input => "input",
        Buf::Output => "output",
        Buf::Scratch => "scratch",
    }
}
