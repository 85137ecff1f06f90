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

/// Whether `flag` is among the arguments.
pub fn flag(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| a == flag)
}

/// The value after `name` among the arguments.
pub fn value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.as_str())
}
