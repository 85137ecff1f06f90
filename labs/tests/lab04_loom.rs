//! Lab 4, second half: the barrier's memory orderings, under loom.
//!
//! loom runs a program under every interleaving of its threads and, for each relaxed load,
//! every value the memory model allows it to return. The model here is two ranks as two
//! threads: each writes its data (a relaxed store, like a put), runs the student's barrier ops
//! on signal pads whose signals use `SIGNAL` and whose waits use `WAIT` (the student's
//! constants), then reads the peer's data. A barrier must make the peer's write visible; with
//! relaxed orderings loom finds an execution where it is not.
//!
//! Run by `cargo xtask lab check 4` as
//! `RUSTFLAGS="--cfg loom" cargo test --release -p symm-labs --test lab04_loom -- [--solution]`
//! (in `<target>/loom`); `--grade` requires the solution to pass and the skeleton to fail.
//! Without `--cfg loom` this test only says how to run it.

#[cfg(not(loom))]
fn main() {
    println!(
        "lab04_loom: lab 4's loom model runs with --cfg loom: cargo xtask lab check 4, or \
         RUSTFLAGS=\"--cfg loom\" cargo test --release -p symm-labs --test lab04_loom"
    );
}

#[cfg(loom)]
fn main() -> std::process::ExitCode {
    model::main()
}

#[cfg(loom)]
mod model {
    use loom::sync::atomic::AtomicU64;
    use loom::sync::Arc;
    use std::process::ExitCode;
    use std::sync::atomic::Ordering;
    use std::sync::Mutex;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::exec::{Executor, Fabric, LlPoll, Step};
    use symm_core::op::{Op, SignalOp};
    use symm_core::sched::{Algorithm, Collective, Request};
    use symm_labs::kit::Kit;
    use symm_labs::lab04::{skeleton, solution};

    type Barrier = fn(&Kit) -> Vec<Op>;

    /// Two ranks' signal pads and data words.
    struct World {
        pads: Vec<Vec<AtomicU64>>,
        data: Vec<AtomicU64>,
    }

