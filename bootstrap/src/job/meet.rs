//! The rendezvous: rank 0 listens, every other rank connects, and each side proves to the other
//! that it knows the job's token.
//!
//! Root: binds `@symm-<job>-<uid>` (abstract namespace), then until every rank has arrived or
//! the deadline passes, waits on the listener and the connections that have not finished their
//! handshake (one `poll`, so a silent connection delays nobody). Each accepted connection goes
//! through these steps, and is refused with the reason sent back at the first that fails:
//!
//! 1. the peer's effective uid (`SO_PEERCRED`) equals the root's, before anything is read;
//! 2. its first frame is a hello of this version (claimed rank, world, local rank, the rank's
//!    nonce); the root answers with a challenge: its own nonce and its proof of the token
//!    (HMAC-SHA256, see the `auth` module) over the claims and both nonces;
//! 3. its next frame is the rank's proof over the same transcript, checked in constant time;
//! 4. the world size agrees, the rank is in range and not taken (rank 0 is the root's).
//!
//! An accepted rank gets `Accepted`. When all have arrived the root closes the listener (the name
//! is free again) and sends `Ready` to every rank; at the deadline it sends `Failed` with the
//! missing ranks instead, and returns [`BootstrapError::Missing`] naming them and what it refused.
//! Refusals do not end the root's rendezvous: a stray or hostile connection cannot stop a job.
//! Connections in their handshake are bounded (the world size plus 64); when a new one finds
//! every place taken, the oldest that has not said hello (else the oldest that has not
//! answered its challenge in time) is refused `Busy` and the new one takes its place, so a
//! flood of silent or mute connections bounds the root's memory and still lets every rank in.
//!
//! Rank: connects with backoff (1 ms doubling to 100 ms) until the deadline, checks that the root
//! runs as its own user, sends its hello and checks the root's proof before it proves anything
//! itself: a process that bound the job's name first (another job of the same user, or anyone
//! in a container where every process is uid 0) gets a hello with a nonce and nothing else, and
//! the rank fails with [`BootstrapError::Unauthenticated`]. The token itself never travels. An
//! accepted rank waits [`VERDICT_GRACE`] past its own deadline for `Ready` or `Failed`, so that
//! when the root gives up it learns which ranks were missing.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use super::auth::{self, Role, Transcript};
use super::env::JobEnv;
use super::error::{BootstrapError, Refusal, Result};
use super::sys;
use super::wire::{self, Frame, Head, Kind, LinkError};

/// How long past its deadline an accepted rank waits for the root's verdict.
pub const VERDICT_GRACE: Duration = Duration::from_secs(2);
/// How long the root spends telling a refused or abandoned peer why, or sending it a challenge.
const NOTICE: Duration = Duration::from_millis(100);
/// Connections that have not finished their handshake yet, beyond the world size; past it, a
/// new connection takes the place of an older one (`evicted`).
const EXTRA_PENDING: usize = 64;

/// The root's uid check: a peer must run as the root's own user (root included: no exception).
pub(crate) fn check_user(ours: u32, peer: u32) -> std::result::Result<(), Refusal> {
    if peer == ours {
        Ok(())
    } else {
        Err(Refusal::User {
            expected: ours,
            found: peer,
        })
    }
}

/// A rank's check of the process listening on the job's socket.
pub(crate) fn check_root(ours: u32, root: u32) -> Result<()> {
    if root == ours {
        Ok(())
    } else {
        Err(BootstrapError::UntrustedRoot { uid: root, ours })
    }
}

/// What a hello claimed, kept until the rank's proof.
#[derive(Clone, Copy)]
struct Claim {
    rank: u16,
    world: u16,
    local: u16,
    rank_nonce: [u8; auth::NONCE],
}

/// A connection in its handshake.
struct Pending {
    fd: OwnedFd,
    /// The root's nonce for this connection.
    nonce: [u8; auth::NONCE],
    /// Set once the hello came and the challenge went.
    claim: Option<Claim>,
    /// When the challenge went.
    challenged: Option<Instant>,
}

impl Pending {
    fn transcript<'a>(&self, job: &'a JobEnv, c: Claim) -> Transcript<'a> {
        Transcript {
            job: &job.job,
            rank: c.rank,
            world: c.world,
            local: c.local,
            rank_nonce: c.rank_nonce,
            root_nonce: self.nonce,
        }
    }
}

/// Where a connection's handshake stands after a frame.
enum Step {
    /// The hello came and the challenge went: wait for the proof.
    Challenged,
    /// The proof holds and the claims fit: the connection is this rank's.
    Member(u16),
}

