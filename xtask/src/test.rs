//! `cargo xtask test`: everything CI runs, in order, failing on the first failure; [`USAGE`]
//! lists the steps. The workspace tests run in release mode; symm-driver's multicast tests run
//! against the fake driver with the `multicast` feature, which this binary itself must not have
//! (`symm-bench` refuses to run with it).

use crate::util::{self, cargo, run as sh};
use std::time::Instant;

fn step(
    name: &str,
    times: &mut Vec<(String, f64)>,
    f: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    eprintln!("==> {name}");
    let t = Instant::now();
    f().map_err(|e| format!("{name}: {e}"))?;
    times.push((name.to_string(), t.elapsed().as_secs_f64()));
    Ok(())
}

/// Usage of `cargo xtask test`.
pub const USAGE: &str = "usage: cargo xtask test [--no-browser]
  everything CI runs, in order, stopping at the first failure: cargo fmt --check, clippy with
  warnings denied, every workspace test (doctests included) in release mode, symm-driver's
  multicast tests against the fake driver, the loom models, cargo xtask mutants, symm-core for
  thumbv7em-none-eabihf (no_std), the examples (run, and the no_std one built for thumbv7em),
  the labs (every solution passes, every untouched skeleton fails), the Python package (abi3
  wheel built with maturin, installed in a venv, ruff and pytest), the plan-building
  benchmark, plan.cuh freshness and the NVRTC compile of every kernel variant, cargo doc with
  warnings denied, cargo +MSRV xtask demo --no-serve, and the viz in headless Chromium; then
  the time of each step.
  Installs what is missing, saying so first: rustup targets (thumbv7em-none-eabihf,
  wasm32-unknown-unknown), the MSRV toolchain (rustup, minimal profile), wasm-bindgen-cli
  (cargo install), the NVRTC wheel (python3 and pip, into <target>/nvrtc-wheel), a venv with
  maturin, ruff, pytest, numpy and torch from PyPI (python3 -m venv and pip, into <target>/py-venv)
  and chromium with chromium-driver (apt-get, needs root). <target> is $CARGO_TARGET_DIR when set, else target/.
  --no-browser   skip the viz's headless-Chromium step (and so apt-get, Chromium and the wasm
                 build); every other step runs";

/// The workspace's declared minimum Rust version (`rust-version` in the root Cargo.toml).
pub fn msrv() -> Result<String, String> {
    let path = util::root().join("Cargo.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .find_map(|l| {
            let v = l.trim().strip_prefix("rust-version")?.trim_start();
            let v = v.strip_prefix('=')?.trim();
            Some(v.trim_matches('"').to_string())
        })
        .ok_or_else(|| format!("{}: no rust-version", path.display()))
}

/// `cargo +MSRV xtask demo --no-serve` in `<target>/msrv`, installing the toolchain when missing.
fn msrv_demo() -> Result<(), String> {
    let v = msrv()?;
    let list = std::process::Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .map_err(|e| format!("rustup: {e}"))?;
    let have = String::from_utf8_lossy(&list.stdout)
        .lines()
        .any(|l| l.starts_with(&format!("{v}-")));
    if !have {
        eprintln!("msrv: installing Rust {v} with rustup (minimal profile)");
        sh(std::process::Command::new("rustup").args([
            "toolchain",
            "install",
            &v,
            "--profile",
            "minimal",
        ]))?;
    }
    sh(std::process::Command::new("rustup")
        .args(["run", &v, "cargo", "xtask", "demo", "--no-serve"])
        .env("CARGO_TARGET_DIR", util::target_dir().join("msrv")))
}

/// Runs the whole suite.
pub fn run(args: &[String]) -> Result<(), String> {
    let Some(args) = util::command_args(args, &[("--no-browser", false)], USAGE)? else {
        return Ok(());
    };
    let skip_browser = args.flag("--no-browser");
    let mut times = Vec::new();
    step("fmt", &mut times, || {
        sh(cargo().args(["fmt", "--all", "--check"]))
    })?;
    step("clippy", &mut times, || {
        sh(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("tests", &mut times, || {
        sh(cargo().args(["test", "--release", "--workspace", "--", "--nocapture"]))
    })?;
    step(
        "multicast binding (fake driver), GPU plan checks",
        &mut times,
        || {
            if symm_driver::cuda::multicast::COMPILED {
                return Err("xtask was built with the multicast feature".into());
            }
            sh(cargo().args([
                "test",
                "--release",
                "-p",
                "symm-driver",
                "--features",
                "multicast",
                "--lib",
                "--",
                "multicast",
                "cuda::plan",
            ]))
        },
    )?;
    step("loom", &mut times, || {
        let dir = util::target_dir().join("loom");
        sh(cargo()
            .args(["test", "--release", "-p", "symm-driver"])
            .args(["--test", "loom", "--test", "loom_signature"])
            .env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", dir))
    })?;
    step("mutants (protocol orderings)", &mut times, || {
        crate::mutants::run(&[])
    })?;
    step("no_std (thumbv7em-none-eabihf)", &mut times, || {
        util::rustup_target("thumbv7em-none-eabihf")?;
        sh(cargo().args([
            "build",
            "-p",
            "symm-core",
            "--no-default-features",
            "--target",
            "thumbv7em-none-eabihf",
        ]))
    })?;
    step("examples", &mut times, || {
        for bin in ["host-allreduce", "foreign-runtime", "no-std-schedule"] {
            sh(cargo().args([
                "run",
                "--release",
                "-q",
                "-p",
                "symm-examples",
                "--bin",
                bin,
            ]))?;
        }
        util::rustup_target("thumbv7em-none-eabihf")?;
        sh(cargo().args([
            "build",
            "-p",
            "symm-example-no-std",
            "--target",
            "thumbv7em-none-eabihf",
        ]))
    })?;
    step(
        "labs (solutions pass, skeletons fail)",
        &mut times,
        crate::lab::grade,
    )?;
    // Before the wheel: the kernels it ships are the ones this check compiled.
    step("kernels", &mut times, crate::hw::ci_checks)?;
    step("python", &mut times, crate::python::ci_checks)?;
    step("bench (plan building)", &mut times, || {
        crate::demo::bench(&[])
    })?;
    step("doc (warnings denied)", &mut times, || {
        sh(cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"))
    })?;
    step(&format!("msrv (Rust {})", msrv()?), &mut times, msrv_demo)?;
    if !skip_browser {
        step("viz (headless chromium)", &mut times, crate::viz::ci_checks)?;
    }
    println!("\ncargo xtask test: all steps passed");
    for (name, secs) in &times {
        println!("  {name:<32} {secs:>7.1} s");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_declared_minimum_rust_version() {
        let v = super::msrv().unwrap();
        let parts: Vec<u32> = v.split('.').map(|p| p.parse().unwrap()).collect();
        // libloading, which the CUDA backend loads its libraries with, needs 1.88.
        assert!(parts.len() >= 2 && parts[0] == 1 && parts[1] >= 88, "{v}");
    }
}
