//! The process-per-GPU bootstrap and `symm-run` with real processes, no GPU.
//!
//! Ranks are this test binary run again with `SYMM_TEST_ROLE` naming what the child does (the
//! `child` test below); a child reports on stdout in lines `@@ key value` and counts its open
//! descriptors (`/proc/self/fd`) before joining and after dropping the bootstrap.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use symm_bootstrap::{memfd, BootstrapError, JobEnv, Refusal, SocketBootstrap, NOT_LOST};

const ROLE: &str = "SYMM_TEST_ROLE";
const TIMEOUT: &str = "SYMM_TEST_TIMEOUT_MS";
const GOOD_TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const BAD_TOKEN: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
/// Where timing is not the point: long enough for a loaded two-core machine.
const SLOW: Duration = Duration::from_secs(60);

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn say(key: &str, value: impl std::fmt::Display) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "@@ {key} {value}");
    let _ = o.flush();
}

/// The content rank `r`'s memfd holds in round `round`.
fn content(r: u16, round: u32) -> Vec<u8> {
    format!("rank {r} round {round} ")
        .repeat(100 + r as usize)
        .into_bytes()
}

/// memfds and bytes, twenty rounds, every content checked by every rank; then an orderly end.
fn role_memfd(boot: &SocketBootstrap, timeout: Duration) -> Result<(), String> {
    let (me, world) = (boot.rank(), boot.world());
    for round in 0..20u32 {
        let f = memfd("symm-test").map_err(|e| e.to_string())?;
        f.write_all_at(&content(me, round), 0)
            .map_err(|e| e.to_string())?;
        let got = boot
            .all_gather_fds(&[f.as_fd()], timeout)
            .map_err(|e| e.to_string())?;
        if got.len() != world as usize {
            return Err(format!("{} parts", got.len()));
        }
        for (src, fds) in got.into_iter().enumerate() {
            let [fd] = <[_; 1]>::try_from(fds).map_err(|v| format!("{} fds", v.len()))?;
            let want = content(src as u16, round);
            let mut buf = vec![0u8; want.len() + 1];
            let n = std::fs::File::from(fd)
                .read_at(&mut buf, 0)
                .map_err(|e| e.to_string())?;
            if buf[..n] != want[..] {
                return Err(format!("rank {src}'s memfd holds other bytes"));
            }
        }
        let bytes = boot
            .all_gather(&me.to_le_bytes().repeat(me as usize + 1), timeout)
            .map_err(|e| e.to_string())?;
        for (src, b) in bytes.iter().enumerate() {
            if *b != (src as u16).to_le_bytes().repeat(src + 1) {
                return Err(format!("rank {src}'s bytes differ"));
            }
        }
        boot.barrier(timeout).map_err(|e| e.to_string())?;
    }
    say("gathered", 20);
    Ok(())
}

/// Joined, then waits in a barrier until a peer is lost; reports when and through which means.
fn role_hold(boot: &SocketBootstrap) -> Result<(), String> {
    let seen = Arc::new(OnceLock::new());
    let s = seen.clone();
    boot.on_lost(move |r| {
        let _ = s.set((r, now_ns()));
    });
    let word: Arc<AtomicU32> = boot.lost_word();
    say("ready", boot.rank());
    let e = boot
        .barrier(SLOW)
        .err()
        .ok_or("barrier passed with a rank killed")?;
    let at = now_ns();
    let rank = match e {
        BootstrapError::PeerLost { rank } => rank,
        other => return Err(format!("barrier: {other}")),
    };
    let (cb_rank, cb_at) = *seen.get().ok_or("callback not run")?;
    let w = word.load(Ordering::Acquire);
    if cb_rank != rank || w != rank as u32 || w == NOT_LOST {
        return Err(format!("callback {cb_rank}, word {w}, error {rank}"));
    }
    say("lost", format!("{rank} {at} {cb_at}"));
    Ok(())
}

