//! The direct algorithms' rows of the algorithm table, and the cost model that prices them.

use super::FUSED_FANIN;
use crate::cost::{Path, Shape};
use crate::sched::table::{no_scratch, no_streams, one_slot, serves, Desc};
use crate::sched::{Collective, Request};

/// Every collective a direct-family algorithm does not serve, priced as a serial exchange.
macro_rules! unserved {
    () => {
        Collective::ReduceScatter
            | Collective::AllGather
            | Collective::Broadcast { .. }
            | Collective::Reduce { .. }
            | Collective::Scatter { .. }
            | Collective::Gather { .. }
            | Collective::AllToAll
            | Collective::AllToAllV
            | Collective::SendRecv { .. }
    };
}

// The direct costs follow the simulator's rules for one phase after another (`Ready` signals,
// their waits, the body, the completion signals, their waits):
//
// * `s` signals to distinct peers cost `s` issues; the last lands a hop after it was issued, so
//   the phase of waits for them ends `s` issues and one hop after it began (the peers issue
//   theirs in the same order and at the same time).
// * A put is posted: `p - 1` puts of `b` bytes to distinct peers, each followed by its `Data`
//   signal, keep the egress port busy `(p-1) b` and the stream `p - 1` issues more; the receivers
//   see the last one a hop later. At each step every rank writes to a different peer, so no
//   ingress port is shared.
// * A copy into the rank's own buffers uses its memory port.

/// The combining body of a direct reduction of `b` bytes of every rank's input, as every rank
/// (`all`) or only the root runs it. Up to [`FUSED_FANIN`] ranks it is one k-way read: the
/// reader's ingress carries `(p-1) b` (every source's egress too, when every rank reads), then
/// one hop for the loads to come back. Beyond, a chain of `p - 1` binary reads, a hop each;
/// when every rank runs the chain they all read the same source at each step, so the first
/// source's egress serialises the `p - 1` readers and the last of them reads its remaining
/// `p - 2` sources after that: `2p - 3` transfers of `b`.
fn combine(s: &Shape, b: f64, all: bool) -> Path {
    let p = s.pf;
    if s.p as usize <= FUSED_FANIN {
        Path::new(1.0, (p - 1.0) * b)
    } else if all {
        Path::new(p - 1.0, (2.0 * p - 3.0) * b)
    } else {
        Path::new(p - 1.0, (p - 1.0) * b)
    }
}

/// `k` signals, then the waits for the peers' `k`: `k` issues and the last one's hop.
fn handshake(k: f64) -> Path {
    Path::issues(k) + Path::hops(1.0)
}

/// Own copy, then `p - 1` puts of `b`, each with its `Data` signal, and the last one's hop.
fn sends(s: &Shape, b: f64, own: bool) -> Path {
    let copy = if own { Path::mem(b) } else { Path::default() };
    copy + (Path::link(b) + Path::issues(1.0)) * (s.pf - 1.0) + Path::hops(1.0)
}

fn one_shot_cost(r: &Request, s: &Shape) -> Path {
    // Ready to every peer, every rank reduces the whole buffer, Done to every peer.
    let q = s.pf - 1.0;
    match r.collective {
        Collective::AllReduce => handshake(q) + combine(s, s.n as f64, true) + handshake(q),
        unserved!() => s.serial(),
    }
}

fn two_shot_cost(r: &Request, s: &Shape) -> Path {
    // Ready to every peer, a reduce of the rank's block, then its puts (with `Data`).
    let (q, b) = (s.pf - 1.0, s.block() as f64);
    match r.collective {
        Collective::AllReduce => handshake(q) + combine(s, b, true) + sends(s, b, false),
        unserved!() => s.serial(),
    }
}

fn multicast_cost(r: &Request, s: &Shape) -> Path {
    // A switch op is its transfer through the rank's switch port, then one hop.
    let q = s.pf - 1.0;
    let mc = |b: f64| Path::mc(b) + Path::hops(1.0);
    match r.collective {
        Collective::AllReduce => {
            let b = s.block() as f64;
            handshake(q) + mc(b) + mc(b) + handshake(q)
        }
        Collective::ReduceScatter | Collective::AllGather => {
            handshake(q) + mc(s.n as f64) + handshake(q)
        }
        // Ready from the leaves, the root's store, Done to each leaf.
        Collective::Broadcast { .. } => handshake(1.0) + mc(s.n as f64) + handshake(q),
        Collective::Reduce { .. }
        | Collective::Scatter { .. }
        | Collective::Gather { .. }
        | Collective::AllToAll
        | Collective::AllToAllV
        | Collective::SendRecv { .. } => s.serial(),
    }
}

