//! One order for a Comm's collectives, whatever streams they are enqueued on.
//!
//! Every collective of one team (the job is team 0) uses the team's slots of the signal pad and
//! their `expected` counters: a kernel reads a counter, adds what it waits for and writes it
//! back, so two of them running at once on two streams would mix their counts and pass waits
//! early. The ranks agree on one order of a team's collectives (the order each enqueues them
//! in), so the GPU must run them in that order too. Collectives of different teams use disjoint
//! slots and may run at the same time.
//!
//! Per team, the Comm remembers the stream of its last collective. A collective on the same
//! stream is ordered by the stream itself. On another stream:
//!
//! * the first time the Comm sees a second stream it waits for its device once (nothing of an
//!   earlier stream is still running after that) and from then on records an event after every
//!   collective;
//! * after that, a collective on a stream other than the last one first makes its stream wait
//!   for that event (`cuStreamWaitEvent`: on the GPU, no host synchronisation).
//!
//! A single-stream program pays nothing: a launch on the team's last stream, with no event
//! yet, does not even ask whether the stream is capturing (the answer would change nothing).
//! Once a second stream was used, each launch asks (unless its caller knows: `capturing`) and
//! records the event after itself: two driver calls, made with the context the launch's guard
//! bound. Work enqueued while a stream is capturing into a graph runs only at a replay, so it is
//! not ordered here; [`super::CommGraph::launch`] orders every replay the same way. The state
//! lives under the Comm's launch lock.

use std::collections::HashMap;

use super::Comm;
use crate::cuda::device::{Event, Stream};
use crate::cuda::error::Result;

/// Per team id, the stream of its last collective and, once a second stream was used, the
/// event recorded after each of its collectives.
#[derive(Default)]
pub(crate) struct StreamOrder {
    lanes: HashMap<u16, Lane, super::admit::FastHash>,
}

#[derive(Default)]
struct Lane {
    /// The last stream's key (`Stream::key`).
    last: Option<u64>,
    event: Option<Event>,
}

impl Lane {
    /// Whether work on the stream of key `key` needs nothing from the order whether or not
    /// its stream captures: the team's last stream, and no event to record.
    fn in_order(&self, key: u64) -> bool {
        self.last == Some(key) && self.event.is_none()
    }
}

impl Comm {
    /// Orders work about to be enqueued on `stream` after the Comm's earlier collectives
    /// (launch lock held: `order` is its state; the context bound by the caller's guard).
    /// `capturing` is whether `stream` captures when the caller asked already (`None`: asked
    /// here, only when it matters). Returns whether the event must be recorded after the work
    /// ([`Comm::ordered_after`]).
    pub(super) fn order_before(
        &self,
        order: &mut StreamOrder,
        team: u16,
        stream: &Stream,
        capturing: Option<bool>,
    ) -> Result<bool> {
        let key = stream.key();
        let lane = order.lanes.entry(team).or_default();
        if lane.in_order(key) {
            return Ok(false);
        }
        let capturing = match capturing {
            Some(c) => c,
            None => stream.capturing_bound()?,
        };
        if capturing {
            return Ok(false);
        }
        match (lane.last, &lane.event) {
            (None, _) => {}
            (Some(k), _) if k == key => {}
            (Some(_), Some(event)) => stream.wait_event_bound(event)?,
            (Some(_), None) => {
                // The first switch: nothing of the earlier streams runs after this.
                self.sync_device()?;
                lane.event = Some(Event::untimed(&self.dev)?);
            }
        }
        lane.last = Some(key);
        Ok(lane.event.is_some())
    }

    /// Records the order event after work enqueued on `stream` when
    /// [`Comm::order_before`] asked for it (the context bound by the caller's guard).
    pub(super) fn ordered_after(
        &self,
        order: &StreamOrder,
        team: u16,
        stream: &Stream,
        record: bool,
    ) -> Result<()> {
        if !record {
            return Ok(());
        }
        match order.lanes.get(&team).and_then(|l| l.event.as_ref()) {
            Some(e) => e.record_bound(stream),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_stream_without_an_event_skips_the_capture_query() {
        let mut lane = Lane::default();
        // The first launch sets the lane: it must know whether it captures.
        assert!(!lane.in_order(7));
        lane.last = Some(7);
        assert!(lane.in_order(7));
        // Another stream is ordered.
        assert!(!lane.in_order(8));
    }
}