/// What a child does, by `SYMM_TEST_ROLE`.
fn run_role(role: &str) -> Result<(), String> {
    let timeout = std::env::var(TIMEOUT)
        .ok()
        .and_then(|t| t.parse().ok())
        .map_or(SLOW, Duration::from_millis);
    let before = fd_count();
    let result = (|| {
        let job = JobEnv::from_env().map_err(|e| e.to_string())?;
        let boot = match SocketBootstrap::join(&job, timeout) {
            Ok(b) => b,
            Err(e) if role == "join" => {
                say("join", format!("{e:?}"));
                return Ok(());
            }
            Err(e) => return Err(format!("join: {e}")),
        };
        match role {
            "join" => {
                say("join", "ok");
                boot.finish(SLOW).map_err(|e| e.to_string())
            }
            "memfd" => {
                role_memfd(&boot, timeout)?;
                boot.finish(SLOW).map_err(|e| e.to_string())
            }
            "hold" => role_hold(&boot),
            "scrub" => {
                // The token was read; a program this rank starts must not see it.
                let out = Command::new("sh")
                    .args(["-c", "echo \"${SYMM_TOKEN-unset}\""])
                    .output()
                    .map_err(|e| e.to_string())?;
                say("child_token", String::from_utf8_lossy(&out.stdout).trim());
                say("own_token", std::env::var_os("SYMM_TOKEN").is_some());
                say("job_kept", std::env::var_os("SYMM_JOB").is_some());
                boot.finish(SLOW).map_err(|e| e.to_string())
            }
            "leave" => {
                say("ready", boot.rank());
                let at = now_ns();
                boot.leave();
                match boot.barrier(SLOW) {
                    Err(BootstrapError::Poisoned(e))
                        if *e == BootstrapError::Left { rank: job.rank } =>
                    {
                        say("left", at);
                        Ok(())
                    }
                    other => Err(format!("after leave: {other:?}")),
                }
            }
            "victim" => {
                say("ready", boot.rank());
                std::thread::sleep(SLOW);
                Err("not killed".into())
            }
            other => Err(format!("unknown role {other}")),
        }
    })();
    say("fds", format!("{before} {}", fd_count()));
    result
}

/// The child side: runs only when this binary is started as a rank.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let code = match run_role(&role) {
        Ok(()) => 0,
        Err(e) => {
            say("error", e);
            1
        }
    };
    std::process::exit(code);
}

/// A started rank and its `@@` lines.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<(String, String)>,
    seen: HashMap<String, String>,
}

impl Proc {
    /// The value of the next `@@ key` line, waiting at most `timeout`.
    fn expect(&mut self, key: &str, timeout: Duration) -> String {
        self.try_expect(key, timeout)
            .unwrap_or_else(|| panic!("no `{key}` within {timeout:?}; saw {:?}", self.seen))
    }

    /// As [`Proc::expect`], `None` when no such line came in time.
    fn try_expect(&mut self, key: &str, timeout: Duration) -> Option<String> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(v) = self.seen.remove(key) {
                return Some(v);
            }
            let left = end.saturating_duration_since(Instant::now());
            let (k, v) = self.lines.recv_timeout(left).ok()?;
            self.seen.insert(k, v);
        }
    }

    /// Waits for the exit and checks the descriptor count did not grow.
    fn finish(mut self) -> HashMap<String, String> {
        let end = Instant::now() + SLOW;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < end, "child still running");
            std::thread::sleep(Duration::from_millis(5));
        };
        while let Ok((k, v)) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.insert(k, v);
        }
        assert!(status.success(), "{status}: {:?}", self.seen);
        let fds = self.seen.get("fds").expect("fd counts").clone();
        let (a, b) = fds.split_once(' ').unwrap();
        assert_eq!(a, b, "descriptors before and after: {fds}");
        eprintln!("fds before/after: {fds}");
        self.seen
    }
}

static JOBS: AtomicU32 = AtomicU32::new(0);