/// The root's handling of a frame from a connection in its handshake.
fn step(
    job: &JobEnv,
    taken: &[Option<OwnedFd>],
    p: &mut Pending,
    f: Frame,
) -> std::result::Result<Step, Refusal> {
    let Some(claim) = p.claim else {
        if f.head.kind != Kind::Hello {
            return Err(Refusal::Malformed);
        }
        let (world, local, rank_nonce) = wire::parse_hello(&f.payload).ok_or(Refusal::Malformed)?;
        let claim = Claim {
            rank: f.head.rank,
            world,
            local,
            rank_nonce,
        };
        let proof = p.transcript(job, claim).prove(&job.token, Role::Root);
        let head = Head::control(Kind::Challenge, 0);
        let payload = wire::challenge(&p.nonce, &proof);
        // A peer that does not take its challenge at once is dropped (without a reason: it
        // would not read one either).
        wire::send(p.fd.as_fd(), head, &payload, &[], Instant::now() + NOTICE)
            .map_err(|_| Refusal::Malformed)?;
        p.claim = Some(claim);
        p.challenged = Some(Instant::now());
        return Ok(Step::Challenged);
    };
    if f.head.kind != Kind::Proof || f.head.rank != claim.rank {
        return Err(Refusal::Malformed);
    }
    if !p
        .transcript(job, claim)
        .verify(&job.token, Role::Rank, &f.payload)
    {
        return Err(Refusal::Token);
    }
    if claim.world != job.world {
        return Err(Refusal::World {
            expected: job.world,
            found: claim.world,
        });
    }
    let rank = claim.rank;
    if rank >= job.world {
        return Err(Refusal::Rank {
            rank,
            world: job.world,
        });
    }
    if rank == 0 || taken.get(rank as usize).is_some_and(Option::is_some) {
        return Err(Refusal::Duplicate { rank });
    }
    Ok(Step::Member(rank))
}

/// Frames the root reads and drops from a refused connection before closing it.
const DRAIN: usize = 4;

/// Tells a peer it is refused, best effort, and drops the connection. What the peer already
/// sent is read first (a few frames at most): closing a socket with unread data resets the
/// peer's end, and the reset would reach the peer ahead of the reason.
fn refuse(fd: OwnedFd, why: Refusal, refused: &mut Vec<Refusal>) {
    let head = Head::control(Kind::Refused, 0);
    let _ = wire::send(
        fd.as_fd(),
        head,
        &wire::refusal(why),
        &[],
        Instant::now() + NOTICE,
    );
    let mut scrap = [0u8; 64];
    for _ in 0..DRAIN {
        // Truncated into a small buffer (the kernel drops the rest); descriptors closed.
        match sys::recv(fd.as_fd(), &mut scrap, 0) {
            Ok(got) if got.len > 0 || !got.fds.is_empty() => {}
            _ => break,
        }
    }
    if refused.len() < 1024 {
        refused.push(why);
    }
}

/// The connection that gives up its place when every place is taken and another arrives: the
/// oldest that has not said hello, else the oldest that was challenged more than [`NOTICE`]
/// ago and has not answered; none (the new one is refused) when every place holds a
/// connection challenged just now. `pending` is in order of arrival. A rank says hello as it
/// connects and answers its challenge within a round trip, and the root reads what waiting
/// connections sent before it accepts more than [`ACCEPTS_PER_PASS`] new ones, so silent or
/// mute connections, however many, cannot keep a rank out.
fn evicted(pending: &[Pending], now: Instant) -> Option<usize> {
    pending.iter().position(|p| p.claim.is_none()).or_else(|| {
        pending
            .iter()
            .position(|p| p.challenged.is_some_and(|t| now.duration_since(t) > NOTICE))
    })
}

/// Connections the root accepts before it reads again from those already waiting.
const ACCEPTS_PER_PASS: usize = 16;

