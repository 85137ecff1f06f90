//! Crafted traces that attack the decoder, the viewer's model and the Perfetto export: each
//! targets one way a header or an event could make the readers panic or allocate far more than
//! the input's size. They are the hostile-input tests' inputs and seeds of the `trace_pipeline`
//! fuzz corpus.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Buf, Loc, McLoc, Op};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::trace::{Event, EventKind, Header, Source, Writer};
use symm_driver::host::{random_inputs, simulate, SimOptions};

/// A header for `req` (world and channels taken from it).
pub fn header(req: Request) -> Header {
    Header {
        world: req.world,
        channels: req.channels,
        request: req,
        source: Source::Host { simulated: true },
        time_unit_ns: 1,
        team: None,
    }
}

/// Encodes `events` in the given order after `header`, with the end record.
pub fn write(header: &Header, events: impl IntoIterator<Item = Event>) -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), header).expect("header encodes");
    for e in events {
        w.event(&e).expect("event encodes");
    }
    w.finish().expect("end record")
}

/// A Begin event of `op` on (rank, channel) at op `index`.
pub fn begin(time: u64, rank: u16, channel: u16, index: u32, op: Op) -> Event {
    Event {
        time,
        rank,
        channel,
        index,
        kind: EventKind::Begin,
        op,
        contents: None,
    }
}

/// A world-4 ring all-reduce of 4 KiB on the simulator, chunk contents on (about 6 KB).
pub fn sample() -> Vec<u8> {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        4096,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_pipeline(512, 2);
    let opts = SimOptions {
        contents: true,
        ..Default::default()
    };
    simulate(&req, &random_inputs(&req, 1), &opts)
        .expect("the sample simulates")
        .trace
}

/// A header whose request (world and channels 65535) makes the slot layout overflow `u32`, with
/// `n` waits on the largest slots.
pub fn slots_overflow(n: u32) -> Vec<u8> {
    let mut req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        u16::MAX,
        1024,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(u16::MAX);
    req.slots = 2;
    let wait = |i: u32| Op::Wait {
        slot: u32::MAX - i,
        count: 1,
    };
    write(
        &header(req),
        (0..n).map(|i| begin(i as u64, (i % 7) as u16, 0, i, wait(i))),
    )
}

/// A header claiming 65535 ranks x 65535 channels over a world-4 request, with `n` events.
pub fn world_mismatch(n: u32) -> Vec<u8> {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        1024,
        DType::F32,
        ReduceOp::Sum,
    );
    let h = Header {
        world: u16::MAX,
        channels: u16::MAX,
        ..header(req)
    };
    let wait = Op::Wait { slot: 0, count: 1 };
    write(&h, (0..n).map(|i| begin(i as u64, 0, 0, i, wait)))
}

/// The largest valid world (1024 ranks x 64 channels) with `n` events, all on rank 0 channel 0:
/// rows sized from the header would be 65536 per export.
pub fn huge_world(n: u32) -> Vec<u8> {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        1024,
        1024 * 1024,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(64);
    let wait = Op::Wait { slot: 0, count: 1 };
    write(&header(req), (0..n).map(|i| begin(i as u64, 0, 0, i, wait)))
}

/// `n` events on one stream whose op indices jump by 65536: a dense index table would grow by
/// 65536 entries per event.
pub fn span_fanout(n: u32) -> Vec<u8> {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        1024,
        DType::F32,
        ReduceOp::Sum,
    );
    let wait = Op::Wait { slot: 0, count: 1 };
    write(
        &header(req),
        (0..n).map(|i| begin(i as u64, 1, 0, i.wrapping_mul(1 << 16), wait)),
    )
}

/// `n` finished multicast stores over the whole output of a world-64 all-reduce, each with
/// contents and a different offset: every one covers every cell of every rank's buffer.
pub fn multicast_fanout(n: u32) -> Vec<u8> {
    let bytes = 64 * 1024;
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Multicast,
        64,
        bytes,
        DType::F32,
        ReduceOp::Sum,
    );
    let events = (0..n).map(move |i| {
        let op = Op::McStore {
            src: Loc::new(0, Buf::Output, 0),
            dst: McLoc {
                buf: Buf::Output,
                offset: (i as u64 * 997) % 1024,
            },
            bytes,
        };
        Event {
            kind: EventKind::End,
            contents: Some(u64::MAX),
            ..begin(i as u64, (i % 64) as u16, 0, i / 64, op)
        }
    });
    write(&header(req), events)
}
