//! The safe bodies of the exported calls: everything but pointers.

use symm_core::cost;
use symm_core::plan::{PlanOp, OP_BYTES};
use symm_core::sched::{Algorithm, Request, SchedError, Schedule};
use symm_core::trace::{self, Event, Header, Source};

use crate::error::Error;
use crate::types::codes;
use crate::types::{symm_buffer_sizes, symm_event, symm_link, symm_op, symm_request};

/// The version of the ABI this library implements (`SYMM_ABI_VERSION` in the header).
pub const ABI_VERSION: u32 = 2;

/// The most events a trace writer may hold (`SYMM_TRACE_MAX_EVENTS`).
pub const TRACE_MAX_EVENTS: u64 = 1 << 22;

/// Input, output and scratch bytes of a valid request.
pub fn buffer_sizes(req: &symm_request) -> Result<symm_buffer_sizes, Error> {
    let s = req.validated()?.buffer_sizes();
    Ok(symm_buffer_sizes {
        input: s.input,
        output: s.output,
        scratch: s.scratch,
    })
}

/// The schedule of (`rank`, `channel`).
pub fn schedule(req: &symm_request, rank: u16, channel: u16) -> Result<Schedule, Error> {
    Ok(Schedule::new(req.to_core()?, rank, channel)?)
}

/// The 64-byte plan encoding of an op.
pub fn encode(op: &symm_op) -> Result<[u8; OP_BYTES], Error> {
    Ok(PlanOp::encode(&op.to_core()?).to_bytes())
}

/// The op of a 64-byte plan encoding.
pub fn decode(bytes: &[u8]) -> Result<symm_op, Error> {
    let p = PlanOp::from_bytes(bytes).map_err(|_| Error::TooSmall {
        need: OP_BYTES,
        have: bytes.len(),
    })?;
    let op = p.decode().map_err(|e| Error::BadCode {
        field: "plan op",
        value: match e {
            symm_core::plan::PlanError::BadKind(v)
            | symm_core::plan::PlanError::BadDType(v)
            | symm_core::plan::PlanError::BadReduceOp(v)
            | symm_core::plan::PlanError::BadSignalOp(v)
            | symm_core::plan::PlanError::BadBuf(v) => v.into(),
            _ => 0,
        },
    })?;
    Ok(symm_op::of(&op))
}

/// Predicted microseconds of a valid request on `link`, launch included.
pub fn predict(req: &symm_request, link: &symm_link) -> Result<f64, Error> {
    let req = req.validated()?;
    Ok(cost::predict(&req, &link.to_core()?))
}

/// The algorithm code with the lowest predicted time (the request's algorithm is ignored),
/// among those that honour deterministic mode when the request asks for it.
pub fn select(req: &symm_request, link: &symm_link, multicast: bool) -> Result<u32, Error> {
    let mut r = *req;
    r.algorithm = 0;
    r.flags = 0;
    let core = r.to_core()?;
    let link = link.to_core()?;
    let alg = if req.deterministic() {
        cost::select_where(&core, &link, multicast, Request::is_deterministic).ok_or(
            SchedError::NotDeterministic {
                collective: core.collective,
                algorithm: cost::select(&core, &link, multicast),
            },
        )?
    } else {
        cost::select(&core, &link, multicast)
    };
    let picked = Request {
        algorithm: alg,
        ..core
    };
    picked.validate()?;
    Algorithm::ALL
        .iter()
        .position(|&a| a == alg)
        .map(|i| i as u32)
        .ok_or(Error::Internal)
}

/// A trace of one request being written: events are kept (at most `max` of them, the
/// capacity never above it: `size_of::<Event>()`, 120 bytes, each) and sorted and encoded by
/// [`TraceWriter::finish`].
pub struct TraceWriter {
    header: Header,
    events: Vec<Event>,
    max: u64,
}

impl TraceWriter {
    /// A writer for `req`, recorded on `source` (`SYMM_SOURCE_*`), `time_unit_ns` nanoseconds
    /// per time unit, holding at most `max_events` events.
    pub fn new(
        req: &symm_request,
        source: u32,
        time_unit_ns: u32,
        max_events: u64,
    ) -> Result<TraceWriter, Error> {
        let request = req.to_core()?;
        let source = match source {
            codes::SOURCE_HOST_SIMULATED => Source::Host { simulated: true },
            codes::SOURCE_HOST_THREADS => Source::Host { simulated: false },
            codes::SOURCE_GPU => Source::Gpu {
                devices: Default::default(),
            },
            v => {
                return Err(Error::BadCode {
                    field: "trace source",
                    value: v.into(),
                })
            }
        };
        if max_events == 0 || max_events > TRACE_MAX_EVENTS {
            return Err(Error::Range {
                what: "max_events (0 is refused)",
                value: max_events,
                max: TRACE_MAX_EVENTS,
            });
        }
        if time_unit_ns == 0 {
            return Err(Error::Range {
                what: "time_unit_ns (0 is refused)",
                value: 0,
                max: u32::MAX.into(),
            });
        }
        let header = Header {
            world: request.world,
            channels: request.channels,
            request,
            source,
            time_unit_ns,
            team: None,
        };
        header.validate().map_err(Error::Header)?;
        Ok(TraceWriter {
            header,
            events: Vec::new(),
            max: max_events,
        })
    }

