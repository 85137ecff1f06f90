use super::*;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective};

/// Low-latency ops that name lines outside the scratch words, misaligned, in a user buffer
/// or with offsets that overflow are `Oob`, and change nothing.
#[test]
fn hostile_ll_ops_are_out_of_bounds() {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShotLl,
        2,
        64,
        DType::F32,
        ReduceOp::Sum,
    );
    let mem = WorldMem::new(&req, &[vec![1; 64], vec![2; 64]], 0xA5).unwrap();
    let scratch = req.buffer_sizes().scratch;
    let mut t = Temps::default();
    let src = Loc::new(0, Buf::Input, 0);
    let put = |dst: Loc, bytes: u64, flip: u64| Op::LlPut {
        format: Format::Ll,
        src,
        dst,
        bytes,
        slot: 0,
        flip,
    };
    for op in [
        put(Loc::new(1, Buf::Scratch, scratch), 8, 0),
        put(Loc::new(1, Buf::Scratch, 4), 8, 0),
        put(Loc::new(1, Buf::Output, 0), 8, 0),
        put(Loc::new(1, Buf::Scratch, 0), 8, u64::MAX),
        put(Loc::new(9, Buf::Scratch, 0), 8, 0),
    ] {
        assert!(mem.ll(&op, 1, &mut t).is_err(), "{op:?}");
    }
    let reduce = |stride: u64, sources: u16, elems: u64| Op::LlReduce {
        format: Format::Ll,
        src: Loc::new(0, Buf::Scratch, 0),
        stride,
        sources,
        dst: Loc::new(0, Buf::Output, 0),
        elems,
        dtype: DType::F32,
        op: ReduceOp::Sum,
        div: 1,
        slot: 0,
        flip: 0,
    };
    for op in [
        reduce(u64::MAX, 2, 1),
        reduce(scratch, 2, 1),
        reduce(16, 1, u64::MAX),
    ] {
        // Out of bounds, or waiting on lines no put wrote: never done, nothing written.
        let r = mem.ll(&op, 1, &mut t);
        assert!(!matches!(r, Ok(LlPoll::Done)), "{op:?}: {r:?}");
    }
    assert_eq!(mem.output(0), vec![0xA5; 64]);
    // A plain data op path never takes them without an epoch.
    assert!(mem.apply(&reduce(16, 1, 1), &mut t).is_err());
}
