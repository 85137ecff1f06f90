//! Helpers shared by the xtask commands.

use std::path::PathBuf;
use std::process::Command;

/// The workspace root: the parent of xtask's manifest directory as cargo reports it when it
/// runs xtask (so a binary built in one checkout and run from another finds the right tree).
pub fn root() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    dir.parent().map(PathBuf::from).unwrap_or(dir)
}

/// Runs a command in the workspace root, failing with its name when it fails.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    if cmd.get_current_dir().is_none() {
        cmd.current_dir(root());
    }
    let shown = format!("{cmd:?}");
    eprintln!("$ {shown}");
    let st = cmd.status().map_err(|e| format!("{shown}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed: {st}"))
    }
}

/// `cargo` with the same toolchain as the one running xtask.
pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// `cargo` with the whitespace-separated arguments of `line`.
pub fn cargo_with(line: &str) -> Command {
    let mut c = cargo();
    c.args(line.split_whitespace());
    c
}

/// The rustup target `t` for the toolchain running xtask, installed with `rustup target add`
/// (saying so first) when its sysroot lacks it.
pub fn rustup_target(t: &str) -> Result<(), String> {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("rustc: {e}"))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if sysroot.join("lib/rustlib").join(t).is_dir() {
        return Ok(());
    }
    eprintln!(
        "installing the {t} target into {} with `rustup target add`",
        sysroot.display()
    );
    run(Command::new("rustup").args(["target", "add", t]))
}

/// The cargo target directory: `CARGO_TARGET_DIR` when set (relative to the workspace root when
/// relative), else `target/` in the workspace root.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root().join(p) })
        .unwrap_or_else(|| root().join("target"))
}

/// The flags of one command: each name, and whether a value follows it.
pub type Flags = [(&'static str, bool)];

/// A command line checked against its [`Flags`] by [`parse_flags`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// `--help` or `-h` was given.
    pub help: bool,
    /// The flags given, in order, with their values.
    given: Vec<(String, Option<String>)>,
}

impl Args {
    /// Whether the switch `name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.given.iter().any(|(f, _)| f == name)
    }

    /// The value of `name` (the last one when given more than once).
    pub fn value(&self, name: &str) -> Option<&str> {
        self.given
            .iter()
            .rev()
            .find(|(f, _)| f == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// The value of `name` parsed as a number.
    pub fn num<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        self.value(name)
            .map(|v| v.parse().map_err(|e| format!("{name} {v:?}: {e}")))
            .transpose()
    }
}

/// Checks `args` against `known`: every argument must be one of the flags (`--name VALUE` or
/// `--name=VALUE` for those taking a value). Anything else is an error naming the argument and
/// ending with `usage`. `--help` or `-h` anywhere asks for help, whatever else is given.
pub fn parse_flags(args: &[String], known: &Flags, usage: &str) -> Result<Args, String> {
    let mut out = Args::default();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        out.help = true;
        return Ok(out);
    }
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with('-') => (n, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let Some(&(flag, takes)) = known.iter().find(|(f, _)| *f == name) else {
            let what = if a.starts_with('-') {
                "unknown flag"
            } else {
                "unexpected argument"
            };
            return Err(format!("{what} {a:?}\n{usage}"));
        };
        let value = match (takes, inline) {
            (false, None) => None,
            (false, Some(_)) => return Err(format!("{flag} takes no value\n{usage}")),
            (true, Some(v)) if !v.is_empty() => Some(v),
            (true, Some(_)) => return Err(format!("{flag} needs a value\n{usage}")),
            (true, None) => match it.next() {
                Some(v) if !v.starts_with('-') => Some(v.clone()),
                _ => return Err(format!("{flag} needs a value\n{usage}")),
            },
        };
        out.given.push((flag.to_string(), value));
    }
    Ok(out)
}

/// [`parse_flags`], printing `usage` and returning `None` when help was asked for, so a command
/// starts with `let Some(args) = util::command_args(args, FLAGS, USAGE)? else { return Ok(()) };`
/// and does nothing else on `--help`.
pub fn command_args(args: &[String], known: &Flags, usage: &str) -> Result<Option<Args>, String> {
    let parsed = parse_flags(args, known, usage)?;
    if parsed.help {
        println!("{usage}");
        return Ok(None);
    }
    Ok(Some(parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &Flags = &[("--serve", false), ("--port", true)];
    const USAGE: &str = "usage: cargo xtask x [--serve] [--port N]";

    fn parse(args: &[&str]) -> Result<Args, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse_flags(&args, FLAGS, USAGE)
    }

    #[test]
    fn known_flags_and_values() {
        let a = parse(&["--serve", "--port", "8080"]).unwrap();
        assert!(!a.help);
        assert!(a.flag("--serve"));
        assert_eq!(a.value("--port"), Some("8080"));
        assert_eq!(a.num::<u16>("--port"), Ok(Some(8080)));
        let b = parse(&["--port=9000"]).unwrap();
        assert!(!b.flag("--serve"));
        assert_eq!(b.value("--port"), Some("9000"));
        assert_eq!(parse(&[]).unwrap(), Args::default());
    }

    #[test]
    fn unknown_flag_is_refused_by_name_with_the_usage() {
        let e = parse(&["--serve", "--bogus"]).unwrap_err();
        assert!(e.contains("unknown flag \"--bogus\""), "{e}");
        assert!(e.ends_with(USAGE), "{e}");
        let e = parse(&["stray"]).unwrap_err();
        assert!(e.contains("unexpected argument \"stray\""), "{e}");
        let e = parse(&["--serve=yes"]).unwrap_err();
        assert!(e.contains("--serve takes no value"), "{e}");
    }

    #[test]
    fn value_flags_need_a_value() {
        for args in [&["--port"][..], &["--port", "--serve"], &["--port="]] {
            let e = parse(args).unwrap_err();
            assert!(e.starts_with("--port needs a value"), "{args:?}: {e}");
        }
        let e = parse(&["--port", "x"]).unwrap().num::<u16>("--port");
        assert!(e.unwrap_err().starts_with("--port \"x\""));
    }

    #[test]
    fn help_is_recognised_anywhere() {
        assert!(parse(&["--help"]).unwrap().help);
        assert!(parse(&["-h"]).unwrap().help);
        assert!(parse(&["--serve", "--help"]).unwrap().help);
        assert!(parse(&["--bogus", "-h"]).unwrap().help);
        assert!(parse(&["--port", "-h"]).unwrap().help);
        let args: Vec<String> = vec!["-h".into()];
        assert_eq!(command_args(&args, FLAGS, USAGE), Ok(None));
    }
}
