//! Two traces of the same schedule, op by op: what ran on the GPU against what the simulator
//! ran, or any two runs of one plan.
//!
//! Timing differs between any two runs; the op sequence of each (rank, channel) does not. Each
//! trace's End events, ordered by op index, give that sequence; the first (rank, channel, index)
//! where the two differ (an op missing on one side, or a different op) is the difference.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use symm_core::op::Op;
use symm_core::trace::{EventKind, Reader};

/// Ops of each (rank, channel) in index order.
type Streams = BTreeMap<(u16, u16), Vec<(u32, Op)>>;

/// Why two traces differ.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TraceDiff {
    /// A trace does not decode.
    Unreadable {
        /// Which side ("first" or "second", in the caller's names where given).
        side: &'static str,
        /// The decoder's message.
        error: String,
    },
    /// The first op where the two sequences differ.
    Op {
        /// The rank.
        rank: u16,
        /// The channel.
        channel: u16,
        /// Position in the (rank, channel) sequence.
        index: usize,
        /// The first trace's op there (none: it ended before).
        first: Option<Op>,
        /// The second trace's op there.
        second: Option<Op>,
    },
}

impl fmt::Display for TraceDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceDiff::Unreadable { side, error } => {
                write!(f, "the {side} trace does not decode: {error}")
            }
            TraceDiff::Op {
                rank,
                channel,
                index,
                first,
                second,
            } => write!(
                f,
                "rank {rank} channel {channel} op {index}: gpu {first:?} host {second:?}"
            ),
        }
    }
}

impl std::error::Error for TraceDiff {}

fn streams(bytes: &[u8], side: &'static str) -> Result<Streams, Box<TraceDiff>> {
    let bad = |e: &dyn fmt::Display| {
        Box::new(TraceDiff::Unreadable {
            side,
            error: e.to_string(),
        })
    };
    let rd = Reader::new(bytes).map_err(|e| bad(&e))?;
    let mut m = Streams::new();
    for ev in rd {
        let ev = ev.map_err(|e| bad(&e))?;
        if ev.kind == EventKind::End {
            m.entry((ev.rank, ev.channel))
                .or_default()
                .push((ev.index, ev.op));
        }
    }
    for v in m.values_mut() {
        v.sort_by_key(|x| x.0);
    }
    Ok(m)
}

/// The number of ops compared when `first` (a GPU trace) and `second` (the simulator's) ran
/// the same op sequence on every (rank, channel), else the first difference.
pub fn first_difference(first: &[u8], second: &[u8]) -> Result<usize, Box<TraceDiff>> {
    let (a, b) = (streams(first, "gpu")?, streams(second, "host")?);
    let keys: BTreeSet<_> = a.keys().chain(b.keys()).copied().collect();
    let mut n = 0;
    for k in keys {
        let (x, y) = (
            a.get(&k).map(Vec::as_slice).unwrap_or_default(),
            b.get(&k).map(Vec::as_slice).unwrap_or_default(),
        );
        for i in 0..x.len().max(y.len()) {
            let (p, q) = (x.get(i).map(|o| o.1), y.get(i).map(|o| o.1));
            if p != q {
                return Err(Box::new(TraceDiff::Op {
                    rank: k.0,
                    channel: k.1,
                    index: i,
                    first: p,
                    second: q,
                }));
            }
        }
        n += x.len();
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate as host;
    use crate::SimOptions;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::sched::{Algorithm, Collective, Request};

    fn trace(alg: Algorithm) -> Vec<u8> {
        let req = Request::new(
            Collective::AllReduce,
            alg,
            3,
            4096,
            DType::F32,
            ReduceOp::Sum,
        );
        let inputs = host::random_inputs(&req, 1);
        host::simulate(&req, &inputs, &SimOptions::default())
            .expect("simulates")
            .trace
    }

    #[test]
    fn the_same_schedule_has_no_difference_and_another_names_its_first_op() {
        let ring = trace(Algorithm::Ring);
        assert!(first_difference(&ring, &ring).expect("same ops") > 0);
        match first_difference(&ring, &trace(Algorithm::OneShot)).map_err(|e| *e) {
            Err(TraceDiff::Op {
                rank: 0,
                channel: 0,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            first_difference(b"nope", &ring).map_err(|e| *e),
            Err(TraceDiff::Unreadable { side: "gpu", .. })
        ));
    }
}
