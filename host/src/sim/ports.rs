//! The simulator's machine: what each op costs, and the ports that bytes share.
//!
//! Every rank has four ports, each a timeline of busy intervals in virtual nanoseconds:
//!
//! * **egress** and **ingress**: its link, one per direction, at `beta` bytes per microsecond;
//! * **memory**: its own memory for passes that never leave the rank, at
//!   [`Link::memory_bytes_per_us`];
//! * **switch**: its share of the multicast switch, at `multicast_bytes_per_us`.
//!
//! An op executed by rank `me` moves its bytes *through* `me`, as a GPU's load/store copy does:
//! each source on another rank `s` sends the op's bytes from `s`'s egress into `me`'s ingress,
//! and a destination on another rank `d` receives them from `me`'s egress into `d`'s ingress.
//! An op whose sources and destination are all on `me` loads `me`'s memory port with its output
//! bytes. (Local reads of an op that also crosses ranks ride on the faster memory and are not
//! charged.) Each port then serves its share of the op on its own: it takes the earliest gap of
//! its timeline, at or after the op's begin, long enough for its bytes at its bandwidth. The
//! op's transfer ends when the last of its ports is done. So every port carries at most its
//! bandwidth: the channels of a rank (and its low-latency puts) that move bytes at the same
//! time *serialise* on the ports they share, in the order the simulator runs them, later ones
//! filling the gaps earlier ones left. That order is fixed, so the result is deterministic.
//!
//! Latency (`alpha`, one hop) is paid where a GPU pays it:
//!
//! * a **read** (some source on another rank) ends on the executing stream's clock one hop
//!   after its transfer: the last loads must come back;
//! * a **write** to another rank is posted: the stream moves on when its transfer ends, and the
//!   bytes *land* one hop later;
//! * a **signal** costs its sender only [`Link::issue_us`]; it lands on the peer one hop after
//!   it was issued, and a wait on it ends no earlier than that;
//! * a multicast op is a round trip through the switch: its transfer, then one hop.
//!
//! On a GPU each channel is one thread block, and a block alone moves data at a bounded rate
//! (its loads in flight over their latency), so one channel cannot use a whole port. The
//! [`Block`] model adds that: a data op starts [`Block::op_us`] after it is ready (the block's
//! barrier and dispatch), and its transfer lasts at least its block bytes (what the block loads:
//! the op's bytes once per source, or the bytes it stores when it loads none) over
//! [`Block::bytes_per_us`] ([`Block::reduce_bytes_per_us`] for a reduction), besides what the
//! ports allow. The ports are still charged only
//! their bytes at their bandwidth, so slow blocks leave room on a port for other channels.

use std::collections::BTreeMap;

use symm_core::cost::Link;
use symm_core::ll::Format;
use symm_core::op::{Access, At, Op};

/// What one channel (a GPU thread block) can do on its own, besides sharing its rank's ports.
///
/// The default ([`Block::UNLIMITED`]) adds nothing: the simulator is then the port model the
/// closed-form costs of `symm_core::cost` are derived from. [`Block::HOPPER`] is what a Hopper
/// block does; [`fit_link`](super::fit_link) fits both numbers to measured times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Block {
    /// The most bytes per microsecond one block loads in a copy (or stores, for an op that
    /// loads nothing); infinite for no limit.
    pub bytes_per_us: f64,
    /// The same for a reduction (its loads from every source, converted, added and stored):
    /// slower than a copy's.
    pub reduce_bytes_per_us: f64,
    /// Fixed cost of every data op on its block (a barrier and the dispatch), microseconds.
    pub op_us: f64,
}

impl Block {
    /// No per-block limit and no per-op cost: only the ports bound a channel.
    pub const UNLIMITED: Block = Block {
        bytes_per_us: f64::INFINITY,
        reduce_bytes_per_us: f64::INFINITY,
        op_us: 0.0,
    };

    /// One Hopper (H100/H200) thread block: about 100 GB/s of copy through its loads in
    /// flight, half that in a reduction, and 0.4 us per op for its barrier and dispatch. Ranks
    /// sharing one GPU under MPS see much less per block (tens of GB/s: the fit of
    /// `docs/perf/sim-fit-shared-w2.md` in `tests/tests/sim_fit.rs`).
    pub const HOPPER: Block = Block {
        bytes_per_us: 100_000.0,
        reduce_bytes_per_us: 50_000.0,
        op_us: 0.4,
    };

