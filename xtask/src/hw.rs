//! `cargo xtask hw`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use symm_driver::cuda::compile::Compiler;

use crate::{codegen, util};

/// The NVRTC wheel CI compiles with (known to work on a CPU machine).
const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc-cu12==12.9.86";

/// Checks for `cargo xtask test`: the generated header is fresh and every kernel variant compiles
/// for sm_90 with NVRTC from the pip wheel (installed under target/ when missing).
pub fn ci_checks() -> Result<(), String> {
    codegen::check()?;
    let lib = nvrtc_from_wheel()?;
    let t = Instant::now();
    let compiler = Compiler::load(Some(&lib)).map_err(|e| e.to_string())?;
    let (maj, min) = compiler.version();
    let mut n = 0;
    for v in symm_kernels::ALL {
        let cubin = compiler.compile(&v, 90).map_err(|e| e.to_string())?;
        if cubin.len() < 16 || &cubin[..4] != b"\x7fELF" {
            return Err(format!("{}: NVRTC returned no ELF cubin", v.name));
        }
        n += 1;
    }
    println!(
        "kernels: {n} variants compiled for sm_90 with NVRTC {maj}.{min} in {:.1} s; plan.cuh fresh",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// libnvrtc.so.12 from the pip wheel, installed into target/nvrtc-wheel when missing.
fn nvrtc_from_wheel() -> Result<PathBuf, String> {
    let dir = util::root().join("target/nvrtc-wheel");
    let lib = dir.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
    if lib.exists() {
        return Ok(lib);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut last = String::new();
    for py in ["python3", "python"] {
        let out = Command::new(py)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--upgrade", "--target"])
            .arg(&dir)
            .arg(NVRTC_WHEEL)
            .output();
        match out {
            Ok(o) if o.status.success() && lib.exists() => return Ok(lib),
            Ok(o) => last = format!("{py} -m pip install {NVRTC_WHEEL}: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => last = format!("{py}: {e}"),
        }
    }
    Err(format!("could not install NVRTC for the kernel check: {last}"))
}

pub fn run(args: &[String]) -> Result<(), String> {
    if util::flag(args, "--ci-checks") {
        return ci_checks();
    }
    Err("`cargo xtask hw` is not available in this build yet".into())
}
