//! The checker's command line: what it prints is the lab's verdict, or says it is only part of it.

use std::process::Command;

fn check(lab: &str) -> (bool, String) {
    let out = std::env::temp_dir().join(format!("symm-labs-cli-{lab}-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_symm-labs"))
        .args(["check", lab, "--solution", "--out"])
        .arg(&out)
        .output()
        .expect("the checker runs");
    let _ = std::fs::remove_dir_all(&out);
    (
        run.status.success(),
        String::from_utf8_lossy(&run.stdout).into_owned(),
    )
}

#[test]
fn a_lab_with_a_loom_half_is_not_said_to_pass_before_loom_ran() {
    let (ok, text) = check("4");
    assert!(ok, "{text}");
    assert!(!text.contains("lab 4 passes"), "{text}");
    assert!(
        text.contains("once its orderings pass under loom"),
        "{text}"
    );
}

#[test]
fn a_lab_without_one_passes_on_the_checker_alone() {
    let (ok, text) = check("1");
    assert!(ok, "{text}");
    assert!(text.contains("lab 1 passes"), "{text}");
}

#[test]
fn a_rerun_keeps_the_last_trace_and_says_so() {
    let out = std::env::temp_dir().join(format!("symm-labs-rerun-{}", std::process::id()));
    let run = || {
        let r = Command::new(env!("CARGO_BIN_EXE_symm-labs"))
            .args(["check", "1", "--solution", "--out"])
            .arg(&out)
            .output()
            .expect("the checker runs");
        String::from_utf8_lossy(&r.stdout).into_owned()
    };
    let first = run();
    assert!(!first.contains("yours.previous.trace"), "{first}");
    let mine = std::fs::read(out.join("yours.trace")).expect("a first trace");
    let second = run();
    assert!(second.contains("yours.previous.trace"), "{second}");
    let kept = std::fs::read(out.join("yours.previous.trace")).expect("the last run's trace kept");
    let _ = std::fs::remove_dir_all(&out);
    assert_eq!(kept, mine);
}

#[test]
fn run_on_the_gpu_says_in_one_line_when_there_is_none() {
    #[cfg(not(loom))]
    if symm_labs::gpu::gpus().is_ok() {
        return; // a GPU machine runs it for real (docs/hw-results.md)
    }
    let r = Command::new(env!("CARGO_BIN_EXE_symm-labs"))
        .args(["run", "1", "--gpu", "--solution"])
        .output()
        .expect("the checker runs");
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("no GPU here"), "{text}");
    let r = Command::new(env!("CARGO_BIN_EXE_symm-labs"))
        .args(["run", "1"])
        .output()
        .expect("the checker runs");
    assert_eq!(r.status.code(), Some(2), "run N without --gpu is refused");
}
