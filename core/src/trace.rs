//! The trace format, version 4: one format from the simulator and the GPU alike.
//!
//! ```text
//! magic    8 bytes  "SYMMTRCE"
//! version  u16 LE   4
//! hlen     u32 LE   length of the header (at most MAX_HEADER)
//! header   postcard Header { world, channels, request, source, time_unit, team }
//! records  back to back:
//!   event  b'E', then the event (see below)
//!   end    b'Z', count u64 LE, checksum u64 LE  (exactly once, last)
//! ```
//!
//! An [`Event`] is (time, rank, channel, op index, kind, op, contents). `kind` is `Begin` or `End`
//! of an op, or `Stall` for a wait that never finished (written when a run times out, with what it
//! expected and found). The op is a one-byte tag from [`OpKind`](crate::op::OpKind)'s append-only table followed by
//! the op's fields, so a new op never renumbers the others; `wire` gives the exact
//! bytes. `contents` is optional: the set of ranks whose contributions the op's destination holds
//! afterwards (bit r for rank r; worlds up to 64), which lets a viewer colour data by origin.
//!
//! The end record carries the number of events and a 64-bit FNV-1a checksum of every byte before
//! the checksum field (magic, version, header, every event record, the end tag and the count).
//! A trace that stops before its end record was cut short (a crash while writing): readers show
//! the events it holds with a warning naming the byte offset ([`TraceError::is_truncation`]).
//! A record that does not decode, an op tag the version does not define, an event outside the
//! header's world, a wrong count or checksum or bytes after the end record are errors; a version
//! newer than this crate's is [`TraceError::NewerVersion`].
//!
//! # Older versions
//!
//! Every older version is still read. Versions 1 to 3 tagged ops by the position of the variant
//! in [`Op`] ([`OpLayout`]), and the op enum grew in the middle twice while the version stayed
//! at 3: a version 3 trace uses the original layout (written before the k-way reduce), the k-way
//! layout (with `reduce_n`, before the low-latency ops) or the low-latency layout (the order
//! version 4 froze). Nothing in a version 3 file says which, so the reader tries them: a trace
//! reads with the first of [`OpLayout::V3`] under which every record decodes, every event is
//! inside the world and the count matches (or the trace was cut short) and whose ops fit the
//! header's algorithm (low-latency ops only in a `one_shot_ll` trace, multicast ops only in a
//! `multicast` one: what symm's schedules write); failing that, the first that reads. Whole
//! traces of symm's schedules read under one layout only (an op read with the wrong table
//! misaligns the records after it), but a short or cut trace, or one of hand-written op streams,
//! can read under two: then the low-latency layout is preferred (it was written longest), then
//! the original. [`Reader::layout`] says which was used; [`Reader::with_layout`] picks one.
//! Version 3 added the team tag; version 2 traces (no tag) are read as traces of a whole world.
//! Version 1 traces (no record tags, no end record: events until the end of the input) are read
//! too; they carry no count or checksum, so only undecodable records are detected in them.
//! Versions 1 and 2 only ever used the original layout. Version 1 headers also come in two
//! shapes: the collective's tag list grew in the middle (`AllToAllV` before `SendRecv`) during
//! version 1, so a version 1 header that neither decodes nor validates with today's list is read
//! with the earlier one.
//!
//! A trace of a team collective (see [`crate::team`]) names the team in the header
//! ([`TeamTag`]: its id, the world it is part of and its members): events use the team's local
//! ranks, as its request does.
//!
//! The header is validated before anything uses it ([`Header::validate`]): the request passes
//! [`Request::validate`] and the header's world and channels are the request's. Every event
//! names a rank and channel inside that world.
//!
//! Encoding and decoding need no allocation: [`Writer`] encodes each record into a stack buffer
//! and hands it to a [`Sink`]; [`Reader`] decodes from a byte slice. Hostile input is a
//! [`TraceError`] that names the byte offset, never a panic.

mod old;
mod read;
mod wire;
mod write;

pub use read::Reader;
#[cfg(feature = "alloc")]
pub use read::{decode, Decoded};
pub use wire::OpLayout;
#[cfg(feature = "alloc")]
pub use write::encode;
pub use write::{Sink, Writer};

use crate::op::Op;
use crate::sched::{Request, SchedError};
use serde::{Deserialize, Serialize};

