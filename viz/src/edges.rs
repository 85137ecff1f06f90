//! The schedule's edges, read from the trace: which rank sends data to which.
//!
//! Every `Signal` of rank `r` names its peer and a slot of the peer's pad, and the slot's kind
//! ([`SlotLayout::key`](symm_core::signal::SlotLayout::key)) says what it announces. A `Data`
//! signal announces data on the first tree of a tree schedule (the only data stream of any
//! other), a `DataB` signal data on a double binary tree's second tree: they are edges
//! `r -> peer` of class [`Class::Data`] (`t0`) and [`Class::DataB`] (`t1`). Data moved between
//! two ranks with no such signal between them (a copy, put or reduce whose footprint reads on
//! one rank and writes on another, e.g. the one-shot's reads of every peer or the low-latency
//! puts, whose flags travel with the data) is an edge of class [`Class::Put`] (`d`). The other
//! kinds (`Ready`, `Credit`, `CreditB`, `Done`, `Barrier`, `User`, `Epoch`) are control, not
//! data, and make no edge; neither do multicast ops, which move data through the switch.
//!
//! [`Graph::edges`] is sorted and deduplicated; [`text`] writes it as `0>1:t0 0>7:t1 2>3:d`, the
//! form the topology canvas publishes in its `data-edges` attribute for the browser check.
//!
//! For a tree schedule the topology view places ranks by depth ([`Graph::layout`]): breadth
//! first over the tree-0 edges (either direction) from the root, which is, in this order,
//! the request's root (broadcast, reduce), the ranks with an outgoing tree-0 edge and no
//! incoming one, or, when every tree-0 edge goes both ways (an all-reduce: reduce up the tree,
//! broadcast down it), the rank whose first tree-0 signal comes last (the root signals down
//! only after its children's data came up).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use symm_core::op::{Access, At, Op};
use symm_core::perfetto::Span;
use symm_core::sched::Collective;
use symm_core::signal::SlotKind;
use symm_core::trace::Header;

/// What an edge carries. Ordered as its tag sorts (`d` < `t0` < `t1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Data moved between the ranks with no data signal between them.
    Put,
    /// A `Data` signal: tree 0, or the only data stream.
    Data,
    /// A `DataB` signal: a double binary tree's tree 1.
    DataB,
}

impl Class {
    /// The tag in [`text`].
    pub fn tag(self) -> &'static str {
        match self {
            Class::Put => "d",
            Class::Data => "t0",
            Class::DataB => "t1",
        }
    }
}

/// A directed edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Edge {
    /// The rank that sends.
    pub from: u16,
    /// The rank that receives.
    pub to: u16,
    /// What it carries.
    pub class: Class,
}

/// The edges of a trace and the roots of its tree-0 graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph {
    /// Every edge, sorted by (from, to, class), each once.
    pub edges: Vec<Edge>,
    /// The ranks at the top of the tree layout (none without tree-0 edges).
    pub roots: Vec<u16>,
}

/// The edges as `from>to:tag`, space separated, in the order given.
pub fn text<'a>(edges: impl IntoIterator<Item = &'a Edge>) -> String {
    let parts: Vec<String> = edges
        .into_iter()
        .map(|e| format!("{}>{}:{}", e.from, e.to, e.class.tag()))
        .collect();
    parts.join(" ")
}

impl Graph {
    /// Derives the edges from a trace's spans (ranks outside the header's world are left out).
    /// Tables are sized by the distinct edges, never by the world the header claims.
    pub fn derive(header: &Header, spans: &[Span]) -> Graph {
        let world = header.world;
        let layout = header.request.layout();
        let mut signals: BTreeSet<Edge> = BTreeSet::new();
        let mut puts: BTreeSet<(u16, u16)> = BTreeSet::new();
        // First tree-0 signal of each rank that sends one.
        let mut first: BTreeMap<u16, u64> = BTreeMap::new();
        for s in spans {
            if s.rank >= world {
                continue;
            }
            if let Op::Signal { peer, slot, .. } = s.op {
                let class = match layout.key(slot).map(|k| k.kind) {
                    Some(SlotKind::Data) => Class::Data,
                    Some(SlotKind::DataB) => Class::DataB,
                    _ => continue,
                };
                if peer >= world {
                    continue;
                }
                if class == Class::Data {
                    let t = first.entry(s.rank).or_insert(s.begin);
                    *t = (*t).min(s.begin);
                }
                signals.insert(Edge {
                    from: s.rank,
                    to: peer,
                    class,
                });
            } else if !s.op.is_multicast() {
                let fp = s.op.footprint();
                let ranks = |read| {
                    fp.ranges()
                        .iter()
                        .filter(move |r| (r.access == Access::Read) == read)
                        .filter_map(|r| match r.at {
                            At::Rank(l) if l.rank < world => Some(l.rank),
                            _ => None,
                        })
                };
                for a in ranks(true) {
                    for b in ranks(false).filter(|b| *b != a) {
                        puts.insert((a, b));
                    }
                }
            }
        }
        let signalled: BTreeSet<(u16, u16)> = signals.iter().map(|e| (e.from, e.to)).collect();
        let mut all = signals;
        all.extend(
            puts.into_iter()
                .filter(|p| !signalled.contains(p))
                .map(|(from, to)| Edge {
                    from,
                    to,
                    class: Class::Put,
                }),
        );
        let edges: Vec<Edge> = all.into_iter().collect();
        let roots = roots(header, &edges, &first);
        Graph { edges, roots }
    }

