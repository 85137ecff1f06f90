//! symm's multicast driver calls live in one place: `driver/src/cuda/multicast/` and the entry
//! points of `driver/src/cuda/ffi/driver.rs`. This test fails if any other source file (Rust,
//! CUDA) of the repository names a multicast-object entry point. Kernels may hold `multimem`
//! instructions: those are not entry points.

use std::path::{Path, PathBuf};

/// The entry points' common prefix, built so that this file does not name it.
fn needle() -> String {
    ["cu", "Multicast"].concat()
}

fn scan(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            scan(&p, out);
        } else if t.is_file()
            && p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| matches!(x, "rs" | "cu" | "cuh"))
        {
            out.push(p);
        }
    }
}

#[test]
fn only_the_multicast_module_and_the_driver_table_name_the_multicast_entry_points() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the driver crate lies in the workspace")
        .to_path_buf();
    let allowed = [
        root.join("driver/src/cuda/multicast"),
        root.join("driver/src/cuda/ffi/driver.rs"),
        root.join("driver/tests/multicast_confined.rs"),
    ];
    let mut files = Vec::new();
    for d in ["core", "driver", "kernels", "tests", "xtask", "bench"] {
        scan(&root.join(d), &mut files);
    }
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("driver/src/cuda/ffi/driver.rs")),
        "the scan reached the driver table"
    );
    assert!(
        files.iter().any(|f| f.ends_with("bench/src/main.rs")),
        "the scan reached symm-bench"
    );
    let needle = needle();
    let mut found = Vec::new();
    for f in &files {
        if allowed.iter().any(|a| f.starts_with(a)) {
            continue;
        }
        let Ok(text) = std::fs::read(f) else { continue };
        if String::from_utf8_lossy(&text).contains(&needle) {
            found.push(f.strip_prefix(&root).unwrap_or(f).display().to_string());
        }
    }
    assert!(
        found.is_empty(),
        "{needle}* named outside driver/src/cuda/multicast/ and ffi/driver.rs: {found:?}"
    );
    let table = std::fs::read_to_string(root.join("driver/src/cuda/ffi/driver.rs")).unwrap();
    assert!(
        table.contains(&format!("\"{needle}Create\"")),
        "the driver table holds the entry points"
    );
}
