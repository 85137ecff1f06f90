//! Trees and chains: double binary tree all-reduce, binary tree reduce and broadcast, and the
//! pipelined chain broadcast (a "ring" broadcast is a chain from the root).
//!
//! Ranks are placed at positions of a tree. A binary tree is heap ordered: position p has parent
//! (p-1)/2 and children 2p+1, 2p+2. A chain has parent p-1 and child p+1. Rooted collectives use
//! position `(rank - root) mod world`. The all-reduce uses two binary trees over the two halves of
//! each channel's data: tree 0 at position `rank`, tree 1 at position `world-1-rank` (the mirror),
//! so a rank that is interior in one tree is (almost always) a leaf in the other. A channel runs
//! one tree's chunks, then the other's (odd channels in the other order, so two channels keep
//! both trees busy): interleaved in one stream, the trees would wait on each other chunk by chunk.
//!
//! * Up (reduce) pass, chunk by chunk: a node waits for each child's partial in its scratch,
//!   combines them with its input (in place in the first child's slot), and writes the result
//!   into its parent's scratch (root: its output), then returns credits to its children.
//! * Down (broadcast) pass: the root copies its result (broadcast: its input) into each child's
//!   output; every other node waits for its parent and forwards to its children.
//!
//! Scratch: one stream per (tree, child) with `slots` slots; credits as in the ring.

use super::part::{chunks, part, Part};
use super::table::{no_scratch, no_streams, one_slot, serves, Desc};
use super::{Batch, Collective, Ctx, Program, Request};
use crate::cost::{self, div_ceil, Path};
use crate::op::Buf;
use crate::signal::SlotKind::{self, Credit, CreditB, Data, DataB, Ready};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Binary,
    Chain,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Tree {
    shape: Shape,
    trees: u64,
    root: u16,
    up: bool,
    down: bool,
    part: Part,
    k: u64,
}

impl Tree {
    pub fn new(ctx: &Ctx) -> Tree {
        let r = &ctx.req;
        let (trees, root, up, down) = match r.collective {
            Collective::AllReduce => (2, 0, true, true),
            Collective::Reduce { root } => (1, root, true, false),
            Collective::Broadcast { root } => (1, root, false, true),
            _ => (1, 0, false, false),
        };
        let shape = if r.algorithm == super::Algorithm::Ring {
            Shape::Chain
        } else {
            Shape::Binary
        };
        let part = part(r.elems(), ctx.channel as u64, r.channels as u64);
        let per_tree = part.len.div_ceil(trees);
        Tree {
            shape,
            trees,
            root,
            up,
            down,
            part,
            k: chunks(per_tree, r.chunk_elems()),
        }
    }

    fn pos(&self, ctx: &Ctx, t: u64, rank: u16) -> u64 {
        let w = ctx.world() as u64;
        if self.trees == 2 {
            if t == 0 {
                rank as u64
            } else {
                w - 1 - rank as u64
            }
        } else {
            (rank as u64 + w - self.root as u64) % w
        }
    }

    fn rank_at(&self, ctx: &Ctx, t: u64, pos: u64) -> u16 {
        let w = ctx.world() as u64;
        (if self.trees == 2 {
            if t == 0 {
                pos
            } else {
                w - 1 - pos
            }
        } else {
            (pos + self.root as u64) % w
        }) as u16
    }

    fn parent(&self, ctx: &Ctx, t: u64) -> Option<u16> {
        let p = self.pos(ctx, t, ctx.rank);
        if p == 0 {
            return None;
        }
        let q = match self.shape {
            Shape::Binary => (p - 1) / 2,
            Shape::Chain => p - 1,
        };
        Some(self.rank_at(ctx, t, q))
    }

    /// Child `i` (0 or 1) of this rank in tree `t`.
    fn child(&self, ctx: &Ctx, t: u64, i: u64) -> Option<u16> {
        let w = ctx.world() as u64;
        let p = self.pos(ctx, t, ctx.rank);
        let q = match (self.shape, i) {
            (Shape::Binary, _) => 2 * p + 1 + i,
            (Shape::Chain, 0) => p + 1,
            (Shape::Chain, _) => return None,
        };
        (q < w).then(|| self.rank_at(ctx, t, q))
    }

    /// Which child this rank is of its parent in tree `t`.
    fn child_index(&self, ctx: &Ctx, t: u64) -> u64 {
        let p = self.pos(ctx, t, ctx.rank);
        match self.shape {
            Shape::Binary => (p + 1) % 2,
            Shape::Chain => 0,
        }
    }

    fn kinds(t: u64) -> (SlotKind, SlotKind) {
        if t == 0 {
            (Data, Credit)
        } else {
            (DataB, CreditB)
        }
    }

    fn neighbour(&self, ctx: &Ctx, t: u64, i: u64) -> Option<u16> {
        match i {
            0 => self.parent(ctx, t),
            _ => self.child(ctx, t, i - 1),
        }
    }

