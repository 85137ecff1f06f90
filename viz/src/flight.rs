//! The chunks in flight at a playback time, as the topology view draws them: one dot per chunk
//! travelling between two ranks, or between a rank and the NVSwitch, at the fraction of its op
//! done; and which ranks are blocked in a wait.
//!
//! A multicast store fans out to every rank, so a trace can put far more chunks in flight than a
//! frame can draw (a world of 1024 with 64 channels: 67 million). At most [`MAX_DOTS`] are
//! placed; the rest are only counted, and the view says how many it left out.

use crate::model::Trace;
use symm_core::op::Op;

/// A point on the canvas.
pub type Point = (f64, f64);

/// A chunk in flight: where it left, where it is now, whose colour it has (a rank).
pub type Flight = (Point, Point, usize);

/// Most chunks placed in one frame.
pub const MAX_DOTS: usize = 2048;

/// What moves at one time.
#[derive(Clone, Debug, PartialEq)]
pub struct InFlight {
    /// The chunks placed, at most the budget.
    pub dots: Vec<Flight>,
    /// Chunks in flight beyond the budget, not placed.
    pub more: u64,
    /// Per rank: 0 idle, 1 blocked in a wait, 2 in a wait that never finished.
    pub state: Vec<u8>,
}

impl InFlight {
    fn push(&mut self, budget: usize, from: Point, to: Point, rank: usize) {
        if self.dots.len() < budget {
            self.dots.push((from, to, rank));
        } else {
            self.more = self.more.saturating_add(1);
        }
    }
}

fn lerp(a: Point, b: Point, f: f64) -> Point {
    (a.0 + (b.0 - a.0) * f, a.1 + (b.1 - a.1) * f)
}

/// The chunks in flight at trace time `now`, with the ranks at `pts` (one per rank of the world)
/// and the switch at `switch`: at most `budget` placed. Work is one lookup per lane plus the
/// chunks placed.
pub fn at(t: &Trace, now: u64, pts: &[Point], switch: Point, budget: usize) -> InFlight {
    let mut out = InFlight {
        dots: Vec::new(),
        more: 0,
        state: vec![0; pts.len()],
    };
    let at = |r: u16| pts.get(r as usize).copied();
    for lane in &t.lanes {
        let Some(si) = t.lane_span_at(lane, now) else {
            continue;
        };
        let s = &t.spans[si];
        let running = s.end.is_none_or(|e| e > now) && s.begin <= now;
        if !running {
            continue;
        }
        let f = match s.end {
            Some(e) if e > s.begin => (now - s.begin) as f64 / (e - s.begin) as f64,
            _ => 0.5,
        };
        let me = s.rank;
        match s.op {
            Op::Wait { .. } => {
                if let Some(st) = out.state.get_mut(me as usize) {
                    *st = (*st).max(if s.stall.is_some() { 2 } else { 1 });
                }
            }
            Op::Copy { src, dst, .. } | Op::LlPut { src, dst, .. } if src.rank != dst.rank => {
                if let (Some(a), Some(b)) = (at(src.rank), at(dst.rank)) {
                    out.push(budget, a, lerp(a, b, f), src.rank as usize);
                }
            }
            Op::Reduce { a, b, .. } => {
                for l in [a, b] {
                    if l.rank != me {
                        if let (Some(x), Some(y)) = (at(l.rank), at(me)) {
                            out.push(budget, x, lerp(x, y, f), l.rank as usize);
                        }
                    }
                }
            }
            Op::ReduceN { ranks, .. } => {
                for &q in ranks.as_slice() {
                    if q != me {
                        if let (Some(x), Some(y)) = (at(q), at(me)) {
                            out.push(budget, x, lerp(x, y, f), q as usize);
                        }
                    }
                }
            }
            Op::McReduce { .. } => {
                if let Some(y) = at(me) {
                    out.push(budget, switch, lerp(switch, y, f), me as usize);
                }
            }
            Op::McStore { .. } => {
                let Some(x) = at(me) else {
                    continue;
                };
                if f < 0.5 {
                    out.push(budget, x, lerp(x, switch, f * 2.0), me as usize);
                } else {
                    // To every rank: place what the budget leaves room for, count the rest.
                    let room = budget.saturating_sub(out.dots.len()).min(pts.len());
                    for q in &pts[..room] {
                        let d = (switch, lerp(switch, *q, (f - 0.5) * 2.0), me as usize);
                        out.dots.push(d);
                    }
                    out.more = out.more.saturating_add((pts.len() - room) as u64);
                }
            }
            // A copy within a rank, signals and low-latency reduces (their lines arrived
            // with their puts) move nothing between ranks.
            Op::Copy { .. } | Op::LlPut { .. } | Op::Signal { .. } | Op::LlReduce { .. } => {}
        }
    }
    out
}

#[cfg(test)]
mod tests;