fn job_name(what: &str) -> String {
    let n = JOBS.fetch_add(1, Ordering::Relaxed);
    format!("t{}-{n}-{what}", std::process::id())
}

/// Starts this binary as rank `rank` of `world` in `job` with `role`.
fn spawn(role: &str, job: &str, rank: u16, world: u16, token: &str, timeout: Duration) -> Proc {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, role)
        .env(TIMEOUT, timeout.as_millis().to_string())
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("SYMM_JOB", job)
        .env("SYMM_TOKEN", token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    Proc {
        lines: lines_of(child.stdout.take().unwrap()),
        child,
        seen: HashMap::new(),
    }
}

fn lines_of(out: impl Read + Send + 'static) -> mpsc::Receiver<(String, String)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("@@ ").nth(1) {
                let (k, v) = rest.split_once(' ').unwrap_or((rest, ""));
                let _ = tx.send((k.to_string(), v.to_string()));
            }
        }
    });
    rx
}

#[test]
fn a_memfd_reaches_every_rank_and_no_descriptor_leaks() {
    let job = job_name("memfd");
    let procs: Vec<Proc> = (0..4)
        .map(|r| spawn("memfd", &job, r, 4, GOOD_TOKEN, SLOW))
        .collect();
    for p in procs {
        let seen = p.finish();
        assert_eq!(seen.get("gathered").map(String::as_str), Some("20"));
    }
}

/// A rank with another token finds that the root cannot prove the token it holds, so it
/// proves nothing itself and fails naming authentication; the job goes on.
#[test]
fn a_wrong_token_fails_authentication_and_the_job_goes_on() {
    let job = job_name("token");
    let mut root = spawn("join", &job, 0, 2, GOOD_TOKEN, SLOW);
    let mut intruder = spawn("join", &job, 1, 2, BAD_TOKEN, SLOW);
    let e = intruder.expect("join", SLOW);
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    let name = format!("symm-{job}-{}", uid.unwrap());
    assert_eq!(e, format!("{:?}", BootstrapError::Unauthenticated { name }));
    intruder.finish();
    let mut rank1 = spawn("join", &job, 1, 2, GOOD_TOKEN, SLOW);
    assert_eq!(rank1.expect("join", SLOW), "ok");
    assert_eq!(root.expect("join", SLOW), "ok");
    root.finish();
    rank1.finish();
}

#[test]
fn a_duplicate_rank_is_refused() {
    let job = job_name("dup");
    let mut root = spawn("join", &job, 0, 3, GOOD_TOKEN, SLOW);
    let mut a = spawn("join", &job, 1, 3, GOOD_TOKEN, SLOW);
    let mut b = spawn("join", &job, 1, 3, GOOD_TOKEN, SLOW);
    // Whichever said hello second is refused at once; then rank 2 completes the job.
    let end = Instant::now() + SLOW;
    let refused = loop {
        assert!(Instant::now() < end, "neither rank 1 was refused");
        if let Some(e) = a.try_expect("join", Duration::from_millis(20)) {
            break (e, &mut b);
        }
        if let Some(e) = b.try_expect("join", Duration::from_millis(20)) {
            break (e, &mut a);
        }
    };
    let want = BootstrapError::Refused(Refusal::Duplicate { rank: 1 });
    assert_eq!(refused.0, format!("{want:?}"));
    let mut c = spawn("join", &job, 2, 3, GOOD_TOKEN, SLOW);
    assert_eq!(c.expect("join", SLOW), "ok");
    assert_eq!(refused.1.expect("join", SLOW), "ok");
    c.finish();
    assert_eq!(root.expect("join", SLOW), "ok");
    for p in [root, a, b] {
        p.finish();
    }
}

#[test]
fn the_token_is_not_inherited_by_what_a_rank_starts() {
    let job = job_name("scrub");
    let mut rank = spawn("scrub", &job, 0, 1, GOOD_TOKEN, SLOW);
    assert_eq!(rank.expect("child_token", SLOW), "unset");
    assert_eq!(rank.expect("own_token", SLOW), "false");
    assert_eq!(rank.expect("job_kept", SLOW), "true");
    rank.finish();
}

