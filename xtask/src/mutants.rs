//! `cargo xtask mutants`: every ordering of the signal protocol is needed, and the loom models
//! prove it.
//!
//! The protocol's orderings are defined once, in `symm_core::signal::order`, and the host pads
//! (`host/src/pad.rs`) read them from there. This command copies the workspace's sources
//! into a temporary folder and, one mutant at a time, weakens a single `Release`, `Acquire`,
//! `AcqRel` or `SeqCst` of the protocol to `Relaxed` (in the `order` module, or anywhere in the
//! host pad and memory code and the MoE protocol's threads), builds the loom models against the
//! copy and runs them.
//!
//! A named ordering (an `order` constant, or a `const NAME: Ordering` of a host file) is also
//! weakened at each call site alone when it has several, so every store that needs it is caught.
//!
//! A mutant is *killed* when a model fails, and *survives* when every model passes: a survivor
//! means an ordering nothing checks. The unmutated copy runs first and must pass, so a kill is
//! the mutation's doing. The command fails unless every mutant is killed.

use crate::util::{self, cargo};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Files whose orderings are the protocol's, relative to the workspace root.
const FILES: [&str; 5] = [
    "core/src/signal.rs",
    "host/src/pad.rs",
    "host/src/mem.rs",
    "host/src/moe/threads.rs",
    "host/src/norm.rs",
];

/// Orderings a mutant weakens.
const STRONG: [&str; 4] = [
    "Ordering::Release",
    "Ordering::Acquire",
    "Ordering::AcqRel",
    "Ordering::SeqCst",
];

/// One weakening: in `file`, on line `line` (1-based), the `nth` strong ordering of that line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mutant {
    /// The file, relative to the root.
    pub file: &'static str,
    /// 1-based line.
    pub line: usize,
    /// The text replaced: an ordering, or a name of one at a call site.
    pub from: String,
    /// The constant or expression the line defines (for the table).
    pub label: String,
    /// Byte offset of the replaced text in the file.
    offset: usize,
}

/// Whether line `text` of `file` belongs to the protocol: in core's signal module only the
/// `order` module's constants count (not the PTX mapping, which names every ordering).
fn in_scope(file: &str, text: &str, in_order_consts: bool) -> bool {
    if file == "core/src/signal.rs" {
        in_order_consts && text.trim_start().starts_with("pub const ")
    } else {
        !text.trim_start().starts_with("//")
    }
}

/// Every mutant of `src` (the contents of `file`).
pub fn mutants_of(file: &'static str, src: &str) -> Vec<Mutant> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut in_order = false;
    let mut depth = 0i32;
    for (i, line) in src.split_inclusive('\n').enumerate() {
        if line.trim_start().starts_with("pub mod order") {
            in_order = true;
            depth = 0;
        }
        if in_order {
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
        }
        // Constants sit at depth 1 of the module (a `const fn` body is deeper).
        let order_const = in_order && depth == 1;
        if in_scope(file, line, order_const) {
            for from in STRONG {
                for (at, _) in line.match_indices(from) {
                    let t = line.trim();
                    let label = match t.strip_prefix("pub const ") {
                        Some(c) => c.split(':').next().unwrap_or(c).to_string(),
                        None => t.chars().take(20).collect(),
                    };
                    out.push(Mutant {
                        file,
                        line: i + 1,
                        from: from.to_string(),
                        label,
                        offset: offset + at,
                    });
                }
            }
        }
        if in_order && depth <= 0 && line.contains('}') {
            in_order = false;
        }
        offset += line.len();
    }
    out
}