fn direct_cost(r: &Request, s: &Shape) -> Path {
    let (q, n) = (s.pf - 1.0, s.n as f64);
    match r.collective {
        // Every rank reduces its block of every input.
        Collective::ReduceScatter => handshake(q) + combine(s, n, true) + handshake(q),
        Collective::AllGather => handshake(q) + sends(s, n, true),
        // One Ready to the root; the root writes every leaf.
        Collective::Broadcast { .. } | Collective::Scatter { .. } => {
            handshake(1.0) + sends(s, n, true)
        }
        // The root alone reads every input, then Done to every leaf.
        Collective::Reduce { .. } => handshake(1.0) + combine(s, n, false) + handshake(q),
        // The root's Ready reaches leaf `i` after `i` issues; the leaves' puts share the root's
        // ingress: the last lands after the later of the last Ready plus one put and the
        // first Ready plus `p - 1` puts, then its `Data` signal.
        Collective::Gather { .. } => {
            let last = s.max(
                Path::issues(q) + Path::link(n),
                Path::issues(1.0) + Path::link(q * n),
            );
            Path::hops(1.0) + last + handshake(1.0)
        }
        Collective::SendRecv { .. } => handshake(1.0) + Path::link(n) + handshake(1.0),
        Collective::AllReduce | Collective::AllToAll | Collective::AllToAllV => s.serial(),
    }
}

fn pairwise_cost(r: &Request, s: &Shape) -> Path {
    match r.collective {
        // As the direct all-gather, block `q` of the input to peer `q`.
        Collective::AllToAll | Collective::AllToAllV => {
            handshake(s.pf - 1.0) + sends(s, s.n as f64, true)
        }
        Collective::AllReduce
        | Collective::ReduceScatter
        | Collective::AllGather
        | Collective::Broadcast { .. }
        | Collective::Reduce { .. }
        | Collective::Scatter { .. }
        | Collective::Gather { .. }
        | Collective::SendRecv { .. } => s.serial(),
    }
}

/// One-shot all-reduce.
pub(crate) const ONE_SHOT: Desc = Desc {
    serves: serves::ALL_REDUCE,
    streams: no_streams,
    min_slots: one_slot,
    cost: one_shot_cost,
    scratch: no_scratch,
    max_bytes: crate::sched::table::unbounded,
    in_place: 0,
    own: [0, serves::ALL_REDUCE],
    combines: crate::sched::Combines::RankOrder,
};

/// Two-shot all-reduce.
pub(crate) const TWO_SHOT: Desc = Desc {
    serves: serves::ALL_REDUCE,
    streams: no_streams,
    min_slots: one_slot,
    cost: two_shot_cost,
    scratch: no_scratch,
    max_bytes: crate::sched::table::unbounded,
    in_place: serves::ALL_REDUCE,
    own: [0, 0],
    combines: crate::sched::Combines::RankOrder,
};

/// The host model of NVLink multicast (never launched on shared GPUs).
pub(crate) const MULTICAST: Desc = Desc {
    serves: serves::ALL_REDUCE | serves::REDUCE_SCATTER | serves::ALL_GATHER | serves::BROADCAST,
    streams: no_streams,
    min_slots: one_slot,
    cost: multicast_cost,
    scratch: no_scratch,
    max_bytes: crate::sched::table::unbounded,
    in_place: serves::ALL_REDUCE,
    own: [serves::ALL_GATHER | serves::BROADCAST, serves::REDUCE_SCATTER],
    combines: crate::sched::Combines::Unordered,
};

/// Direct reads and writes of the peers' buffers.
pub(crate) const DIRECT: Desc = Desc {
    serves: serves::REDUCE_SCATTER
        | serves::ALL_GATHER
        | serves::BROADCAST
        | serves::REDUCE
        | serves::SCATTER
        | serves::GATHER
        | serves::SEND_RECV,
    streams: no_streams,
    min_slots: one_slot,
    cost: direct_cost,
    scratch: no_scratch,
    max_bytes: crate::sched::table::unbounded,
    in_place: 0,
    own: [serves::ALL_GATHER | serves::BROADCAST | serves::SCATTER | serves::GATHER | serves::SEND_RECV, serves::REDUCE_SCATTER | serves::REDUCE],
    combines: crate::sched::Combines::RankOrder,
};

/// Pairwise all-to-all.
pub(crate) const PAIRWISE: Desc = Desc {
    serves: serves::ALL_TO_ALL | serves::ALL_TO_ALLV,
    streams: no_streams,
    min_slots: one_slot,
    cost: pairwise_cost,
    scratch: no_scratch,
    max_bytes: crate::sched::table::unbounded,
    in_place: 0,
    own: [serves::ALL_TO_ALL, 0],
    combines: crate::sched::Combines::Unordered,
};