    /// Adds an event (its rank and channel inside the request).
    pub fn event(&mut self, e: &symm_event) -> Result<(), Error> {
        if self.events.len() as u64 >= self.max {
            return Err(Error::EventLimit { max: self.max });
        }
        let e = e.to_core()?;
        if e.rank >= self.header.world {
            return Err(Error::Range {
                what: "event rank",
                value: e.rank.into(),
                max: u64::from(self.header.world) - 1,
            });
        }
        if e.channel >= self.header.channels {
            return Err(Error::Range {
                what: "event channel",
                value: e.channel.into(),
                max: u64::from(self.header.channels) - 1,
            });
        }
        if self.events.len() == self.events.capacity() {
            // Grow by doubling, but never past the budget.
            let room = (self.max as usize).saturating_sub(self.events.len());
            self.events
                .reserve_exact(self.events.len().max(64).min(room));
        }
        self.events.push(e);
        Ok(())
    }

    /// The trace: header, the events sorted by (time, rank, channel, index), the end record.
    pub fn finish(mut self) -> Result<Vec<u8>, Error> {
        Ok(trace::encode(&self.header, &mut self.events)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::trace::decode;

    fn ring(world: u16) -> symm_request {
        symm_request {
            world,
            channels: 1,
            bytes: 1 << 16,
            ..Default::default()
        }
    }

    #[test]
    fn a_written_trace_decodes_to_its_events() {
        let req = ring(4);
        let mut w = TraceWriter::new(&req, codes::SOURCE_HOST_SIMULATED, 1000, 8).unwrap();
        let sched = schedule(&req, 2, 0).unwrap();
        for (i, op) in sched.take(4).enumerate() {
            let e = symm_event {
                time: 10 - i as u64,
                rank: 2,
                index: i as u32,
                kind: codes::EVENT_END,
                op: symm_op::of(&op),
                ..Default::default()
            };
            w.event(&e).unwrap();
        }
        let bad = symm_event {
            rank: 4,
            ..Default::default()
        };
        assert!(matches!(w.event(&bad), Err(Error::Range { .. })));
        let bytes = w.finish().unwrap();
        let d = decode(&bytes).unwrap();
        assert_eq!(d.events.len(), 4);
        assert!(d.events.windows(2).all(|p| p[0].time <= p[1].time));
        assert_eq!(d.header.request, req.to_core().unwrap());
    }

    #[test]
    fn the_writer_holds_at_most_its_budget() {
        let mut w = TraceWriter::new(&ring(2), codes::SOURCE_GPU, 1, 1).unwrap();
        let e = symm_event {
            kind: codes::EVENT_BEGIN,
            op: symm_op {
                kind: 3,
                ..Default::default()
            },
            ..Default::default()
        };
        w.event(&e).unwrap();
        assert_eq!(w.event(&e), Err(Error::EventLimit { max: 1 }));
        let mut w = TraceWriter::new(&ring(2), codes::SOURCE_GPU, 1, 100).unwrap();
        while w.event(&e).is_ok() {}
        assert_eq!((w.events.len(), w.events.capacity()), (100, 100));
        assert!(TraceWriter::new(&ring(0), codes::SOURCE_GPU, 1, 1).is_err());
        assert!(TraceWriter::new(&ring(2), 7, 1, 1).is_err());
        assert!(TraceWriter::new(&ring(2), 0, 1, TRACE_MAX_EVENTS + 1).is_err());
    }

    #[test]
    fn selection_returns_a_valid_algorithm() {
        let link = symm_link::preset(codes::LINK_NVLINK4).unwrap();
        let mut req = ring(8);
        req.algorithm = 99;
        let a = select(&req, &link, false).unwrap();
        req.algorithm = a;
        assert!(req.validated().is_ok());
        assert!(predict(&req, &link).unwrap() > 0.0);
    }
}
