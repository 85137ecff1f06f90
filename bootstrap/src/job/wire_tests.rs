//! Frames against damage, and sends and receives against peers that stop reading or leave.

use super::*;
use std::os::fd::AsFd;

#[test]
fn frames_round_trip_and_damage_is_refused() {
    let head = Head {
        kind: Kind::Part,
        op: Op::Gather,
        rank: 7,
        seq: 42,
        epoch: 3,
    };
    let mut bytes = head.encode(3).to_vec();
    bytes.extend_from_slice(b"abc");
    let g = Frame::decode(&bytes, Vec::new()).unwrap();
    assert_eq!(g.head, head);
    assert_eq!(g.payload, b"abc");
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            // Never a panic; damage to magic, version or length is refused (a flipped
            // kind or op may name another valid one, a flipped epoch is stale).
            let r = Frame::decode(&b, Vec::new());
            if matches!(i, 0..=2 | 12..=15) {
                assert!(r.is_err(), "byte {i} bit {bit}");
            }
        }
    }
    for cut in 0..bytes.len() {
        assert!(Frame::decode(&bytes[..cut], Vec::new()).is_err());
    }
}

fn part() -> Head {
    Head {
        kind: Kind::Part,
        op: Op::Gather,
        rank: 1,
        seq: 1,
        epoch: 0,
    }
}

/// Sends frames from `a` until its queue is full (the peer reads none).
fn fill(a: BorrowedFd<'_>) -> usize {
    let payload = vec![7u8; MAX_PAYLOAD];
    let mut sent = 0;
    while send(a, part(), &payload, &[], Instant::now()).is_ok() {
        sent += 1;
        assert!(sent < 1 << 16, "the queue never filled");
    }
    sent
}

/// One whole frame sent from `a` with `timeout` to its deadline: the outcome and the time taken.
fn send_within(a: BorrowedFd<'_>, timeout: Duration) -> (Result<(), LinkError>, Duration) {
    let start = Instant::now();
    let r = send(a, part(), &[1; MAX_PAYLOAD], &[], start + timeout);
    (r, start.elapsed())
}

#[test]
fn a_peer_that_stops_reading_and_shuts_its_side_ends_a_send_at_once() {
    let (a, b) = sys::seqpacket_pair().unwrap();
    assert!(fill(a.as_fd()) > 0);
    sys::shutdown_write(b.as_fd()).unwrap();
    let (r, took) = send_within(a.as_fd(), Duration::from_secs(30));
    assert!(matches!(r, Err(LinkError::Closed)), "{r:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    drop(b);
}

#[test]
fn a_full_queue_times_out_by_the_deadline() {
    let (a, b) = sys::seqpacket_pair().unwrap();
    fill(a.as_fd());
    let (r, took) = send_within(a.as_fd(), Duration::from_millis(200));
    assert!(matches!(r, Err(LinkError::Timeout)), "{r:?}");
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // A receive that finds nothing waits out its deadline too, and a passed one is a
    // timeout even on a readable socket.
    let mut buf = vec![0u8; MAX_FRAME];
    assert!(recv(b.as_fd(), &mut buf, Instant::now()).is_ok());
    assert!(matches!(
        wait(b.as_fd(), sys::POLLIN, Instant::now()),
        Err(LinkError::Timeout)
    ));
}

#[test]
fn any_timeout_is_a_deadline() {
    let now = Instant::now();
    assert!(after(now, Duration::MAX) > now + Duration::from_secs(3600));
    assert_eq!(after(now, Duration::ZERO), now);
}

#[test]
fn payloads_round_trip() {
    for r in [
        Refusal::User {
            expected: 1000,
            found: 0,
        },
        Refusal::Token,
        Refusal::World {
            expected: 4,
            found: 5,
        },
        Refusal::Rank { rank: 9, world: 4 },
        Refusal::Duplicate { rank: 2 },
        Refusal::Malformed,
        Refusal::Busy,
    ] {
        assert_eq!(parse_refusal(&refusal(r)), Some(r));
    }
    assert_eq!(parse_refusal(&[9; 9]), None);
    assert_eq!(parse_refusal(&[]), None);
    let h = hello(8, 1, &[7; auth::NONCE]);
    assert_eq!(parse_hello(&h), Some((8, 1, [7u8; auth::NONCE])));
    assert_eq!(parse_hello(&h[..20]), None);
    assert_eq!(parse_hello(&[h.clone(), vec![0]].concat()), None);
    let c = challenge(&[1; auth::NONCE], &[2; auth::PROOF]);
    assert_eq!(
        parse_challenge(&c),
        Some(([1; auth::NONCE], [2; auth::PROOF]))
    );
    assert_eq!(parse_challenge(&c[1..]), None);
    assert_eq!(parse_challenge(&[c.clone(), vec![0]].concat()), None);
    assert_eq!(parse_ranks(&ranks(&[1, 5, 1023])), Some(vec![1, 5, 1023]));
    assert_eq!(parse_ranks(&[1]), None);
    let e = BootstrapError::PeerLost { rank: 6 };
    assert_eq!(parse_abort(&abort(&e), "barrier"), e);
    assert!(matches!(
        parse_abort(&[1], "barrier"),
        BootstrapError::Protocol { .. }
    ));
}