    /// Scratch element offset of (tree, child index, chunk) on the receiving rank.
    fn scratch(&self, ctx: &Ctx, t: u64, ci: u64, k: u64) -> u64 {
        ctx.scratch(self.trees * 2, t * 2 + ci, k % ctx.req.slot_count())
    }

    fn chunk(&self, t: u64, k: u64) -> Part {
        self.part.sub(t, self.trees).sub(k, self.k)
    }

    /// (tree, chunk) of unit `u` of a pass: one tree's chunks, then the other's. Interleaving
    /// the two trees chunk by chunk in one stream couples them (a rank's next chunk in one tree
    /// waits behind its previous chunk in the other, whose subtree is deep where this one is
    /// shallow), which serialises every chunk over both trees' depths; one tree after the other,
    /// each pipelines on its own. Odd channels take the trees in the other order, so with two or
    /// more channels both trees are busy at once.
    fn tree_chunk(&self, ctx: &Ctx, u: u64) -> (u64, u64) {
        let k = self.k.max(1);
        let (i, chunk) = (u / k, u % k);
        let t = if ctx.channel.is_multiple_of(2) {
            i
        } else {
            self.trees.saturating_sub(1 + i)
        };
        (t, chunk)
    }

    fn emit_up(&self, ctx: &Ctx, t: u64, k: u64, out: &mut Batch) {
        let me = ctx.rank;
        let (data, credit) = Self::kinds(t);
        let c = self.chunk(t, k);
        let slots = ctx.req.slot_count();
        let kids = [self.child(ctx, t, 0), self.child(ctx, t, 1)];
        for kid in kids.iter().flatten() {
            let _ = out.push(ctx.wait(*kid, data, 1));
        }
        let parent = self.parent(ctx, t);
        let dst = match parent {
            Some(pa) => {
                if k >= slots {
                    let _ = out.push(ctx.wait(pa, credit, 1));
                }
                ctx.loc(
                    pa,
                    Buf::Scratch,
                    self.scratch(ctx, t, self.child_index(ctx, t), k),
                )
            }
            None => ctx.loc(me, Buf::Output, c.start),
        };
        let root = parent.is_none();
        let input = ctx.loc(me, Buf::Input, c.start);
        let s0 = ctx.loc(me, Buf::Scratch, self.scratch(ctx, t, 0, k));
        let s1 = ctx.loc(me, Buf::Scratch, self.scratch(ctx, t, 1, k));
        let op = match kids {
            [None, _] => ctx.copy(input, dst, c.len),
            [Some(_), None] => ctx.reduce(input, s0, dst, c.len, root),
            [Some(_), Some(_)] => {
                let _ = out.push(ctx.reduce(input, s0, s0, c.len, false));
                ctx.reduce(s0, s1, dst, c.len, root)
            }
        };
        let _ = out.push(op);
        if k + slots < self.k {
            for kid in kids.iter().flatten() {
                let _ = out.push(ctx.signal(*kid, credit));
            }
        }
        if let Some(pa) = parent {
            let _ = out.push(ctx.signal(pa, data));
        }
    }

    fn emit_down(&self, ctx: &Ctx, t: u64, k: u64, out: &mut Batch) {
        let me = ctx.rank;
        let (data, _) = Self::kinds(t);
        let c = self.chunk(t, k);
        let own = ctx.loc(me, Buf::Output, c.start);
        let src = match self.parent(ctx, t) {
            Some(pa) => {
                let _ = out.push(ctx.wait(pa, data, 1));
                own
            }
            None if !self.up => {
                let input = ctx.loc(me, Buf::Input, c.start);
                let _ = out.push(ctx.copy(input, own, c.len));
                input
            }
            None => own,
        };
        for i in 0..2 {
            if let Some(kid) = self.child(ctx, t, i) {
                let _ = out.push(ctx.copy(src, ctx.loc(kid, Buf::Output, c.start), c.len));
                let _ = out.push(ctx.signal(kid, data));
            }
        }
    }
}

impl Program for Tree {
    const PHASES: u8 = 4;

    fn new(ctx: &Ctx) -> Self {
        Tree::new(ctx)
    }

    fn units(&self, _ctx: &Ctx, p: u8) -> u64 {
        match p {
            0 | 1 => self.trees * 3,
            2 if self.up => self.trees * self.k,
            3 if self.down => self.trees * self.k,
            _ => 0,
        }
    }

    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch) {
        match p {
            0 | 1 => {
                let (t, i) = (u / 3, u % 3);
                if let Some(n) = self.neighbour(ctx, t, i) {
                    let op = if p == 0 {
                        ctx.signal(n, Ready)
                    } else {
                        ctx.wait(n, Ready, 1)
                    };
                    let _ = out.push(op);
                }
            }
            2 => {
                let (t, k) = self.tree_chunk(ctx, u);
                self.emit_up(ctx, t, k, out)
            }
            _ => {
                let (t, k) = self.tree_chunk(ctx, u);
                self.emit_down(ctx, t, k, out)
            }
        }
    }
}