    /// One rank's view: signals with `signal`, waits load with `wait`.
    struct View<'a> {
        world: &'a World,
        rank: usize,
        signal: Ordering,
        wait: Ordering,
    }

    impl Fabric for View<'_> {
        type Error = String;
        fn execute(&mut self, op: &Op) -> Result<(), String> {
            let Op::Signal {
                peer,
                slot,
                op,
                value,
            } = *op
            else {
                return Err(format!("a barrier only signals and waits; it ran {op:?}"));
            };
            let s = self
                .world
                .pads
                .get(peer as usize)
                .and_then(|p| p.get(slot as usize))
                .ok_or_else(|| format!("signal to rank {peer}'s slot {slot}: no such slot"))?;
            match op {
                SignalOp::Add => {
                    s.fetch_add(value, self.signal);
                }
                SignalOp::Set => return Err("the barrier's signals add 1 (k.signal)".into()),
            }
            Ok(())
        }
        fn load_slot(&mut self, slot: u32) -> Result<u64, String> {
            self.world.pads[self.rank]
                .get(slot as usize)
                .map(|s| s.load(self.wait))
                .ok_or_else(|| format!("wait on slot {slot}: no such slot"))
        }
        fn ll(&mut self, op: &Op, _epoch: u64) -> Result<LlPoll, String> {
            Err(format!("a barrier only signals and waits; it ran {op:?}"))
        }
    }

    fn request() -> Request {
        Request::new(
            Collective::AllGather,
            Algorithm::Direct,
            2,
            4,
            DType::U32,
            ReduceOp::Sum,
        )
    }

    /// Rank `rank`: write my data, pass the barrier, read the peer's.
    fn rank(world: &World, rank: usize, barrier: Barrier, signal: Ordering, wait: Ordering) {
        let req = request();
        let peer = 1 - rank;
        world.data[rank].store(100 + rank as u64, Ordering::Relaxed);
        let ops = barrier(&Kit::new(req, rank as u16, 0));
        let mut expected = vec![0u64; req.layout().slots() as usize];
        let mut ex = Executor::new(ops.into_iter(), &mut expected);
        let mut view = View {
            world,
            rank,
            signal,
            wait,
        };
        loop {
            match ex.step(&mut view) {
                Ok(Step::Ran { .. }) => {}
                Ok(Step::Blocked { .. }) => loom::thread::yield_now(),
                Ok(Step::Done) => break,
                Err(e) => return found(format!("rank {rank}'s barrier op failed: {e:?}")),
            }
        }
        let seen = world.data[peer].load(Ordering::Relaxed);
        if seen != 100 + peer as u64 {
            found(format!(
                "rank {rank} passed the barrier and then read rank {peer}'s data as {seen}, the \
                 value from before rank {peer} wrote it"
            ));
        }
    }

    /// The first broken execution's story. Model threads record it here rather than panic (a
    /// panic inside a loom thread aborts the process), and loom explores on.
    static FOUND: Mutex<Option<String>> = Mutex::new(None);

    fn found(message: String) {
        if let Ok(mut m) = FOUND.lock() {
            m.get_or_insert(message);
        }
    }

    /// Explores every execution; the first failing assertion's message, if any.
    fn explore(barrier: Barrier, signal: Ordering, wait: Ordering) -> Result<(), String> {
        if matches!(wait, Ordering::Release | Ordering::AcqRel) {
            return Err(format!(
                "WAIT = {wait:?}: a load cannot release (it writes nothing to publish)"
            ));
        }
        if let Ok(mut m) = FOUND.lock() {
            *m = None;
        }
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(move || {
            let slots = request().layout().slots() as usize;
            let world = Arc::new(World {
                pads: (0..2)
                    .map(|_| (0..slots).map(|_| AtomicU64::new(0)).collect())
                    .collect(),
                data: (0..2).map(|_| AtomicU64::new(0)).collect(),
            });
            let other = world.clone();
            let t = loom::thread::spawn(move || rank(&other, 1, barrier, signal, wait));
            rank(&world, 0, barrier, signal, wait);
            t.join().unwrap();
        });
        match FOUND.lock().ok().and_then(|mut m| m.take()) {
            Some(message) => Err(message),
            None => Ok(()),
        }
    }

    /// Checks one side and says what loom found.
    fn check(name: &str, barrier: Barrier, signal: Ordering, wait: Ordering) -> bool {
        println!("lab 4 under loom ({name}): SIGNAL = {signal:?}, WAIT = {wait:?}");
        if let Some((message, hint)) = symm_labs::lab04::refused_orderings(signal, wait) {
            println!("FAIL  {message}\nhint: {hint}");
            return false;
        }
        match explore(barrier, signal, wait) {
            Ok(()) => {
                println!(
                    "pass  loom explored every execution of two ranks: each sees the other's \
                     write after the barrier"
                );
                true
            }
            Err(message) => {
                println!("FAIL  loom found an execution that breaks the barrier:\n      {message}");
                let weak = signal == Ordering::Relaxed || wait == Ordering::Relaxed;
                if weak {
                    println!(
                        "hint: a relaxed signal carries no data with it, and a relaxed wait \
                         learns only the count: the write before the signal may still be \
                         invisible. The signal must publish (Release) and the wait must \
                         receive (Acquire) what was written before it"
                    );
                } else {
                    println!(
                        "hint: the orderings pair up, so the barrier's ops let a rank through \
                         before its peer arrived: wait for one Barrier signal of every peer"
                    );
                }
                false
            }
        }
    }

    pub fn main() -> ExitCode {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let has = |f: &str| args.iter().any(|a| a == f);
        let ok =
            if has("--grade") {
                let sol = check(
                    "the solution",
                    solution::barrier,
                    solution::SIGNAL,
                    solution::WAIT,
                );
                let stu = check(
                    "the untouched skeleton, which must fail",
                    skeleton::barrier,
                    skeleton::SIGNAL,
                    skeleton::WAIT,
                );
                // Each half of the pair is needed: loom must catch either one weakened.
                let one_sided =
                    [
                        (solution::SIGNAL, Ordering::Relaxed),
                        (Ordering::Relaxed, solution::WAIT),
                    ]
                    .into_iter()
                    .all(|(signal, wait)| {
                        let caught = explore(solution::barrier, signal, wait).is_err();
                        println!(
                    "{}  the solution's barrier with SIGNAL = {signal:?}, WAIT = {wait:?}: {}",
                    if caught { "pass" } else { "FAIL" },
                    if caught { "loom finds the bug" } else { "loom misses the bug" }
                );
                        caught
                    });
                match (sol && one_sided, stu) {
                    (true, false) => {
                        println!("lab 4 (loom): the solution passes and the skeleton fails");
                        true
                    }
                    (false, _) => false,
                    (true, true) => {
                        println!("lab 4 (loom): FAILED: the untouched skeleton passes");
                        false
                    }
                }
            } else if has("--solution") {
                check(
                    "the solution",
                    solution::barrier,
                    solution::SIGNAL,
                    solution::WAIT,
                )
            } else {
                check(
                    "your skeleton.rs",
                    skeleton::barrier,
                    skeleton::SIGNAL,
                    skeleton::WAIT,
                )
            };
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}
