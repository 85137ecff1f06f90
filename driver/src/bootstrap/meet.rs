//! The rendezvous: rank 0 listens, every other rank connects and says hello.
//!
//! Root: binds `@symm-<job>-<uid>` (abstract namespace), then until every rank has arrived or
//! the deadline passes, waits on the listener and the connections that have not said hello yet
//! (one `poll`, so a silent connection delays nobody). Each accepted connection is checked in
//! this order, and refused with the reason sent back:
//!
//! 1. the peer's effective uid (`SO_PEERCRED`) equals the root's, before anything is read;
//! 2. the first frame is a hello of this version; the token matches (constant time);
//! 3. the world size agrees, the rank is in range and not taken (rank 0 is the root's).
//!
//! An accepted rank gets `Accepted`. When all have arrived the root closes the listener (the name
//! is free again) and sends `Ready` to every rank; at the deadline it sends `Failed` with the
//! missing ranks instead, and returns [`BootstrapError::Missing`] naming them and what it refused.
//! Refusals do not end the root's rendezvous: a stray or hostile connection cannot stop a job.
//!
//! Rank: connects with backoff (1 ms doubling to 100 ms) until the deadline, checks that the root
//! runs as its own user before sending the token, sends its hello and waits for the verdict. An
//! accepted rank waits [`VERDICT_GRACE`] past its own deadline for `Ready` or `Failed`, so that
//! when the root gives up it learns which ranks were missing.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use super::env::JobEnv;
use super::error::{BootstrapError, Refusal, Result};
use super::sys;
use super::wire::{self, Head, Kind, LinkError};

/// How long past its deadline an accepted rank waits for the root's verdict.
pub const VERDICT_GRACE: Duration = Duration::from_secs(2);
/// How long the root spends telling a refused or abandoned peer why.
const NOTICE: Duration = Duration::from_millis(100);
/// Connections that have not said hello yet, beyond the world size.
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

/// The root's checks of a hello, in order: token, world, rank.
fn check_hello(
    job: &JobEnv,
    taken: &[Option<OwnedFd>],
    head: Head,
    payload: &[u8],
) -> std::result::Result<u16, Refusal> {
    if head.kind != Kind::Hello {
        return Err(Refusal::Malformed);
    }
    let (world, _local, token) = wire::parse_hello(payload).ok_or(Refusal::Malformed)?;
    if !job.token.matches(token) {
        return Err(Refusal::Token);
    }
    if world != job.world {
        return Err(Refusal::World {
            expected: job.world,
            found: world,
        });
    }
    let rank = head.rank;
    if rank >= job.world {
        return Err(Refusal::Rank {
            rank,
            world: job.world,
        });
    }
    if rank == 0 || taken.get(rank as usize).is_some_and(Option::is_some) {
        return Err(Refusal::Duplicate { rank });
    }
    Ok(rank)
}