/// The magic bytes at the start of every trace.
pub const MAGIC: [u8; 8] = *b"SYMMTRCE";
/// The format version this crate writes (and the newest it reads).
pub const VERSION: u16 = 4;
/// The oldest format version this crate reads.
pub const MIN_VERSION: u16 = 1;
/// Largest encoded header.
pub const MAX_HEADER: usize = 512;
/// Largest encoded event (without its tag).
pub const MAX_EVENT: usize = 128;
/// Most device names in a header.
pub const MAX_DEVICES: usize = 16;
/// The tag of an event record (version 2).
pub const TAG_EVENT: u8 = b'E';
/// The tag of the end record (version 2).
pub const TAG_END: u8 = b'Z';
/// Length of the end record: tag, count, checksum.
pub const END_LEN: usize = 17;
/// Byte offset of the header.
pub const HEADER_OFFSET: usize = 14;

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

/// Most members of a team a trace header names.
pub const MAX_TEAM_TAG: usize = 64;

/// The team a traced collective ran on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeamTag {
    /// The team's slot id (0: the world).
    pub id: u16,
    /// Ranks of the world the team is part of.
    pub world: u16,
    /// World rank of each local rank.
    pub members: heapless::Vec<u16, MAX_TEAM_TAG>,
}

impl TeamTag {
    /// The tag of `team`; `None` when it has more than [`MAX_TEAM_TAG`] members.
    pub fn of(team: &crate::team::Team) -> Option<TeamTag> {
        Some(TeamTag {
            id: team.id(),
            world: team.world_size(),
            members: heapless::Vec::from_slice(team.members()).ok()?,
        })
    }
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
    /// The team, when the collective ran on one (version 3).
    pub team: Option<TeamTag>,
}

impl Header {
    /// Checks everything a reader relies on: the request validates (so its world, channels,
    /// slot layout and buffer sizes are in range) and the header's world and channels are the
    /// request's. A request refused only for too few scratch slots is accepted: its sizes and
    /// layout are in range, and a trace of such a run (one that deadlocks) is worth reading.
    pub fn validate(&self) -> Result<(), HeaderError> {
        let r = &self.request;
        match r.validate() {
            Ok(()) | Err(SchedError::TooFewSlots { .. }) => {}
            Err(e) => return Err(HeaderError::Request(e)),
        }
        if self.world != r.world {
            return Err(HeaderError::World {
                header: self.world,
                request: r.world,
            });
        }
        if self.channels != r.channels {
            return Err(HeaderError::Channels {
                header: self.channels,
                request: r.channels,
            });
        }
        if let Some(t) = &self.team {
            let ok = t.members.len() == r.world as usize
                && t.world >= r.world
                && t.members
                    .iter()
                    .enumerate()
                    .all(|(i, &m)| m < t.world && !t.members[..i].contains(&m));
            if !ok {
                return Err(HeaderError::Team);
            }
        }
        Ok(())
    }
}

/// Why a header is not acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderError {
    /// The request does not validate.
    Request(SchedError),
    /// The header's world is not the request's.
    World {
        /// World in the header.
        header: u16,
        /// World in the request.
        request: u16,
    },
    /// The header's channel count is not the request's.
    Channels {
        /// Channels in the header.
        header: u16,
        /// Channels in the request.
        request: u16,
    },
    /// The team tag does not name the request's world of distinct ranks of the team's world.
    Team,
}

impl core::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HeaderError::Request(e) => write!(f, "the request is invalid: {e}"),
            HeaderError::World { header, request } => {
                write!(f, "the header says {header} ranks, its request {request}")
            }
            HeaderError::Channels { header, request } => write!(
                f,
                "the header says {header} channels, its request {request}"
            ),
            HeaderError::Team => write!(
                f,
                "the team tag does not list one distinct rank of its world per rank of the request"
            ),
        }
    }
}

