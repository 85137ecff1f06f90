//! `cargo xtask viz`: build, serve and test the browser replayer.
//!
//! * [`build`]: compiles `symm-viz` to `wasm32-unknown-unknown` (release), runs wasm-bindgen
//!   (the CLI pinned to the exact `wasm-bindgen` version of `Cargo.lock`, installed with
//!   `cargo install --locked` when missing), copies the static `index.html` and generates the
//!   example traces with the host simulator into `viz/dist/`.
//! * [`serve`]: a std-only HTTP server on 127.0.0.1 for the app and a folder of traces, and
//!   nothing outside those two folders; it answers only requests that name its loopback address
//!   in `Host` (see [`http`]).
//! * [`ci_checks`]: the browser tests in real headless Chromium (Debian's `chromium` and
//!   `chromium-driver`, installed with apt-get when missing), see [`browser`].

mod browser;
mod examples;
mod topology;

use crate::util;
use std::path::{Path, PathBuf};
use std::process::Command;
use symm_viz_serve as http;

/// Usage of `cargo xtask viz`.
pub const USAGE: &str =
    "usage: cargo xtask viz [--serve [--port N] [--traces DIR]] [--test] [--screenshots]
  builds the browser replayer into viz/dist (symm-viz for wasm32-unknown-unknown, then
  wasm-bindgen); installs what is missing, and says so first: the wasm32-unknown-unknown target
  (rustup target add) and wasm-bindgen-cli at the version in Cargo.lock (cargo install, into
  ~/.cargo/bin)
  --serve          then serve the app on 127.0.0.1 until interrupted
  --port N         port to serve on (an error when taken; without it 8000, or any free port
                   when 8000 is taken, with a line saying so)
  --traces DIR     traces to serve (default viz/dist/examples)
  --test           the browser tests in headless Chromium (chromium and chromium-driver installed
                   with apt-get when missing, which needs root)
  --screenshots    --test, also writing the README's screenshots to docs/img";

const FLAGS: &util::Flags = &[
    ("--serve", false),
    ("--port", true),
    ("--traces", true),
    ("--test", false),
    ("--screenshots", false),
];

/// `cargo xtask viz ...`.
pub fn run(args: &[String]) -> Result<(), String> {
    let Some(args) = util::command_args(args, FLAGS, USAGE)? else {
        return Ok(());
    };
    if args.flag("--test") || args.flag("--screenshots") {
        let shots = args
            .flag("--screenshots")
            .then(|| util::root().join("docs/img"));
        return checks(shots.as_deref());
    }
    let dist = build()?;
    println!("viz: built {}", dist.display());
    if args.flag("--serve") {
        let traces = args
            .value("--traces")
            .map(PathBuf::from)
            .unwrap_or_else(|| dist.join("examples"));
        let port = match args.num::<u16>("--port")? {
            Some(p) => http::Port::Given(p),
            None => http::Port::Default(http::DEFAULT_PORT),
        };
        return serve_on(&dist, &traces, port, None);
    }
    Ok(())
}

/// The version of a package in Cargo.lock.
fn locked_version(package: &str) -> Result<String, String> {
    let lock = std::fs::read_to_string(util::root().join("Cargo.lock"))
        .map_err(|e| format!("Cargo.lock: {e}"))?;
    let needle = format!("name = \"{package}\"\nversion = \"");
    let at = lock
        .find(&needle)
        .ok_or_else(|| format!("{package} is not in Cargo.lock"))?
        + needle.len();
    let end = lock[at..].find('"').ok_or("Cargo.lock is malformed")?;
    Ok(lock[at..at + end].to_string())
}

fn cargo_bin(name: &str) -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"));
    home.join("bin").join(name)
}

/// wasm-bindgen-cli at exactly `version`, installed when missing.
fn wasm_bindgen(version: &str) -> Result<PathBuf, String> {
    let bin = cargo_bin("wasm-bindgen");
    let have = Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if have.as_deref() != Some(&format!("wasm-bindgen {version}")) {
        let found = have.map_or("none".to_string(), |h| format!("{h:?}"));
        eprintln!(
            "viz: installing wasm-bindgen-cli {version} (the version of Cargo.lock; found {found}) \
             with `cargo install` into {}",
            bin.display()
        );
        let install = format!("install wasm-bindgen-cli --version {version} --locked --force");
        util::run(&mut util::cargo_with(&install))?;
    }
    Ok(bin)
}

