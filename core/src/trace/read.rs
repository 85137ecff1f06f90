//! The decoder: [`Reader`] and, with `alloc`, [`decode`].

use super::wire::{self, OpLayout, WireError};
use super::{Event, Fnv, Header, TraceError, END_LEN, HEADER_OFFSET, MAGIC, MAX_HEADER};
use super::{MIN_VERSION, TAG_END, TAG_EVENT, VERSION};
use crate::op::Op;
use crate::sched::Algorithm;

/// A streaming trace decoder over a byte slice.
///
/// [`Reader::new`] checks the preamble and validates the header; iterating yields the events,
/// then stops. A problem is yielded once, as the last item: when it
/// [is a truncation](TraceError::is_truncation) the events before it are whole and may be used
/// (with the error as a warning); any other error means the trace is damaged. From version 2 on
/// the count and checksum of the end record are checked before the iteration ends cleanly.
///
/// A version 3 trace's op tags mean one of three things ([`OpLayout::V3`]): [`Reader::new`]
/// reads the input once per layout (no allocation) and keeps the first, in the order of
/// [`OpLayout::V3`], under which the whole input reads, preferring one whose ops fit the
/// header's algorithm (low-latency ops in a low-latency trace, multicast ops in a multicast
/// one); when none reads, the one that reads furthest, so the error names the damage.
/// [`Reader::layout`] says which it took and [`Reader::with_layout`] overrides it.
pub struct Reader<'a> {
    header: Header,
    cur: Cursor<'a>,
}

/// The record-by-record state of a [`Reader`].
#[derive(Clone, Copy)]
struct Cursor<'a> {
    world: u16,
    channels: u16,
    version: u16,
    layout: OpLayout,
    bytes: &'a [u8],
    offset: usize,
    hash: Fnv,
    count: u64,
    done: bool,
}

