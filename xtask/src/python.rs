//! `cargo xtask python`: the Python package's host side, as CI checks it (see [`USAGE`]; the
//! shipped kernels come from [`crate::hw::bundle`]). About a minute from nothing (the venv and
//! the release build of the extension), seconds when both are there.

use crate::util::{self, run as sh};
use std::path::{Path, PathBuf};
use symm_driver::safety_env;

/// The maturin release the wheel is built with.
pub const MATURIN: &str = "maturin==1.7.4";
/// The ruff release the package is checked with (lint rules change between releases).
pub const RUFF: &str = "ruff==0.17.6";
/// The zig toolchain maturin links the wheel with, against glibc 2.28 (manylinux_2_28).
pub const ZIG: &str = "ziglang==0.13.0";
/// The torch release the `torch.distributed` backend's host tests run with (the GPU machines'):
/// about 3 GiB with its CUDA wheels, installed once into the venv.
pub const TORCH: &str = "torch==2.11.0";
/// The platform tag of the wheel.
pub const MANYLINUX: &str = "manylinux_2_28";

/// Usage of `cargo xtask python`.
pub const USAGE: &str = "usage: cargo xtask python
  the Python package's host side: in <target>/py-venv (python3 -m venv; pip installs the pinned
  maturin, ruff and ziglang, pytest, numpy and torch from PyPI), compile the kernels the wheel ships for
  sm_90 with the pinned NVRTC wheel (kept under <target>/bundled-kernels) into python/symm/kernels,
  build the abi3 manylinux_2_28 wheel of python/ with maturin into <target>/wheels, check its tags, install it, then ruff check python and
  pytest python/tests. <target> is $CARGO_TARGET_DIR when set, else target/.";

/// Runs the checks (the `python` step of `cargo xtask test`).
pub fn run(args: &[String]) -> Result<(), String> {
    let Some(_) = util::command_args(args, &[], USAGE)? else {
        return Ok(());
    };
    ci_checks()
}

/// The venv's interpreter.
fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// The one wheel in `dir`, checked to be an abi3 wheel for CPython 3.9 and later.
fn abi3_wheel(dir: &Path) -> Result<PathBuf, String> {
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    if wheels.len() != 1 {
        return Err(format!(
            "{}: expected one wheel, found {}",
            dir.display(),
            wheels.len()
        ));
    }
    let wheel = wheels.remove(0);
    let name = wheel
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if !is_abi3(name) {
        return Err(format!("{name}: not a cp39-abi3 manylinux x86-64 wheel"));
    }
    Ok(wheel)
}

/// Whether a wheel file name carries the `cp39-abi3` tags and a manylinux x86-64 platform.
fn is_abi3(name: &str) -> bool {
    // name-version-python-abi-platform.whl
    let parts: Vec<&str> = name.trim_end_matches(".whl").split('-').collect();
    parts.len() == 5
        && parts[2] == "cp39"
        && parts[3] == "abi3"
        && parts[4].starts_with("manylinux")
        && parts[4].ends_with("_x86_64")
}

/// `PATH` with the venv's `bin` first.
fn with_venv_path(venv: &Path) -> std::ffi::OsString {
    let mut paths = vec![venv.join("bin")];
    if let Some(p) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(paths).unwrap_or_default()
}

/// `python -m pip install`, quietly.
fn pip_install(py: &Path) -> std::process::Command {
    let mut c = safety_env::command(py);
    c.args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]);
    c
}

/// Whether the venv imports the pinned torch already.
fn has_torch(py: &Path) -> bool {
    let want = TORCH.trim_start_matches("torch==");
    safety_env::command(py)
        .args(["-c", "import torch; print(torch.__version__.split('+')[0])"])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == want)
}

/// Builds, installs and tests the package.
pub fn ci_checks() -> Result<(), String> {
    let target = util::target_dir();
    let venv = target.join("py-venv");
    let py = venv_python(&venv);
    if !py.exists() {
        eprintln!("python: creating {} (python3 -m venv)", venv.display());
        sh(safety_env::command("python3")
            .arg("-m")
            .arg("venv")
            .arg(&venv))?;
    }
    eprintln!("python: installing {MATURIN}, {RUFF}, pytest and numpy from PyPI into the venv");
    sh(pip_install(&py).args([MATURIN, RUFF, ZIG, "pytest", "numpy"]))?;
    if !has_torch(&py) {
        eprintln!("python: installing {TORCH} from PyPI into the venv (the backend's tests)");
        sh(pip_install(&py).arg(TORCH))?;
    }
    let kernels = Path::new("python/symm/kernels");
    let (n, bytes) = crate::hw::bundle::install(kernels)?;
    eprintln!(
        "python: {n} kernels for sm_{} ({:.1} MiB) into {} for the wheel",
        crate::hw::bundle::ARCH,
        bytes as f64 / (1 << 20) as f64,
        kernels.display()
    );
    let wheels = target.join("wheels");
    if wheels.exists() {
        std::fs::remove_dir_all(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
    }
    sh(safety_env::command(&py)
        .args(["-m", "maturin", "build", "--release", "--strip", "--zig"])
        .args([
            "--compatibility",
            MANYLINUX,
            "-m",
            "python/Cargo.toml",
            "-o",
        ])
        .arg(&wheels)
        .env("CARGO_TARGET_DIR", &target)
        // maturin finds zig as `python -m ziglang` with the first python on PATH: the venv's.
        .env("PATH", with_venv_path(&venv)))?;
    let wheel = abi3_wheel(&wheels)?;
    sh(pip_install(&py)
        .args(["--force-reinstall", "--no-deps"])
        .arg(&wheel))?;
    sh(safety_env::command(&py).args(["-m", "ruff", "check", "python"]))?;
    sh(safety_env::command(&py).args(["-m", "pytest", "python/tests", "-q"]))
}

#[cfg(test)]
mod tests {
    use super::is_abi3;

    #[test]
    fn wheel_tags() {
        assert!(!is_abi3("symm-0.1.0-cp39-abi3-linux_x86_64.whl"));
        assert!(is_abi3("symm-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl"));
        assert!(is_abi3("symm-0.1.0-cp39-abi3-manylinux_2_17_x86_64.whl"));
        assert!(!is_abi3("symm-0.1.0-cp311-cp311-linux_x86_64.whl"));
        assert!(!is_abi3("symm-0.1.0-cp39-abi3.whl"));
    }
}