    /// The tree layout of `world` ranks: for each rank its horizontal place in `0..1` and its
    /// row (0 at the top), with the number of rows; `None` without tree-0 edges. Children split
    /// their parent's width (an only child sits under its parent); ranks the search from the
    /// roots never reaches take a last row of their own.
    pub fn layout(&self, world: usize) -> Option<(Vec<(f64, usize)>, usize)> {
        if self.roots.is_empty() {
            return None;
        }
        let mut adj: BTreeMap<u16, BTreeSet<u16>> = BTreeMap::new();
        for e in self.edges.iter().filter(|e| e.class == Class::Data) {
            adj.entry(e.from).or_default().insert(e.to);
            adj.entry(e.to).or_default().insert(e.from);
        }
        let mut place: Vec<Option<(f64, f64, usize)>> = vec![None; world];
        let mut queue = VecDeque::new();
        let n = self.roots.len() as f64;
        for (i, &r) in self.roots.iter().enumerate() {
            if let Some(p) = place.get_mut(r as usize) {
                *p = Some((i as f64 / n, (i + 1) as f64 / n, 0));
                queue.push_back(r);
            }
        }
        let mut rows = 1;
        while let Some(r) = queue.pop_front() {
            let Some((lo, hi, depth)) = place[r as usize] else {
                continue;
            };
            let kids: Vec<u16> = adj
                .get(&r)
                .into_iter()
                .flatten()
                .copied()
                .filter(|&k| place.get(k as usize).is_some_and(Option::is_none))
                .collect();
            let k = kids.len() as f64;
            for (i, &c) in kids.iter().enumerate() {
                let w = (hi - lo) / k;
                place[c as usize] = Some((lo + w * i as f64, lo + w * (i + 1) as f64, depth + 1));
                rows = rows.max(depth + 2);
                queue.push_back(c);
            }
        }
        let lost: Vec<usize> = (0..world).filter(|&r| place[r].is_none()).collect();
        let last = rows;
        if !lost.is_empty() {
            rows += 1;
        }
        let mut out: Vec<(f64, usize)> = place
            .iter()
            .map(|p| p.map_or((0.0, last), |(lo, hi, d)| ((lo + hi) / 2.0, d)))
            .collect();
        for (i, &r) in lost.iter().enumerate() {
            out[r].0 = (i as f64 + 0.5) / lost.len() as f64;
        }
        Some((out, rows))
    }
}

