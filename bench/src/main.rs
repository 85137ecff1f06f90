//! `symm-bench`: symm's checks and benchmarks on real GPUs, the one binary to copy to a GPU
//! machine. `cargo xtask hw ARGS` builds it in release and runs it with ARGS.
//!
//! * `symm-bench check`: correctness, one process per GPU through symm-run's launcher (or
//!   `--one-process`: every GPU from this process), the safety and leak checks, the selftest;
//! * `symm-bench bench`: every collective and size beside NCCL and PyTorch SymmetricMemory,
//!   nccl-tests columns, a JSON record, SVG plots;
//! * `symm-bench comm-rank` (hidden): one rank of a check or of the bench, started by the two
//!   above as `current_exe() comm-rank PHASE ...`.

mod hw;
mod mps;
mod progress;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// symm on real GPUs: correctness checks and benchmarks beside NCCL and PyTorch.
#[derive(Parser, Debug)]
#[command(name = "symm-bench", version, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Correctness on GPUs (`cargo xtask hw`).
    ///
    /// The conformance matrix (every collective x algorithm, multicast
    /// never, x size x dtype x op) bit exact on every rank, graph replay, the device API, traces
    /// diffed against the simulator, timeout / poison / reset, hostile calls, the caller's
    /// context, leak checks and a rank killed inside a collective.
    Check(CheckArgs),
    /// Every collective and size beside NCCL and PyTorch (`cargo xtask hw bench`).
    ///
    /// Every collective at every size, one process per GPU, symm beside NCCL (same processes,
    /// same buffers) and PyTorch SymmetricMemory, eager and in CUDA graphs; prints nccl-tests
    /// columns and writes bench-wN.json, bench-wN.md and SVG plots to --out.
    Bench(BenchArgs),
    /// One rank of a check or bench phase (started by `check` and `bench`).
    #[command(hide = true)]
    CommRank(RankArgs),
}

/// `symm-bench check`.
#[derive(Args, Debug, Clone)]
pub(crate) struct CheckArgs {
    /// World sizes to run.
    #[arg(long, value_delimiter = ',', default_values_t = [2u16, 4])]
    pub worlds: Vec<u16>,
    /// Largest message of the matrix (bytes; K, M, G suffixes; default 256M).
    #[arg(long, value_parser = parse_size)]
    pub max_bytes: Option<u64>,
    /// Traces and per-rank reports.
    #[arg(long, default_value = "hw-out")]
    pub out: PathBuf,
    /// Heap create/destroy cycles of the leak check (default 10000, 1000 per process).
    #[arg(long)]
    pub leak_cycles: Option<u32>,
    /// Every GPU driven from this process (World) instead of one process per GPU: the same
    /// matrix plus dtype semantics, graph replay, device API, trace diff, safety and the VMM
    /// leak check.
    #[arg(long)]
    pub one_process: bool,
    /// Only the quick bench: `bench --quick --no-torch` per world (with --one-process: the
    /// all-reduce from one process).
    #[arg(long)]
    pub bench_quick: bool,
    /// Only the selftest: a Wait with no Signal must fail within the deadline, naming the slot.
    #[arg(long)]
    pub selftest_timeout: bool,
    /// Only the MoE phase: dispatch, combine and the device-count all-to-allv against the host
    /// reference (graph replays included), and their latency.
    #[arg(long)]
    pub moe: bool,
    /// Only the deterministic phase: a job in deterministic mode, every algorithm, channel count
    /// and size against the rank-order reference, eager, on plain buffers and in graphs.
    #[arg(long)]
    pub deterministic: bool,
    /// Only the fault suite: calls that differ across ranks (on first use and after), a skipped
    /// or doubled call, a rank that abandons the job or is stopped past the deadline; each named
    /// by a typed error on every rank, then reset and 100 all-reduces bit exact.
    #[arg(long)]
    pub faults: bool,
    /// Correctness, the quick bench and the selftest in one run.
    #[arg(long)]
    pub all: bool,
    /// Ranks share the GPUs there are (SYMM_DEVICES=mod, so any world runs on one GPU), under
    /// an MPS daemon this run starts in a private directory and stops at the end.
    #[arg(long)]
    pub share_gpus: bool,
}

