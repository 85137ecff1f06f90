//! Lab 7's checker: one-shot against two-shot all-reduce, and where one overtakes the other.
//!
//! The student's two-shot must pass the usual checks; then the crossover the student predicts
//! with the cost model (`symm_core::cost::predict`) must be the model's, and the one the
//! student measures on the simulator (virtual time, no data moved) must be what the student's
//! own schedules give. Once the schedules pass, a table of both curves at world 8 is printed.

#[path = "../07-one-shot-two-shot/skeleton.rs"]
pub mod skeleton;
#[path = "../07-one-shot-two-shot/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::problem::count;
use crate::problem::Problem;
use crate::run::{self, Case, Plan};
use symm_core::cost::{predict, Link};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{At, Op};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::host::DEFAULT_LINK;

/// The sizes (bytes per rank) the crossover is searched over: 1 KiB to 16 MiB, powers of two.
pub const SIZES: [u64; 15] = {
    let mut s = [0u64; 15];
    let mut i = 0;
    while i < 15 {
        s[i] = 1024 << i;
        i += 1;
    }
    s
};

/// The world the crossover is graded at.
pub const WORLD: u16 = 8;

/// The all-reduce request of `algorithm` at `world` ranks and `bytes` bytes (f32, sum, one
/// channel): what both the model and the simulator are asked about.
pub fn request(algorithm: Algorithm, world: u16, bytes: u64) -> Request {
    Request::new(
        Collective::AllReduce,
        algorithm,
        world,
        bytes,
        DType::F32,
        ReduceOp::Sum,
    )
}

/// The simulator's time of `plan` as `algorithm` at `world` ranks and `bytes` bytes on `link`,
/// in microseconds (timing only: no data moves, so any size is cheap).
pub fn time_us(
    plan: Plan,
    algorithm: Algorithm,
    world: u16,
    bytes: u64,
    link: &Link,
) -> Result<f64, Problem> {
    let case = Case::new("", request(algorithm, world, bytes));
    let streams = run::build(&case, plan)?;
    run::lint(&case.req, &streams)?;
    run::time_us(&case.req, &streams, *link).map_err(|error| Problem::Host {
        backend: "simulator",
        error,
    })
}

fn case(algorithm: Algorithm, world: u16, n: u64) -> Case {
    let label = format!(
        "{}, world {world}, {}",
        algorithm.name(),
        count(n, "element")
    );
    Case::new(label, request(algorithm, world, n * 4))
}

/// Elements each rank reads from other ranks' buffers.
fn remote_reads(req: &Request, streams: &[Vec<Op>]) -> Vec<u64> {
    let channels = req.channels.max(1) as usize;
    let mut out = vec![0; req.world as usize];
    for (s, ops) in streams.iter().enumerate() {
        let rank = (s / channels) as u16;
        for op in ops {
            let remote: u64 = op
                .footprint()
                .reads()
                .filter(|x| matches!(x.at, At::Rank(l) if l.rank != rank))
                .map(|x| x.bytes / req.dtype.size())
                .sum();
            out[rank as usize] += remote;
        }
    }
    out
}

fn kib(bytes: Option<u64>) -> String {
    bytes.map_or("none (two-shot never wins)".into(), |b| {
        format!("{} KiB", b >> 10)
    })
}

fn hint(p: &Problem) -> Option<String> {
    Some(match p {
        Problem::Unbalanced { .. } => "two-shot needs no Done round: each peer's Data (your \
            output holds my segment) comes after that peer has read your input"
            .into(),
        Problem::Wrong { found, .. } if found.count == 0 => "every rank's output must receive \
            every segment: rank r writes segment r into each peer's output"
            .into(),
        _ => return None,
    })
}

