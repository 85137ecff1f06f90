//! Every way symm reaches NCCL, torch or NVSHMEM keeps NVLink multicast off.
//!
//! * **Programs symm starts.** Every command constructor call in the workspace's sources is either
//!   `symm_driver::safety_env::command` itself or one of the reviewed programs below, none of which
//!   loads NCCL, torch or NVSHMEM. A new place that starts a program fails this test until it uses
//!   `safety_env::command` (which sets the three variables) or is reviewed into the list.
//! * **Libraries symm loads.** Shared libraries are opened in two files only: NVRTC's loader and
//!   NCCL's, and NCCL's asks `safety_env::check` before it opens anything.
//! * **Python.** Every Python file that imports torch assigns the three variables (assigns: a
//!   default would keep a caller's `NCCL_NVLS_ENABLE=1`) before its first torch import.
//! * **The launcher.** A rank started by `symm-run` sees the three variables with their values even
//!   when the launcher's own environment says otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;

use symm_bootstrap::safety_env::SAFETY_ENV;

/// (file, the program expression) of every `Command::new` that starts a program which loads
/// neither NCCL, torch nor NVSHMEM, with why.
const REVIEWED: &[(&str, &str, &str)] = &[
    (
        "bootstrap/src/safety_env.rs",
        "program",
        "the guarded constructor itself",
    ),
    ("xtask/src/util.rs", "std::env::var(\"CARGO\")", "cargo"),
    ("xtask/src/util.rs", "\"rustup\"", "rustup"),
    ("xtask/src/util.rs", "\"rustc\"", "rustc"),
    ("xtask/src/fuzz.rs", "std::env::var(\"CARGO\")", "cargo"),
    ("xtask/src/mutants.rs", "\"git\"", "git"),
    ("xtask/src/test.rs", "\"rustup\"", "rustup"),
    ("xtask/src/viz.rs", "&bin", "wasm-bindgen --version"),
    ("xtask/src/viz.rs", "&bindgen", "wasm-bindgen"),
    ("xtask/src/viz/browser.rs", "\"apt-get\"", "apt-get"),
    ("viz/serve/src/webdriver.rs", "chromedriver", "chromedriver"),
    ("bench/src/hw/comm/life.rs", "\"kill\"", "kill"),
    ("bench/src/hw/comm/faults.rs", "\"kill\"", "kill"),
    (
        "bootstrap/tests/bootstrap.rs",
        "std::env::current_exe()",
        "this test binary",
    ),
    (
        "bootstrap/tests/bootstrap.rs",
        "SYMM_RUN",
        "symm-run sets the variables itself (below)",
    ),
    ("bootstrap/tests/bootstrap.rs", "\"kill\"", "kill"),
    (
        "bootstrap/tests/bootstrap.rs",
        "\"sh\"",
        "a shell printing whether the token was inherited",
    ),
    ("bootstrap/tests/launcher.rs", "\"kill\"", "kill"),
    (
        "bootstrap/tests/launcher.rs",
        "SYMM_RUN",
        "symm-run sets the variables itself (below)",
    ),
    (
        "bootstrap/tests/multicast_env.rs",
        "env!(\"CARGO_BIN_EXE_symm-run\")",
        "symm-run (below)",
    ),
    (
        "labs/tests/cli.rs",
        "env!(\"CARGO_BIN_EXE_symm-labs\")",
        "the labs checker on the host backend",
    ),
    ("capi/tests/c_program.rs", "&cc", "a C compiler"),
    ("capi/tests/c_program.rs", "&cxx", "a C++ compiler"),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the bootstrap crate lies in the workspace")
        .to_path_buf()
}

fn scan(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            // Build outputs are skipped, whatever their name: cargo marks its target
            // directories with CACHEDIR.TAG.
            if !matches!(
                name.to_str(),
                Some("target" | ".git" | "node_modules" | "dist" | "hwbin")
            ) && !p.join("CACHEDIR.TAG").exists()
            {
                scan(&p, exts, out);
            }
        } else if t.is_file()
            && p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| exts.contains(&x))
        {
            out.push(p);
        }
    }
}

fn files(exts: &[&str]) -> Vec<(String, String)> {
    let root = root();
    let mut paths = Vec::new();
    scan(&root, exts, &mut paths);
    paths
        .into_iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).ok()?;
            let rel = p.strip_prefix(&root).ok()?.display().to_string();
            Some((rel, text))
        })
        .collect()
}

/// The program expression of each command constructor call in `text` (up to its closing
/// parenthesis).
fn commands(text: &str) -> Vec<String> {
    let needle = ["Command", "::new("].concat();
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(&needle) {
        let after = &rest[i + needle.len()..];
        let mut depth = 1;
        let end = after
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map_or(after.len(), |(j, _)| j);
        out.push(after[..end].trim().to_string());
        rest = &after[end..];
    }
    out
}

