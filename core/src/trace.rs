//! The trace format, version 1: one format from the simulator and the GPU alike.
//!
//! ```text
//! magic    8 bytes  "SYMMTRCE"
//! version  u16 LE   1
//! hlen     u32 LE   length of the header
//! header   postcard Header { world, channels, request, source, time_unit }
//! events   postcard Event, back to back, until the end of the input
//! ```
//!
//! An [`Event`] is (time, rank, channel, op index, kind, op, contents). `kind` is `Begin` or `End`
//! of an op, or `Stall` for a wait that never finished (written when a run times out, with what it
//! expected and found). `contents` is optional: the set of ranks whose contributions the op's
//! destination holds afterwards (bit r for rank r; worlds up to 64), which lets a viewer colour
//! data by origin.
//!
//! Encoding and decoding need no allocation: [`Writer`] encodes each record into a stack buffer and
//! hands it to a [`Sink`]; [`Reader`] decodes from a byte slice. Truncated, corrupted or
//! future-version input is a [`TraceError`] that names the byte offset, never a panic.

use crate::op::Op;
use crate::sched::Request;
use serde::{Deserialize, Serialize};

/// The magic bytes at the start of every trace.
pub const MAGIC: [u8; 8] = *b"SYMMTRCE";
/// The format version this crate writes and reads.
pub const VERSION: u16 = 1;
/// Largest encoded header.
pub const MAX_HEADER: usize = 512;
/// Largest encoded event.
pub const MAX_EVENT: usize = 128;
/// Most device names in a header.
pub const MAX_DEVICES: usize = 16;

/// Where a trace was recorded.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// The host simulator or the host thread backend.
    Host {
        /// `true` for the deterministic single-threaded simulator (time is simulated).
        simulated: bool,
    },
    /// GPUs, with the device names in rank order.
    Gpu {
        /// Device names.
        devices: heapless::Vec<heapless::String<64>, MAX_DEVICES>,
    },
}

/// The trace header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Ranks.
    pub world: u16,
    /// Channels.
    pub channels: u16,
    /// The request that was run.
    pub request: Request,
    /// Where it ran.
    pub source: Source,
    /// Nanoseconds per time unit of the events.
    pub time_unit_ns: u32,
}

/// What an event marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// The op started (a wait: started waiting).
    Begin,
    /// The op finished.
    End,
    /// A wait that never finished: it needed `target` and found `found`.
    Stall {
        /// The value the slot had to reach.
        target: u64,
        /// The value the slot held.
        found: u64,
    },
}

/// One trace event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Time in header units.
    pub time: u64,
    /// Rank.
    pub rank: u16,
    /// Channel.
    pub channel: u16,
    /// Position of the op in the (rank, channel) stream.
    pub index: u32,
    /// Begin, end or stall.
    pub kind: EventKind,
    /// The op.
    pub op: Op,
    /// Ranks whose contributions the destination holds after the op (bit r: rank r).
    pub contents: Option<u64>,
}

/// Why a trace could not be read or written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceError {
    /// The input does not start with [`MAGIC`].
    BadMagic,
    /// The input's version is not one this crate reads.
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// The input ends inside a record that starts at `offset`.
    Truncated {
        /// Byte offset of the record.
        offset: usize,
    },
    /// The record at `offset` does not decode.
    Corrupt {
        /// Byte offset of the record.
        offset: usize,
    },
    /// A record does not fit the encoder's buffer.
    TooLarge,
    /// The sink refused bytes.
    Sink,
}

impl core::fmt::Display for TraceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TraceError::BadMagic => write!(f, "not a symm trace (bad magic at byte 0)"),
            TraceError::UnsupportedVersion { found } => write!(
                f,
                "trace version {found} is not supported (this build reads version {VERSION}) at byte 8"
            ),
            TraceError::Truncated { offset } => {
                write!(f, "trace is truncated: the record at byte {offset} is incomplete")
            }
            TraceError::Corrupt { offset } => {
                write!(f, "trace is corrupt: the record at byte {offset} does not decode")
            }
            TraceError::TooLarge => write!(f, "record too large to encode"),
            TraceError::Sink => write!(f, "the output refused the bytes"),
        }
    }
}

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

/// A streaming trace encoder.
pub struct Writer<S> {
    sink: S,
}

impl<S: Sink> Writer<S> {
    /// Writes the magic, version and header.
    pub fn new(mut sink: S, header: &Header) -> Result<Self, TraceError> {
        let mut buf = [0u8; MAX_HEADER];
        let used = postcard::to_slice(header, &mut buf).map_err(|_| TraceError::TooLarge)?;
        sink.put(&MAGIC)?;
        sink.put(&VERSION.to_le_bytes())?;
        sink.put(&(used.len() as u32).to_le_bytes())?;
        sink.put(used)?;
        Ok(Writer { sink })
    }

    /// Appends an event.
    pub fn event(&mut self, e: &Event) -> Result<(), TraceError> {
        let mut buf = [0u8; MAX_EVENT];
        let used = postcard::to_slice(e, &mut buf).map_err(|_| TraceError::TooLarge)?;
        self.sink.put(used)
    }

