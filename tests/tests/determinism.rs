//! The proof of deterministic mode: for worlds 1 to 64, every reducing request that
//! `Request::is_deterministic` accepts reduces every element of its result as the left fold of
//! every rank in rank order, rounded once for 16-bit floats (`symbolic::check_rank_order`), on
//! one channel and several, with chunked and odd sizes; and the algorithms it rejects are
//! caught combining out of order by the same witness.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, Collective, Request};
use symm_core::symbolic::{check_rank_order, SymError};

#[test]
fn every_deterministic_schedule_reduces_every_element_in_rank_order_for_worlds_1_to_64() {
    let (mut proven, mut caught, mut rejected) = (0u32, 0u32, 0u32);
    for world in 1u16..=64 {
        let collectives = [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::Reduce { root: world / 2 },
        ];
        for c in collectives {
            for &a in algorithms(c) {
                for dtype in [DType::Bf16, DType::F32] {
                    // An odd size on one channel at every world; a chunked size on three
                    // channels at every eighth world.
                    let shapes = [(world as u64 + 1, 1u16), (world as u64 * 8, 3)];
                    let n = 1 + usize::from(world % 8 == 1);
                    for (elems, channels) in shapes.into_iter().take(n) {
                        let req =
                            Request::new(c, a, world, elems * dtype.size(), dtype, ReduceOp::Sum)
                                .with_channels(channels);
                        // The rejected schedules run up to world 12: enough to show that the
                        // witness catches them, without running every ring up to 64.
                        if req.validate().is_err() || (!req.is_deterministic() && world > 12) {
                            continue;
                        }
                        let got = check_rank_order(&req, world as u64);
                        if req.is_deterministic() {
                            assert_eq!(got, Ok(()), "{req:?}");
                            proven += 1;
                        } else {
                            rejected += 1;
                            match got {
                                Err(SymError::NotRankOrder { .. }) => caught += 1,
                                Ok(()) => {}
                                Err(e) => panic!("{req:?}: {e}"),
                            }
                        }
                    }
                }
            }
        }
    }
    println!(
        "{proven} deterministic requests proven in rank order; {caught} of {rejected} rejected \
         ones caught out of order by the witness"
    );
    assert!(proven > 300, "{proven}");
    // The witness tells orders apart: most rejected schedules are caught (some small worlds
    // happen to combine in rank order).
    assert!(caught * 10 >= rejected * 8, "{caught} of {rejected}");
}