/// The call-site mutants of the names `defs` define, in `src` (host file `file`): each use of
/// `order::NAME` (a core constant) or of a `const NAME: Ordering` of `file`, outside comments and
/// definitions, for names used at two or more sites in `file` (one site is the definition's own
/// mutant).
pub fn call_sites_of(file: &'static str, src: &str, defs: &[Mutant]) -> Vec<Mutant> {
    let name = |d: &Mutant| {
        let n = d.label.trim_start_matches("const ");
        let n = n
            .split(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .next()?;
        match d.file {
            _ if n.is_empty() => None,
            "core/src/signal.rs" => Some(format!("order::{n}")),
            f => (f == file).then(|| n.to_string()),
        }
    };
    let names: std::collections::BTreeSet<String> = defs.iter().filter_map(name).collect();
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
    let mut out = Vec::new();
    for name in names {
        let (mut offset, mut sites) = (0, Vec::new());
        for (i, line) in src.split_inclusive('\n').enumerate() {
            let code = !line.trim_start().starts_with("//") && !line.contains(": Ordering =");
            for (at, _) in line.match_indices(name.as_str()).filter(|_| code) {
                if !word(line[at + name.len()..].chars().next()) && !word(line[..at].chars().last())
                {
                    let label = format!("{} (call)", name.trim_start_matches("order::"));
                    let (line, from, offset) = (i + 1, name.clone(), offset + at);
                    sites.push(Mutant {
                        file,
                        line,
                        from,
                        label,
                        offset,
                    });
                }
            }
            offset += line.len();
        }
        if sites.len() >= 2 {
            out.extend(sites);
        }
    }
    out
}

/// Copies the files git knows (tracked or untracked, not ignored) from `root` into `to`.
fn copy_tree(root: &Path, to: &Path) -> Result<(), String> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| format!("git ls-files: {e}"))?;
    if !out.status.success() {
        return Err("git ls-files failed".into());
    }
    for name in out.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let rel = Path::new(std::str::from_utf8(name).map_err(|e| e.to_string())?);
        let src = root.join(rel);
        if !src.is_file() {
            continue;
        }
        let dst = to.join(rel);
        if let Some(p) = dst.parent() {
            std::fs::create_dir_all(p).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        std::fs::copy(&src, &dst).map_err(|e| format!("{}: {e}", src.display()))?;
    }
    Ok(())
}

/// What running the models on the copy gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Passed,
    Failed,
}

/// Builds and runs the loom models in `tree`, with the shared loom target directory.
fn loom(tree: &Path, target: &Path) -> Result<Outcome, String> {
    let base = || {
        let mut c = cargo();
        c.args(["test", "--release", "-p", "symm-driver", "--test", "loom"])
            .env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", target)
            .current_dir(tree);
        c
    };
    let built = base()
        .arg("--no-run")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !built.success() {
        return Err("the loom models do not build".into());
    }
    let ran = base()
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    Ok(if ran.success() {
        Outcome::Passed
    } else {
        Outcome::Failed
    })
}

/// A temporary folder removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Usage of `cargo xtask mutants`.
pub const USAGE: &str = "usage: cargo xtask mutants
  copies the sources to a temporary folder and, one at a time, weakens each Release, Acquire,
  AcqRel or SeqCst of the signal protocol (core/src/signal.rs's order module, the host pad and
  memory code, the MoE header words of host/src/moe/threads.rs) to Relaxed, and each call
  site of a named ordering used more than once on its own, then runs the loom models (target
  directory <target>/loom, <target> being $CARGO_TARGET_DIR when set, else target/); fails
  unless a model catches every mutant";