impl core::error::Error for HeaderError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            HeaderError::Request(e) => Some(e),
            _ => None,
        }
    }
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
    /// The input's version is older than any this crate reads (no symm trace has it).
    UnsupportedVersion {
        /// The version found.
        found: u16,
    },
    /// The input's version is newer than this crate reads: a newer symm wrote it.
    NewerVersion {
        /// The version found.
        found: u16,
    },
    /// The input ends inside the record that starts at `offset` (a warning when it is an event
    /// or the end record: see [`TraceError::is_truncation`]).
    Truncated {
        /// Byte offset of the record.
        offset: usize,
    },
    /// The input ends at `offset`, after whole records but without the end record (a warning:
    /// see [`TraceError::is_truncation`]).
    MissingEnd {
        /// Byte offset where the end record should start.
        offset: usize,
    },
    /// The record at `offset` does not decode.
    Corrupt {
        /// Byte offset of the record.
        offset: usize,
    },
    /// The event at `offset` has an op tag that its format version does not define (damage,
    /// or an op a newer symm added).
    UnknownOp {
        /// Byte offset of the record.
        offset: usize,
        /// The tag.
        tag: u32,
        /// The trace's format version.
        version: u16,
    },
    /// The header decodes but is not acceptable.
    InvalidHeader {
        /// Byte offset of the header.
        offset: usize,
        /// What is wrong with it.
        reason: HeaderError,
    },
    /// The event at `offset` names a rank or channel outside the header's world.
    OutOfRange {
        /// Byte offset of the record.
        offset: usize,
        /// The event's rank.
        rank: u16,
        /// The event's channel.
        channel: u16,
    },
    /// The end record at `offset` counts a different number of events than were read.
    BadCount {
        /// Byte offset of the end record.
        offset: usize,
        /// The count in the end record.
        recorded: u64,
        /// Events read before it.
        read: u64,
    },
    /// The checksum in the end record at `offset` does not match the bytes before it.
    BadChecksum {
        /// Byte offset of the end record.
        offset: usize,
    },
    /// Bytes follow the end record, starting at `offset`.
    TrailingBytes {
        /// Byte offset of the first extra byte.
        offset: usize,
    },
    /// A record does not fit the encoder's buffer.
    TooLarge,
    /// The sink refused bytes.
    Sink,
}

impl TraceError {
    /// Whether the trace was cut short (a crash while writing): the events before the offset are
    /// whole and may be shown, with this error as a warning. They are unverified, since the
    /// checksum is in the missing end record.
    pub fn is_truncation(&self) -> bool {
        matches!(
            self,
            TraceError::MissingEnd { .. } | TraceError::Truncated { .. }
        )
    }
}

impl core::fmt::Display for TraceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TraceError::BadMagic => write!(f, "not a symm trace (bad magic at byte 0)"),
            TraceError::UnsupportedVersion { found } => write!(
                f,
                "trace version {found} is not supported (this build reads versions {MIN_VERSION} to {VERSION}) at byte 8"
            ),
            TraceError::NewerVersion { found } => write!(
                f,
                "trace version {found} is newer than this build reads (versions {MIN_VERSION} to {VERSION}): it was written by a newer symm (version at byte 8)"
            ),
            TraceError::Truncated { offset } => {
                write!(f, "trace is truncated: the record at byte {offset} is incomplete")
            }
            TraceError::MissingEnd { offset } => write!(
                f,
                "trace is truncated: it stops at byte {offset} without its end record"
            ),
            TraceError::Corrupt { offset } => {
                write!(f, "trace is corrupt: the record at byte {offset} does not decode")
            }
            TraceError::UnknownOp {
                offset,
                tag,
                version,
            } => write!(
                f,
                "trace is corrupt or from a newer symm: the event at byte {offset} has op tag {tag}, which format version {version} does not define"
            ),
            TraceError::InvalidHeader { offset, reason } => {
                write!(f, "trace header at byte {offset} is invalid: {reason}")
            }
            TraceError::OutOfRange {
                offset,
                rank,
                channel,
            } => write!(
                f,
                "trace is corrupt: the event at byte {offset} names rank {rank} channel {channel}, outside the header's world"
            ),
            TraceError::BadCount {
                offset,
                recorded,
                read,
            } => write!(
                f,
                "trace is corrupt: the end record at byte {offset} counts {recorded} events, {read} were read"
            ),
            TraceError::BadChecksum { offset } => write!(
                f,
                "trace is corrupt: the checksum in the end record at byte {offset} does not match"
            ),
            TraceError::TrailingBytes { offset } => write!(
                f,
                "trace is corrupt: unexpected bytes after the end record at byte {offset}"
            ),
            TraceError::TooLarge => write!(f, "record too large to encode"),
            TraceError::Sink => write!(f, "the output refused the bytes"),
        }
    }
}

impl core::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            TraceError::InvalidHeader { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// 64-bit FNV-1a, the checksum of the end record.
#[derive(Clone, Copy, Debug)]
struct Fnv(u64);

impl Fnv {
    const fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn update(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for &b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = h;
    }
}

#[cfg(test)]
mod tests;