    /// The least time, in ns, a block takes to load `bytes` in a copy (or a reduction).
    fn min_ns(&self, bytes: u64, reduce: bool) -> u64 {
        let bw = if reduce {
            self.reduce_bytes_per_us
        } else {
            self.bytes_per_us
        };
        if bw.is_finite() && bw > 0.0 {
            ns(bytes as f64 / bw)
        } else {
            0
        }
    }
}

impl Default for Block {
    fn default() -> Self {
        Block::UNLIMITED
    }
}

/// Microseconds (of a rate or latency) to whole virtual nanoseconds; 0 for anything not
/// finite or not positive.
pub(super) fn ns(us: f64) -> u64 {
    if us.is_finite() && us > 0.0 {
        (us * 1000.0).round() as u64
    } else {
        0
    }
}

/// One port's busy intervals: start -> end, disjoint, adjacent ones merged.
#[derive(Clone, Debug, Default)]
struct Timeline {
    busy: BTreeMap<u64, u64>,
}

impl Timeline {
    /// Reserves the earliest free interval of `len` ns starting at or after `at`; returns its
    /// end.
    fn reserve(&mut self, at: u64, len: u64) -> u64 {
        if len == 0 {
            return at;
        }
        let mut start = at;
        if let Some((_, &end)) = self.busy.range(..=start).next_back() {
            start = start.max(end);
        }
        // Intervals are merged, so the next one after a skip starts strictly later.
        while let Some((_, &end)) = self
            .busy
            .range(start..)
            .next()
            .filter(|(&s, _)| s < start.saturating_add(len))
        {
            start = end;
        }
        let mut lo = start;
        let mut hi = start.saturating_add(len);
        if let Some((&s, &e)) = self.busy.range(..start).next_back() {
            if e == start {
                lo = s;
            }
        }
        if let Some(e) = self.busy.remove(&hi) {
            hi = e;
        }
        self.busy.insert(lo, hi);
        start.saturating_add(len)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Egress,
    Ingress,
    Memory,
    Switch,
}

/// When an op ends on its stream's clock, and when its writes (or its signal) land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Timing {
    /// The executing stream's clock after the op.
    pub end: u64,
    /// When its effect is visible to the destination rank (its bytes, its signal).
    pub landed: u64,
}

/// Every rank's ports.
#[derive(Clone, Debug)]
pub(super) struct Ports {
    link: Link,
    block: Block,
    /// `world * 4` timelines, rank-major.
    lines: Vec<Timeline>,
}

impl Ports {
    pub(super) fn new(world: u16, link: Link, block: Block) -> Ports {
        Ports {
            link,
            block,
            lines: vec![Timeline::default(); world as usize * 4],
        }
    }

    fn bandwidth(&self, kind: Kind) -> f64 {
        match kind {
            Kind::Egress | Kind::Ingress => self.link.beta_bytes_per_us,
            Kind::Memory => self.link.memory_bytes_per_us(),
            Kind::Switch => self.link.multicast_bytes_per_us,
        }
        .max(1e-9)
    }

    /// Serves each (port, bytes) load from `begin`; the time the last one is done. A rank
    /// outside the world (the fabric refused the op before it got here) loads nothing.
    fn serve(&mut self, begin: u64, loads: &[(u16, Kind, u64)]) -> u64 {
        let mut done = begin;
        for &(rank, kind, bytes) in loads {
            let len = ns(bytes as f64 / self.bandwidth(kind));
            let i = rank as usize * 4 + kind as usize;
            if let Some(t) = self.lines.get_mut(i) {
                done = done.max(t.reserve(begin, len));
            }
        }
        done
    }

