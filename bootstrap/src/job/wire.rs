//! Frames on the wire, and sending and receiving them with a deadline.
//!
//! Connections are `SOCK_SEQPACKET`: the kernel keeps message boundaries, so one `recvmsg` is
//! one frame and the descriptors it carries belong to that frame (no descriptor can straddle two
//! frames, as on a byte stream). Every frame is a 16-byte little-endian header, then `len` bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | magic `0x5359` |
//! | 2 | version (`VERSION`, 3) |
//! | 3 | kind (`Kind`) |
//! | 4 | op (`Op`, collectives only) |
//! | 5 | epoch: how many times the job recovered (wrapping); frames of another are stale |
//! | 6..8 | rank: the sender (hello), the source (part) or the lost rank (lost) |
//! | 8..12 | sequence number of the collective |
//! | 12..16 | `len`, at most [`MAX_PAYLOAD`]; must equal what follows |
//!
//! A frame is received into a buffer of exactly [`MAX_FRAME`] bytes with room for [`MAX_FDS`]
//! descriptors: a longer message or more descriptors is cut by the kernel (the extra descriptors
//! closed by it), seen here, and refused, so a hostile peer costs bounded memory.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use super::auth;
use super::error::{BootstrapError, Refusal};
use super::sys;

/// Header bytes.
pub const HEADER: usize = 16;
/// Most payload bytes in one frame (and so in one rank's `all_gather` contribution).
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// Most bytes of one frame.
pub const MAX_FRAME: usize = HEADER + MAX_PAYLOAD;
/// Most descriptors in one frame (one rank's `all_gather_fds` contribution).
pub const MAX_FDS: usize = 64;

const MAGIC: u16 = 0x5359;
const VERSION: u8 = 3;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Rank to root: rank (in the header), world, local rank, the rank's nonce.
    Hello = 1,
    /// Root to rank: the hello was accepted; wait for Ready.
    Accepted = 2,
    /// Root to rank: refused (payload: [`Refusal`]); the root closes.
    Refused = 3,
    /// Root to rank: every rank arrived.
    Ready = 4,
    /// Root to rank: the rendezvous failed (payload: the missing ranks).
    Failed = 5,
    /// Rank to root: this rank's part of a collective.
    Contribute = 6,
    /// Root to rank: one source rank's part of a collective's result.
    Part = 7,
    /// Root to rank: `rank` was lost.
    Lost = 8,
    /// Root to rank: the current collective failed at the root (payload: [`Abort`]).
    Abort = 9,
    /// Root to rank, answering a hello: the root's nonce and its proof of the token.
    Challenge = 10,
    /// Rank to root, after checking the root's proof: the rank's proof of the token.
    Proof = 11,
    /// Rank to root: this rank recovers into the frame's epoch. Root to rank: every rank did.
    Recover = 12,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Accepted,
            3 => Kind::Refused,
            4 => Kind::Ready,
            5 => Kind::Failed,
            6 => Kind::Contribute,
            7 => Kind::Part,
            8 => Kind::Lost,
            9 => Kind::Abort,
            10 => Kind::Challenge,
            11 => Kind::Proof,
            12 => Kind::Recover,
            _ => return None,
        })
    }
}

/// Which collective a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// None (rendezvous and control frames).
    None = 0,
    /// `barrier`.
    Barrier = 1,
    /// `all_gather`.
    Gather = 2,
    /// `all_gather_fds`.
    GatherFds = 3,
}

impl Op {
    fn from_u8(b: u8) -> Option<Op> {
        Some(match b {
            0 => Op::None,
            1 => Op::Barrier,
            2 => Op::Gather,
            3 => Op::GatherFds,
            _ => return None,
        })
    }

    /// The collective's name in errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::None => "no collective",
            Op::Barrier => "barrier",
            Op::Gather => "all_gather",
            Op::GatherFds => "all_gather_fds",
        }
    }
}

/// The fields of a frame's header other than its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub kind: Kind,
    pub op: Op,
    pub rank: u16,
    pub seq: u32,
    /// The epoch the sender was in (see [`Kind::Recover`]).
    pub epoch: u8,
}

