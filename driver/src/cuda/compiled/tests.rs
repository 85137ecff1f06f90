use super::*;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};

#[test]
fn channels_of_one_shape_share_a_function_that_reads_only_what_differs() {
    let req = |bytes: u64, ch: u16| {
        Request::new(
            Collective::AllReduce,
            Algorithm::TwoShot,
            4,
            bytes,
            DType::Bf16,
            ReduceOp::Sum,
        )
        .with_channels(ch)
    };
    let plan = RankPlan::schedule(&req(1 << 20, 64), 1).expect("schedules");
    let per_channel = plan.ops.len() / plan.channels();
    assert_eq!(plan.ops.len(), 64 * per_channel);
    // Every channel of a two-shot has one shape: the kernel holds one channel's ops.
    assert_eq!(compiled_ops(&plan), per_channel);
    let src = source(&plan).expect("short enough");
    assert_eq!(src.matches("__noinline__ void symm_shape_").count(), 1);
    assert_eq!(src.matches("  case ").count(), plan.channels());
    // Each block stages its channel's ops (one round trip) before it runs them.
    assert_eq!(src.matches("symm_stage_ops(p.plan + ").count(), 64);
    let traced = sections(&src, "#if SYMM_TRACE", "#else");
    assert_eq!(traced.matches("SYMM_OP(").count(), per_channel);
    assert_eq!(ops_in(&sections(&src, "#else", "#endif")), per_channel);
    // The channels differ in offsets and slots, not in sizes: those are read, these are
    // constants.
    assert!(
        traced.contains(".dst_off") && traced.contains(".slot"),
        "{traced}"
    );
    assert!(!traced.contains(".count"), "{traced}");
    // Only numbers and reads of the plan: SYMM_OP(i, three shape words, six fields).
    for line in traced
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("SYMM_OP("))
    {
        let inner = line.trim_start_matches("SYMM_OP(").trim_end_matches(')');
        let parts: Vec<&str> = inner.split(", ").collect();
        assert_eq!(parts.len(), 10, "{line}");
        assert!(parts[0].parse::<usize>().is_ok());
        assert!(parts[1..4].iter().all(|w| w.starts_with("0x")), "{line}");
        let read = format!("ops[{}].", parts[0]);
        assert!(
            parts[4..]
                .iter()
                .all(|w| w.starts_with("0x") || w.starts_with(&read)),
            "{line}"
        );
    }
    // One channel: every field a constant, nothing read or staged.
    let one = source(&RankPlan::schedule(&req(1 << 20, 1), 1).expect("schedules")).unwrap();
    assert!(
        !one.contains("ops[") && !one.contains("symm_stage_ops(p."),
        "{one}"
    );
    assert!(one.contains("symm_shape_0(p, nullptr"));
}

#[test]
fn a_direct_channel_signals_behind_one_fence_waits_at_once_and_copies_once() {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::TwoShot,
        4,
        1 << 20,
        DType::Bf16,
        ReduceOp::Sum,
    )
    .with_channels(64);
    let plan = RankPlan::schedule(&req, 1).expect("schedules");
    let g = Groups::of(&plan);
    assert_eq!(g.shapes.len(), 1);
    use Step::*;
    assert_eq!(
        g.shapes[0].steps,
        [Signals(3), Waits(3), Op, Copies(3), Signals(3), Waits(3)]
    );
    let fused = sections(&source(&plan).unwrap(), "#else", "#endif");
    for call in ["symm_signal_n<3>(", "symm_wait_n<3>(", "symm_copy_n<3>("] {
        assert!(fused.contains(call), "{call}: {fused}");
    }
    assert_eq!(ops_in(&fused), compiled_ops(&plan));
    // Waits on one slot are not polled at once (the second counts from the first).
    let wait = |slot| PlanOp {
        kind: plan_code::WAIT,
        slot,
        count: 1,
        ..PlanOp::default()
    };
    assert_eq!(steps(&[wait(3), wait(3)]), [Op, Op]);
    assert_eq!(steps(&[wait(3), wait(4), wait(3)]), [Waits(2), Op]);
    // Copies of different sources are not one step.
    let copy = |a_off, dst_rank| PlanOp {
        kind: plan_code::COPY,
        a_off,
        dst_rank,
        count: 64,
        ..PlanOp::default()
    };
    assert_eq!(steps(&[copy(0, 1), copy(64, 2)]), [Op, Op]);
    assert_eq!(steps(&[copy(0, 1), copy(0, 2)]), [Copies(2)]);
}

