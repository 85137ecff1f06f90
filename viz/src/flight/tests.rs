use super::*;
use crate::model::tests::{header, small};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Buf, Loc, McLoc};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::trace::{Event, EventKind, Writer};

fn ring(n: usize) -> Vec<Point> {
    (0..n).map(|i| (i as f64 * 10.0, 0.0)).collect()
}

/// Every (rank, channel) begins a multicast store that never ends: each fans out to the world.
fn stores(world: u16, channels: u16) -> Trace {
    let mut h = header(world);
    h.channels = channels;
    h.request = Request::new(
        Collective::AllReduce,
        Algorithm::Multicast,
        world,
        1 << 20,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(channels);
    let mut w = Writer::new(Vec::new(), &h).unwrap();
    for rank in 0..world {
        for channel in 0..channels {
            let op = Op::McStore {
                src: Loc::new(rank, Buf::Input, 0),
                dst: McLoc {
                    buf: Buf::Output,
                    offset: 0,
                },
                bytes: 128,
            };
            let e = Event {
                time: 1 + rank as u64,
                rank,
                channel,
                index: 0,
                kind: EventKind::Begin,
                op,
                contents: None,
            };
            w.event(&e).unwrap();
        }
    }
    Trace::decode("stores", w.finish().unwrap()).unwrap()
}

#[test]
fn a_multicast_fan_out_places_at_most_the_budget() {
    let (world, channels) = (1024u16, 64u16);
    let t = stores(world, channels);
    assert_eq!(t.lanes.len(), 65_536);
    let pts = ring(world as usize);
    let now = t.time_at(t.events.len());
    let sw = (500.0, 150.0);
    let f = at(&t, now, &pts, sw, MAX_DOTS);
    let all = 65_536u64 * world as u64;
    assert_eq!(f.dots.len(), MAX_DOTS);
    assert_eq!(f.dots.len() as u64 + f.more, all);
    // A store that never finished waits at the switch, in its rank's colour.
    assert!(f.dots.iter().all(|d| d.0 == sw && d.1 == sw));
    assert_eq!(f.dots[1023].2, 0);
    assert_eq!(f.dots[1024].2, 0, "rank 0's second channel");
    // A budget with room for everything places everything.
    let small_world = stores(4, 2);
    let f = at(&small_world, 10, &ring(4), (0.0, 0.0), MAX_DOTS);
    assert_eq!((f.dots.len(), f.more), (32, 0));
    let f = at(&small_world, 10, &ring(4), (0.0, 0.0), 5);
    assert_eq!((f.dots.len(), f.more), (5, 27));
}

#[test]
fn chunks_and_blocked_ranks_at_a_time() {
    // Rank 0 copies into rank 1 over times 0..10 while rank 1 waits.
    let t = Trace::decode("small", small(false)).unwrap();
    let pts = ring(2);
    let f = at(&t, 0, &pts, (5.0, 5.0), MAX_DOTS);
    assert_eq!(f.dots, vec![((0.0, 0.0), (0.0, 0.0), 0)]);
    assert_eq!((f.state.clone(), f.more), (vec![0, 1], 0));
    // The copy has landed; rank 1 reduces what it received locally.
    let f = at(&t, 15, &pts, (5.0, 5.0), MAX_DOTS);
    assert!(f.dots.is_empty() && f.state == vec![0, 0], "{f:?}");
    // The wait that never finished rings rank 1 red.
    let hung = Trace::decode("hang", small(true)).unwrap();
    let f = at(&hung, hung.end, &pts, (5.0, 5.0), MAX_DOTS);
    assert_eq!(f.state, vec![0, 2]);
}