impl<'a> Reader<'a> {
    /// Reads and checks the preamble and header.
    pub fn new(bytes: &'a [u8]) -> Result<Reader<'a>, TraceError> {
        let (header, cur) = preamble(bytes, OpLayout::LowLatency)?;
        let cur = match OpLayout::of_version(cur.version) {
            Some(layout) => Cursor { layout, ..cur },
            None => detect(cur, header.request.algorithm),
        };
        Ok(Reader { header, cur })
    }

    /// Reads and checks the preamble and header, and reads the ops with `layout`'s tags whatever
    /// the version (for a version 3 trace whose layout [`Reader::new`] guessed wrong).
    pub fn with_layout(bytes: &'a [u8], layout: OpLayout) -> Result<Reader<'a>, TraceError> {
        let (header, cur) = preamble(bytes, layout)?;
        Ok(Reader { header, cur })
    }

    /// The header (validated).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The format version of the input.
    pub fn version(&self) -> u16 {
        self.cur.version
    }

    /// The op table the events are read with.
    pub fn layout(&self) -> OpLayout {
        self.cur.layout
    }

    /// Byte offset of the next record.
    pub fn offset(&self) -> usize {
        self.cur.offset
    }

    /// Events read so far.
    pub fn count(&self) -> u64 {
        self.cur.count
    }
}

/// Checks the magic, version and header: the header and a cursor at the first record.
fn preamble(bytes: &[u8], layout: OpLayout) -> Result<(Header, Cursor<'_>), TraceError> {
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
    if bytes.len() < HEADER_OFFSET {
        return Err(TraceError::Truncated { offset: 8 });
    }
    let found = u16::from_le_bytes([bytes[8], bytes[9]]);
    if found > VERSION {
        return Err(TraceError::NewerVersion { found });
    }
    if found < MIN_VERSION {
        return Err(TraceError::UnsupportedVersion { found });
    }
    let hlen = u32::from_le_bytes([bytes[10], bytes[11], bytes[12], bytes[13]]) as usize;
    if hlen > MAX_HEADER {
        return Err(TraceError::Corrupt { offset: 10 });
    }
    let body = &bytes[HEADER_OFFSET..];
    if body.len() < hlen {
        return Err(TraceError::Truncated {
            offset: HEADER_OFFSET,
        });
    }
    let hb = &body[..hlen];
    let parsed = match found {
        1 => super::old::header_v1(hb),
        2 => super::old::exact::<super::old::HeaderV2>(hb).map(Header::from),
        _ => super::old::exact::<Header>(hb),
    };
    let Some(header) = parsed else {
        return Err(TraceError::Corrupt {
            offset: HEADER_OFFSET,
        });
    };
    header
        .validate()
        .map_err(|reason| TraceError::InvalidHeader {
            offset: HEADER_OFFSET,
            reason,
        })?;
    let offset = HEADER_OFFSET + hlen;
    let mut hash = Fnv::new();
    hash.update(&bytes[..offset]);
    let cur = Cursor {
        world: header.world,
        channels: header.channels,
        version: found,
        layout,
        bytes,
        offset,
        hash,
        count: 0,
        done: false,
    };
    Ok((header, cur))
}

/// The cursor with the version 3 layout that reads the input: the first of [`OpLayout::V3`]
/// that reads all of it (a trace cut short counts as read) with ops that fit the header's
/// algorithm ([`fits`]), else the first that reads all of it, else the one that reads furthest.
fn detect(start: Cursor<'_>, algorithm: Algorithm) -> Cursor<'_> {
    let mut read: Option<Cursor<'_>> = None;
    let mut furthest: Option<(Cursor<'_>, usize)> = None;
    for layout in OpLayout::V3 {
        let first = Cursor { layout, ..start };
        let mut c = first;
        let (mut failed, mut fit) = (false, true);
        while let Some(r) = c.step() {
            match r {
                Ok(e) => fit &= fits(&e.op, algorithm),
                Err(e) => {
                    failed = !e.is_truncation();
                    break;
                }
            }
        }
        if !failed && fit {
            return first;
        }
        if !failed {
            read = read.or(Some(first));
        } else if furthest.is_none_or(|(_, reached)| c.offset > reached) {
            furthest = Some((first, c.offset));
        }
    }
    read.or(furthest.map(|(c, _)| c)).unwrap_or(start)
}

/// Whether `op` is one that symm's schedules for `algorithm` write: the low-latency ops only in
/// the traces of the low-latency algorithms of their line format, the multicast ops only in the multicast algorithm's.
fn fits(op: &Op, algorithm: Algorithm) -> bool {
    use crate::ll::Format;
    if op.is_multicast() {
        return algorithm == Algorithm::Multicast;
    }
    match op.line_format() {
        Some(Format::Ll) => matches!(algorithm, Algorithm::OneShotLl | Algorithm::DirectLl),
        Some(Format::Ll128) => {
            matches!(algorithm, Algorithm::OneShotLl128 | Algorithm::DirectLl128)
        }
        None => true,
    }
}

impl Cursor<'_> {
    fn fail(&mut self, e: TraceError) -> Option<Result<Event, TraceError>> {
        self.done = true;
        Some(Err(e))
    }

    /// Whether the input ends in something shaped like an end record after `offset`: then a
    /// record that runs into the end of the input was damaged, not cut short by a crash.
    fn ends_terminated(&self, offset: usize) -> bool {
        let n = self.bytes.len();
        if self.version < 2 || n < END_LEN || n - END_LEN <= offset {
            return false;
        }
        let tail = &self.bytes[n - END_LEN..];
        let mut count = [0u8; 8];
        count.copy_from_slice(&tail[1..9]);
        tail[0] == TAG_END && u64::from_le_bytes(count) <= n as u64
    }

    fn end_record(&mut self) -> Option<Result<Event, TraceError>> {
        let offset = self.offset;
        let rest = &self.bytes[offset..];
        if rest.len() < END_LEN {
            return self.fail(TraceError::Truncated { offset });
        }
        let mut count = [0u8; 8];
        count.copy_from_slice(&rest[1..9]);
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&rest[9..END_LEN]);
        let mut hash = self.hash;
        hash.update(&rest[..9]);
        if hash.0 != u64::from_le_bytes(sum) {
            return self.fail(TraceError::BadChecksum { offset });
        }
        let recorded = u64::from_le_bytes(count);
        if recorded != self.count {
            return self.fail(TraceError::BadCount {
                offset,
                recorded,
                read: self.count,
            });
        }
        if rest.len() > END_LEN {
            return self.fail(TraceError::TrailingBytes {
                offset: offset + END_LEN,
            });
        }
        self.done = true;
        None
    }

    /// The next record: an event, the last error, or `None` at a clean end.
    fn step(&mut self) -> Option<Result<Event, TraceError>> {
        if self.done {
            return None;
        }
        let offset = self.offset;
        let rest = &self.bytes[offset..];
        if rest.is_empty() {
            self.done = true;
            return (self.version >= 2).then_some(Err(TraceError::MissingEnd { offset }));
        }
        let skip = if self.version >= 2 {
            match rest[0] {
                TAG_EVENT => 1,
                TAG_END => return self.end_record(),
                _ => return self.fail(TraceError::Corrupt { offset }),
            }
        } else {
            0
        };
        match wire::decode(&rest[skip..], self.layout) {
            Ok((e, n)) => {
                if e.rank >= self.world || e.channel >= self.channels {
                    return self.fail(TraceError::OutOfRange {
                        offset,
                        rank: e.rank,
                        channel: e.channel,
                    });
                }
                let used = skip + n;
                self.hash.update(&rest[..used]);
                self.offset += used;
                self.count += 1;
                Some(Ok(e))
            }
            Err(WireError::End) if !self.ends_terminated(offset) => {
                self.fail(TraceError::Truncated { offset })
            }
            Err(WireError::UnknownOp(tag)) => self.fail(TraceError::UnknownOp {
                offset,
                tag,
                version: self.version,
            }),
            Err(_) => self.fail(TraceError::Corrupt { offset }),
        }
    }
}

impl Iterator for Reader<'_> {
    type Item = Result<Event, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.cur.step()
    }
}

