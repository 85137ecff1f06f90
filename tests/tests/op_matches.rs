//! Adding an op is a compiler error everywhere it matters: outside the ops table
//! (`core/src/op/`), no `match` on an `Op` has a catch-all arm (`_ =>`, or a bare binding such
//! as `other =>`), which would take a new op silently. Such a match lists its arms, or asks a
//! column of the table (`Op::reduces`, `Op::line_format`, `Op::footprint`) instead.
//!
//! The scanner is textual but not naive: comments, strings and character literals are blanked
//! first, and only the arms of a match's own body count (a nested match is judged on its own).
//! A match is one on an op when one of its arms names an `Op::` variant. `matches!` is the
//! predicate form and is not a match.

use std::path::{Path, PathBuf};

/// The folder whose matches may have catch-all arms (the table's own code).
const EXEMPT: &str = "core/src/op/";

/// `text` with comments, string and character literals replaced by spaces (newlines kept, so
/// byte offsets and line numbers are unchanged).
fn blank(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let clear = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in out.iter_mut().take(to.min(b.len())).skip(from) {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |n| i + n);
                clear(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (mut depth, mut j) = (0usize, i);
                while j < b.len() {
                    if b[j..].starts_with(b"/*") {
                        depth += 1;
                        j += 2;
                    } else if b[j..].starts_with(b"*/") {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                clear(&mut out, i, j);
                i = j;
            }
            b'r' if (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
                && (i == 0
                    || !ident(b[i - 1])
                    || (b[i - 1] == b'b' && (i < 2 || !ident(b[i - 2])))) =>
            {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let mut close = vec![b'"'];
                close.extend(std::iter::repeat_n(b'#', hashes));
                let start = i + 2 + hashes;
                let end = b[start..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(b.len(), |n| start + n + close.len());
                clear(&mut out, i, end);
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                clear(&mut out, i, j + 1);
                i = j + 1;
            }
            b'\'' => {
                // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
                let end = if b.get(i + 1) == Some(&b'\\') {
                    b.get(i + 3..)
                        .and_then(|r| r.iter().position(|&c| c == b'\''))
                        .map(|n| i + 4 + n)
                } else {
                    let ch = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                    (b.get(i + 1 + ch) == Some(&b'\'')).then_some(i + 2 + ch)
                };
                match end {
                    Some(e) => {
                        clear(&mut out, i, e);
                        i = e;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    out
}

fn ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The index just past the bracket that closes the one at `open`.
fn close_of(b: &[u8], open: usize) -> usize {
    let mut depth = 0i32;
    for (j, &c) in b.iter().enumerate().skip(open) {
        match c {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
    }
    b.len()
}

/// The arms' patterns (guards cut off) of the match body `b[open..close]` (`open` at its `{`),
/// each with the offset where it starts.
fn arms(b: &[u8], open: usize, close: usize) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut i = open + 1;
    let end = close.saturating_sub(1);
    while i < end {
        // The pattern: up to `=>` at this depth.
        let start = i;
        let mut j = i;
        let mut arrow = None;
        while j < end {
            match b[j] {
                b'(' | b'[' | b'{' => j = close_of(b, j),
                b'=' if b.get(j + 1) == Some(&b'>') => {
                    arrow = Some(j);
                    break;
                }
                _ => j += 1,
            }
        }
        let Some(arrow) = arrow else { break };
        let pattern = String::from_utf8_lossy(&b[start..arrow]).into_owned();
        let pattern = match find_word(&pattern, "if") {
            Some(g) => pattern[..g].to_string(),
            None => pattern,
        };
        out.push((start, pattern));
        // The arm's expression: a block, or up to a comma at this depth.
        let mut k = arrow + 2;
        while k < end && b[k].is_ascii_whitespace() {
            k += 1;
        }
        if k < end && b[k] == b'{' {
            k = close_of(b, k);
            while k < end && b[k].is_ascii_whitespace() {
                k += 1;
            }
            if k < end && b[k] == b',' {
                k += 1;
            }
        } else {
            while k < end {
                match b[k] {
                    b'(' | b'[' | b'{' => k = close_of(b, k),
                    b',' => {
                        k += 1;
                        break;
                    }
                    _ => k += 1,
                }
            }
        }
        i = k;
    }
    out
}

/// The offset of `word` in `s` as a whole word.
fn find_word(s: &str, word: &str) -> Option<usize> {
    let b = s.as_bytes();
    s.match_indices(word)
        .map(|(i, _)| i)
        .find(|&i| (i == 0 || !ident(b[i - 1])) && b.get(i + word.len()).is_none_or(|&c| !ident(c)))
}

/// Whether a pattern names an `Op::` variant (`OpKind::` and `MyOp::` are other types).
fn names_op(pattern: &str) -> bool {
    let b = pattern.as_bytes();
    pattern
        .match_indices("Op::")
        .any(|(i, _)| i == 0 || !ident(b[i - 1]))
}

/// Whether a pattern takes everything: `_` or a bare lowercase binding.
fn catch_all(pattern: &str) -> bool {
    let p = pattern.trim();
    let p = p.strip_prefix("mut ").unwrap_or(p).trim();
    !p.is_empty()
        && p.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
        && !p.as_bytes()[0].is_ascii_digit()
}

/// The 1-based lines of the catch-all arms of matches on an op in `text`.
fn violations(text: &str) -> Vec<usize> {
    let b = blank(text);
    let s = String::from_utf8_lossy(&b).into_owned();
    let mut found = Vec::new();
    for (at, _) in s.match_indices("match") {
        let before_ok = at == 0 || !ident(b[at - 1]);
        let after_ok = b.get(at + 5).is_some_and(|&c| !ident(c) && c != b'!');
        if !before_ok || !after_ok {
            continue;
        }
        // The body: the first `{` after the scrutinee, outside its brackets.
        let mut j = at + 5;
        while j < b.len() && b[j] != b'{' && b[j] != b';' {
            j = match b[j] {
                b'(' | b'[' => close_of(&b, j),
                _ => j + 1,
            };
        }
        if j >= b.len() || b[j] != b'{' {
            continue;
        }
        let arms = arms(&b, j, close_of(&b, j));
        if !arms.iter().any(|(_, p)| names_op(p)) {
            continue;
        }
        for (start, p) in &arms {
            if catch_all(p) {
                let off = start + p.len() - p.trim_start().len();
                found.push(1 + b[..off].iter().filter(|&&c| c == b'\n').count());
            }
        }
    }
    found
}

/// Every `.rs` file under `dir`, skipping build output and hidden folders.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name.starts_with('.') || name == "target" || name == "node_modules" {
                continue;
            }
            sources(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_match_on_an_op_outside_the_table_has_a_catch_all_arm() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_path_buf();
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 100,
        "the workspace's sources: {}",
        files.len()
    );
    let mut bad = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(&root)
            .unwrap_or(&f)
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with(EXEMPT) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        bad.extend(violations(&text).into_iter().map(|l| format!("{rel}:{l}")));
    }
    assert!(
        bad.is_empty(),
        "a match on an Op takes every other op silently (list the arms, or ask a column of the \
         ops table):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn the_scanner_finds_catch_all_arms_on_ops_and_nothing_else() {
    let bad = "fn f(op: Op) -> u8 {\n    match op {\n        Op::Copy { .. } => 1,\n        _ => 0,\n    }\n}\n";
    assert_eq!(violations(bad), vec![4]);
    let binding = "fn f(op: &Op) -> u8 {\n    match *op {\n        Op::Wait { slot, .. } if slot > 2 => { 1 }\n        other => g(other),\n    }\n}\n";
    assert_eq!(violations(binding), vec![4]);
    let path = "fn f(op: Op) -> u8 { match op { symm_core::op::Op::Copy { .. } => 1, _ => 0 } }";
    assert_eq!(violations(path), vec![1]);
    // Listed arms, other enums, the predicate macro, nested matches on other things, and `Op::`
    // or `_ =>` inside comments and strings are fine.
    let good = r#"
fn f(op: Op, k: OpKind, n: u8) -> u8 {
    let _ = matches!(op, Op::Copy { .. });
    let _ = match k { OpKind::Copy => 1, _ => 2 };
    // match op { Op::Copy { .. } => 1, _ => 0 }
    let _ = "match op { Op::Copy { .. } => 1, _ => 0 }";
    let _ = ('{', '\'', '\\', b'"', br"\");
    match op {
        Op::Copy { bytes, .. } => match n {
            0 => 1,
            _ => 2,
        },
        Op::Reduce { .. } | Op::Signal { .. } => { match n { 3 => 4, _ => 5 } }
        Op::Wait { .. } => 0,
    }
}
"#;
    assert_eq!(violations(good), Vec::<usize>::new());
}
