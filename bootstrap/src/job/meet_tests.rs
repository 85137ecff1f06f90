//! The rendezvous against hostile peers: malformed handshakes, squatters on either side.

use super::*;
use crate::job::env::Token;
use crate::job::SocketBootstrap;
use std::os::fd::BorrowedFd;

const LONG: Duration = Duration::from_secs(20);

fn job(rank: u16, world: u16, name: &str) -> JobEnv {
    JobEnv {
        rank,
        world,
        local_rank: rank,
        job: format!("u{}-{name}", std::process::id()),
        token: Token::from_bytes(&[7; 32]).unwrap(),
    }
}

/// Receives one frame by a long deadline.
fn answer(fd: BorrowedFd<'_>) -> Option<Frame> {
    let mut buf = vec![0u8; wire::MAX_FRAME];
    wire::recv(fd, &mut buf, Instant::now() + LONG).ok()
}

/// The refusal in a frame, which must be one.
fn refusal_in(f: Option<Frame>) -> Option<Refusal> {
    let f = f?;
    assert_eq!(f.head.kind, Kind::Refused);
    wire::parse_refusal(&f.payload)
}

/// Connects to `name` and sends `parts` with `fds`; returns what the root answered.
fn poke(name: &str, parts: &[&[u8]], fds: &[BorrowedFd<'_>]) -> Option<Refusal> {
    let fd = connect(name, Instant::now() + LONG).unwrap();
    sys::send(fd.as_fd(), parts, fds).unwrap();
    refusal_in(answer(fd.as_fd()))
}

/// A hello of rank `rank` claiming `world`, with nonce `nonce`.
fn hello_frame(rank: u16, world: u16, nonce: &[u8; auth::NONCE]) -> Vec<u8> {
    let payload = wire::hello(world, rank, nonce);
    let mut b = Head::control(Kind::Hello, rank)
        .encode_for_test(payload.len())
        .to_vec();
    b.extend_from_slice(&payload);
    b
}

fn proof_frame(rank: u16, proof: &[u8]) -> Vec<u8> {
    let mut b = Head::control(Kind::Proof, rank)
        .encode_for_test(proof.len())
        .to_vec();
    b.extend_from_slice(proof);
    b
}

/// Does the handshake as rank `rank` of `world`, proving with `token`: the root's refusal, or
/// `None` when it accepted. Checks the root's proof on the way.
fn handshake(name: &str, job_name: &str, rank: u16, world: u16, token: &Token) -> Option<Refusal> {
    let fd = connect(name, Instant::now() + LONG).unwrap();
    let rank_nonce = auth::nonce().unwrap();
    sys::send(fd.as_fd(), &[&hello_frame(rank, world, &rank_nonce)], &[]).unwrap();
    let f = answer(fd.as_fd()).unwrap();
    if f.head.kind == Kind::Refused {
        return wire::parse_refusal(&f.payload);
    }
    assert_eq!(f.head.kind, Kind::Challenge);
    let (root_nonce, root_proof) = wire::parse_challenge(&f.payload).unwrap();
    let t = Transcript {
        job: job_name,
        rank,
        world,
        local: rank,
        rank_nonce,
        root_nonce,
    };
    // Whatever this peer claims, the real root proves itself for exactly those claims.
    let real = Token::from_bytes(&[7; 32]).unwrap();
    assert!(t.verify(&real, Role::Root, &root_proof));
    let proof = t.prove(token, Role::Rank);
    sys::send(fd.as_fd(), &[&proof_frame(rank, &proof)], &[]).unwrap();
    let f = answer(fd.as_fd()).unwrap();
    match f.head.kind {
        Kind::Accepted => None,
        _ => refusal_in(Some(f)),
    }
}

#[test]
fn hostile_handshakes_are_refused_and_the_root_goes_on() {
    let root_job = job(0, 2, "hostile");
    let name = root_job.socket_name(sys::euid());
    let job_name = root_job.job.clone();
    let root = std::thread::spawn(move || {
        root(&root_job, Instant::now() + Duration::from_secs(30)).map(|l| l.len())
    });
    // A connection that never speaks delays nobody.
    let silent = connect(&name, Instant::now() + LONG).unwrap();
    let garbage = [0xAAu8; 100];
    assert_eq!(poke(&name, &[&garbage], &[]), Some(Refusal::Malformed));
    let huge = vec![0u8; wire::MAX_FRAME + 4096];
    assert_eq!(poke(&name, &[&huge], &[]), Some(Refusal::Malformed));
    let nonce = [3u8; auth::NONCE];
    let hello = hello_frame(1, 2, &nonce);
    let file = crate::job::memfd("x").unwrap();
    assert_eq!(
        poke(&name, &[&hello], &[file.as_fd()]),
        Some(Refusal::Malformed)
    );
    // A hello one byte short or long, a proof before any hello.
    let head = Head::control(Kind::Hello, 1);
    for len in [auth::NONCE + 3, auth::NONCE + 5] {
        let payload = vec![0u8; len];
        assert_eq!(
            poke(&name, &[&head.encode_for_test(len), &payload], &[]),
            Some(Refusal::Malformed)
        );
    }
    assert_eq!(
        poke(&name, &[&proof_frame(1, &[0; auth::PROOF])], &[]),
        Some(Refusal::Malformed)
    );
    // Without the token: refused as unauthenticated, whatever it claims.
    let wrong = Token::from_bytes(&[8; 32]).unwrap();
    let good = Token::from_bytes(&[7; 32]).unwrap();
    assert_eq!(
        handshake(&name, &job_name, 1, 2, &wrong),
        Some(Refusal::Token)
    );
    assert_eq!(
        handshake(&name, &job_name, 9, 7, &wrong),
        Some(Refusal::Token)
    );
    // With it: the claims are checked next.
    assert_eq!(
        handshake(&name, &job_name, 1, 3, &good),
        Some(Refusal::World {
            expected: 2,
            found: 3
        })
    );
    assert_eq!(
        handshake(&name, &job_name, 9, 2, &good),
        Some(Refusal::Rank { rank: 9, world: 2 })
    );
    assert_eq!(
        handshake(&name, &job_name, 0, 2, &good),
        Some(Refusal::Duplicate { rank: 0 })
    );
    // The real rank 1 still gets in.
    let me = job(1, 2, "hostile");
    let link = join(&me, Instant::now() + LONG).unwrap();
    assert_eq!(root.join().unwrap(), Ok(1));
    drop((link, silent));
}

/// A peer that knows no token answers a challenge with what it has: the root's own proof sent
/// back, a proof from another rendezvous, or bytes of its choice. Each is refused; the root's
/// messages hold nothing of the token; the real rank still gets in.
#[test]
fn a_squatter_rank_without_the_token_is_refused_and_learns_nothing() {
    let root_job = job(0, 2, "squat-rank");
    let name = root_job.socket_name(sys::euid());
    let token = root_job.token.clone();
    let root = std::thread::spawn(move || {
        root(&root_job, Instant::now() + Duration::from_secs(30)).map(|l| l.len())
    });
    let mut seen: Vec<u8> = Vec::new();
    let mut old_proof: Option<Vec<u8>> = None;
    for attempt in 0..3 {
        let fd = connect(&name, Instant::now() + LONG).unwrap();
        let nonce = auth::nonce().unwrap();
        sys::send(fd.as_fd(), &[&hello_frame(1, 2, &nonce)], &[]).unwrap();
        let f = answer(fd.as_fd()).unwrap();
        assert_eq!(f.head.kind, Kind::Challenge);
        seen.extend_from_slice(&f.payload);
        let (_, root_proof) = wire::parse_challenge(&f.payload).unwrap();
        let reply = match (attempt, &old_proof) {
            (0, _) => root_proof.to_vec(),
            (1, Some(p)) => p.clone(),
            _ => vec![0x5A; auth::PROOF],
        };
        old_proof = Some(root_proof.to_vec());
        sys::send(fd.as_fd(), &[&proof_frame(1, &reply)], &[]).unwrap();
        let f = answer(fd.as_fd());
        if let Some(f) = &f {
            seen.extend_from_slice(&f.payload);
        }
        assert_eq!(refusal_in(f), Some(Refusal::Token), "attempt {attempt}");
    }
    let secret = token.bytes();
    assert!(!seen.windows(8).any(|w| secret.windows(8).any(|s| s == w)));
    let hex = token.to_hex();
    assert!(!seen
        .windows(16)
        .any(|w| hex.as_bytes().windows(16).any(|s| s == w)));
    let me = job(1, 2, "squat-rank");
    let link = join(&me, Instant::now() + LONG).unwrap();
    assert_eq!(root.join().unwrap(), Ok(1));
    drop(link);
}

/// How a squatter root answers a rank's hello.
#[derive(Clone, Copy, Debug)]
enum Forge {
    /// A challenge with a nonce and bytes of its choice as the proof.
    Random,
    /// A challenge proved with a token of its own.
    OwnToken,
    /// No challenge: `Accepted` and `Ready` at once.
    Skip,
}

/// A process of the same user binds the job's name first. The rank it fools must send it no
/// proof, no token and no descriptor, and fail naming authentication.
#[test]
fn a_squatter_root_gets_no_token_and_no_descriptor() {
    for (i, forge) in [Forge::Random, Forge::OwnToken, Forge::Skip]
        .into_iter()
        .enumerate()
    {
        let me = job(1, 2, &format!("squat-root-{i}"));
        let name = me.socket_name(sys::euid());
        let listener = sys::seqpacket_socket().unwrap();
        sys::bind_listen(listener.as_fd(), name.as_bytes(), 4).unwrap();
        let rank_job = me.clone();
        let rank = std::thread::spawn(move || {
            let boot = SocketBootstrap::join(&rank_job, Duration::from_secs(10))?;
            // Were it fooled, this is what it would hand over.
            let f = crate::job::memfd("heap").unwrap();
            boot.all_gather_fds(&[f.as_fd()], Duration::from_secs(5))?;
            boot.all_gather(rank_job.token.bytes(), Duration::from_secs(5))?;
            Ok::<(), BootstrapError>(())
        });
        wire::wait(listener.as_fd(), sys::POLLIN, Instant::now() + LONG).unwrap();
        let fd = sys::accept(listener.as_fd()).unwrap();
        // Everything the rank sends, raw, until it closes.
        let mut bytes = Vec::new();
        let mut fds = 0;
        let mut frames = 0;
        let mut buf = vec![0u8; wire::MAX_FRAME];
        let end = Instant::now() + LONG;
        loop {
            if wire::wait(fd.as_fd(), sys::POLLIN, end).is_err() {
                panic!("{forge:?}: the rank neither spoke nor closed");
            }
            let got = match sys::recv(fd.as_fd(), &mut buf, wire::MAX_FDS) {
                Ok(g) => g,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => break,
            };
            if got.len == 0 && got.fds.is_empty() {
                break;
            }
            frames += 1;
            fds += got.fds.len();
            bytes.extend_from_slice(&buf[..got.len]);
            if frames > 1 {
                continue;
            }
            let f = Frame::decode(&buf[..got.len], Vec::new()).unwrap();
            assert_eq!(f.head.kind, Kind::Hello, "{forge:?}");
            // Best effort: the rank may already have hung up on an earlier forged frame.
            let send = |kind: Kind, payload: &[u8]| {
                let _ = wire::send(
                    fd.as_fd(),
                    Head::control(kind, 0),
                    payload,
                    &[],
                    Instant::now() + LONG,
                );
            };
            match forge {
                Forge::Random => send(
                    Kind::Challenge,
                    &wire::challenge(&auth::nonce().unwrap(), &[0x42; auth::PROOF]),
                ),
                Forge::OwnToken => {
                    let (world, local, rank_nonce) = wire::parse_hello(&f.payload).unwrap();
                    let root_nonce = auth::nonce().unwrap();
                    let t = Transcript {
                        job: &me.job,
                        rank: f.head.rank,
                        world,
                        local,
                        rank_nonce,
                        root_nonce,
                    };
                    let mine = Token::random().unwrap();
                    let proof = t.prove(&mine, Role::Root);
                    send(Kind::Challenge, &wire::challenge(&root_nonce, &proof));
                }
                Forge::Skip => {
                    send(Kind::Accepted, &[]);
                    send(Kind::Ready, &[]);
                }
            }
        }
        let e = rank.join().unwrap().unwrap_err();
        assert_eq!(
            e,
            BootstrapError::Unauthenticated { name: name.clone() },
            "{forge:?}"
        );
        assert!(e.to_string().contains("authentication failed"), "{e}");
        // The hello alone: no proof frame, no descriptor, nothing of the token.
        assert_eq!((frames, fds), (1, 0), "{forge:?}");
        let secret = me.token.bytes();
        assert!(!bytes.windows(8).any(|w| secret.windows(8).any(|s| s == w)));
        let hex = me.token.to_hex();
        assert!(!bytes
            .windows(16)
            .any(|w| hex.as_bytes().windows(16).any(|s| s == w)));
    }
}

/// Idle connections of the same user fill every handshake place, and more keep coming while
/// the ranks join: the oldest silent ones give up their places (refused as busy), and every
/// rank gets in.
#[test]
fn a_rank_gets_in_through_a_flood_of_silent_connections() {
    let root_job = job(0, 3, "flood");
    let name = root_job.socket_name(sys::euid());
    let root = std::thread::spawn(move || {
        root(&root_job, Instant::now() + Duration::from_secs(60)).map(|l| l.len())
    });
    // More silent connections than the root keeps places for.
    let flood: Vec<OwnedFd> = (0..3 + 2 * EXTRA_PENDING)
        .map(|_| connect(&name, Instant::now() + LONG).unwrap())
        .collect();
    let one = job(1, 3, "flood");
    let a = std::thread::spawn(move || join(&one, Instant::now() + LONG));
    // More arrive while rank 1 is in its handshake, and after it.
    let more: Vec<OwnedFd> = (0..EXTRA_PENDING)
        .map(|_| connect(&name, Instant::now() + LONG).unwrap())
        .collect();
    let two = job(2, 3, "flood");
    let b = join(&two, Instant::now() + LONG).unwrap();
    let a = a.join().unwrap().unwrap();
    assert_eq!(root.join().unwrap(), Ok(2));
    // The silent ones that lost their place were told why.
    let mut buf = vec![0u8; wire::MAX_FRAME];
    let busy = flood
        .iter()
        .filter(|fd| {
            matches!(
                wire::try_recv(fd.as_fd(), &mut buf),
                Ok(Some(f)) if f.head.kind == Kind::Refused
            )
        })
        .count();
    assert!(busy >= EXTRA_PENDING, "{busy} refused");
    drop((a, b, flood, more));
}

/// Connections that say hello, take their challenge and never answer it fill every place: a
/// rank that comes once their challenges are old takes the place of one of them.
#[test]
fn a_rank_gets_in_past_connections_that_never_answer_their_challenge() {
    let root_job = job(0, 2, "mute");
    let name = root_job.socket_name(sys::euid());
    let root = std::thread::spawn(move || {
        root(&root_job, Instant::now() + Duration::from_secs(60)).map(|l| l.len())
    });
    let mute: Vec<OwnedFd> = (0..2 + EXTRA_PENDING)
        .map(|i| {
            let fd = connect(&name, Instant::now() + LONG).unwrap();
            let nonce = [i as u8; auth::NONCE];
            sys::send(fd.as_fd(), &[&hello_frame(1, 2, &nonce)], &[]).unwrap();
            // The challenge comes; no proof follows.
            let f = answer(fd.as_fd()).expect("a challenge");
            assert_eq!(f.head.kind, Kind::Challenge);
            fd
        })
        .collect();
    std::thread::sleep(NOTICE * 3);
    let me = job(1, 2, "mute");
    let link = join(&me, Instant::now() + LONG).unwrap();
    assert_eq!(root.join().unwrap(), Ok(1));
    drop((link, mute));
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
