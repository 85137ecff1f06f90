//! The layering Cargo cannot see.
//!
//! The crates stand in layers: symm-core; symm-host (the simulator and threads) and
//! symm-bootstrap (the job's bootstrap and `symm-run`), which know nothing of CUDA; symm-driver,
//! the runtime; symm-harness (the one-process `World`, NCCL, the device-API examples) above it,
//! for tests and benchmarks. A normal dependency against the layers is a cycle Cargo refuses, and
//! a module cannot name a crate its manifest lacks. Two ways around that compile, and this test
//! refuses them:
//!
//! * **Manifests.** A dev-dependency may point back up (the runtime's tests on the harness), and
//!   nothing stops a binding or a lower crate from taking a crate it must not ship or know. Each
//!   manifest's dependency tables (every `[*dependencies]` table, target-specific ones too) are
//!   read as names and checked against what its layer may depend on.
//! * **Sources from elsewhere.** `#[path = ...]` and `include!` pull another crate's files into a
//!   crate without a dependency. In the layered crates every such path resolves inside the crate.

use std::path::{Component, Path, PathBuf};

/// (crate folder, symm crates it may depend on, other crates it must not depend on).
const LAYERS: &[(&str, &[&str], &[&str])] = &[
    ("host", &["symm-core"], &["cudarc", "libloading"]),
    ("bootstrap", &["symm-core"], &["cudarc", "libloading"]),
    (
        "driver",
        &["symm-core", "symm-host", "symm-bootstrap", "symm-kernels"],
        &[],
    ),
    ("kernels", &[], &[]),
];

/// Crates that ship to users and so never carry the test harness.
const BINDINGS: &[&str] = &["capi", "python", "nccl"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the driver crate lies in the workspace")
        .to_path_buf()
}

/// The dependency names of a manifest, from every dependency table: `name = ...`,
/// `name.workspace = true` and `[dependencies.name]`, renamed ones (`package = "..."`) by the
/// crate they name.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_table = false;
    for line in manifest.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(header) = line.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            let header = header.trim();
            in_table = header.ends_with("dependencies");
            if let Some((table, name)) = header.rsplit_once('.') {
                if table.ends_with("dependencies") {
                    out.push(name.trim_matches('"').to_string());
                }
            }
            continue;
        }
        if !in_table || line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let key = key.split('.').next().unwrap_or(key).trim_matches('"');
        let renamed = value.split_once("package").and_then(|(_, v)| {
            let v = v
                .trim_start()
                .strip_prefix('=')?
                .trim_start()
                .strip_prefix('"')?;
            v.split('"').next()
        });
        out.push(renamed.unwrap_or(key).to_string());
    }
    out
}

fn manifest(dir: &str) -> String {
    let p = root().join(dir).join("Cargo.toml");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn manifests_depend_only_downward() {
    let mut wrong = Vec::new();
    for &(dir, allowed, banned) in LAYERS {
        let deps = dependencies(&manifest(dir));
        for d in &deps {
            let symm = d.starts_with("symm-") && !allowed.contains(&d.as_str());
            if symm || banned.contains(&d.as_str()) {
                wrong.push(format!("{dir}/Cargo.toml depends on {d}"));
            }
        }
    }
    for dir in BINDINGS {
        if dependencies(&manifest(dir))
            .iter()
            .any(|d| d == "symm-harness")
        {
            wrong.push(format!("{dir}/Cargo.toml ships the test harness"));
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies against the layers: {wrong:#?}"
    );
    // The reading finds what is there, so the check above cannot pass on an empty list.
    let driver = dependencies(&manifest("driver"));
    for d in ["symm-host", "symm-bootstrap", "symm-core", "cudarc", "loom"] {
        assert!(driver.iter().any(|x| x == d), "driver's {d}: {driver:?}");
    }
    let harness = dependencies(&manifest("harness"));
    assert!(harness.iter().any(|x| x == "symm-driver"), "{harness:?}");
}

#[test]
fn the_manifest_reader_sees_every_table_form() {
    let m = r#"
[package]
name = "x"
[dependencies]
a = "1"
b.workspace = true
c = { workspace = true } # comment
alias = { package = "real", version = "1" }
[dev-dependencies.d]
version = "1"
[target.'cfg(loom)'.dev-dependencies]
e = "1"
[features]
f = ["a"]
"#;
    assert_eq!(dependencies(m), ["a", "b", "c", "real", "d", "e"]);
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The string literal arguments of `#[path = "..."]` and `include!`/`include_str!`/
/// `include_bytes!` in `text`, with the line they are on.
fn source_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let start = if code.starts_with("#[path") {
            code.find('"')
        } else {
            ["include!(", "include_str!(", "include_bytes!("]
                .iter()
                .filter_map(|m| code.find(m).map(|at| at + m.len()))
                .filter_map(|at| code[at..].find('"').map(|q| at + q))
                .next()
        };
        if let Some(q) = start {
            let lit = code[q + 1..].split('"').next().unwrap_or("");
            out.push((i + 1, lit.to_string()));
        }
    }
    out
}

/// Whether `rel`, taken from `file`'s folder, stays inside `krate`.
fn stays_inside(krate: &Path, file: &Path, rel: &str) -> bool {
    let mut at: Vec<Component> = file.parent().unwrap_or(krate).components().collect();
    for c in Path::new(rel).components() {
        match c {
            Component::ParentDir => {
                at.pop();
            }
            Component::Normal(_) => at.push(c),
            Component::CurDir => {}
            // An absolute path or a drive names a place outside any crate.
            _ => return false,
        }
    }
    at.iter().collect::<PathBuf>().starts_with(krate)
}

#[test]
fn layered_crates_take_no_source_files_from_elsewhere() {
    let mut outside = Vec::new();
    let mut seen = 0;
    for &(dir, _, _) in LAYERS {
        let krate = root().join(dir);
        let mut files = Vec::new();
        sources(&krate, &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (line, rel) in source_paths(&text) {
                seen += 1;
                if !stays_inside(&krate, &f, &rel) {
                    outside.push(format!("{}:{line}: {rel}", f.display()));
                }
            }
        }
    }
    // The bootstrap's tests module and the kernels' sources are found.
    assert!(seen >= 5, "the scan found the crates' own paths ({seen})");
    assert!(
        outside.is_empty(),
        "source files taken from outside the crate: {outside:#?}"
    );
}

#[test]
fn the_source_path_reader_resolves_against_the_file() {
    let krate = Path::new("/w/driver");
    let file = krate.join("src/cuda/mod.rs");
    assert!(stays_inside(krate, &file, "world.rs"));
    assert!(stays_inside(krate, &file, "../../symm/x.cu"));
    assert!(!stays_inside(
        krate,
        &file,
        "../../../harness/src/world/mod.rs"
    ));
    assert!(!stays_inside(krate, &file, "/etc/passwd"));
    let text = "#[path = \"../x.rs\"]\nmod x;\n// include!(\"no\")\nconst S: &str = include_str!(\"../s.cu\");";
    assert_eq!(
        source_paths(text),
        [(1, "../x.rs".to_string()), (4, "../s.cu".to_string())]
    );
}