    /// Charges `op`, executed by `me` from `begin`, to the ports; waits are the caller's.
    ///
    /// The op's footprint says what moves: each plain range it reads on another rank crosses
    /// that rank's egress and this rank's ingress, its write to another rank this rank's egress
    /// and that rank's ingress, and an op that does neither loads this rank's memory. Lines an
    /// op reads are its own memory once they are there (their arrival is the wait).
    pub(super) fn run(&mut self, op: &Op, me: u16, begin: u64) -> Timing {
        let hop = ns(self.link.alpha_us);
        if op.is_multicast() {
            let begin = begin + ns(self.block.op_us);
            let done = self.serve(begin, &[(me, Kind::Switch, op.bytes())]);
            let done = done.max(begin + self.block.min_ns(op.bytes(), op.reduces())) + hop;
            return Timing {
                end: done,
                landed: done,
            };
        }
        let fp = op.footprint();
        let Some(dst) = fp.writes().next().copied() else {
            // A signal (it writes a slot) or a wait.
            if fp.slot.is_some_and(|s| s.access == Access::Write) {
                let end = begin + ns(self.link.issue_us());
                return Timing {
                    end,
                    landed: end + hop,
                };
            }
            return Timing {
                end: begin,
                landed: begin,
            };
        };
        let bytes = dst.bytes;
        let mut loads: Vec<(u16, Kind, u64)> = Vec::new();
        let mut add = |rank: u16, kind: Kind, b: u64| match loads
            .iter_mut()
            .find(|l| l.0 == rank && l.1 == kind)
        {
            Some(l) => l.2 = l.2.saturating_add(b),
            None => loads.push((rank, kind, b)),
        };
        let mut read = false;
        let mut loaded = 0u64;
        for r in fp.reads().filter(|r| r.lines.is_none()) {
            let At::Rank(src) = r.at else { continue };
            loaded = loaded.saturating_add(r.bytes);
            if src.rank == me {
                continue;
            }
            read = true;
            add(src.rank, Kind::Egress, r.bytes);
            add(me, Kind::Ingress, r.bytes);
        }
        let dst_rank = match dst.at {
            At::Rank(l) => l.rank,
            At::Every(_) => me,
        };
        let write = dst_rank != me;
        if write {
            add(me, Kind::Egress, bytes);
            add(dst_rank, Kind::Ingress, bytes);
        }
        if !read && !write {
            add(me, Kind::Memory, bytes);
        }
        let block = loaded.max(bytes);
        let begin = begin + ns(self.block.op_us);
        let done = self
            .serve(begin, &loads)
            .max(begin + self.block.min_ns(block, op.reduces()));
        let end = if read { done + hop } else { done };
        let landed = if write { done + hop } else { end };
        if write && dst.lines.is_some_and(|l| l.format == Format::Ll128) {
            // 128-byte lines: the flag words are released after the data landed (the release
            // waits for the data's acknowledgement), and land a hop after that.
            return Timing {
                end: done + hop,
                landed: done + 2 * hop,
            };
        }
        Timing { end, landed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::op::{Buf, Loc};

    #[test]
    fn a_timeline_fills_gaps_and_merges() {
        let mut t = Timeline::default();
        assert_eq!(t.reserve(10, 5), 15);
        assert_eq!(t.reserve(0, 5), 5); // fits before
        assert_eq!(t.reserve(0, 6), 21); // [5, 10) is too short
        assert_eq!(t.reserve(12, 0), 12);
        assert_eq!(t.reserve(5, 5), 10); // exactly the gap
        assert_eq!(t.busy.len(), 1, "{:?}", t.busy);
        assert_eq!(t.busy.get(&0), Some(&21));
    }

    fn loc(rank: u16) -> Loc {
        Loc {
            rank,
            buf: Buf::Input,
            offset: 0,
        }
    }

    #[test]
    fn ports_serialise_concurrent_puts_and_charge_latency_where_it_is_paid() {
        let link = Link::NVLINK4;
        let mut p = Ports::new(4, link, Block::UNLIMITED);
        let bytes = 370_000; // 1 us on the link
        let put = |dst| Op::Copy {
            src: loc(0),
            dst: loc(dst),
            bytes,
        };
        // A put is posted: it ends with its transfer and lands a hop later.
        let a = p.run(&put(1), 0, 0);
        assert_eq!(
            a,
            Timing {
                end: 1000,
                landed: 1600
            }
        );
        // A second put from the same rank at the same time waits for the egress port.
        assert_eq!(p.run(&put(3), 0, 0).end, 2000);
        // A read of rank 1 by rank 2 uses other ports, and ends a hop after its transfer.
        let get = Op::Copy {
            src: loc(1),
            dst: loc(2),
            bytes,
        };
        assert_eq!(p.run(&get, 2, 0).end, 1600);
        // A signal costs its sender the issue; it lands a hop later.
        let s = Op::Signal {
            peer: 1,
            slot: 0,
            op: symm_core::op::SignalOp::Add,
            value: 1,
        };
        assert_eq!(
            p.run(&s, 0, 0),
            Timing {
                end: 75,
                landed: 675
            }
        );
        // A local copy uses the memory port, four times faster than the link.
        let local = Op::Copy {
            src: loc(0),
            dst: loc(0),
            bytes,
        };
        assert_eq!(p.run(&local, 0, 0).end, 250);
    }
}
