//! The kernels the Python wheel ships (`symm/kernels`, read by
//! `symm_driver::kernel_cache::bundled`): every variant but the multimem ones, compiled for
//! sm_90 (H100, H200) with the pinned NVRTC, each file named by its bundled key and carrying
//! the cache's SHA-256 header. A first `symm.init` on a new machine then loads the interpreter
//! instead of compiling it (tens of seconds per variant); other GPUs still compile.
//!
//! Compiled variants are kept under `<target>/bundled-kernels` by key, so the kernel check and
//! the wheel build compile each once.

use std::path::{Path, PathBuf};

use symm_driver::cuda::compile::{bundled_key, Compiler};
use symm_driver::kernel_cache::encode;
use symm_kernels::Variant;

use crate::util;

/// The architecture the wheel's kernels are built for.
pub const ARCH: u32 = 90;

/// Whether the wheel ships `v` (multimem kernels are never launched from it).
pub fn shipped(v: &Variant) -> bool {
    !v.defines.contains(&"SYMM_MULTIMEM=1")
}

fn store_dir() -> PathBuf {
    util::target_dir().join("bundled-kernels")
}

/// Keeps `cubin` of `v` (for [`ARCH`]) for the wheel.
pub fn store(v: &Variant, cubin: &[u8]) -> Result<(), String> {
    let dir = store_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let key = bundled_key(v, ARCH);
    let path = dir.join(&key);
    std::fs::write(&path, encode(&key, cubin)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Fills `to` (emptied first) with every shipped variant, compiling those not kept yet with the
/// pinned NVRTC. Returns the files and their bytes.
pub fn install(to: &Path) -> Result<(usize, u64), String> {
    let dir = store_dir();
    let mut compiler = None;
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    }
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let (mut n, mut bytes) = (0, 0);
    for v in symm_kernels::ALL.into_iter().filter(shipped) {
        let key = bundled_key(&v, ARCH);
        if !dir.join(&key).is_file() {
            if compiler.is_none() {
                let lib = super::wheel::nvrtc()?;
                compiler = Some(Compiler::load(Some(&lib)).map_err(|e| e.to_string())?);
            }
            let c = compiler.as_ref().ok_or("no compiler")?;
            eprintln!(
                "python: compiling the {} kernel for sm_{ARCH} to ship",
                v.name
            );
            let cubin = c.compile(&v, ARCH).map_err(|e| e.to_string())?;
            store(&v, &cubin)?;
        }
        let dest = to.join(&key);
        bytes +=
            std::fs::copy(dir.join(&key), &dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        n += 1;
    }
    Ok((n, bytes))
}