/// Root: waits for every rank. Returns the connections, index `r - 1` for rank `r`.
pub(crate) fn root(job: &JobEnv, deadline: Instant) -> Result<Vec<OwnedFd>> {
    let uid = sys::euid();
    let name = job.socket_name(uid);
    let listener = sys::seqpacket_socket().map_err(|e| BootstrapError::sys("socket", e))?;
    let backlog = job.world as i32 + 16;
    sys::bind_listen(listener.as_fd(), name.as_bytes(), backlog).map_err(|e| {
        if e.raw_os_error() == Some(sys::EADDRINUSE) {
            BootstrapError::NameTaken { name: name.clone() }
        } else {
            BootstrapError::sys("bind", e)
        }
    })?;
    let world = job.world as usize;
    let mut ranks: Vec<Option<OwnedFd>> = (0..world).map(|_| None).collect();
    let mut arrived = 1;
    let mut pending: Vec<Pending> = Vec::new();
    let mut refused = Vec::new();
    let mut buf = vec![0u8; wire::MAX_FRAME];
    while arrived < world {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut set: Vec<sys::Watch> = std::iter::once(&listener)
            .chain(pending.iter().map(|p| &p.fd))
            .map(|fd| sys::Watch {
                fd: std::os::fd::AsRawFd::as_raw_fd(fd),
                events: sys::POLLIN,
                revents: 0,
            })
            .collect();
        sys::poll(&mut set, Some(left)).map_err(|e| BootstrapError::sys("poll", e))?;
        // Handshakes first, on the connections already waiting.
        let mut keep = Vec::with_capacity(pending.len());
        for (mut p, w) in pending.drain(..).zip(&set[1..]) {
            if w.revents == 0 {
                keep.push(p);
                continue;
            }
            match wire::try_recv(p.fd.as_fd(), &mut buf) {
                Ok(None) => keep.push(p),
                Ok(Some(f)) => match step(job, &ranks, &mut p, f) {
                    Ok(Step::Challenged) => keep.push(p),
                    Ok(Step::Member(rank)) => {
                        let head = Head::control(Kind::Accepted, 0);
                        if wire::send(p.fd.as_fd(), head, &[], &[], deadline).is_ok() {
                            ranks[rank as usize] = Some(p.fd);
                            arrived += 1;
                        }
                    }
                    Err(why) => refuse(p.fd, why, &mut refused),
                },
                Err(LinkError::Protocol(_)) => refuse(p.fd, Refusal::Malformed, &mut refused),
                Err(_) => {} // gone during its handshake
            }
        }
        pending = keep;
        if set[0].revents != 0 {
            for _ in 0..ACCEPTS_PER_PASS {
                let fd = match sys::accept(listener.as_fd()) {
                    Ok(fd) => fd,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    // A connection that died in the queue, or a transient shortage: keep serving.
                    Err(_) => break,
                };
                let peer = match sys::peer_uid(fd.as_fd()) {
                    Ok(u) => u,
                    Err(_) => continue,
                };
                if let Err(why) = check_user(uid, peer) {
                    refuse(fd, why, &mut refused);
                } else {
                    if pending.len() >= world + EXTRA_PENDING {
                        match evicted(&pending, Instant::now()) {
                            Some(i) => {
                                let old = pending.remove(i);
                                refuse(old.fd, Refusal::Busy, &mut refused);
                            }
                            None => {
                                refuse(fd, Refusal::Busy, &mut refused);
                                continue;
                            }
                        }
                    }
                    let nonce = auth::nonce().map_err(|e| BootstrapError::sys("getrandom", e))?;
                    pending.push(Pending {
                        fd,
                        nonce,
                        claim: None,
                        challenged: None,
                    });
                }
            }
        }
    }
    drop(listener);
    drop(pending);
    if arrived < world {
        let missing: Vec<u16> = (1..job.world)
            .filter(|&r| ranks[r as usize].is_none())
            .collect();
        let notice = Instant::now() + NOTICE;
        for fd in ranks.iter().flatten() {
            let head = Head::control(Kind::Failed, 0);
            let _ = wire::send(fd.as_fd(), head, &wire::ranks(&missing), &[], notice);
        }
        return Err(BootstrapError::Missing {
            ranks: missing,
            refused,
        });
    }
    let links: Vec<OwnedFd> = ranks.into_iter().skip(1).flatten().collect();
    for (i, fd) in links.iter().enumerate() {
        let head = Head::control(Kind::Ready, 0);
        wire::send(fd.as_fd(), head, &[], &[], wire::after(deadline, NOTICE))
            .map_err(|e| e.at(i as u16 + 1, "rendezvous"))?;
    }
    Ok(links)
}