#[test]
fn channels_of_different_shapes_get_functions_of_their_own() {
    // A ring's channels differ in their ranks (alternate directions): no op is run by a
    // function of another shape, and every op is in the kernel once per shape.
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        64 << 10,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(4);
    let plan = RankPlan::schedule(&req, 2).expect("schedules");
    let g = Groups::of(&plan);
    for (c, id) in g.of_channel.iter().enumerate() {
        let first = g.shapes[*id].members[0];
        let ops = |c: usize| {
            plan.ops[plan.chan_start[c] as usize..plan.chan_start[c + 1] as usize]
                .iter()
                .map(shape)
                .collect::<Vec<_>>()
        };
        assert_eq!(ops(c), ops(first), "channel {c}");
    }
    let src = source(&plan).expect("short");
    let traced = sections(&src, "#if SYMM_TRACE", "#else");
    assert_eq!(traced.matches("SYMM_OP(").count(), compiled_ops(&plan));
    assert_eq!(
        src.matches("__noinline__ void symm_shape_").count(),
        g.shapes.len()
    );
}

#[test]
fn a_one_channel_plan_is_inlined_into_its_kernel() {
    // Called once, its shape costs nothing to inline; every plan of more channels keeps one
    // function per shape (above).
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShotLl,
        2,
        1024,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(1);
    let plan = RankPlan::schedule(&req, 0).expect("schedules");
    let src = source(&plan).expect("short");
    assert_eq!(src.matches("__forceinline__ void symm_shape_0(").count(), 1);
    assert!(!src.contains("__noinline__"), "{src}");
    let two = RankPlan::schedule(&req.with_channels(2), 0).expect("schedules");
    let src = source(&two).expect("short");
    assert!(!src.contains("__forceinline__ void symm_shape_"), "{src}");
}

/// The lines of `src` between each `open` line and the next `close` line.
fn sections(src: &str, open: &str, close: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in src.lines() {
        if line.trim() == open {
            inside = true;
        } else if line.trim() == close {
            inside = false;
        } else if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Ops a body's lines stand for: one per `SYMM_OP` line, `k` per fused step
/// (`{ symm_plan_op o_[k]; SYMM_MK(..) x k call; .. }`).
fn ops_in(body: &str) -> usize {
    let mut n = 0;
    for line in body.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("{ symm_plan_op o_[") {
            let k: usize = rest.split(']').next().unwrap().parse().expect("a count");
            assert_eq!(line.matches("SYMM_MK(").count(), k, "{line}");
            n += k;
        } else if line.starts_with("SYMM_OP(") {
            n += 1;
        }
    }
    n
}

#[test]
fn untraced_kernels_fuse_the_low_latency_epoch_and_puts() {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShotLl,
        4,
        4096,
        DType::Bf16,
        ReduceOp::Sum,
    );
    let plan = RankPlan::schedule(&req, 2).expect("schedules");
    let src = source(&plan).expect("short enough");
    let fused = sections(&src, "#else", "#endif");
    assert_eq!(fused.matches("symm_local_epoch(").count(), 1, "{fused}");
    assert_eq!(fused.matches("symm_ll_put_n<4>(").count(), 1, "{fused}");
    assert_eq!(ops_in(&fused), compiled_ops(&plan));
    // The traced kernel runs the ops one by one, as the interpreter does.
    let traced = sections(&src, "#if SYMM_TRACE", "#else");
    assert!(!traced.contains("o_["));
    assert_eq!(traced.matches("SYMM_OP(").count(), compiled_ops(&plan));
    // Puts of different sources are not fused.
    let ring = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        4096,
        DType::Bf16,
        ReduceOp::Sum,
    );
    let plan = RankPlan::schedule(&ring, 0).expect("schedules");
    let fused = sections(&source(&plan).expect("short"), "#else", "#endif");
    assert!(!fused.contains("symm_ll_put_n"));
    assert_eq!(ops_in(&fused), compiled_ops(&plan));
}

