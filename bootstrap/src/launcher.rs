//! `symm-run`: starts the ranks of a job on this host, and ends the job when one fails.
//!
//! ```text
//! symm-run -n N [--timeout S] [--grace S] [--job NAME] [--no-prefix] -- PROGRAM [ARGS...]
//! ```
//!
//! * Makes a job name (`--job`, else `j<pid>-<random>`) and a 32-byte token from
//!   `/dev/urandom`, and starts N copies of PROGRAM with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!   `LOCAL_WORLD_SIZE`, `SYMM_JOB`, `SYMM_TOKEN` set, and always `NCCL_NVLS_ENABLE=0`,
//!   `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`, `NVSHMEM_DISABLE_NVLS=1` (NVLink multicast stays off
//!   on shared machines, whatever the caller's environment says).
//! * Each rank runs in its own process group with no standard input. Its output lines are
//!   prefixed `[r] ` (unless `--no-prefix`).
//! * Nothing of the job outlives the launcher, however it ends. A rank's leader receives
//!   `SIGTERM` when the launcher dies (`PR_SET_PDEATHSIG`), and a watchdog process forked before
//!   the first rank (`sys::Watchdog`, in a group of its own) sees the launcher's death as end of
//!   file on a pipe, even after `SIGKILL`, and ends every rank's whole group, grandchildren and
//!   processes that ignore `SIGTERM` included: `SIGTERM`, then `SIGKILL` after the grace period.
//!   On its own way out the launcher does the same to any group that still has a process (a
//!   rank's background child, say), then disarms the watchdog.
//! * `SIGINT` and `SIGTERM` to the launcher are forwarded to every rank's group.
//! * When a rank exits non-zero or dies of a signal the launcher did not send, the launcher names
//!   it, sends the other ranks `SIGTERM`, then `SIGKILL` after the grace period (`--grace`,
//!   default 5 s), and exits with that rank's exit status (128 + signal for a signal). The same
//!   happens to every rank after `--timeout` seconds (exit 124) and after a forwarded signal
//!   (exit 128 + signal). When every rank exits 0, so does the launcher.

use std::ffi::OsString;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::job::env::{self, Token, MAX_WORLD};
use crate::job::sys;

mod gpus;
use gpus::{dev_nodes, share_gpus, visible_gpus};

/// Variables set to keep NVLink multicast off, in every rank, always ([`crate::safety_env`]).
pub use crate::safety_env::SAFETY_ENV;

/// Longest output line forwarded whole; longer ones are split.
const MAX_LINE: u64 = 64 * 1024;
/// How often the launcher looks at its ranks.
const TICK: Duration = Duration::from_millis(10);
/// How long the launcher waits for the ranks' last output after they exit.
const DRAIN: Duration = Duration::from_secs(2);

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Ranks to start.
    pub ranks: u16,
    /// End the job after this long.
    pub timeout: Option<Duration>,
    /// Time between `SIGTERM` and `SIGKILL` when ending ranks.
    pub grace: Duration,
    /// The job's name (else one is made).
    pub job: Option<String>,
    /// Prefix each output line with the rank.
    pub prefix: bool,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// Why the launcher could not start or run the job.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LaunchError {
    /// `-h` or `--help`: print [`USAGE`].
    Help,
    /// An option needs a value and none followed.
    MissingValue {
        /// The option.
        flag: &'static str,
    },
    /// An option's value is out of range or malformed (cut to 64 characters).
    BadValue {
        /// The option.
        flag: &'static str,
        /// The value.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// An unknown option (cut to 64 characters).
    Unknown {
        /// The argument.
        arg: String,
    },
    /// `-n` was not given.
    NoRanks,
    /// No program follows the options.
    NoProgram,
    /// The token could not be read from `/dev/urandom`.
    Token(String),
    /// Signal handlers could not be installed.
    Signals(String),
    /// The watchdog that ends the ranks if the launcher dies could not be started or fed.
    Watchdog(String),
    /// A rank could not be started (the ones already started were ended).
    Spawn {
        /// The rank.
        rank: u16,
        /// The operating system's message.
        message: String,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::Help => write!(f, "{USAGE}"),
            LaunchError::MissingValue { flag } => write!(f, "{flag} needs a value"),
            LaunchError::BadValue {
                flag,
                value,
                expected,
            } => write!(f, "{flag} {value:?}: expected {expected}"),
            LaunchError::Unknown { arg } => write!(f, "unknown option {arg:?}"),
            LaunchError::NoRanks => write!(f, "-n N is required"),
            LaunchError::NoProgram => write!(f, "no program to run (put it after --)"),
            LaunchError::Token(e) => write!(f, "cannot read /dev/urandom: {e}"),
            LaunchError::Signals(e) => write!(f, "cannot install signal handlers: {e}"),
            LaunchError::Watchdog(e) => write!(f, "cannot start the watchdog: {e}"),
            LaunchError::Spawn { rank, message } => {
                write!(f, "cannot start rank {rank}: {message}")
            }
        }
    }
}