/// Builds the app into `viz/dist` and returns that folder.
pub fn build() -> Result<PathBuf, String> {
    util::rustup_target("wasm32-unknown-unknown")?;
    let version = locked_version("wasm-bindgen")?;
    let bindgen = wasm_bindgen(&version)?;
    util::run(&mut util::cargo_with(
        "build -p symm-viz --target wasm32-unknown-unknown --release",
    ))?;
    let wasm = util::target_dir().join("wasm32-unknown-unknown/release/symm_viz.wasm");
    let dist = util::root().join("viz/dist");
    std::fs::create_dir_all(&dist).map_err(|e| format!("{}: {e}", dist.display()))?;
    util::run(
        Command::new(&bindgen)
            .args(["--target", "web", "--no-typescript", "--out-dir"])
            .arg(&dist)
            .arg(&wasm),
    )?;
    let index = util::root().join("viz/static/index.html");
    std::fs::copy(&index, dist.join("index.html"))
        .map_err(|e| format!("{}: {e}", index.display()))?;
    let names = examples::write_all(&dist.join("examples"))?;
    eprintln!("viz: wrote {} example traces", names.len());
    Ok(dist)
}

/// Serves the app in `dist` and the traces in `traces` on 127.0.0.1 until interrupted, printing
/// one link: the app at `query` (`?trace=...&compare=...`), else at the first trace.
pub fn serve(dist: &Path, traces: &Path, query: Option<&str>) -> Result<(), String> {
    serve_on(dist, traces, http::Port::Default(http::DEFAULT_PORT), query)
}

/// The link a server prints: the app at `query`, else at the first trace in `traces`.
fn open_link(addr: &str, query: Option<&str>, first: Option<&str>) -> Option<String> {
    match (query, first) {
        (Some(q), _) => Some(format!("http://{addr}/{q}")),
        (None, Some(f)) => Some(format!("http://{addr}/?trace=traces/{f}")),
        (None, None) => None,
    }
}

fn serve_on(
    dist: &Path,
    traces: &Path,
    port: http::Port,
    query: Option<&str>,
) -> Result<(), String> {
    let started = http::start(dist, traces, port)?;
    if let Some(notice) = &started.notice {
        eprintln!("{notice}");
    }
    let addr = started.addr;
    let first = std::fs::read_dir(traces)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".trace"))
        .min();
    println!(
        "viz: serving the app on http://{addr}/ (traces from {})",
        traces.display()
    );
    if let Some(link) = open_link(&addr.to_string(), query, first.as_deref()) {
        println!("viz: open {link}");
    }
    loop {
        std::thread::park();
    }
}

/// What `cargo xtask test` runs: build, then the browser tests in headless Chromium.
pub fn ci_checks() -> Result<(), String> {
    checks(None)
}

fn checks(screenshots: Option<&Path>) -> Result<(), String> {
    // The viewer's model (decoding, pairing, buffers, hang analysis, words) natively first.
    util::run(&mut util::cargo_with("test -q -p symm-viz --lib"))?;
    let dist = build()?;
    let (chromium, driver) = browser::install()?;
    let scratch = util::target_dir().join("viz-test");
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let summary = browser::run_all(&dist, &scratch, &chromium, &driver, screenshots)?;
    println!("{summary}");
    Ok(())
}

#[cfg(test)]
mod link_tests {
    use super::open_link;

    #[test]
    fn a_given_query_is_the_one_link() {
        let q = "?trace=traces/reference.trace&compare=traces/yours.trace";
        assert_eq!(
            open_link("127.0.0.1:8001", Some(q), Some("one-slot.trace")).as_deref(),
            Some("http://127.0.0.1:8001/?trace=traces/reference.trace&compare=traces/yours.trace")
        );
        assert_eq!(
            open_link("127.0.0.1:8000", None, Some("a.trace")).as_deref(),
            Some("http://127.0.0.1:8000/?trace=traces/a.trace")
        );
        assert_eq!(open_link("127.0.0.1:8000", None, None), None);
    }
}
