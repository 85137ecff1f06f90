use super::*;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective};

/// A request whose schedule would hold more than `MAX_PLAN_OPS` ops (a 1-element chunk
/// over 64 Mi elements) is refused while the ops are collected.
#[test]
fn oversized_plans_are_refused() {
    let req = Request::new(
        Collective::AllGather,
        Algorithm::Ring,
        2,
        256 << 20,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_pipeline(4, 2);
    assert!(req.validate().is_ok());
    let t = std::time::Instant::now();
    let r = RankPlan::schedule(&req, 0);
    assert!(
        matches!(
            &r,
            Err(CudaError::TooLarge {
                what: "plan ops",
                limit,
                ..
            }) if *limit == MAX_PLAN_OPS as u64
        ),
        "{:?}",
        r.as_ref().map(|p| p.ops.len())
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
}

/// Changes a put's (dst, bytes, flip, slot) through `f`.
fn set_put(v: &mut Op, f: impl Fn(&mut symm_core::op::Loc, &mut u64, &mut u64, &mut u32)) {
    if let Op::LlPut {
        dst,
        bytes,
        flip,
        slot,
        ..
    } = v
    {
        f(dst, bytes, flip, slot);
    }
}

/// Changes a reduce's (stride, sources, flip) through `f`.
fn set_reduce(v: &mut Op, f: impl Fn(&mut u64, &mut u16, &mut u64)) {
    if let Op::LlReduce {
        stride,
        sources,
        flip,
        ..
    } = v
    {
        f(stride, sources, flip);
    }
}

/// 128-byte-line ops are checked against the spans of their own format: a put or reduce
/// whose 128-byte lines would reach past the scratch (more data, the half offset at its end,
/// a huge stride), lines into a user buffer, misaligned lines, a slot past the pad or a peer
/// outside the world are refused, and the plan compiler makes no source of them.
#[test]
fn hostile_128_byte_line_ops_are_refused() {
    use symm_core::op::{Buf, Loc};
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShotLl128,
        2,
        4096,
        DType::F32,
        ReduceOp::Sum,
    );
    let sizes = req.buffer_sizes();
    let slots = req.layout().slots();
    let plan = RankPlan::schedule(&req, 0).unwrap();
    plan.validate(0, 2, &sizes, slots, false).unwrap();
    let views: Vec<(usize, Op)> = plan
        .ops
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Some((i, p.decode().ok()?)))
        .filter(|(_, o)| o.line_format() == Some(symm_core::ll::Format::Ll128))
        .collect();
    assert!(views.len() >= 3, "two puts and a reduce: {views:?}");
    let mut refused = 0;
    for (i, v) in views {
        // `v` with one thing changed by `f`.
        let with = |f: &dyn Fn(&mut Op)| {
            let mut b = v;
            f(&mut b);
            b
        };
        let bad: Vec<Op> = match v {
            Op::LlPut { .. } => vec![
                with(&|b| set_put(b, |_, _, flip, _| *flip = sizes.scratch)),
                with(&|b| set_put(b, |_, bytes, _, _| *bytes = sizes.scratch)),
                with(&|b| set_put(b, |_, bytes, _, _| *bytes = u64::MAX)),
                with(&|b| set_put(b, |dst, _, _, _| dst.offset += 8)),
                with(&|b| set_put(b, |dst, _, _, _| *dst = Loc::new(1, Buf::Output, 0))),
                with(&|b| set_put(b, |dst, _, _, _| dst.rank = 2)),
                with(&|b| set_put(b, |_, _, _, slot| *slot = slots)),
            ],
            Op::LlReduce { .. } => vec![
                with(&|b| set_reduce(b, |stride, _, _| *stride = u64::MAX)),
                with(&|b| set_reduce(b, |stride, _, _| *stride = sizes.scratch)),
                with(&|b| set_reduce(b, |_, sources, _| *sources = u16::MAX)),
                with(&|b| set_reduce(b, |_, sources, _| *sources = 0)),
                with(&|b| set_reduce(b, |_, _, flip| *flip = sizes.scratch)),
            ],
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Signal { .. }
            | Op::Wait { .. }
            | Op::ReduceN { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => vec![],
        };
        for b in bad {
            let mut p = plan.clone();
            p.ops[i] = PlanOp::encode(&b);
            assert!(p.validate(0, 2, &sizes, slots, false).is_err(), "{b:?}");
            assert!(
                crate::cuda::compiled::checked_source(&p, 0, 2, &sizes, slots).is_err(),
                "{b:?}"
            );
            refused += 1;
        }
    }
    assert!(refused >= 19, "{refused}");
}

/// Low-latency and k-way ops that would reach past their buffers (a hostile or broken
/// plan: huge stride, half offset past the scratch, lines into a user buffer, misaligned
/// lines, a source rank outside the world) are refused before any launch.
#[test]
fn out_of_bounds_fused_and_ll_ops_are_refused() {
    use symm_core::op::{Buf, Loc, Op, Ranks};
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShotLl,
        2,
        1024,
        DType::F32,
        ReduceOp::Sum,
    );
    let sizes = req.buffer_sizes();
    let slots = req.layout().slots();
    let plan = RankPlan::schedule(&req, 0).unwrap();
    plan.validate(0, 2, &sizes, slots, false).unwrap();
    let decoded: Vec<Op> = plan.ops.iter().map(|p| p.decode().unwrap()).collect();
    let with = |i: usize, op: Op| {
        let mut p = plan.clone();
        p.ops[i] = PlanOp::encode(&op);
        p.validate(0, 2, &sizes, slots, false)
    };
    let put = decoded
        .iter()
        .position(|o| matches!(o, Op::LlPut { .. }))
        .unwrap();
    let red = decoded
        .iter()
        .position(|o| matches!(o, Op::LlReduce { .. }))
        .unwrap();
    let Op::LlPut {
        format,
        src,
        dst,
        bytes,
        slot,
        flip,
    } = decoded[put]
    else {
        unreachable!()
    };
    for bad in [
        Op::LlPut {
            format,
            src,
            dst,
            bytes,
            slot,
            flip: sizes.scratch,
        },
        Op::LlPut {
            format,
            src,
            dst: Loc {
                offset: dst.offset + 8,
                ..dst
            },
            bytes,
            slot,
            flip,
        },
        Op::LlPut {
            format,
            src,
            dst: Loc::new(1, Buf::Output, 0),
            bytes,
            slot,
            flip,
        },
        Op::LlPut {
            format,
            src,
            dst,
            bytes: u64::MAX,
            slot,
            flip,
        },
        Op::LlPut {
            format,
            src,
            dst,
            bytes,
            slot: slots,
            flip,
        },
    ] {
        assert!(with(put, bad).is_err(), "{bad:?}");
    }
    let Op::LlReduce {
        format,
        src,
        dst,
        elems,
        dtype,
        op,
        div,
        slot,
        flip,
        ..
    } = decoded[red]
    else {
        unreachable!()
    };
    let reduce = |stride: u64, sources: u16| Op::LlReduce {
        format,
        src,
        stride,
        sources,
        dst,
        elems,
        dtype,
        op,
        div,
        slot,
        flip,
    };
    for bad in [
        reduce(u64::MAX, 2),
        reduce(sizes.scratch, 2),
        reduce(16, u16::MAX),
    ] {
        assert!(with(red, bad).is_err(), "{bad:?}");
    }
    let k = Op::ReduceN {
        buf: Buf::Input,
        offset: 0,
        ranks: Ranks::new(&[0, 2]).unwrap(),
        dst: Loc::new(0, Buf::Output, 0),
        elems: 4,
        dtype: DType::F32,
        op: ReduceOp::Sum,
        div: 1,
    };
    assert!(with(red, k).is_err(), "a source rank outside the world");
}