impl std::error::Error for LaunchError {}

/// The usage text.
pub const USAGE: &str = "usage: symm-run -n N [--timeout S] [--grace S] [--job NAME] [--no-prefix] -- PROGRAM [ARGS...]";

fn cut(s: &OsString) -> String {
    s.to_string_lossy().chars().take(64).collect()
}

fn seconds(flag: &'static str, v: &OsString) -> Result<Duration, LaunchError> {
    let bad = || LaunchError::BadValue {
        flag,
        value: cut(v),
        expected: "seconds, a number from 0 to 1000000",
    };
    let s = v.to_str().ok_or_else(bad)?;
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
        return Err(bad());
    }
    let x: f64 = s.parse().map_err(|_| bad())?;
    if !(0.0..=1e6).contains(&x) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(x))
}

/// Parses the arguments after the program name.
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Options, LaunchError> {
    let mut it = args.into_iter();
    let mut o = Options {
        ranks: 0,
        timeout: None,
        grace: Duration::from_secs(5),
        job: None,
        prefix: true,
        command: Vec::new(),
    };
    let value = |it: &mut dyn Iterator<Item = OsString>, flag| {
        it.next().ok_or(LaunchError::MissingValue { flag })
    };
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-h" | "--help") => return Err(LaunchError::Help),
            Some("-n" | "--nproc") => {
                let v = value(&mut it, "-n")?;
                let bad = || LaunchError::BadValue {
                    flag: "-n",
                    value: cut(&v),
                    expected: "a rank count from 1 to 1024",
                };
                let s = v.to_str().ok_or_else(bad)?;
                if s.is_empty() || s.len() > 5 || !s.bytes().all(|c| c.is_ascii_digit()) {
                    return Err(bad());
                }
                let n: u32 = s.parse().map_err(|_| bad())?;
                if n == 0 || n > MAX_WORLD as u32 {
                    return Err(bad());
                }
                o.ranks = n as u16;
            }
            Some("--timeout") => {
                o.timeout = Some(seconds("--timeout", &value(&mut it, "--timeout")?)?)
            }
            Some("--grace") => o.grace = seconds("--grace", &value(&mut it, "--grace")?)?,
            Some("--job") => {
                let v = value(&mut it, "--job")?;
                o.job = Some(env::parse_job(&v).map_err(|_| LaunchError::BadValue {
                    flag: "--job",
                    value: cut(&v),
                    expected: "1 to 64 of A-Z a-z 0-9 . _ -",
                })?);
            }
            Some("--no-prefix") => o.prefix = false,
            Some("--") => {
                o.command.extend(it.by_ref());
                break;
            }
            Some(s) if s.starts_with('-') => return Err(LaunchError::Unknown { arg: cut(&a) }),
            _ => {
                o.command.push(a);
                o.command.extend(it.by_ref());
                break;
            }
        }
    }
    if o.ranks == 0 {
        return Err(LaunchError::NoRanks);
    }
    if o.command.is_empty() {
        return Err(LaunchError::NoProgram);
    }
    Ok(o)
}

/// Copies `src` to the launcher's stdout (or stderr) a line at a time, each line prefixed.
fn forward(rank: u16, src: impl Read, to_stderr: bool, done: mpsc::Sender<()>) {
    let prefix = format!("[{rank}] ");
    let mut r = BufReader::new(src);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut r).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        // A closed stdout or stderr must not stop the job: write errors are dropped.
        let _ = if to_stderr {
            let mut e = std::io::stderr().lock();
            e.write_all(prefix.as_bytes())
                .and_then(|_| e.write_all(&line))
        } else {
            let mut o = std::io::stdout().lock();
            o.write_all(prefix.as_bytes())
                .and_then(|_| o.write_all(&line))
                .and_then(|_| o.flush())
        };
    }
    let _ = done.send(());
}

/// One started rank.
struct Rank {
    rank: u16,
    child: Child,
    status: Option<ExitStatus>,
}

/// An exit status as the launcher's own exit code.
fn code_of(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}

/// Sends `sig` to every rank's process group, also where the rank itself has exited: its
/// children may still be there.
fn signal_all(ranks: &[Rank], sig: i32) {
    for r in ranks {
        // A group already gone is not an error worth reporting.
        let _ = sys::kill_group(r.child.id(), sig);
    }
}