#[test]
fn missing_ranks_are_named_after_the_deadline() {
    let job = job_name("missing");
    let deadline = Duration::from_millis(1500);
    let start = Instant::now();
    let mut root = spawn("join", &job, 0, 4, GOOD_TOKEN, deadline);
    let mut rank2 = spawn("join", &job, 2, 4, GOOD_TOKEN, deadline);
    let want = format!(
        "{:?}",
        BootstrapError::Missing {
            ranks: vec![1, 3],
            refused: Vec::new()
        }
    );
    assert_eq!(root.expect("join", SLOW), want);
    assert!(start.elapsed() >= deadline);
    // The rank hears the root's verdict, with the same names.
    assert_eq!(rank2.expect("join", SLOW), want);
    root.finish();
    rank2.finish();
}

/// Kills `victim` (kill -9) once all `world` ranks hold (or, with `leave`, lets it leave), and
/// checks that every other rank sees `PeerLost { victim }` within a second, by its error, lost
/// word and callback.
fn killed_rank_is_lost(victim: u16, world: u16, leave: bool) {
    let job = job_name("kill");
    let mut procs: Vec<Proc> = (0..world)
        .map(|r| {
            let role = match (r == victim, leave) {
                (false, _) => "hold",
                (true, false) => "victim",
                (true, true) => "leave",
            };
            spawn(role, &job, r, world, GOOD_TOKEN, SLOW)
        })
        .collect();
    for p in &mut procs {
        p.expect("ready", SLOW);
    }
    let mut gone = procs.remove(victim as usize);
    let at = if leave {
        let at = gone.expect("left", SLOW).parse().unwrap();
        gone.finish();
        at
    } else {
        let at = now_ns();
        gone.child.kill().unwrap();
        gone.child.wait().unwrap();
        at
    };
    let how = if leave { "left" } else { "killed" };
    let mut worst = 0u128;
    for p in procs {
        let seen = p.finish();
        let lost = seen.get("lost").expect("a lost report");
        let v: Vec<u128> = lost.split(' ').map(|x| x.parse().unwrap()).collect();
        assert_eq!(v[0], victim as u128, "{lost}");
        let error_ms = v[1].saturating_sub(at) as f64 / 1e6;
        let callback_ms = v[2].saturating_sub(at) as f64 / 1e6;
        eprintln!(
            "rank {victim} {how}: PeerLost after {error_ms:.2} ms, callback after {callback_ms:.2} ms"
        );
        worst = worst
            .max(v[1].saturating_sub(at))
            .max(v[2].saturating_sub(at));
    }
    assert!(
        worst < 1_000_000_000,
        "a rank saw the loss only after {} ms",
        worst / 1_000_000
    );
}

#[test]
fn a_killed_rank_is_lost_within_a_second() {
    killed_rank_is_lost(2, 4, false);
}

#[test]
fn a_killed_root_is_lost_within_a_second() {
    killed_rank_is_lost(0, 3, false);
}

#[test]
fn a_rank_that_leaves_is_lost_within_a_second() {
    killed_rank_is_lost(1, 3, true);
}

const SYMM_RUN: &str = env!("CARGO_BIN_EXE_symm-run");

/// Runs `symm-run args` to its end (at most [`SLOW`]): (exit code, stdout, stderr, seconds).
fn symm_run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String, f64) {
    let start = Instant::now();
    let mut cmd = Command::new(SYMM_RUN);
    cmd.args(args).stdin(Stdio::null());
    for v in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "SYMM_JOB", "SYMM_TOKEN"] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let secs = start.elapsed().as_secs_f64();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
        secs,
    )
}

