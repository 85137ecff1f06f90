//! Progress bars for minutes-long runs: drawn on stderr when stdout is a terminal, hidden
//! otherwise so that logs and redirected tables stay clean.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` steps titled `what`, ticking on its own while a step runs in a child process.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let b = ProgressBar::with_draw_target(Some(len), target());
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} {prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
    ) {
        b.set_style(style);
    }
    b.set_prefix(what.to_string());
    if !b.is_hidden() {
        b.enable_steady_tick(Duration::from_millis(200));
    }
    b
}

fn target() -> ProgressDrawTarget {
    if std::io::stdout().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}
