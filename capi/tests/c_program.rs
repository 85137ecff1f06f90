//! Compiles `examples/c/validate_and_iterate.c` against `include/symm.h` and the static library
//! cargo built beside this test, runs it outside any job (so the runtime must refuse to open with
//! `SYMM_ERR_UNAVAILABLE`, naming what is missing), and fails on any failure (a missing C
//! compiler included). The header is also compiled as C++ when a C++ compiler is there.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The static library: cargo builds every crate type of the library for this test, into the
/// folder of the test's own executable (`<target>/<profile>/deps`).
fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let deps = exe.parent().expect("the test's folder");
    let name = if cfg!(windows) {
        "symm.lib"
    } else {
        "libsymm.a"
    };
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let p = dir.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{name} not found beside {}: the library's staticlib crate type was not built",
        exe.display()
    );
}

fn compiler(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}): {cmd:?}\n{text}",
        out.status
    );
    text
}

#[test]
fn the_c_program_builds_and_passes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("examples/c/validate_and_iterate.c");
    let include = root.join("include");
    let lib = static_lib();
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-c-program");
    std::fs::create_dir_all(&out_dir).expect("a folder for the C program");
    let exe = out_dir.join("validate_and_iterate");

    let cc = compiler("CC", "cc");
    let mut build = Command::new(&cc);
    build
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(&include)
        .arg(&src)
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe);
    run(
        &mut build,
        &format!("compiling the C program with {cc} (set CC to choose another)"),
    );

    // The program reaches the GPU runtime: it starts with the variables that keep NVLink
    // multicast off, and without the job's variables, so the runtime cannot open.
    let mut program = symm_driver::safety_env::command(&exe);
    for var in ["WORLD_SIZE", "RANK", "LOCAL_RANK", "SYMM_JOB", "SYMM_TOKEN"] {
        program.env_remove(var);
    }
    let out = run(&mut program, "the C program");
    println!("{out}");
    assert!(out.contains("all checks passed"), "{out}");
    assert!(
        out.contains("runtime unavailable (SYMM_ERR_UNAVAILABLE)") && out.contains("WORLD_SIZE"),
        "outside a job the runtime is refused, naming the missing variable: {out}"
    );
}

#[test]
fn the_header_compiles_as_cpp() {
    let cxx = compiler("CXX", "c++");
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("no C++ compiler ({cxx}); the header is checked as C only");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-cpp-header");
    std::fs::create_dir_all(&out_dir).expect("a folder for the C++ check");
    let src = out_dir.join("header.cpp");
    std::fs::write(
        &src,
        concat!(
            "#include \"symm.h\"\n",
            "int main() { return symm_abi_version() == SYMM_ABI_VERSION ? 0 : 1; }\n",
        ),
    )
    .expect("write the C++ source");
    let mut build = Command::new(&cxx);
    build
        .args([
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-fsyntax-only",
            "-I",
        ])
        .arg(root.join("include"))
        .arg(&src);
    run(&mut build, &format!("compiling symm.h as C++ with {cxx}"));
}