#[test]
fn only_the_reduced_dtypes_are_instantiated() {
    let req = |c, a, dt| Request::new(c, a, 2, 4096, dt, ReduceOp::Sum);
    let ar = RankPlan::schedule(
        &req(Collective::AllReduce, Algorithm::OneShotLl, DType::Bf16),
        0,
    )
    .unwrap();
    let bf16 = 1u32 << DType::Bf16 as u8;
    assert!(source(&ar)
        .unwrap()
        .starts_with(&format!("// Generated by symm_driver::cuda::compiled from one rank's validated plan.\n#define SYMM_DTYPE_MASK 0x{bf16:x}u\n")));
    // A plan that only copies reduces nothing.
    let ag =
        RankPlan::schedule(&req(Collective::AllGather, Algorithm::Ring, DType::F32), 1).unwrap();
    assert!(source(&ag)
        .unwrap()
        .contains("#define SYMM_DTYPE_MASK 0x0u\n"));
}

#[test]
fn hostile_plans_get_typed_errors_and_no_source() {
    use symm_core::op::{Buf, Loc, Op};
    let sizes = symm_core::sched::BufferSizes {
        input: 1024,
        output: 1024,
        scratch: 16,
    };
    let copy = |rank: u16, off: u64, bytes: u64| Op::Copy {
        src: Loc {
            rank: 0,
            buf: Buf::Input,
            offset: 0,
        },
        dst: Loc {
            rank,
            buf: Buf::Output,
            offset: off,
        },
        bytes,
    };
    let plan = |ops: Vec<Op>| RankPlan::from_channels(&[ops]).expect("encodes");
    assert!(checked_source(&plan(vec![copy(1, 0, 1024)]), 0, 2, &sizes, 64).is_ok());
    for bad in [copy(9, 0, 16), copy(1, 1020, 16), copy(1, 0, 4096)] {
        assert!(
            checked_source(&plan(vec![bad]), 0, 2, &sizes, 64).is_err(),
            "{bad:?}"
        );
    }
    let wait = Op::Wait {
        slot: 1 << 20,
        count: 1,
    };
    assert!(checked_source(&plan(vec![wait]), 0, 2, &sizes, 64).is_err());
    let many = plan(vec![copy(1, 0, 16); MAX_COMPILED_OPS + 1]);
    assert!(matches!(
        checked_source(&many, 0, 2, &sizes, 64),
        Err(CudaError::TooLarge { .. })
    ));
}

#[test]
fn long_plans_are_refused_and_paths_choose_by_size() {
    let big = RankPlan {
        ops: vec![symm_core::plan::PlanOp::default(); MAX_COMPILED_OPS + 1],
        chan_start: vec![0, MAX_COMPILED_OPS as u32 + 1],
    };
    assert!(matches!(source(&big), Err(CudaError::TooLarge { .. })));
    assert!(PlanPath::Auto.compiles(10));
    assert!(!PlanPath::Interpreted.compiles(1));
    assert!(PlanPath::Compiled.compiles(100));
    assert!(!PlanPath::Compiled.compiles(MAX_COMPILED_OPS + 1));
    // Auto compiles short kernels only: NVRTC's time grows with the ops.
    assert!(PlanPath::Auto.compiles(AUTO_COMPILED_OPS));
    assert!(!PlanPath::Auto.compiles(AUTO_COMPILED_OPS + 1));
    assert!(PlanPath::Compiled.compiles(AUTO_COMPILED_OPS + 1));
    assert_eq!(PlanPath::parse("compiled"), Some(PlanPath::Compiled));
    assert_eq!(PlanPath::parse("Compiled"), None);
}