/// Grades lab 7.
pub fn check(g: &mut Grader) -> Graded {
    let one: Plan = g.pick(&skeleton::one_shot, &solution::one_shot);
    let two: Plan = g.pick(&skeleton::two_shot, &solution::two_shot);
    let predicted: &dyn Fn(u16, &Link) -> Option<u64> =
        g.pick(&skeleton::predict_crossover, &solution::predict_crossover);
    let measured: &dyn Fn(u16, &Link) -> Option<u64> =
        g.pick(&skeleton::measure_crossover, &solution::measure_crossover);
    let show = case(Algorithm::TwoShot, 4, 4096);
    g.traces(&show, two, &solution::two_shot);
    g.trace("one-shot.trace", &case(Algorithm::OneShot, 4, 4096), one);
    for (w, n) in [(4, 16), (2, 5), (3, 7), (5, 3), (6, 13)] {
        g.case(&case(Algorithm::OneShot, w, n), one, &hint)?;
        let c = case(Algorithm::TwoShot, w, n);
        let passed = g.case(&c, two, &hint)?;
        // A two-shot reads one segment of each peer's input, not the whole of it.
        let most = (w as u64 - 1) * n.div_ceil(w as u64);
        if let Some((r, read)) = remote_reads(&c.req, &passed.streams)
            .into_iter()
            .enumerate()
            .find(|&(_, e)| e > most)
        {
            let message = format!(
                "rank {r}'s two_shot reads {read} elements of other ranks' buffers; a two-shot \
                 reads one segment of each, {most} at most: this is still a one-shot"
            );
            return Err(Grader::lab_failure(
                &c,
                "traffic",
                message,
                "rank r sums only segment r = k.segment(rank, world) of the inputs, then sends \
                 that segment to every peer",
            ));
        }
    }
    // Both curves, from the model and from the student's schedules on the simulator.
    let link = DEFAULT_LINK;
    g.note(format!(
        "note  all-reduce at world {WORLD} on NVLink 4, microseconds:\n      {:>9} {:>9} {:>9} {:>9} {:>9}",
        "bytes", "model 1", "model 2", "sim 1", "sim 2"
    ));
    let mut sim_cross = None;
    for bytes in SIZES {
        let m1 = predict(&request(Algorithm::OneShot, WORLD, bytes), &link);
        let m2 = predict(&request(Algorithm::TwoShot, WORLD, bytes), &link);
        let s1 = time_us(one, Algorithm::OneShot, WORLD, bytes, &link);
        let s2 = time_us(two, Algorithm::TwoShot, WORLD, bytes, &link);
        let (s1, s2) = match (s1, s2) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(p), _) | (_, Err(p)) => {
                let c = case(Algorithm::TwoShot, WORLD, bytes / 4);
                return Err(Grader::fail(&c, p, &hint, &[]));
            }
        };
        if sim_cross.is_none() && s2 < s1 {
            sim_cross = Some(bytes);
        }
        g.note(format!(
            "      {bytes:>9} {m1:>9.1} {m2:>9.1} {s1:>9.1} {s2:>9.1}"
        ));
    }
    let model_cross = solution::predict_crossover(WORLD, &link);
    let at = case(Algorithm::TwoShot, WORLD, 256);
    let fail = |what: String, hint: &str| Err(Grader::lab_failure(&at, "crossover", what, hint));
    let said = predicted(WORLD, &link);
    if said != model_cross {
        return fail(
            format!(
                "predict_crossover({WORLD}) says {}; the cost model's crossover is {}",
                kib(said),
                kib(model_cross)
            ),
            "the first size of SIZES where cost::predict of the two-shot request is below the \
             one-shot's (requests from lab07::request)",
        );
    }
    g.note(format!("pass  predicted crossover: {}", kib(said)));
    let said = measured(WORLD, &link);
    if said != sim_cross {
        return fail(
            format!(
                "measure_crossover({WORLD}) says {}; your schedules cross at {} on the simulator",
                kib(said),
                kib(sim_cross)
            ),
            "the first size of SIZES where lab07::time_us of your two_shot is below your \
             one_shot's",
        );
    }
    g.note(format!("pass  measured crossover: {}", kib(said)));
    Ok(())
}