/// After every rank exited: ends what their groups still hold (`SIGTERM`, `SIGKILL` after
/// `grace`), and waits a little for the kernel to take it.
fn sweep(ranks: &[Rank], grace: Duration) {
    let left = || -> Vec<u16> {
        ranks
            .iter()
            .filter(|r| sys::group_alive(r.child.id()))
            .map(|r| r.rank)
            .collect()
    };
    let behind = left();
    if behind.is_empty() {
        return;
    }
    eprintln!(
        "symm-run: rank(s) {} left processes behind; ending them",
        list(&behind)
    );
    signal_all(ranks, sys::SIGTERM);
    let until = |end: Instant| {
        while !left().is_empty() && Instant::now() < end {
            std::thread::sleep(TICK);
        }
    };
    until(Instant::now() + grace);
    signal_all(ranks, sys::SIGKILL);
    until(Instant::now() + Duration::from_secs(1));
}

fn list(ranks: &[u16]) -> String {
    ranks
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs the job; returns the launcher's exit code. Messages go to stderr, prefixed `symm-run:`.
pub fn run(o: &Options) -> Result<i32, LaunchError> {
    let random = || Token::random().map_err(|e| LaunchError::Token(e.to_string()));
    let token = random()?;
    let job = match &o.job {
        Some(j) => j.clone(),
        // The name is public (it names the socket): its random part is not the token's.
        None => format!("j{}-{}", std::process::id(), &random()?.to_hex()[..12]),
    };
    let _caught = sys::catch_signals(&[sys::SIGINT, sys::SIGTERM])
        .map_err(|e| LaunchError::Signals(e.to_string()))?;
    let watchdog =
        sys::Watchdog::start(o.grace).map_err(|e| LaunchError::Watchdog(e.to_string()))?;
    let (done_tx, done_rx) = mpsc::channel();
    let mut streams = 0;
    let mut ranks: Vec<Rank> = Vec::with_capacity(o.ranks as usize);
    let share = share_gpus(
        o.ranks,
        std::env::var_os("SYMM_DEVICES").is_some(),
        visible_gpus(std::env::var_os("CUDA_VISIBLE_DEVICES"), dev_nodes()),
    );
    if let Some(gpus) = share {
        eprintln!(
            "symm-run: {} ranks on {gpus} GPU(s): ranks share GPUs (SYMM_DEVICES=mod; start MPS \
             for full speed, see the README)",
            o.ranks
        );
    }
    for r in 0..o.ranks {
        let mut cmd = crate::safety_env::command(&o.command[0]);
        cmd.args(&o.command[1..])
            .env(env::RANK, r.to_string())
            .env(env::WORLD_SIZE, o.ranks.to_string())
            .env(env::LOCAL_RANK, r.to_string())
            .env("LOCAL_WORLD_SIZE", o.ranks.to_string())
            .env(env::SYMM_JOB, &job)
            .env(env::SYMM_TOKEN, token.to_hex())
            .envs(share.map(|_| ("SYMM_DEVICES", "mod")))
            .stdin(Stdio::null())
            .process_group(0);
        if o.prefix {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        sys::die_with_parent(&mut cmd, sys::SIGTERM);
        let started = cmd.spawn().and_then(|mut c| match watchdog.guard(c.id()) {
            Ok(()) => Ok(c),
            Err(e) => {
                let _ = sys::kill_group(c.id(), sys::SIGKILL);
                let _ = c.wait();
                Err(e)
            }
        });
        let mut child = match started {
            Ok(c) => c,
            Err(e) => {
                signal_all(&ranks, sys::SIGKILL);
                for r in &mut ranks {
                    let _ = r.child.wait();
                }
                // Dropping the watchdog undisarmed ends whatever the groups still hold.
                return Err(LaunchError::Spawn {
                    rank: r,
                    message: e.to_string(),
                });
            }
        };
        if let Some(out) = child.stdout.take() {
            let tx = done_tx.clone();
            std::thread::spawn(move || forward(r, out, false, tx));
            streams += 1;
        }
        if let Some(err) = child.stderr.take() {
            let tx = done_tx.clone();
            std::thread::spawn(move || forward(r, err, true, tx));
            streams += 1;
        }
        ranks.push(Rank {
            rank: r,
            child,
            status: None,
        });
    }
    drop(done_tx);

    let start = Instant::now();
    let mut failed: Option<(u16, ExitStatus)> = None;
    let mut signalled: Option<i32> = None;
    let mut timed_out = false;
    let mut kill_at: Option<Instant> = None;
    let end = |why: String, ranks: &[Rank], kill_at: &mut Option<Instant>| {
        let live: Vec<u16> = ranks
            .iter()
            .filter(|r| r.status.is_none())
            .map(|r| r.rank)
            .collect();
        if !live.is_empty() {
            eprintln!("symm-run: {why}; ending rank(s) {}", list(&live));
        }
        signal_all(ranks, sys::SIGTERM);
        kill_at.get_or_insert(Instant::now() + o.grace);
    };
    loop {
        let caught = sys::take_caught();
        for sig in [sys::SIGINT, sys::SIGTERM] {
            if caught & (1 << sig) != 0 {
                signalled.get_or_insert(sig);
                signal_all(&ranks, sig);
                kill_at.get_or_insert(Instant::now() + o.grace);
            }
        }
        for i in 0..ranks.len() {
            if ranks[i].status.is_some() {
                continue;
            }
            let st = match ranks[i].child.try_wait() {
                Ok(Some(st)) => st,
                Ok(None) => continue,
                // Not our child any more (cannot happen): count it as ended.
                Err(_) => ExitStatus::from_raw(1 << 8),
            };
            ranks[i].status = Some(st);
            let ending = failed.is_some() || signalled.is_some() || timed_out;
            if !st.success() && !ending {
                let rank = ranks[i].rank;
                failed = Some((rank, st));
                end(
                    format!("rank {rank} {}", describe(st)),
                    &ranks,
                    &mut kill_at,
                );
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        if let Some(t) = o.timeout {
            if !timed_out && failed.is_none() && start.elapsed() >= t {
                timed_out = true;
                end(
                    format!("the job passed its {t:?} timeout"),
                    &ranks,
                    &mut kill_at,
                );
            }
        }
        if kill_at.is_some_and(|k| Instant::now() >= k) {
            signal_all(&ranks, sys::SIGKILL);
            kill_at = Some(Instant::now() + Duration::from_secs(3600));
        }
        std::thread::sleep(TICK);
    }
    sweep(&ranks, o.grace);
    watchdog.disarm();
    let drain_end = Instant::now() + DRAIN;
    for _ in 0..streams {
        let left = drain_end.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    Ok(match (failed, signalled, timed_out) {
        (Some((rank, st)), _, _) => {
            eprintln!("symm-run: job failed: rank {rank} {}", describe(st));
            code_of(st).clamp(1, 255)
        }
        (None, Some(sig), _) => {
            eprintln!("symm-run: ended by signal {sig}");
            128 + sig
        }
        (None, None, true) => 124,
        (None, None, false) => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Options, LaunchError> {
        parse_args(s.split_whitespace().map(OsString::from))
    }

    #[test]
    fn arguments_parse_strictly() {
        let o = args("-n 4 --timeout 2.5 --grace 0 --job a.b -- prog -n x").unwrap();
        assert_eq!(o.ranks, 4);
        assert_eq!(o.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(o.grace, Duration::ZERO);
        assert_eq!(o.job.as_deref(), Some("a.b"));
        assert_eq!(o.command, ["prog", "-n", "x"].map(OsString::from));
        assert_eq!(args("-n 2 prog --x").unwrap().command.len(), 2);
        assert!(args("-n 2 --no-prefix -- p").is_ok_and(|o| !o.prefix));
        assert_eq!(args("-n 2"), Err(LaunchError::NoProgram));
        assert_eq!(args("-- prog"), Err(LaunchError::NoRanks));
        assert_eq!(args("-n"), Err(LaunchError::MissingValue { flag: "-n" }));
        assert_eq!(args("--help"), Err(LaunchError::Help));
        for bad in ["0", "1025", "-1", "x", "99999999999", "1.5"] {
            assert!(
                matches!(
                    args(&format!("-n {bad} p")),
                    Err(LaunchError::BadValue { .. })
                ),
                "{bad}"
            );
        }
        for bad in ["-1", "nan", "inf", "1e9", "", "1..2"] {
            assert!(args(&format!("-n 1 --timeout {bad} p")).is_err(), "{bad}");
        }
        assert!(matches!(
            args("-n 1 --job a/b p"),
            Err(LaunchError::BadValue { .. })
        ));
        assert!(matches!(
            args("-n 1 --frob p"),
            Err(LaunchError::Unknown { .. })
        ));
        let long = format!("-n 1 --{} p", "x".repeat(5000));
        assert!(args(&long).unwrap_err().to_string().len() < 200);
    }

    #[test]
    fn statuses_become_exit_codes() {
        assert_eq!(code_of(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(code_of(ExitStatus::from_raw(9)), 137);
        assert_eq!(describe(ExitStatus::from_raw(9)), "was killed by signal 9");
    }
}