impl Head {
    /// A control frame's head (no collective).
    pub fn control(kind: Kind, rank: u16) -> Head {
        Head {
            kind,
            op: Op::None,
            rank,
            seq: 0,
            epoch: 0,
        }
    }

    /// The same head in epoch `epoch`.
    pub fn in_epoch(self, epoch: u8) -> Head {
        Head { epoch, ..self }
    }

    /// The header bytes for a payload of `len` bytes (tests craft frames with it).
    #[cfg(test)]
    pub fn encode_for_test(self, len: usize) -> [u8; HEADER] {
        self.encode(len)
    }

    fn encode(self, len: usize) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        h[2] = VERSION;
        h[3] = self.kind as u8;
        h[4] = self.op as u8;
        h[5] = self.epoch;
        h[6..8].copy_from_slice(&self.rank.to_le_bytes());
        h[8..12].copy_from_slice(&self.seq.to_le_bytes());
        h[12..16].copy_from_slice(&(len as u32).to_le_bytes());
        h
    }
}

/// A received frame; its descriptors are owned (closed when it drops).
pub(crate) struct Frame {
    pub head: Head,
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Frame {
    /// Checks a received message (`buf`, its descriptors) and builds the frame.
    pub fn decode(buf: &[u8], fds: Vec<OwnedFd>) -> Result<Frame, &'static str> {
        let h = buf.get(..HEADER).ok_or("short frame")?;
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        if u16_at(0) != MAGIC || h[2] != VERSION {
            return Err("not a frame of this protocol version");
        }
        let kind = Kind::from_u8(h[3]).ok_or("unknown frame kind")?;
        let op = Op::from_u8(h[4]).ok_or("unknown collective")?;
        let len = u32_at(12) as usize;
        if len > MAX_PAYLOAD || len != buf.len() - HEADER {
            return Err("frame length does not match its header");
        }
        let carries_fds = op == Op::GatherFds && matches!(kind, Kind::Contribute | Kind::Part);
        if !fds.is_empty() && !carries_fds {
            return Err("descriptors on a frame that carries none");
        }
        Ok(Frame {
            head: Head {
                kind,
                op,
                rank: u16_at(6),
                seq: u32_at(8),
                epoch: h[5],
            },
            payload: buf[HEADER..].to_vec(),
            fds,
        })
    }
}

/// How moving a frame failed, before the caller names the peer.
#[derive(Debug)]
pub(crate) enum LinkError {
    /// The peer closed or reset the connection.
    Closed,
    /// The deadline passed.
    Timeout,
    /// The peer sent a frame outside the protocol.
    Protocol(&'static str),
    /// Another system error.
    Sys(&'static str, io::Error),
}

impl LinkError {
    /// The bootstrap error for this failure on the link to `rank`.
    pub fn at(self, rank: u16, op: &'static str) -> BootstrapError {
        match self {
            LinkError::Closed => BootstrapError::PeerLost { rank },
            LinkError::Timeout => BootstrapError::Timeout {
                op,
                waiting_for: vec![rank],
            },
            LinkError::Protocol(what) => BootstrapError::Protocol { rank, what },
            LinkError::Sys(call, e) => BootstrapError::sys(call, e),
        }
    }
}

fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(sys::EPIPE | sys::ECONNRESET | sys::ENOTCONN)
    )
}