/// `cargo xtask mutants`.
pub fn run(args: &[String]) -> Result<(), String> {
    if util::command_args(args, &[], USAGE)?.is_none() {
        return Ok(());
    }
    let t0 = Instant::now();
    let root = util::root();
    let dir = std::env::temp_dir().join(format!("symm-mutants-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tmp = TempDir(dir);
    copy_tree(&root, &tmp.0)?;
    let target = util::target_dir().join("loom");
    let mut all = Vec::new();
    let mut originals = Vec::new();
    for file in FILES {
        let text = std::fs::read_to_string(tmp.0.join(file)).map_err(|e| format!("{file}: {e}"))?;
        all.extend(mutants_of(file, &text));
        originals.push((file, text));
    }
    let defs = all.clone();
    for (f, text) in &originals {
        all.extend(call_sites_of(f, text, &defs));
    }
    if all.is_empty() {
        return Err("no orderings found to mutate".into());
    }
    eprintln!("mutants: {} sites; baseline first", all.len());
    if loom(&tmp.0, &target)? != Outcome::Passed {
        return Err("the loom models fail on the unmutated sources".into());
    }
    let mut rows = Vec::new();
    for m in &all {
        let (_, text) = originals
            .iter()
            .find(|(f, _)| *f == m.file)
            .ok_or("lost a file")?;
        let mut mutated = text.clone();
        mutated.replace_range(
            m.offset..m.offset + m.from.len(),
            "core::sync::atomic::Ordering::Relaxed",
        );
        let path = tmp.0.join(m.file);
        std::fs::write(&path, &mutated).map_err(|e| e.to_string())?;
        let t = Instant::now();
        let outcome = loom(&tmp.0, &target);
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        let verdict = match outcome? {
            Outcome::Failed => "killed",
            Outcome::Passed => "SURVIVED",
        };
        eprintln!("  {}:{} {} -> Relaxed: {verdict}", m.file, m.line, m.from);
        rows.push((m, verdict, t.elapsed().as_secs_f64()));
    }
    println!(
        "\n{:<28} {:<5} {:<24} {:<26} {:<9} {:>6}",
        "file", "line", "constant", "weakened", "verdict", "s"
    );
    for (m, v, s) in &rows {
        println!(
            "{:<28} {:<5} {:<24} {:<26} {:<9} {:>6.1}",
            m.file,
            m.line,
            m.label,
            format!("{} -> Relaxed", m.from.trim_start_matches("Ordering::")),
            v,
            s
        );
    }
    let survived = rows.iter().filter(|r| r.1 != "killed").count();
    println!(
        "{} mutants, {} killed, {survived} survived, {:.1} s",
        rows.len(),
        rows.len() - survived,
        t0.elapsed().as_secs_f64()
    );
    if survived > 0 {
        return Err(format!("{survived} mutant(s) survived the loom models"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_order_constants_and_nothing_in_the_ptx_mapping() {
        let src = std::fs::read_to_string(util::root().join("core/src/signal.rs")).unwrap();
        let m = mutants_of("core/src/signal.rs", &src);
        let labels: Vec<&str> = m.iter().map(|m| m.label.as_str()).collect();
        let want = "SIGNAL_ADD SIGNAL_SET WAIT FLAG_RAISE FLAG_WAIT LL128_PUBLISH LL128_OBSERVE";
        assert_eq!(labels.join(" "), want);
        for x in &m {
            assert_eq!(&src[x.offset..x.offset + x.from.len()], x.from.as_str());
        }
    }

    #[test]
    fn the_moe_protocol_has_exactly_its_two_header_orderings() {
        let file = "host/src/moe/threads.rs";
        let src = std::fs::read_to_string(util::root().join(file)).unwrap();
        let m = mutants_of(file, &src);
        let sites: Vec<String> = m
            .iter()
            .map(|m| format!("{} {}", m.label, m.from))
            .collect();
        let want = "const HEADER_PUBLISH Ordering::Release,const HEADER_OBSERVE Ordering::Acquire";
        assert_eq!(sites.join(","), want);
    }

    #[test]
    fn host_code_and_call_sites_outside_comments_are_in_scope() {
        let m = mutants_of(
            "host/src/mem.rs",
            "// Ordering::Release\nx(Ordering::Acquire);",
        );
        assert_eq!((m.len(), m[0].line), (1, 2));
        let (file, root) = ("host/src/moe/threads.rs", util::root());
        let read = |f: &str| std::fs::read_to_string(root.join(f)).unwrap();
        let mut defs = mutants_of("core/src/signal.rs", &read("core/src/signal.rs"));
        let def = "const HEADER_PUBLISH: Ordering = Ordering::Release;\n";
        let src = format!("{def}// HEADER_PUBLISH\nb.store(1, HEADER_PUBLISH);\nc.store(1, X);\n");
        let src =
            src.replace("X", "HEADER_PUBLISH_2") + "d.store(1, HEADER_PUBLISH);\nl(order::WAIT);\n";
        let m = call_sites_of(file, &src, &[defs.clone(), mutants_of(file, def)].concat());
        // Lines 3 and 5; the one WAIT site is the definition's own mutant.
        let whole = |m: &Mutant| (m.line, src[m.offset..].starts_with("HEADER_PUBLISH);"));
        assert_eq!(
            m.iter().map(whole).collect::<Vec<_>>(),
            [(3, true), (5, true)]
        );
        // The real file: the MoE's publishing name has two stores, each a mutant of its own.
        defs.extend(mutants_of(file, &read(file)));
        let sites = call_sites_of(file, &read(file), &defs);
        let names: Vec<&str> = sites.iter().map(|m| m.from.as_str()).collect();
        assert_eq!(names, ["HEADER_PUBLISH"; 2]);
    }
}