/// `symm-bench bench`, with nccl-tests' size and iteration flags.
#[derive(Args, Debug, Clone)]
pub(crate) struct BenchArgs {
    /// Smallest size (bytes; K, M, G suffixes).
    #[arg(short = 'b', long, value_parser = parse_size, default_value = "1K")]
    pub minbytes: u64,
    /// Largest size (bytes; K, M, G suffixes).
    #[arg(short = 'e', long, value_parser = parse_size, default_value = "1G")]
    pub maxbytes: u64,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..))]
    pub stepfactor: u64,
    /// Timed iterations per measurement (0: enough for about 20 ms, 5 to 1000).
    #[arg(short = 'n', long, default_value_t = 0)]
    pub iters: u32,
    /// Warm-up iterations before each measurement.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub warmup_iters: u32,
    /// World sizes to run.
    #[arg(long, value_delimiter = ',', default_values_t = [2u16])]
    pub worlds: Vec<u16>,
    /// Sizes 1K, 1M and 256M only (overrides -b/-e/-f).
    #[arg(long)]
    pub quick: bool,
    /// Where the tables, JSON and plots go.
    #[arg(long, default_value = "docs/perf")]
    pub out: PathBuf,
    /// Skip the PyTorch script.
    #[arg(long)]
    pub no_torch: bool,
    /// Only these collectives (all_reduce, all_gather, reduce_scatter, alltoall, broadcast;
    /// default every one). The samples of the others are kept from the last run into the same
    /// --out (its samples-wN.tsv), so a long run splits into calls whose tables, plots and
    /// calibration hold every collective measured.
    #[arg(long, value_delimiter = ',')]
    pub collectives: Vec<String>,
    /// Also try a quarter and four times the default channels, and write the fastest
    /// (algorithm, channels) per collective and size as symm-core's calibration table of this
    /// (topology, world) into DIR (core/src/cost/calibration: `<topology>_w<world>.rs`, and
    /// the index `calibration.rs` beside DIR, which lists every table there).
    #[arg(long, value_name = "DIR")]
    pub calibrate: Option<PathBuf>,
    /// Measure nothing: redo the tables, plots, simulator fit and (with --calibrate) the
    /// calibration table of each world from --out's samples-wN.tsv, written by an earlier run
    /// (on any machine, no GPU needed; SYMM_DEVICES=mod for samples of ranks sharing a GPU).
    #[arg(long)]
    pub from_samples: bool,
}

impl BenchArgs {
    /// The sizes of the run: `-b`, times `-f`, up to `-e` (or the quick three).
    pub fn sizes(&self) -> Vec<u64> {
        if self.quick {
            return vec![1 << 10, 1 << 20, 256 << 20];
        }
        let mut v = Vec::new();
        let mut s = self.minbytes.max(1);
        while s <= self.maxbytes {
            v.push(s);
            match s.checked_mul(self.stepfactor.max(2)) {
                Some(n) => s = n,
                None => break,
            }
        }
        v
    }
}

/// `symm-bench comm-rank PHASE ...`.
#[derive(Args, Debug, Clone)]
pub(crate) struct RankArgs {
    /// correct, leak, death, perf or perf-cal.
    pub phase: String,
    #[arg(long, value_parser = parse_size)]
    pub max_bytes: Option<u64>,
    #[arg(long, default_value_t = 1000)]
    pub leak_cycles: u32,
    #[arg(long, default_value = "hw-out")]
    pub out: PathBuf,
    /// The bench's sizes.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u64>,
    #[arg(long, default_value_t = 0)]
    pub iters: u32,
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// The bench's collectives (default every one).
    #[arg(long, value_delimiter = ',')]
    pub collectives: Vec<String>,
}

/// A byte count: digits with an optional K, M or G (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 10),
        Some((i, 'm' | 'M')) => (&t[..i], 20),
        Some((i, 'g' | 'G')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n: u64 = num.parse().map_err(|e| format!("{s:?}: {e}"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?}: too large"))
}

fn main() -> ExitCode {
    // Before anything loads NCCL (the bench, the ranks) or starts a program that may: NCCL's
    // loader refuses without these, and every child inherits them.
    // SAFETY: first statement of `main`: no other thread exists yet.
    if let Err(e) = unsafe { symm_driver::safety_env::set_for_process() } {
        eprintln!("error: symm-bench refuses to run: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    // SAFETY: still before any thread or CUDA library (parsing started none).
    let _mps =
        matches!(&cli.cmd, Cmd::Check(a) if a.share_gpus).then(|| unsafe { mps::Mps::start() });
    let result = match cli.cmd {
        Cmd::Check(a) => hw::run(&a),
        Cmd::Bench(a) => hw::perf::run(&a),
        Cmd::CommRank(a) => hw::comm::rank(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_follow_nccl_tests_flags() {
        let cli = Cli::try_parse_from(["symm-bench", "bench", "-b", "1K", "-e", "1M", "-f", "32"])
            .expect("parses");
        let Cmd::Bench(a) = cli.cmd else {
            panic!("not bench")
        };
        assert_eq!(a.sizes(), vec![1 << 10, 1 << 15, 1 << 20]);
        let cli = Cli::try_parse_from(["symm-bench", "bench"]).expect("parses");
        let Cmd::Bench(a) = cli.cmd else {
            panic!("not bench")
        };
        let want: Vec<u64> = (0..11).map(|i| 1u64 << (10 + 2 * i)).collect();
        assert_eq!(a.sizes(), want);
        assert_eq!((a.iters, a.warmup_iters), (0, 1));
    }

    #[test]
    fn bad_command_lines_are_refused() {
        for bad in [
            &["symm-bench", "check", "--frobnicate"][..],
            &["symm-bench", "bench", "-f", "1"],
            &["symm-bench", "bench", "-b", "12Q"],
            &["symm-bench", "bench", "-e", "99999999999G"],
            &["symm-bench", "check", "--worlds", "two"],
            &["symm-bench", "--max-bytes", "4"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4"), Ok(4));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("").is_err() && parse_size("K").is_err() && parse_size("-1").is_err());
    }
}