/// `timeout` after `from`, or a year after it when that overflows (a caller may pass
/// `Duration::MAX` for "no deadline").
pub(crate) fn after(from: Instant, timeout: Duration) -> Instant {
    from.checked_add(timeout)
        .or_else(|| from.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(from)
}

/// Waits until `fd` is ready for `events` or `deadline` passes. The deadline holds on every
/// pass, so a caller that retries after a wait (a send the kernel still refuses, a peer that
/// is readable and sends nothing whole) stops at it. A peer that shut its sending side down
/// while this side waits to send is gone: it is leaving, and a full queue it no longer reads
/// would otherwise hold this side until the deadline (or, with poll reporting the hang-up at
/// once, spin there).
pub(crate) fn wait(fd: BorrowedFd<'_>, events: i16, deadline: Instant) -> Result<(), LinkError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LinkError::Timeout);
        }
        let mut set = [sys::Watch {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        }];
        let n = sys::poll(&mut set, Some(left)).map_err(|e| LinkError::Sys("poll", e))?;
        if n == 0 {
            continue;
        }
        let got = set[0].revents;
        if got & (events | sys::POLLHUP_OR_ERR) != 0 {
            return Ok(());
        }
        if got & sys::POLLRDHUP != 0 {
            // Receiving: the next receive reads the end. Sending: see above.
            return if events & sys::POLLOUT != 0 {
                Err(LinkError::Closed)
            } else {
                Ok(())
            };
        }
    }
}