fn streams(r: &Request) -> u64 {
    match r.collective {
        Collective::AllReduce => 4,
        Collective::Reduce { .. } => 2,
        _ => no_streams(r),
    }
}

/// The binary tree's passes as the simulator runs them, over `n` bytes in `k` chunks of `c`
/// (`k` counts every tree's chunks: a channel runs one tree's, then the other's).
///
/// **Down** (broadcast): the root copies a chunk into its own output (unless the up pass left
/// it there) and puts it to each of its (up to two) children with a signal; an inner node waits
/// and does the same without the copy, so the root sets the pace: per chunk its copy, a put and
/// an issue per child. No credits: outputs are written once. The last chunk then goes down the
/// remaining `d - 1` levels, two puts, two issues and a hop each (the deepest node is a second
/// child), landing a hop after it left the root.
fn down(s: &cost::Shape, n: f64, k: f64, c: f64, copy: bool) -> Path {
    let kids = if s.p == 2 { 1.0 } else { 2.0 };
    let own = if copy { Path::mem(n) } else { Path::default() };
    let level = (Path::link(c) + Path::issues(1.0)) * 2.0 + Path::hops(1.0);
    own + (Path::link(n) + Path::issues(k)) * kids
        + Path::hops(1.0)
        + level * (s.d - 1.0).max(0.0)
}

/// **Up** (reduce): a node waits for its children's partials, combines them with its input
/// (locally, or straight into its parent's scratch) and returns credits. Puts into one node
/// share its ingress. The pace is the slower of the busiest port (a node with two children
/// receives `2c` a chunk) and the slot loop: a child writes slot `j % slots` again only after
/// the credit of chunk `j - slots`, which costs the children's puts into the node's ingress,
/// the data signal's issue and hop, the node's passes and credits, and the credit's hop. The
/// loop of the root (its passes are local) and of an inner node (its last pass is the put to
/// its parent) are both candidates. The first chunk climbs `d` levels before the pace sets
/// in: a put, an issue and a hop each.
fn up(s: &cost::Shape, k: f64, c: f64) -> Path {
    let p = s.p;
    let (link, mem, iss, hop) = (Path::link, Path::mem, Path::issues, Path::hops);
    let root_kids = if p == 2 { 1.0 } else { 2.0 };
    let root = link(root_kids * c)
        + iss(1.0 + root_kids)
        + hop(2.0)
        + mem(root_kids * c);
    let inner_kids = if p >= 5 { 2.0 } else { 1.0 };
    let inner = link((inner_kids + 1.0) * c)
        + iss(1.0 + inner_kids)
        + hop(2.0)
        + mem((inner_kids - 1.0) * c);
    let round = if p >= 4 { s.max(root, inner) } else { root };
    let stage = link(root_kids * c) + iss(1.0);
    let fill = (link(c) + iss(1.0) + hop(1.0)) * s.d + mem(c);
    fill + s.steady((k - 1.0).max(0.0), stage, round)
}

fn cost(r: &Request, s: &cost::Shape) -> Path {
    // Every run begins with a `Ready` to each neighbour in the tree and the waits for theirs.
    let ready = Path::issues(3.0) + Path::hops(1.0);
    let n = s.n as f64;
    match r.collective {
        Collective::AllReduce => {
            // Both trees' up passes, then both trees' down passes, on halves of the data. The
            // second tree's up pass fills again: its deepest leaf is the first tree's root,
            // which starts it only once the first tree's up pass reached it. The down passes
            // stream on at the roots' pace.
            let half = div_ceil(s.n, 2 * s.e) * s.e;
            let (k, c) = s.pipe(half);
            ready + up(s, k, c) * 2.0 + down(s, n, 2.0 * k, c, false)
        }
        Collective::Broadcast { .. } => {
            let (k, c) = s.pipe(s.n);
            ready + down(s, n, k, c, true)
        }
        Collective::Reduce { .. } => {
            let (k, c) = s.pipe(s.n);
            ready + up(s, k, c)
        }
        Collective::ReduceScatter
        | Collective::AllGather
        | Collective::Scatter { .. }
        | Collective::Gather { .. }
        | Collective::AllToAll
        | Collective::AllToAllV
        | Collective::SendRecv { .. } => s.serial(),
    }
}

/// Tree: all-reduce (double binary tree), reduce and broadcast (binary tree).
pub(crate) const DESC: Desc = Desc {
    serves: serves::ALL_REDUCE | serves::REDUCE | serves::BROADCAST,
    streams,
    min_slots: one_slot,
    cost,
    scratch: no_scratch,
    max_bytes: super::table::unbounded,
    in_place: 0,
    own: [serves::ALL_REDUCE | serves::REDUCE | serves::BROADCAST, serves::REDUCE],
    combines: super::Combines::Unordered,
};