/// A whole trace, read by [`decode`].
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// The header (validated).
    pub header: Header,
    /// Every event, in file order.
    pub events: alloc::vec::Vec<Event>,
    /// Set when the trace was cut short: the events are those before the offset it names.
    pub warning: Option<TraceError>,
}

/// Reads a whole trace. A trace cut short (see [`TraceError::is_truncation`]) is read up to the
/// cut, with the reason as a warning; any other problem is an error.
///
/// ```
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::op::Op;
/// use symm_core::sched::{Algorithm, Collective, Request};
/// use symm_core::trace::{decode, encode, Event, EventKind, Header, Source, TraceError};
///
/// let (c, a) = (Collective::AllReduce, Algorithm::Ring);
/// let request = Request::new(c, a, 2, 16, DType::F32, ReduceOp::Sum);
/// let header = Header {
///     world: 2,
///     channels: 1,
///     request,
///     source: Source::Host { simulated: false },
///     time_unit_ns: 1,
///     team: None,
/// };
/// let wait = Op::Wait { slot: 0, count: 1 };
/// let mut events: Vec<Event> = (0..2)
///     .map(|rank| Event {
///         time: 5,
///         rank,
///         channel: 0,
///         index: 0,
///         kind: EventKind::End,
///         op: wait,
///         contents: None,
///     })
///     .collect();
/// let bytes = encode(&header, &mut events).unwrap();
/// assert_eq!(decode(&bytes).unwrap().events.len(), 2);
///
/// // Cut short (a crash while writing): the whole events before the cut, with a warning.
/// let cut = decode(&bytes[..bytes.len() - 3]).unwrap();
/// assert_eq!(cut.events.len(), 2);
/// assert!(cut.warning.is_some_and(|w| w.is_truncation()));
///
/// // Damaged: an error naming what is wrong, never a panic.
/// let mut bad = bytes.clone();
/// bad[0] = b'X';
/// assert_eq!(decode(&bad), Err(TraceError::BadMagic));
/// ```
#[cfg(feature = "alloc")]
pub fn decode(bytes: &[u8]) -> Result<Decoded, TraceError> {
    let mut reader = Reader::new(bytes)?;
    let header = reader.header().clone();
    // Count first: an event takes 120 bytes in memory, so a vector grown by doubling would
    // hold up to twice that per event. The count reads with the layout already chosen, so a
    // version 3 trace is not probed again.
    let n = Reader::with_layout(bytes, reader.layout())?
        .map_while(Result::ok)
        .count();
    let mut events = alloc::vec::Vec::with_capacity(n);
    let mut warning = None;
    for e in &mut reader {
        match e {
            Ok(e) => events.push(e),
            Err(e) if e.is_truncation() => warning = Some(e),
            Err(e) => return Err(e),
        }
    }
    Ok(Decoded {
        header,
        events,
        warning,
    })
}