/// Sends one frame by `deadline`.
pub(crate) fn send(
    fd: BorrowedFd<'_>,
    head: Head,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    deadline: Instant,
) -> Result<(), LinkError> {
    if payload.len() > MAX_PAYLOAD || fds.len() > MAX_FDS {
        return Err(LinkError::Protocol("frame over the bound"));
    }
    let header = head.encode(payload.len());
    let total = HEADER + payload.len();
    loop {
        match sys::send(fd, &[&header, payload], fds) {
            Ok(n) if n == total => return Ok(()),
            Ok(_) => return Err(LinkError::Protocol("short send")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(fd, sys::POLLOUT, deadline)?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_gone(&e) => return Err(LinkError::Closed),
            Err(e) => return Err(LinkError::Sys("sendmsg", e)),
        }
    }
}

/// Receives one frame if one is waiting: `Ok(None)` when none is.
pub(crate) fn try_recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Option<Frame>, LinkError> {
    let got = match sys::recv(fd, buf, MAX_FDS) {
        Ok(got) => got,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(None),
        Err(e) if is_gone(&e) => return Err(LinkError::Closed),
        Err(e) => return Err(LinkError::Sys("recvmsg", e)),
    };
    if got.len == 0 && got.fds.is_empty() {
        return Err(LinkError::Closed);
    }
    if got.truncated || got.len > buf.len() {
        return Err(LinkError::Protocol("frame longer than the bound"));
    }
    if got.fds_truncated {
        return Err(LinkError::Protocol("more descriptors than the bound"));
    }
    Frame::decode(&buf[..got.len], got.fds)
        .map(Some)
        .map_err(LinkError::Protocol)
}

/// Receives one frame by `deadline`.
pub(crate) fn recv(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<Frame, LinkError> {
    loop {
        if let Some(f) = try_recv(fd, buf)? {
            return Ok(f);
        }
        wait(fd, sys::POLLIN, deadline)?;
    }
}

/// Bytes of a hello's payload: world, local rank, nonce.
const HELLO: usize = 4 + auth::NONCE;
/// Bytes of a challenge's payload: nonce, proof.
const CHALLENGE: usize = auth::NONCE + auth::PROOF;

/// The hello's payload: world, local rank, the rank's nonce.
pub(crate) fn hello(world: u16, local_rank: u16, nonce: &[u8; auth::NONCE]) -> Vec<u8> {
    let mut p = Vec::with_capacity(HELLO);
    p.extend_from_slice(&world.to_le_bytes());
    p.extend_from_slice(&local_rank.to_le_bytes());
    p.extend_from_slice(nonce);
    p
}

/// A hello's fields, when it has exactly their size: (world, local rank, nonce).
pub(crate) fn parse_hello(p: &[u8]) -> Option<(u16, u16, [u8; auth::NONCE])> {
    if p.len() != HELLO {
        return None;
    }
    let world = u16::from_le_bytes([p[0], p[1]]);
    let local = u16::from_le_bytes([p[2], p[3]]);
    Some((world, local, p[4..].try_into().ok()?))
}

/// The challenge's payload: the root's nonce and proof.
pub(crate) fn challenge(nonce: &[u8; auth::NONCE], proof: &[u8; auth::PROOF]) -> Vec<u8> {
    [&nonce[..], &proof[..]].concat()
}

/// A challenge's fields, when it has exactly their size: (nonce, proof).
pub(crate) fn parse_challenge(p: &[u8]) -> Option<([u8; auth::NONCE], [u8; auth::PROOF])> {
    if p.len() != CHALLENGE {
        return None;
    }
    let (n, m) = p.split_at(auth::NONCE);
    Some((n.try_into().ok()?, m.try_into().ok()?))
}

/// A refusal as a payload: a code and two values.
pub(crate) fn refusal(r: Refusal) -> Vec<u8> {
    let (code, a, b) = match r {
        Refusal::User { expected, found } => (1, expected, found),
        Refusal::Token => (2, 0, 0),
        Refusal::World { expected, found } => (3, expected as u32, found as u32),
        Refusal::Rank { rank, world } => (4, rank as u32, world as u32),
        Refusal::Duplicate { rank } => (5, rank as u32, 0),
        Refusal::Malformed => (6, 0, 0),
        Refusal::Busy => (7, 0, 0),
    };
    let mut p = vec![code];
    p.extend_from_slice(&a.to_le_bytes());
    p.extend_from_slice(&b.to_le_bytes());
    p
}

/// A refusal from its payload.
pub(crate) fn parse_refusal(p: &[u8]) -> Option<Refusal> {
    if p.len() != 9 {
        return None;
    }
    let a = u32::from_le_bytes([p[1], p[2], p[3], p[4]]);
    let b = u32::from_le_bytes([p[5], p[6], p[7], p[8]]);
    let (a16, b16) = (u16::try_from(a).ok(), u16::try_from(b).ok());
    Some(match p[0] {
        1 => Refusal::User {
            expected: a,
            found: b,
        },
        2 => Refusal::Token,
        3 => Refusal::World {
            expected: a16?,
            found: b16?,
        },
        4 => Refusal::Rank {
            rank: a16?,
            world: b16?,
        },
        5 => Refusal::Duplicate { rank: a16? },
        6 => Refusal::Malformed,
        7 => Refusal::Busy,
        _ => return None,
    })
}

/// A list of ranks as a payload.
pub(crate) fn ranks(list: &[u16]) -> Vec<u8> {
    list.iter().flat_map(|r| r.to_le_bytes()).collect()
}

/// A list of ranks from its payload.
pub(crate) fn parse_ranks(p: &[u8]) -> Option<Vec<u16>> {
    p.len().is_multiple_of(2).then(|| {
        p.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    })
}

/// Why the root failed a collective, as the other ranks learn it.
pub(crate) fn abort(e: &BootstrapError) -> Vec<u8> {
    let (code, rank) = match e {
        BootstrapError::PeerLost { rank } => (1, *rank),
        BootstrapError::Timeout { waiting_for, .. } => {
            (2, waiting_for.first().copied().unwrap_or(0))
        }
        BootstrapError::Mismatch { rank, .. } => (3, *rank),
        BootstrapError::Protocol { rank, .. } => (4, *rank),
        BootstrapError::Recovering { rank } => (6, *rank),
        _ => (5, 0),
    };
    let mut p = vec![code];
    p.extend_from_slice(&rank.to_le_bytes());
    p
}

/// The error an abort payload stands for, in collective `op`.
pub(crate) fn parse_abort(p: &[u8], op: &'static str) -> BootstrapError {
    let rank = match p {
        [_, a, b] => u16::from_le_bytes([*a, *b]),
        _ => {
            return BootstrapError::Protocol {
                rank: 0,
                what: "malformed abort",
            }
        }
    };
    match p[0] {
        1 => BootstrapError::PeerLost { rank },
        2 => BootstrapError::Timeout {
            op,
            waiting_for: vec![rank],
        },
        3 => BootstrapError::Mismatch {
            rank,
            expected: op,
            found: "another collective",
        },
        4 => BootstrapError::Protocol {
            rank,
            what: "reported by the root",
        },
        6 => BootstrapError::Recovering { rank },
        _ => BootstrapError::Protocol {
            rank: 0,
            what: "the root failed the collective",
        },
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