    /// The sink back.
    pub fn finish(self) -> S {
        self.sink
    }
}

/// Encodes a whole trace: sorts `events` by (time, rank, channel, index), the order every reader
/// expects, and writes them after `header`.
#[cfg(feature = "alloc")]
pub fn encode(header: &Header, events: &mut [Event]) -> Result<alloc::vec::Vec<u8>, TraceError> {
    events.sort_by_key(|e| (e.time, e.rank, e.channel, e.index));
    let mut w = Writer::new(alloc::vec::Vec::new(), header)?;
    for e in events.iter() {
        w.event(e)?;
    }
    Ok(w.finish())
}

/// A streaming trace decoder over a byte slice.
pub struct Reader<'a> {
    header: Header,
    rest: &'a [u8],
    offset: usize,
    failed: bool,
}

impl<'a> Reader<'a> {
    /// Reads and checks the preamble and header.
    pub fn new(bytes: &'a [u8]) -> Result<Reader<'a>, TraceError> {
        if bytes.len() < 8 {
            return if MAGIC.starts_with(bytes) {
                Err(TraceError::Truncated { offset: 0 })
            } else {
                Err(TraceError::BadMagic)
            };
        }
        if bytes[..8] != MAGIC {
            return Err(TraceError::BadMagic);
        }
        if bytes.len() < 14 {
            return Err(TraceError::Truncated { offset: 8 });
        }
        let found = u16::from_le_bytes([bytes[8], bytes[9]]);
        if found != VERSION {
            return Err(TraceError::UnsupportedVersion { found });
        }
        let hlen = u32::from_le_bytes([bytes[10], bytes[11], bytes[12], bytes[13]]) as usize;
        if hlen > MAX_HEADER {
            return Err(TraceError::Corrupt { offset: 10 });
        }
        let body = &bytes[14..];
        if body.len() < hlen {
            return Err(TraceError::Truncated { offset: 14 });
        }
        let header: Header = match postcard::from_bytes(&body[..hlen]) {
            Ok(h) => h,
            Err(postcard::Error::DeserializeUnexpectedEnd) => {
                return Err(TraceError::Corrupt { offset: 14 })
            }
            Err(_) => return Err(TraceError::Corrupt { offset: 14 }),
        };
        Ok(Reader {
            header,
            rest: &body[hlen..],
            offset: 14 + hlen,
            failed: false,
        })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Byte offset of the next event.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

impl Iterator for Reader<'_> {
    type Item = Result<Event, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        match postcard::take_from_bytes::<Event>(self.rest) {
            Ok((e, rest)) => {
                self.offset += self.rest.len() - rest.len();
                self.rest = rest;
                Some(Ok(e))
            }
            Err(err) => {
                self.failed = true;
                let offset = self.offset;
                Some(Err(match err {
                    postcard::Error::DeserializeUnexpectedEnd => TraceError::Truncated { offset },
                    _ => TraceError::Corrupt { offset },
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};
    use crate::op::{Buf, Loc};
    use crate::sched::{Algorithm, Collective};

    fn header() -> Header {
        Header {
            world: 4,
            channels: 1,
            request: Request::new(
                Collective::AllReduce,
                Algorithm::Ring,
                4,
                1024,
                DType::F32,
                ReduceOp::Sum,
            ),
            source: Source::Host { simulated: true },
            time_unit_ns: 1,
        }
    }

    fn event(i: u32) -> Event {
        Event {
            time: 10 * i as u64,
            rank: 2,
            channel: 0,
            index: i,
            kind: EventKind::End,
            op: Op::Copy {
                src: Loc::new(2, Buf::Input, 64),
                dst: Loc::new(3, Buf::Scratch, 0),
                bytes: 256,
            },
            contents: Some(0b0100),
        }
    }

    #[test]
    fn round_trip_and_errors() {
        let mut w = Writer::new(heapless::Vec::<u8, 4096>::new(), &header()).unwrap();
        for i in 0..20 {
            w.event(&event(i)).unwrap();
        }
        let bytes = w.finish();
        let r = Reader::new(&bytes).unwrap();
        assert_eq!(r.header(), &header());
        let evs: heapless::Vec<Event, 32> = r.map(|e| e.unwrap()).collect();
        assert_eq!(evs.len(), 20);
        assert_eq!(evs[7], event(7));

        // Truncation inside an event.
        let cut = &bytes[..bytes.len() - 3];
        let last = Reader::new(cut).unwrap().last().unwrap();
        assert!(
            matches!(last, Err(TraceError::Truncated { .. })),
            "{last:?}"
        );
        // Future version.
        let mut future = bytes.clone();
        future[8] = 2;
        assert_eq!(
            Reader::new(&future).err(),
            Some(TraceError::UnsupportedVersion { found: 2 })
        );
        assert_eq!(Reader::new(b"nope").err(), Some(TraceError::BadMagic));
    }
}
