//! Lab 7's checker: one-shot against two-shot all-reduce, and where one overtakes the other.
//!
//! The student's two-shot must pass the usual checks; then the crossover the student predicts
//! with the lab's model ([`predict`]: the library's alpha-beta model plus a fixed cost per data
//! op) must be the model's, and the one the student measures on the simulator (virtual time,
//! no data moved, each stream charged the same cost per data op) must be what the student's own
//! schedules give. Once the schedules pass, a table of both curves at world 8 is printed
//! ([`table`]); the lab's README shows the reference's, and a test keeps the two equal.

#[path = "../07-one-shot-two-shot/skeleton.rs"]
pub mod skeleton;
#[path = "../07-one-shot-two-shot/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::problem::count;
use crate::problem::Problem;
use crate::run::{self, Case, Plan};
use symm_core::cost::{self, Link};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{At, Op};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::host::{Block, DEFAULT_LINK};

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

/// What a GPU thread block pays for every data op it runs (a copy or a reduce), beyond the
/// link: its barrier and dispatch, in microseconds ([`Block::HOPPER`]'s measured cost). It is
/// the overhead `o` of the LogP model, which the alpha-beta model leaves out.
pub const OP_US: f64 = Block::HOPPER.op_us;

/// The lab's block: [`OP_US`] per data op, and no bandwidth limit of its own (the link's is
/// the only one, as in the model).
pub const BLOCK: Block = Block {
    bytes_per_us: f64::INFINITY,
    reduce_bytes_per_us: f64::INFINITY,
    op_us: OP_US,
};

/// The lab's model of an all-reduce of `algorithm` (one-shot or two-shot) at `world` ranks and
/// `bytes` bytes on `link`: the library's alpha-beta model ([`symm_core::cost::predict`]) plus
/// [`OP_US`] for each data op a rank runs one after another (one-shot: its one k-way reduce;
/// two-shot: its k-way reduce and a copy to each of the `world - 1` peers).
pub fn predict(algorithm: Algorithm, world: u16, bytes: u64, link: &Link) -> f64 {
    let ops = match algorithm {
        Algorithm::TwoShot => world as f64,
        _ => 1.0,
    };
    cost::predict(&request(algorithm, world, bytes), link) + ops * OP_US
}

/// One size of the crossover table: the model's and the simulator's microseconds, one-shot and
/// two-shot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// Bytes per rank.
    pub bytes: u64,
    /// The model's one-shot.
    pub model_one: f64,
    /// The model's two-shot.
    pub model_two: f64,
    /// The simulator's one-shot.
    pub sim_one: f64,
    /// The simulator's two-shot.
    pub sim_two: f64,
}

/// The table at [`WORLD`] of `one` and `two` over [`SIZES`] on `link`.
pub fn table(one: Plan, two: Plan, link: &Link) -> Result<Vec<Row>, Box<(u64, Problem)>> {
    SIZES
        .into_iter()
        .map(|bytes| {
            let sim = |p, a| time_us(p, a, WORLD, bytes, link).map_err(|e| Box::new((bytes, e)));
            Ok(Row {
                bytes,
                model_one: predict(Algorithm::OneShot, WORLD, bytes, link),
                model_two: predict(Algorithm::TwoShot, WORLD, bytes, link),
                sim_one: sim(one, Algorithm::OneShot)?,
                sim_two: sim(two, Algorithm::TwoShot)?,
            })
        })
        .collect()
}

/// A row as the checker prints it and the README shows it.
pub fn row_words(r: &Row) -> String {
    format!(
        "{:>9} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
        r.bytes, r.model_one, r.model_two, r.sim_one, r.sim_two
    )
}

/// The world and size of the traces `lab view 7` shows (one-shot beside two-shot).
pub const SHOWN: (u16, u64) = (8, 4096);

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
/// each stream charged [`OP_US`] per data op ([`BLOCK`]), in microseconds (timing only: no data
/// moves, so any size is cheap).
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
    run::time_us_on(&case.req, &streams, *link, BLOCK).map_err(|error| Problem::Host {
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
    Case::new(label, request(algorithm, world, n * 4)).with_block(BLOCK)
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
    let (sw, sn) = SHOWN;
    let show = case(Algorithm::TwoShot, sw, sn / 4);
    g.traces(&show, two, &solution::two_shot);
    g.trace("one-shot.trace", &case(Algorithm::OneShot, sw, sn / 4), one);
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
        "note  all-reduce at world {WORLD} on NVLink 4, {OP_US} us per data op, microseconds:\n      {:>9} {:>9} {:>9} {:>9} {:>9}",
        "bytes", "model 1", "model 2", "sim 1", "sim 2"
    ));
    let rows = match table(one, two, &link) {
        Ok(rows) => rows,
        Err(e) => {
            let (bytes, p) = *e;
            let c = case(Algorithm::TwoShot, WORLD, bytes / 4);
            return Err(Grader::fail(&c, p, &hint, &[]));
        }
    };
    for r in &rows {
        g.note(format!("      {}", row_words(r)));
    }
    let sim_cross = rows.iter().find(|r| r.sim_two < r.sim_one).map(|r| r.bytes);
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
            "the first size of SIZES where lab07::predict of the two-shot is below the \
             one-shot's",
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

/// The simulated times of the shown traces ([`SHOWN`]): the reference's one-shot and two-shot,
/// in microseconds.
pub fn shown_times() -> Result<(f64, f64), Problem> {
    let (w, bytes) = SHOWN;
    let link = DEFAULT_LINK;
    Ok((
        time_us(&solution::one_shot, Algorithm::OneShot, w, bytes, &link)?,
        time_us(&solution::two_shot, Algorithm::TwoShot, w, bytes, &link)?,
    ))
}