#[test]
fn symm_run_sets_the_job_environment_and_keeps_multicast_off() {
    let script = r#"echo "$RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE ${#SYMM_TOKEN} $NCCL_NVLS_ENABLE$TORCH_SYMM_MEM_DISABLE_MULTICAST$NVSHMEM_DISABLE_NVLS $SYMM_JOB""#;
    let (code, out, err, _) = symm_run(
        &["-n", "3", "--", "sh", "-c", script],
        &[
            ("NCCL_NVLS_ENABLE", "1"),
            ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0"),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 3, "{out}");
    let job = lines[0].rsplit(' ').next().unwrap();
    assert!(job.starts_with('j') && job.len() > 8, "{job}");
    for (r, line) in lines.iter().enumerate() {
        assert_eq!(*line, format!("[{r}] {r}/3/{r}/3 64 011 {job}"));
    }
}

#[test]
fn symm_run_runs_a_bootstrap_job() {
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let (code, out, err, secs) = symm_run(
        &[
            "-n",
            "3",
            "--",
            exe,
            "child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ],
        &[(ROLE, "memfd")],
    );
    assert_eq!(code, 0, "{out}{err}");
    for r in 0..3 {
        let mine: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("[{r}] @@ ")))
            .collect();
        assert!(mine.contains(&"gathered 20"), "{out}");
        let fds = mine.iter().find_map(|l| l.strip_prefix("fds ")).unwrap();
        let (a, b) = fds.split_once(' ').unwrap();
        assert_eq!(a, b, "{out}");
    }
    eprintln!("symm-run -n 3, memfd role: {secs:.2} s");
}

#[test]
fn symm_run_ends_the_job_when_a_rank_fails() {
    let dir = std::env::temp_dir().join(job_name("fail"));
    std::fs::create_dir(&dir).unwrap();
    // Ranks 0 and 2 ignore SIGTERM (so SIGKILL must follow) and mark that they started; rank 1
    // fails once both have.
    let script = r#"
        if [ "$RANK" = 1 ]; then
            while [ ! -e "$D/0" ] || [ ! -e "$D/2" ]; do sleep 0.02; done
            exit 3
        fi
        trap "" TERM
        echo "pid $$"
        touch "$D/$RANK"
        sleep 60
    "#;
    let d = dir.to_str().unwrap();
    let (code, out, err, secs) = symm_run(
        &["-n", "3", "--grace", "0.5", "--", "sh", "-c", script],
        &[("D", d)],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        err.contains("rank 1 exited with status 3; ending rank(s) 0, 2"),
        "{err}"
    );
    assert!(
        err.contains("job failed: rank 1 exited with status 3"),
        "{err}"
    );
    assert!(secs < 30.0, "took {secs} s");
    for r in [0, 2] {
        let pid = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("[{r}] pid ")))
            .unwrap_or_else(|| panic!("no pid from rank {r}: {out}"));
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "rank {r} (pid {pid}) still exists"
        );
    }
    eprintln!("symm-run ended the job {secs:.2} s after start");
}

#[test]
fn symm_run_forwards_sigterm_and_enforces_its_timeout() {
    let script = r#"trap "echo term; exit 0" TERM; echo up; while :; do sleep 0.05; done"#;
    let mut run = Command::new(SYMM_RUN)
        .args(["-n", "2", "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let mut up = 0;
    while up < 2 {
        let l = lines.next().unwrap().unwrap();
        up += l.ends_with("] up") as i32;
    }
    let pid = run.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{rest:?}");
    assert_eq!(
        rest.iter().filter(|l| l.ends_with("] term")).count(),
        2,
        "{rest:?}"
    );

    let (code, out, err, secs) = symm_run(
        &[
            "-n",
            "2",
            "--timeout",
            "0.3",
            "--grace",
            "0.2",
            "--",
            "sleep",
            "60",
        ],
        &[],
    );
    assert_eq!(code, 124, "{out}{err}");
    assert!(err.contains("timeout; ending rank(s) 0, 1"), "{err}");
    assert!(secs < 30.0, "took {secs} s");
}