/// The roots of the tree-0 graph (see the module documentation).
fn roots(header: &Header, edges: &[Edge], first: &BTreeMap<u16, u64>) -> Vec<u16> {
    let tree: Vec<&Edge> = edges.iter().filter(|e| e.class == Class::Data).collect();
    if tree.is_empty() {
        return Vec::new();
    }
    let named = match header.request.collective {
        Collective::Broadcast { root } | Collective::Reduce { root } => Some(root),
        _ => None,
    };
    if let Some(r) = named.filter(|r| tree.iter().any(|e| e.from == *r || e.to == *r)) {
        return vec![r];
    }
    let into: BTreeSet<u16> = tree.iter().map(|e| e.to).collect();
    let sources: BTreeSet<u16> = tree
        .iter()
        .map(|e| e.from)
        .filter(|r| !into.contains(r))
        .collect();
    if !sources.is_empty() {
        return sources.into_iter().collect();
    }
    // Latest first signal; the lowest rank among equals.
    first
        .iter()
        .max_by_key(|(r, t)| (**t, std::cmp::Reverse(**r)))
        .map(|(r, _)| vec![*r])
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::op::{Buf, Loc, SignalOp};
    use symm_core::sched::{Algorithm, Request, Schedule};
    use symm_core::trace::{self, Event, EventKind, Source};

    fn header(req: Request) -> Header {
        Header {
            world: req.world,
            channels: req.channels,
            request: req,
            source: Source::Host { simulated: true },
            time_unit_ns: 1,
            team: None,
        }
    }

    /// A trace of per-(rank, channel) op lists, each op one time unit long on its stream's own
    /// clock.
    fn trace_of(req: Request, ops: impl Fn(u16, u16) -> Vec<Op>) -> Graph {
        let mut events = Vec::new();
        for rank in 0..req.world {
            for channel in 0..req.channels {
                for (i, op) in ops(rank, channel).into_iter().enumerate() {
                    let ev = |time, kind| Event {
                        time,
                        rank,
                        channel,
                        index: i as u32,
                        kind,
                        op,
                        contents: None,
                    };
                    let t = 2 * i as u64;
                    events.push(ev(t, EventKind::Begin));
                    events.push(ev(t + 1, EventKind::End));
                }
            }
        }
        let bytes = trace::encode(&header(req), &mut events).unwrap();
        let t = crate::model::Trace::decode("t", bytes).unwrap();
        Graph::derive(&t.header, &t.spans)
    }

    /// A trace of the library's own schedule.
    fn schedule(c: Collective, a: Algorithm, world: u16) -> Graph {
        let req = Request::new(c, a, world, 4096, DType::F32, ReduceOp::Sum).with_pipeline(512, 2);
        trace_of(req, |r, ch| Schedule::new(req, r, ch).unwrap().collect())
    }

    fn set(g: &Graph) -> BTreeSet<(u16, u16, Class)> {
        g.edges.iter().map(|e| (e.from, e.to, e.class)).collect()
    }

    fn rows(g: &Graph, world: usize) -> Vec<usize> {
        g.layout(world).unwrap().0.iter().map(|p| p.1).collect()
    }

    /// Both ways along each tree: the reduce goes up, the broadcast comes down. Tree 0 is heap
    /// ordered by rank, tree 1 by the mirrored rank `w - 1 - r` (`core/src/sched/tree.rs`).
    #[test]
    fn a_tree_all_reduce_has_both_trees_both_ways() {
        let w = 8u16;
        let g = schedule(Collective::AllReduce, Algorithm::Tree, w);
        let mut want = BTreeSet::new();
        for pos in 1..w {
            let parent = (pos - 1) / 2;
            for (class, mirror) in [(Class::Data, false), (Class::DataB, true)] {
                let rank = |p: u16| if mirror { w - 1 - p } else { p };
                want.insert((rank(pos), rank(parent), class));
                want.insert((rank(parent), rank(pos), class));
            }
        }
        assert_eq!(set(&g), want);
        assert!(g.edges.windows(2).all(|p| p[0] < p[1]), "sorted, each once");
        // Rank 0 roots tree 0 and signals down only after the whole reduce came up.
        assert_eq!(g.roots, vec![0]);
        assert_eq!(rows(&g, 8), vec![0, 1, 1, 2, 2, 2, 2, 3]);
    }

    /// A binary tree broadcast from root 3 is heap ordered by `(rank - 3) mod w`: none of the
    /// heap-by-rank edges such as 2 -> 6, and no second tree.
    #[test]
    fn a_tree_broadcast_hangs_from_its_root() {
        let w = 8u16;
        let g = schedule(Collective::Broadcast { root: 3 }, Algorithm::Tree, w);
        let rank = |p: u16| (p + 3) % w;
        let want: BTreeSet<_> = (1..w)
            .map(|p| (rank((p - 1) / 2), rank(p), Class::Data))
            .collect();
        assert_eq!(set(&g), want);
        assert!(!set(&g).contains(&(2, 6, Class::Data)));
        assert_eq!(g.roots, vec![3]);
        let (places, n) = g.layout(8).unwrap();
        assert_eq!(n, 4);
        assert_eq!(places[3], (0.5, 0));
        // Rank 4 (position 1) is the left child, under the left half; 2 (position 7) is alone at
        // the bottom, under its parent 6 (position 3).
        assert_eq!(places[4].1, 1);
        assert!(places[4].0 < places[5].0);
        assert_eq!(places[2], (places[6].0, 3));
    }

    /// Lab 5's double binary tree broadcast at world 8 from root 0, as its README draws it:
    /// tree 0: 0 -> 1; 1 -> 2, 3; 2 -> 4, 5; 3 -> 6, 7; tree 1: 0 -> 7; 7 -> 6, 5; 6 -> 4, 3;
    /// 5 -> 2, 1. Each write is a copy then a `Data` / `DataB` signal; every rank first sends
    /// `Ready` to its parents (control: no edge). A signal to a rank outside the world is left
    /// out.
    #[test]
    fn a_double_binary_tree_broadcast_has_two_classes() {
        let t0: &[(u16, u16)] = &[(0, 1), (1, 2), (1, 3), (2, 4), (2, 5), (3, 6), (3, 7)];
        let t1: &[(u16, u16)] = &[(0, 7), (7, 6), (7, 5), (6, 4), (6, 3), (5, 2), (5, 1)];
        let req = Request::new(
            Collective::Broadcast { root: 0 },
            Algorithm::Tree,
            8,
            4096,
            DType::F32,
            ReduceOp::Sum,
        );
        let layout = req.layout();
        let signal = |me: u16, peer: u16, kind| Op::Signal {
            peer,
            slot: layout.index_unchecked(0, 0, kind, me),
            op: SignalOp::Add,
            value: 1,
        };
        let g = trace_of(req, |me, _| {
            let mut ops = Vec::new();
            for (tree, kind) in [(t0, SlotKind::Data), (t1, SlotKind::DataB)] {
                for &(p, c) in tree.iter().filter(|e| e.1 == me) {
                    ops.push(signal(c, p, SlotKind::Ready));
                }
                for &(_, c) in tree.iter().filter(|e| e.0 == me) {
                    let at = |r| Loc::new(r, Buf::Output, 0);
                    ops.push(Op::Copy {
                        src: at(me),
                        dst: at(c),
                        bytes: 64,
                    });
                    ops.push(signal(me, c, kind));
                }
            }
            if me == 0 {
                ops.push(signal(0, 9, SlotKind::Data));
            }
            ops
        });
        let want: BTreeSet<_> = t0
            .iter()
            .map(|&(a, b)| (a, b, Class::Data))
            .chain(t1.iter().map(|&(a, b)| (a, b, Class::DataB)))
            .collect();
        assert_eq!(set(&g), want);
        assert_eq!(g.roots, vec![0]);
        assert_eq!(rows(&g, 8), vec![0, 1, 2, 2, 3, 3, 3, 3]);
        assert!(text(&g.edges).starts_with("0>1:t0 0>7:t1 1>2:t0 1>3:t0 2>4:t0"));
    }

    /// A ring's data goes one way round; its credits come back (control, no edge).
    #[test]
    fn a_ring_is_a_ring() {
        let g = schedule(Collective::AllReduce, Algorithm::Ring, 4);
        let want: BTreeSet<_> = (0..4).map(|r| (r, (r + 1) % 4, Class::Data)).collect();
        assert_eq!(set(&g), want);
        assert!(g.layout(4).is_some());
    }

    /// The one-shot reads every peer's input with no data signal: data edges between every pair,
    /// and no tree to lay out.
    #[test]
    fn reads_of_peers_are_data_edges() {
        let g = schedule(Collective::AllReduce, Algorithm::OneShot, 4);
        let want: BTreeSet<_> = (0..4u16)
            .flat_map(|a| {
                (0..4u16)
                    .filter(move |b| *b != a)
                    .map(move |b| (a, b, Class::Put))
            })
            .collect();
        assert_eq!(set(&g), want);
        assert!(g.roots.is_empty() && g.layout(4).is_none());
    }

    #[test]
    fn tags_sort_as_classes() {
        let all = [Class::Put, Class::Data, Class::DataB];
        for a in all {
            for b in all {
                assert_eq!(a.cmp(&b), a.tag().cmp(b.tag()), "{a:?} {b:?}");
            }
        }
        let e = |from, to, class| Edge { from, to, class };
        let v = [
            e(0, 1, Class::Data),
            e(0, 7, Class::DataB),
            e(2, 3, Class::Put),
        ];
        assert_eq!(text(&v), "0>1:t0 0>7:t1 2>3:d");
        assert_eq!(text(&[]), "");
    }
}
