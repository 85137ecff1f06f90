//! Request targets to files: percent-decoding and confinement to the two roots.
//!
//! A target's path (before `?`) is percent-decoded once, then split on `/`. `/` is the app's
//! `index.html`; a first component `traces` selects the traces folder, anything else the app
//! folder. Every component must be non-empty and not `.` or `..`, and may hold no backslash,
//! NUL or other control byte. The joined path is then resolved (symlinks included) and must
//! still lie under the resolved root and be a regular file.

use std::path::{Path, PathBuf};

/// What a request target names.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A file under one of the roots (resolved).
    File(PathBuf),
    /// Nothing that may be served: 404.
    NotFound,
    /// A target that is not an origin-form path, or bad percent-encoding: 400.
    Malformed,
}

/// The two folders the server answers from.
#[derive(Clone, Debug)]
pub struct Roots {
    /// The built app.
    pub app: PathBuf,
    /// The traces, under `/traces/`.
    pub traces: PathBuf,
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes `s` once; `None` when a `%` is not followed by two hex digits.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hi = hex(*b.get(i + 1)?)?;
            let lo = hex(*b.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The path components of a decoded path, or `None` when any would be unsafe.
fn components(decoded: &[u8]) -> Option<Vec<&str>> {
    let path = std::str::from_utf8(decoded).ok()?.strip_prefix('/')?;
    if path.is_empty() {
        return Some(vec!["index.html"]);
    }
    let parts: Vec<&str> = path.split('/').collect();
    let safe = |p: &&str| {
        !p.is_empty()
            && *p != "."
            && *p != ".."
            && !p.bytes().any(|b| b == b'\\' || b < 0x20 || b == 0x7f)
    };
    parts.iter().all(safe).then_some(parts)
}

/// Looks up a request target (origin form, `/path?query`).
pub fn lookup(roots: &Roots, target: &str) -> Lookup {
    if !target.starts_with('/') {
        return Lookup::Malformed;
    }
    let raw = target.split(['?', '#']).next().unwrap_or("/");
    let Some(decoded) = percent_decode(raw) else {
        return Lookup::Malformed;
    };
    let Some(parts) = components(&decoded) else {
        return Lookup::NotFound;
    };
    let (root, rest) = match parts.split_first() {
        Some((&"traces", rest)) => (&roots.traces, rest),
        _ => (&roots.app, &parts[..]),
    };
    if rest.is_empty() {
        return Lookup::NotFound;
    }
    match confine(root, rest) {
        Some(p) => Lookup::File(p),
        None => Lookup::NotFound,
    }
}

/// `root/rest...` resolved, when it is a regular file under the resolved root.
fn confine(root: &Path, rest: &[&str]) -> Option<PathBuf> {
    let root = std::fs::canonicalize(root).ok()?;
    let mut p = root.clone();
    p.extend(rest);
    let p = std::fs::canonicalize(p).ok()?;
    (p.starts_with(&root) && p != root && std::fs::metadata(&p).ok()?.is_file()).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_is_single_and_strict() {
        assert_eq!(percent_decode("/a%20b").unwrap(), b"/a b");
        assert_eq!(percent_decode("%2e%2E").unwrap(), b"..");
        assert_eq!(percent_decode("%252e").unwrap(), b"%2e");
        assert_eq!(percent_decode("%2F%00").unwrap(), b"/\0");
        for bad in ["%", "%2", "%zz", "a%g0", "%2%2e"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn unsafe_components_are_refused() {
        assert_eq!(components(b"/"), Some(vec!["index.html"]));
        assert_eq!(
            components(b"/traces/a.trace"),
            Some(vec!["traces", "a.trace"])
        );
        for bad in [
            &b"/traces//etc/passwd"[..],
            b"/traces/../x",
            b"/../x",
            b"/./x",
            b"/a/",
            b"//etc/passwd",
            b"/a\\..\\b",
            b"/a\0b",
            b"/a\nb",
            b"/\xff",
            b"relative",
        ] {
            assert_eq!(components(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