/// Connects to the root's socket, retrying until `deadline`.
fn connect(name: &str, deadline: Instant) -> Result<OwnedFd> {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(1);
    loop {
        let fd = sys::seqpacket_socket().map_err(|e| BootstrapError::sys("socket", e))?;
        match sys::connect(fd.as_fd(), name.as_bytes()) {
            Ok(()) => return Ok(fd),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || matches!(e.raw_os_error(), Some(sys::ECONNREFUSED | sys::ENOENT)) => {}
            Err(e) => return Err(BootstrapError::sys("connect", e)),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BootstrapError::NoRoot {
                name: name.to_string(),
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(Duration::from_millis(100));
    }
}

/// A frame the root sent before it closed, if one is still queued. When the root closes with
/// this rank's frame unread, the kernel reports a reset (once) ahead of what the root had sent:
/// reading again finds it.
fn queued(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Option<Frame> {
    for _ in 0..3 {
        match wire::try_recv(fd, buf) {
            Ok(f) => return f,
            Err(LinkError::Closed) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// The root's next frame by `deadline`; a refusal the root sent before closing is read even
/// when a reset overtakes it.
fn from_root(fd: BorrowedFd<'_>, buf: &mut [u8], deadline: Instant) -> Result<Frame, LinkError> {
    match wire::recv(fd, buf, deadline) {
        Err(LinkError::Closed) => queued(fd, buf).ok_or(LinkError::Closed),
        r => r,
    }
}

/// The refusal a `Refused` frame carries.
fn refused(f: &Frame) -> BootstrapError {
    BootstrapError::Refused(wire::parse_refusal(&f.payload).unwrap_or(Refusal::Malformed))
}

/// What the root answered.
fn verdict(f: Frame, want: Kind) -> Result<()> {
    match f.head.kind {
        k if k == want => Ok(()),
        Kind::Refused => Err(refused(&f)),
        Kind::Failed => Err(BootstrapError::Missing {
            ranks: wire::parse_ranks(&f.payload).unwrap_or_default(),
            refused: Vec::new(),
        }),
        _ => Err(BootstrapError::Protocol {
            rank: 0,
            what: "unexpected frame during the rendezvous",
        }),
    }
}

/// Rank other than 0: joins the root, after the root proved that it knows the token. Returns
/// the connection to it.
pub(crate) fn join(job: &JobEnv, deadline: Instant) -> Result<OwnedFd> {
    let uid = sys::euid();
    let name = job.socket_name(uid);
    let fd = connect(&name, deadline)?;
    let root_uid = sys::peer_uid(fd.as_fd()).map_err(|e| BootstrapError::sys("SO_PEERCRED", e))?;
    check_root(uid, root_uid)?;
    let rank_nonce = auth::nonce().map_err(|e| BootstrapError::sys("getrandom", e))?;
    let mut buf = vec![0u8; wire::MAX_FRAME];
    let hello = wire::hello(job.world, job.local_rank, &rank_nonce);
    let during = |e: LinkError| e.at(0, "rendezvous");
    if let Err(e) = wire::send(
        fd.as_fd(),
        Head::control(Kind::Hello, job.rank),
        &hello,
        &[],
        deadline,
    ) {
        // The root may have refused (and closed) before reading: its reason is still queued.
        if let Some(f) = queued(fd.as_fd(), &mut buf) {
            verdict(f, Kind::Challenge)?;
        }
        return Err(during(e));
    }
    let f = from_root(fd.as_fd(), &mut buf, deadline).map_err(during)?;
    let unproven = || BootstrapError::Unauthenticated { name: name.clone() };
    let (root_nonce, root_proof) = match f.head.kind {
        Kind::Challenge => wire::parse_challenge(&f.payload).ok_or_else(unproven)?,
        Kind::Refused => return Err(refused(&f)),
        // Anything else in place of the challenge is a root that did not prove itself.
        _ => return Err(unproven()),
    };
    let t = Transcript {
        job: &job.job,
        rank: job.rank,
        world: job.world,
        local: job.local_rank,
        rank_nonce,
        root_nonce,
    };
    if !t.verify(&job.token, Role::Root, &root_proof) {
        return Err(unproven());
    }
    let proof = t.prove(&job.token, Role::Rank);
    let head = Head::control(Kind::Proof, job.rank);
    if let Err(e) = wire::send(fd.as_fd(), head, &proof, &[], deadline) {
        if let Some(f) = queued(fd.as_fd(), &mut buf) {
            verdict(f, Kind::Accepted)?;
        }
        return Err(during(e));
    }
    let f = from_root(fd.as_fd(), &mut buf, deadline).map_err(during)?;
    verdict(f, Kind::Accepted)?;
    let f =
        wire::recv(fd.as_fd(), &mut buf, wire::after(deadline, VERDICT_GRACE)).map_err(during)?;
    verdict(f, Kind::Ready)?;
    Ok(fd)
}

#[cfg(test)]
#[path = "meet_tests.rs"]
mod tests;