/// Tells a peer it is refused, best effort, and drops the connection.
fn refuse(fd: OwnedFd, why: Refusal, refused: &mut Vec<Refusal>) {
    let head = Head::control(Kind::Refused, 0);
    let _ = wire::send(
        fd.as_fd(),
        head,
        &wire::refusal(why),
        &[],
        Instant::now() + NOTICE,
    );
    if refused.len() < 1024 {
        refused.push(why);
    }
}

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
    let mut pending: Vec<OwnedFd> = Vec::new();
    let mut refused = Vec::new();
    let mut buf = vec![0u8; wire::MAX_FRAME];
    while arrived < world {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut set: Vec<sys::Watch> = std::iter::once(&listener)
            .chain(&pending)
            .map(|fd| sys::Watch {
                fd: std::os::fd::AsRawFd::as_raw_fd(fd),
                events: sys::POLLIN,
                revents: 0,
            })
            .collect();
        sys::poll(&mut set, Some(left)).map_err(|e| BootstrapError::sys("poll", e))?;
        // Hellos first, from the connections already waiting.
        let mut keep = Vec::with_capacity(pending.len());
        for (fd, w) in pending.drain(..).zip(&set[1..]) {
            if w.revents == 0 {
                keep.push(fd);
                continue;
            }
            match wire::try_recv(fd.as_fd(), &mut buf) {
                Ok(None) => keep.push(fd),
                Ok(Some(f)) => match check_hello(job, &ranks, f.head, &f.payload) {
                    Ok(rank) => {
                        let head = Head::control(Kind::Accepted, 0);
                        if wire::send(fd.as_fd(), head, &[], &[], deadline).is_ok() {
                            ranks[rank as usize] = Some(fd);
                            arrived += 1;
                        }
                    }
                    Err(why) => refuse(fd, why, &mut refused),
                },
                Err(LinkError::Protocol(_)) => refuse(fd, Refusal::Malformed, &mut refused),
                Err(_) => {} // gone before saying hello
            }
        }
        pending = keep;
        if set[0].revents != 0 {
            loop {
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
                } else if pending.len() >= world + EXTRA_PENDING {
                    refuse(fd, Refusal::Busy, &mut refused);
                } else {
                    pending.push(fd);
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

/// What the root answered.
fn verdict(f: wire::Frame, want: Kind) -> Result<()> {
    match f.head.kind {
        k if k == want => Ok(()),
        Kind::Refused => Err(BootstrapError::Refused(
            wire::parse_refusal(&f.payload).unwrap_or(Refusal::Malformed),
        )),
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

/// Rank other than 0: joins the root. Returns the connection to it.
pub(crate) fn join(job: &JobEnv, deadline: Instant) -> Result<OwnedFd> {
    let uid = sys::euid();
    let name = job.socket_name(uid);
    let fd = connect(&name, deadline)?;
    let root_uid = sys::peer_uid(fd.as_fd()).map_err(|e| BootstrapError::sys("SO_PEERCRED", e))?;
    check_root(uid, root_uid)?;
    let mut buf = vec![0u8; wire::MAX_FRAME];
    let head = Head::control(Kind::Hello, job.rank);
    let hello = wire::hello(job.world, job.local_rank, job.token.bytes());
    let during = |e: LinkError| e.at(0, "rendezvous");
    if let Err(e) = wire::send(fd.as_fd(), head, &hello, &[], deadline) {
        // The root may have refused (and closed) before reading: its reason is still queued.
        if let Ok(Some(f)) = wire::try_recv(fd.as_fd(), &mut buf) {
            verdict(f, Kind::Accepted)?;
        }
        return Err(during(e));
    }
    let f = wire::recv(fd.as_fd(), &mut buf, deadline).map_err(during)?;
    verdict(f, Kind::Accepted)?;
    let f =
        wire::recv(fd.as_fd(), &mut buf, wire::after(deadline, VERDICT_GRACE)).map_err(during)?;
    verdict(f, Kind::Ready)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::env::Token;
    use std::os::fd::BorrowedFd;

    fn job(rank: u16, world: u16, name: &str) -> JobEnv {
        JobEnv {
            rank,
            world,
            local_rank: rank,
            job: format!("u{}-{name}", std::process::id()),
            token: Token::from_bytes(&[7; 32]).unwrap(),
        }
    }

    /// Connects to `name` and sends `parts` with `fds`; returns what the root answered.
    fn poke(name: &str, parts: &[&[u8]], fds: &[BorrowedFd<'_>]) -> Option<Refusal> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let fd = connect(name, deadline).unwrap();
        sys::send(fd.as_fd(), parts, fds).unwrap();
        let mut buf = vec![0u8; wire::MAX_FRAME];
        let f = wire::recv(fd.as_fd(), &mut buf, deadline).ok()?;
        assert_eq!(f.head.kind, Kind::Refused);
        wire::parse_refusal(&f.payload)
    }

    #[test]
    fn hostile_hellos_are_refused_and_the_root_goes_on() {
        let root_job = job(0, 2, "hostile");
        let name = root_job.socket_name(sys::euid());
        let root = std::thread::spawn(move || {
            root(&root_job, Instant::now() + Duration::from_secs(30)).map(|l| l.len())
        });
        // A connection that never speaks delays nobody.
        let silent = connect(&name, Instant::now() + Duration::from_secs(20)).unwrap();
        let garbage = [0xAAu8; 100];
        assert_eq!(poke(&name, &[&garbage], &[]), Some(Refusal::Malformed));
        let huge = vec![0u8; wire::MAX_FRAME + 4096];
        assert_eq!(poke(&name, &[&huge], &[]), Some(Refusal::Malformed));
        let me = job(1, 2, "hostile");
        let head = Head::control(Kind::Hello, 1).encode_for_test(37);
        let hello = wire::hello(2, 1, me.token.bytes());
        let file = crate::bootstrap::memfd("x").unwrap();
        let fds = [file.as_fd()];
        assert_eq!(
            poke(&name, &[&head, &hello], &fds),
            Some(Refusal::Malformed)
        );
        let wrong_world = wire::hello(3, 1, me.token.bytes());
        assert_eq!(
            poke(&name, &[&head, &wrong_world], &[]),
            Some(Refusal::World {
                expected: 2,
                found: 3
            })
        );
        let head9 = Head::control(Kind::Hello, 9).encode_for_test(37);
        assert_eq!(
            poke(&name, &[&head9, &hello], &[]),
            Some(Refusal::Rank { rank: 9, world: 2 })
        );
        let head0 = Head::control(Kind::Hello, 0).encode_for_test(37);
        assert_eq!(
            poke(&name, &[&head0, &hello], &[]),
            Some(Refusal::Duplicate { rank: 0 })
        );
        // The real rank 1 still gets in.
        let link = join(&me, Instant::now() + Duration::from_secs(20)).unwrap();
        assert_eq!(root.join().unwrap(), Ok(1));
        drop((link, silent));
    }

    #[test]
    fn only_the_same_user_is_accepted() {
        assert_eq!(check_user(1000, 1000), Ok(()));
        assert_eq!(
            check_user(1000, 0),
            Err(Refusal::User {
                expected: 1000,
                found: 0
            })
        );
        assert_eq!(
            check_user(0, 1000),
            Err(Refusal::User {
                expected: 0,
                found: 1000
            })
        );
        assert!(check_root(5, 5).is_ok());
        assert_eq!(
            check_root(5, 6),
            Err(BootstrapError::UntrustedRoot { uid: 6, ours: 5 })
        );
        // The uid this process reports is the one its peers see.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(sys::peer_uid(a.as_fd()).unwrap(), sys::euid());
        drop(b);
    }
}
