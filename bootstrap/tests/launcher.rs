//! `symm-run` leaves nothing of a job behind: not when it is killed with `SIGKILL`, not when a
//! rank fails, not when every rank exits 0 with a child still running. Ranks are shell scripts
//! whose grandchildren ignore `SIGTERM`; every process of a job carries `SYMM_JOB=<job>`, so
//! `/proc/*/environ` shows what remains of it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const SYMM_RUN: &str = env!("CARGO_BIN_EXE_symm-run");
/// Where timing is not the point: long enough for a loaded two-core machine.
const SLOW: Duration = Duration::from_secs(60);

/// Each rank starts a grandchild that ignores `SIGTERM` (inherited from `trap "" TERM`) and
/// writes its own and the grandchild's pids to `$D/<rank>.pids`.
const RANK_WITH_GRANDCHILD: &str = r#"
    trap "" TERM
    sleep 300 &
    echo "$$ $!" > "$D/$RANK.tmp" && mv "$D/$RANK.tmp" "$D/$RANK.pids"
"#;

static N: AtomicU32 = AtomicU32::new(0);

fn scratch(what: &str) -> (String, PathBuf) {
    let job = format!(
        "l{}-{}-{what}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let dir = std::env::temp_dir().join(&job);
    std::fs::create_dir_all(&dir).unwrap();
    (job, dir)
}

/// Waits for `<rank>.pids` of each of `ranks` ranks; returns every pid in them.
fn pids(dir: &Path, ranks: u16) -> Vec<u32> {
    let end = Instant::now() + SLOW;
    let mut all = Vec::new();
    for r in 0..ranks {
        let f = dir.join(format!("{r}.pids"));
        let text = loop {
            if let Ok(t) = std::fs::read_to_string(&f) {
                break t;
            }
            assert!(Instant::now() < end, "rank {r} never wrote its pids");
            std::thread::sleep(Duration::from_millis(10));
        };
        all.extend(text.split_whitespace().map(|p| p.parse::<u32>().unwrap()));
    }
    all
}

/// Whether `pid` is a live process (a zombie, dead but not yet reaped, does not count).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Live processes whose environment holds `SYMM_JOB=<job>`.
fn of_job(job: &str) -> Vec<u32> {
    let needle = format!("SYMM_JOB={job}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
                && alive(pid)
        })
        .collect()
}

/// Waits at most `within` for every one of `pids` and every process of `job` to be gone.
fn assert_gone(pids: &[u32], job: &str, within: Duration, what: &str) {
    let end = Instant::now() + within;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        let others = of_job(job);
        if left.is_empty() && others.is_empty() {
            return;
        }
        if Instant::now() >= end {
            // Leave nothing running behind a failed test either.
            for p in left.iter().chain(&others) {
                let _ = Command::new("kill")
                    .args(["-KILL", &p.to_string()])
                    .status();
            }
            panic!("{what}: still running after {within:?}: {left:?}, of the job: {others:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn killing_the_launcher_ends_every_process_of_the_job() {
    let (job, dir) = scratch("sigkill");
    // The rank waits on its grandchild, so both are running when the launcher dies.
    let script = format!("{RANK_WITH_GRANDCHILD}\nwait");
    let mut run = Command::new(SYMM_RUN)
        .args(["-n", "2", "--grace", "0.5", "--job", &job, "--", "sh", "-c"])
        .arg(&script)
        .env("D", &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = pids(&dir, 2);
    assert!(pids.iter().all(|&p| alive(p)), "{pids:?}");
    assert_eq!(of_job(&job).len(), 4, "two ranks and two grandchildren");
    run.kill().unwrap();
    run.wait().unwrap();
    // The grace period, and room for a loaded machine.
    assert_gone(
        &pids,
        &job,
        Duration::from_secs(5),
        "after SIGKILL of symm-run",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `symm-run args` to its end with `D=dir`: (exit code, stderr).
fn symm_run(args: &[&str], dir: &Path) -> (i32, String) {
    let out = Command::new(SYMM_RUN)
        .args(args)
        .env("D", dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_failed_rank_ends_the_groups_of_ranks_that_already_exited() {
    let (job, dir) = scratch("fail");
    // Rank 0 exits 0 at once, its grandchild still running; rank 1 fails once it has.
    let script = format!(
        r#"if [ "$RANK" = 1 ]; then
            while [ ! -e "$D/0.pids" ]; do sleep 0.02; done
            echo "$$" > "$D/1.tmp" && mv "$D/1.tmp" "$D/1.pids"
            exit 3
        fi
        {RANK_WITH_GRANDCHILD}"#
    );
    let (code, err) = symm_run(
        &[
            "-n", "2", "--grace", "0.3", "--job", &job, "--", "sh", "-c", &script,
        ],
        &dir,
    );
    assert_eq!(code, 3, "{err}");
    let pids = pids(&dir, 2);
    // symm-run has returned: nothing may be left, at once.
    assert_gone(&pids, &job, Duration::ZERO, "after a failed rank");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_that_succeeds_leaves_no_background_child() {
    let (job, dir) = scratch("ok");
    let (code, err) = symm_run(
        &[
            "-n",
            "2",
            "--grace",
            "0.3",
            "--job",
            &job,
            "--",
            "sh",
            "-c",
            RANK_WITH_GRANDCHILD,
        ],
        &dir,
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("left processes behind; ending them"), "{err}");
    let pids = pids(&dir, 2);
    assert_gone(&pids, &job, Duration::ZERO, "after a successful job");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_process_keeps_multicast_off() {
    let (job, dir) = scratch("env");
    // The rank and its grandchild report the three variables, whatever the caller set.
    let script = r#"
        v() { echo "$NCCL_NVLS_ENABLE$TORCH_SYMM_MEM_DISABLE_MULTICAST$NVSHMEM_DISABLE_NVLS"; }
        v > "$D/$RANK.rank"
        sh -c 'echo "$NCCL_NVLS_ENABLE$TORCH_SYMM_MEM_DISABLE_MULTICAST$NVSHMEM_DISABLE_NVLS"' > "$D/$RANK.child"
    "#;
    let out = Command::new(SYMM_RUN)
        .args(["-n", "2", "--job", &job, "--", "sh", "-c", script])
        .env("D", &dir)
        .env("NCCL_NVLS_ENABLE", "1")
        .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
        .env_remove("NVSHMEM_DISABLE_NVLS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for r in 0..2 {
        for who in ["rank", "child"] {
            let got = std::fs::read_to_string(dir.join(format!("{r}.{who}"))).unwrap();
            assert_eq!(got.trim(), "011", "rank {r}'s {who}");
        }
    }
    assert_eq!(
        symm_bootstrap::launcher::SAFETY_ENV,
        [
            ("NCCL_NVLS_ENABLE", "0"),
            ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
            ("NVSHMEM_DISABLE_NVLS", "1"),
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
