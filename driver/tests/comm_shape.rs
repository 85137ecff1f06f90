//! `Comm` stays the runtime's core: at most 25 public methods and 15 fields. A feature is its
//! own type that borrows the core and owns its state (`Tensors`, `Signals`, `Tracer`, ...), so
//! a new feature adds a type, not methods, fields or locks on `Comm`.
//!
//! The count reads the sources: every inherent `impl Comm` block under `driver/src/cuda/`, its
//! `pub fn` items at the block's own indentation (trait impls are not counted: they are the
//! trait's surface), and the fields of `pub struct Comm`.

use std::path::{Path, PathBuf};

/// The most public inherent methods `Comm` may have.
const MAX_METHODS: usize = 25;
/// The most fields `Comm` may have.
const MAX_FIELDS: usize = 15;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether `line` opens an inherent impl block of `Comm` (`impl Comm {`, `impl<'a> Comm {`).
fn opens_impl(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("impl") else {
        return false;
    };
    let rest = if rest.starts_with('<') {
        match rest.find('>') {
            Some(i) => &rest[i + 1..],
            None => return false,
        }
    } else {
        rest
    };
    rest.trim() == "Comm {"
}

/// The public methods of the inherent impl blocks of `Comm` in `text`.
fn methods(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if opens_impl(line) {
            inside = true;
        } else if inside && line == "}" {
            inside = false;
        } else if inside {
            if let Some(sig) = line.strip_prefix("    pub fn ") {
                out.push(sig.split('(').next().unwrap_or(sig).to_string());
            }
        }
    }
    out
}

/// The fields of `pub struct Comm` in `text` (none when it is not there).
fn fields(text: &str) -> Vec<String> {
    let Some(start) = text.find("\npub struct Comm {\n") else {
        return Vec::new();
    };
    text[start + 1..]
        .lines()
        .skip(1)
        .take_while(|l| *l != "}")
        .filter_map(|l| {
            let l = l.strip_prefix("    ")?;
            if l.starts_with(' ') || l.starts_with("//") || l.starts_with('#') {
                return None;
            }
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            let l = l.strip_prefix("pub(super) ").unwrap_or(l);
            let (name, _) = l.split_once(':')?;
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                .then(|| name.to_string())
        })
        .collect()
}

#[test]
fn comm_has_at_most_25_public_methods_and_15_fields() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let (mut all_methods, mut all_fields) = (Vec::new(), Vec::new());
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        all_methods.extend(methods(&text));
        all_fields.extend(fields(&text));
    }
    // The scan finds what it looks for: the core's own entry points and state.
    for m in ["admit", "launch", "alloc", "free", "rank", "world"] {
        assert!(all_methods.iter().any(|x| x == m), "{m} not found");
    }
    for f in ["plans", "heap", "job"] {
        assert!(all_fields.iter().any(|x| x == f), "{f} not found");
    }
    assert!(
        all_methods.len() <= MAX_METHODS,
        "Comm has {} public methods (at most {MAX_METHODS}): {all_methods:?}",
        all_methods.len()
    );
    assert!(
        all_fields.len() <= MAX_FIELDS,
        "Comm has {} fields (at most {MAX_FIELDS}): {all_fields:?}",
        all_fields.len()
    );
}

#[test]
fn the_counter_reads_impl_blocks_and_fields() {
    let text = "impl Comm {\n    pub fn a(&self) {}\n    fn b(&self) {}\n    pub(crate) fn c() {}\n}\n\
                impl Backend for Comm {\n    pub fn d() {}\n}\n\
                impl<'a> Comm {\n    pub fn e(\n        x: u8,\n    ) {}\n}\n\
                \npub struct Comm {\n    /// A doc.\n    plans: Cache,\n    pub(crate) job: Job,\n    \
                #[allow(dead_code)]\n    heap: Heap<\n        u8,\n    >,\n}\n";
    assert_eq!(methods(text), ["a", "e"]);
    assert_eq!(fields(text), ["plans", "job", "heap"]);
}
