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