#[test]
fn schedules_encode_and_validate() {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        1 << 20,
        DType::Bf16,
        ReduceOp::Sum,
    )
    .with_channels(3);
    for r in 0..4 {
        let p = RankPlan::schedule(&req, r).unwrap();
        assert_eq!(p.channels(), 3);
        p.validate(r, 4, &req.buffer_sizes(), req.layout().slots(), false)
            .unwrap();
        let n: usize = (0..3).map(|c| p.channel_ops(c).len()).sum();
        assert_eq!(n, p.ops.len());
    }
}

#[test]
fn out_of_bounds_ops_are_refused() {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        2,
        64,
        DType::F32,
        ReduceOp::Sum,
    );
    let bad = Op::Copy {
        src: symm_core::op::Loc::new(0, Buf::Input, 32),
        dst: symm_core::op::Loc::new(1, Buf::Output, 0),
        bytes: 64,
    };
    let p = RankPlan::from_channels(&[vec![bad]]).unwrap();
    assert!(p.validate(0, 2, &req.buffer_sizes(), 16, false).is_err());
    let w = Op::Wait { slot: 99, count: 1 };
    let p = RankPlan::from_channels(&[vec![w]]).unwrap();
    assert!(p.validate(0, 2, &req.buffer_sizes(), 16, false).is_err());
}

fn multicast_all_reduce() -> Request {
    Request::new(
        Collective::AllReduce,
        Algorithm::Multicast,
        4,
        2 << 20,
        DType::F32,
        ReduceOp::Sum,
    )
}

#[test]
fn multicast_plans_are_refused_without_a_multicast_object() {
    let req = multicast_all_reduce();
    let p = RankPlan::schedule(&req, 1).unwrap();
    assert!(p
        .ops
        .iter()
        .any(|o| o.decode().is_ok_and(|o| o.is_multicast())));
    for allow in [false, true] {
        match p.validate(1, 4, &req.buffer_sizes(), req.layout().slots(), allow) {
            Err(CudaError::Multicast(McError::NoObject { rank: 1, .. })) => {}
            other => panic!("{other:?}"),
        }
    }
}

#[cfg(feature = "multicast")]
#[test]
fn multicast_plans_validate_with_a_multicast_object() {
    use crate::cuda::multicast::fake;
    let req = multicast_all_reduce();
    let sizes = req.buffer_sizes();
    let mc = fake::object(4, 16 << 20);
    for r in 0..4 {
        let p = RankPlan::schedule(&req, r).unwrap();
        p.validate_multicast(r, 4, &sizes, req.layout().slots(), &mc)
            .unwrap();
    }
    let p = RankPlan::schedule(&req, 0).unwrap();
    let small = fake::object(4, 2 << 20);
    assert!(p
        .validate_multicast(0, 4, &sizes, req.layout().slots(), &small)
        .is_err());
    let other_team = fake::object(2, 16 << 20);
    assert!(p
        .validate_multicast(0, 4, &sizes, req.layout().slots(), &other_team)
        .is_err());
    let bad = Op::McStore {
        src: symm_core::op::Loc::new(0, Buf::Input, 0),
        dst: symm_core::op::McLoc {
            buf: Buf::Output,
            offset: 1,
        },
        bytes: sizes.output,
    };
    let p = RankPlan::from_channels(&[vec![bad]]).unwrap();
    assert!(p
        .validate_multicast(0, 4, &sizes, req.layout().slots(), &mc)
        .is_err());
}
