//! The encoder: [`Writer`] and, with `alloc`, [`encode`].

use super::{Event, Fnv, Header, TraceError, MAGIC, MAX_EVENT, MAX_HEADER, TAG_END, TAG_EVENT};
use super::{OpLayout, END_LEN, VERSION};

/// Somewhere encoded bytes go.
pub trait Sink {
    /// Appends bytes.
    fn put(&mut self, bytes: &[u8]) -> Result<(), TraceError>;
}

impl<const N: usize> Sink for heapless::Vec<u8, N> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), TraceError> {
        self.extend_from_slice(bytes).map_err(|_| TraceError::Sink)
    }
}

#[cfg(feature = "alloc")]
impl Sink for alloc::vec::Vec<u8> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), TraceError> {
        self.extend_from_slice(bytes);
        Ok(())
    }
}

/// A streaming trace encoder. [`Writer::finish`] writes the end record; a writer dropped
/// without it leaves a trace that readers open with a truncation warning.
///
/// The writer does not validate the header: readers do ([`Header::validate`]).
pub struct Writer<S> {
    sink: S,
    hash: Fnv,
    count: u64,
}

impl<S: Sink> Writer<S> {
    /// Writes the magic, version and header.
    pub fn new(sink: S, header: &Header) -> Result<Self, TraceError> {
        let mut buf = [0u8; MAX_HEADER];
        let used = postcard::to_slice(header, &mut buf).map_err(|_| TraceError::TooLarge)?;
        let hlen = u32::try_from(used.len()).map_err(|_| TraceError::TooLarge)?;
        let mut w = Writer {
            sink,
            hash: Fnv::new(),
            count: 0,
        };
        w.put(&MAGIC)?;
        w.put(&VERSION.to_le_bytes())?;
        w.put(&hlen.to_le_bytes())?;
        w.put(used)?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), TraceError> {
        self.hash.update(bytes);
        self.sink.put(bytes)
    }

    /// Appends an event record.
    pub fn event(&mut self, e: &Event) -> Result<(), TraceError> {
        let mut buf = [0u8; 1 + MAX_EVENT];
        buf[0] = TAG_EVENT;
        let n = super::wire::encode(e, OpLayout::Stable, &mut buf[1..])?;
        self.put(&buf[..1 + n])?;
        self.count += 1;
        Ok(())
    }

    /// Events written so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Writes the end record (event count and checksum) and returns the sink.
    pub fn finish(mut self) -> Result<S, TraceError> {
        let mut end = [0u8; END_LEN];
        end[0] = TAG_END;
        end[1..9].copy_from_slice(&self.count.to_le_bytes());
        self.hash.update(&end[..9]);
        end[9..].copy_from_slice(&self.hash.0.to_le_bytes());
        self.sink.put(&end)?;
        Ok(self.sink)
    }
}

/// Encodes a whole trace: sorts `events` by (time, rank, channel, index), the order every reader
/// expects, and writes them after `header`, then the end record.
///
/// ```
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::op::{Buf, Loc, Op};
/// use symm_core::sched::{Algorithm, Collective, Request};
/// use symm_core::trace::{decode, encode, Event, EventKind, Header, Source};
///
/// let (c, a) = (Collective::SendRecv { src: 0, dst: 1 }, Algorithm::Direct);
/// let request = Request::new(c, a, 2, 64, DType::U8, ReduceOp::Sum);
/// let header = Header {
///     world: 2,
///     channels: 1,
///     request,
///     source: Source::Host { simulated: true },
///     time_unit_ns: 1,
///     team: None,
/// };
/// let op = Op::Copy {
///     src: Loc::new(0, Buf::Input, 0),
///     dst: Loc::new(1, Buf::Output, 0),
///     bytes: 64,
/// };
/// let event = |time, kind| Event {
///     time,
///     rank: 0,
///     channel: 0,
///     index: 0,
///     kind,
///     op,
///     contents: None,
/// };
/// // Out of order on purpose: `encode` sorts by time.
/// let mut events = [event(90, EventKind::End), event(10, EventKind::Begin)];
/// let bytes = encode(&header, &mut events).unwrap();
/// assert_eq!(&bytes[..8], b"SYMMTRCE");
///
/// let back = decode(&bytes).unwrap();
/// assert_eq!(back.header, header);
/// assert_eq!(back.events, [event(10, EventKind::Begin), event(90, EventKind::End)]);
/// assert_eq!(back.warning, None);
/// ```
#[cfg(feature = "alloc")]
pub fn encode(header: &Header, events: &mut [Event]) -> Result<alloc::vec::Vec<u8>, TraceError> {
    events.sort_by_key(|e| (e.time, e.rank, e.channel, e.index));
    let mut w = Writer::new(alloc::vec::Vec::new(), header)?;
    for e in events.iter() {
        w.event(e)?;
    }
    w.finish()
}