#[test]
fn every_program_symm_starts_gets_the_variables_or_is_reviewed() {
    let all = files(&["rs"]);
    assert!(
        all.iter().any(|(f, _)| f == "bootstrap/src/launcher.rs"),
        "the scan reached the launcher"
    );
    let mut unreviewed = Vec::new();
    for (file, text) in &all {
        for program in commands(text) {
            let ok = REVIEWED
                .iter()
                .any(|(f, p, _)| f == file && program.starts_with(p));
            if !ok {
                unreviewed.push(format!("{file}: {program}"));
            }
        }
    }
    assert!(
        unreviewed.is_empty(),
        "programs started without symm_driver::safety_env::command (which sets {SAFETY_ENV:?}): \
         {unreviewed:#?}"
    );
    // The scan finds what it looks for: the launcher, symm-bench's ranks and PyTorch script, and
    // `cargo xtask hw` starting symm-bench go through the guard.
    for f in [
        "bootstrap/src/launcher.rs",
        "bench/src/hw/comm/mod.rs",
        "bench/src/hw/perf/mod.rs",
        "xtask/src/hw.rs",
    ] {
        let text = &all.iter().find(|(n, _)| n == f).expect(f).1;
        assert!(text.contains("safety_env::command("), "{f}");
    }
}

/// symm-bench, the binary copied to GPU machines, sets the variables for itself before anything
/// else in `main`, and refuses to run when it cannot.
#[test]
fn symm_bench_sets_the_variables_first() {
    let text = std::fs::read_to_string(root().join("bench/src/main.rs")).unwrap();
    let main = text.find("fn main()").expect("symm-bench has a main");
    let body = &text[main..];
    let first = body
        .lines()
        .skip(1)
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("//"))
        .expect("main has a body");
    assert!(
        first.contains("unsafe { symm_driver::safety_env::set_for_process() }")
            && first.starts_with("if let Err("),
        "the first statement of symm-bench's main sets the variables and checks the result: {first}"
    );
}

#[test]
fn libraries_are_opened_in_two_places_and_nccl_only_after_the_check() {
    let needle = ["Library", "::new("].concat();
    let openers: Vec<String> = files(&["rs"])
        .into_iter()
        .filter(|(_, t)| t.contains(&needle))
        .map(|(f, _)| f)
        .collect();
    let mut sorted = openers.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "driver/src/cuda/ffi/nccl.rs",
            "driver/src/cuda/ffi/nvrtc.rs"
        ],
        "a new place opens a shared library: if it may be NCCL, torch or NVSHMEM, it must ask \
         safety_env::check first, and this list must name it"
    );
    let nccl = std::fs::read_to_string(root().join("driver/src/cuda/ffi/nccl.rs")).unwrap();
    let check = nccl
        .find("safety_env::check_with(")
        .expect("NCCL's loader checks the environment");
    let open = nccl.find(&needle).unwrap();
    assert!(check < open, "the check comes before the library is opened");
}

#[test]
fn python_that_imports_torch_sets_the_variables_first() {
    let mut checked = 0;
    for (file, text) in files(&["py"]) {
        let lines: Vec<&str> = text.lines().collect();
        let Some(first) = lines.iter().position(|l| {
            let l = l.trim_start();
            l.starts_with("import torch") || l.starts_with("from torch")
        }) else {
            continue;
        };
        checked += 1;
        for (var, value) in SAFETY_ENV {
            let set = format!("os.environ[\"{var}\"] = \"{value}\"");
            assert!(
                lines[..first].iter().any(|l| l.trim() == set),
                "{file}: `{set}` must come before line {} (the first torch import)",
                first + 1
            );
        }
    }
    assert!(checked > 0, "the scan found the torch scripts");
}

#[test]
fn a_rank_of_symm_run_sees_the_variables_whatever_the_launcher_was_given() {
    let script = SAFETY_ENV
        .iter()
        .map(|(k, _)| format!("echo {k}=${k}"))
        .collect::<Vec<_>>()
        .join("; ");
    let out = Command::new(env!("CARGO_BIN_EXE_symm-run"))
        .args(["-n", "2", "--no-prefix", "--", "/bin/sh", "-c", &script])
        .env("NCCL_NVLS_ENABLE", "1")
        .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
        .env_remove("NVSHMEM_DISABLE_NVLS")
        .output()
        .expect("symm-run starts");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for (k, v) in SAFETY_ENV {
        let line = format!("{k}={v}");
        assert_eq!(
            text.lines().filter(|l| *l == line).count(),
            2,
            "both ranks print {line}: {text}"
        );
    }
}
