//! The map stays a map: `ARCHITECTURE.md` is kept to about 2,000 words, no cell of its tables is
//! over 300 characters, every repository path it names exists, and it writes no tunable (a
//! duration or a size in binary units): those live in the code, and the map names the item.
//!
//! A path is a backticked span of path characters with a `/` that ends in `/` or in a file
//! extension (`core/src/op.rs`, `core/src/sched/`). It exists when it names a file or folder from
//! the repository root, or the end of one, whole segments only (`host/sim.rs` under a row that
//! names its crate).
//!
//! Beside the map, the build automation stays small: `xtask` holds at most 4,000 lines of Rust
//! (every `.rs` under `xtask/src`); past that, a piece of it belongs in a library crate.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The most words (whitespace-separated tokens) the map may hold.
const MAX_WORDS: usize = 2000;
/// The most characters in one table cell.
const MAX_CELL: usize = 300;
/// The most lines of Rust under `xtask/src`.
const MAX_XTASK_LINES: usize = 4000;
/// Units that make a number a tunable: durations and sizes.
const UNITS: &[&str] = &[
    "ns", "us", "µs", "ms", "s", "min", "h", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB",
];

/// What is wrong with map `text`; `exists` says whether a repository path exists.
fn problems(text: &str, exists: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut out = Vec::new();
    let words = text.split_whitespace().count();
    if words > MAX_WORDS {
        out.push(format!("{words} words, more than {MAX_WORDS}"));
    }
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        let at = i + 1;
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.trim_start().starts_with('|') {
            for cell in cells(line) {
                let n = cell.trim().chars().count();
                if n > MAX_CELL {
                    out.push(format!("line {at}: a table cell of {n} characters"));
                }
            }
        }
        for span in line.split('`').skip(1).step_by(2) {
            if is_path(span) && !exists(span) {
                out.push(format!("line {at}: `{span}` does not exist"));
            }
        }
        if let Some(t) = tunable(line) {
            out.push(format!(
                "line {at}: a tunable ({t}): name the code item instead"
            ));
        }
    }
    out
}

/// The cells of a table row, split at unescaped `|`.
fn cells(line: &str) -> Vec<String> {
    let (mut cells, mut cell, mut escaped) = (Vec::new(), String::new(), false);
    for c in line.trim().trim_matches('|').chars() {
        if c == '|' && !escaped {
            cells.push(std::mem::take(&mut cell));
        } else {
            cell.push(c);
        }
        escaped = c == '\\';
    }
    cells.push(cell);
    cells
}

/// Whether a backticked span looks like a repository path.
fn is_path(span: &str) -> bool {
    let chars = span
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c));
    let last = span.rsplit('/').next().unwrap_or("");
    let extension = last
        .rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && ext.chars().any(|c| c.is_alphabetic()));
    chars
        && span.contains('/')
        && !span.starts_with('/')
        && !span.contains("//")
        && (span.ends_with('/') || extension)
}

/// The first number with a duration or size unit in `line` (`10 s`, `1 MiB`, `64KiB`).
fn tunable(line: &str) -> Option<String> {
    let words: Vec<&str> = line
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| "(),.;:`".contains(c)))
        .collect();
    let number = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit() || c == '.');
    for (i, w) in words.iter().enumerate() {
        if number(w) && words.get(i + 1).is_some_and(|u| UNITS.contains(u)) {
            return Some(format!("{w} {}", words[i + 1]));
        }
        let digits = w.find(|c: char| !c.is_ascii_digit()).unwrap_or(w.len());
        if digits > 0 && UNITS.contains(&&w[digits..]) {
            return Some(w.to_string());
        }
    }
    None
}

/// Every file and folder under `root` (folders ending in `/`), relative to it, leaving out build
/// outputs and hidden folders.
fn tree(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            let path = rel.join(&name);
            let shown = path.to_string_lossy().replace('\\', "/");
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.insert(format!("{shown}/"));
                todo.push(path);
            } else {
                out.insert(shown);
            }
        }
    }
    out
}

/// Whether `path` is in `tree`, from the root or as the end of a longer path.
fn names_one(tree: &BTreeSet<String>, path: &str) -> bool {
    let as_dir = format!("{}/", path.trim_end_matches('/'));
    let wanted: &[&str] = if path.ends_with('/') {
        &[&as_dir]
    } else {
        &[path, &as_dir]
    };
    wanted
        .iter()
        .any(|w| tree.contains(*w) || tree.iter().any(|p| p.ends_with(&format!("/{w}"))))
}

#[test]
fn the_architecture_map_stays_a_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace");
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let tree = tree(root);
    assert!(
        tree.contains("core/src/op.rs"),
        "the walk sees the repository"
    );
    let found = problems(&text, &|p| names_one(&tree, p));
    assert!(found.is_empty(), "ARCHITECTURE.md: {found:#?}");
}

#[test]
fn the_checker_refuses_a_bad_map() {
    let tree: BTreeSet<String> = [
        "core/",
        "core/src/",
        "core/src/op.rs",
        "driver/src/host/sim.rs",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let exists = |p: &str| names_one(&tree, p);
    let good = "# Map\n\n| path | what |\n|---|---|\n| `core/src/op.rs`, `host/sim.rs`, `core/` | \
                the ops table; `a/b` and `x.rs` are not paths; `ll::MAX_CHANNELS` channels |\n\n\
                ```\n`not/checked.rs` 10 s\n```\n";
    assert_eq!(problems(good, &exists), Vec::<String>::new());
    let long = "x".repeat(MAX_CELL + 1);
    let bad = format!(
        "| path | what |\n|---|---|\n| `core/src/gone.rs` | {long} |\nwaits end within 10 s; \
         compiles up to 1 MiB\n`src/host/sim.rs` `ost/sim.rs` `core/src/op.rs/`\n"
    );
    let found = problems(&bad, &exists);
    for want in [
        "line 3: a table cell of 301 characters",
        "line 3: `core/src/gone.rs` does not exist",
        "line 4: a tunable (10 s)",
        "line 5: `ost/sim.rs` does not exist",
        "line 5: `core/src/op.rs/` does not exist",
    ] {
        assert!(
            found.iter().any(|f| f.starts_with(want)),
            "{want}: {found:#?}"
        );
    }
    assert!(
        !found.iter().any(|f| f.contains("`src/host/sim.rs`")),
        "{found:#?}"
    );
    let words = "word ".repeat(MAX_WORDS + 1);
    assert_eq!(
        problems(&words, &exists),
        vec![format!("{} words, more than {MAX_WORDS}", MAX_WORDS + 1)]
    );
    assert_eq!(tunable("`64KiB` of scratch").as_deref(), Some("64KiB"));
    assert_eq!(tunable("128-byte lines, 8 ranks, sm_90"), None);
}

#[test]
fn xtask_stays_under_its_line_budget() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace");
    let src = root.join("xtask/src");
    let mut files: Vec<(usize, String)> = tree(&src)
        .into_iter()
        .filter(|p| p.ends_with(".rs"))
        .map(|p| {
            let text = std::fs::read_to_string(src.join(&p)).unwrap();
            (text.lines().count(), p)
        })
        .collect();
    assert!(
        files.iter().any(|(_, p)| p == "main.rs"),
        "the walk sees xtask"
    );
    files.sort_unstable_by(|a, b| b.cmp(a));
    let total: usize = files.iter().map(|(n, _)| n).sum();
    assert!(
        total <= MAX_XTASK_LINES,
        "xtask/src: {total} lines of Rust, more than {MAX_XTASK_LINES}; move a piece into a \
         library crate. The largest: {:#?}",
        &files[..files.len().min(5)]
    );
}
