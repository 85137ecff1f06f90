//! Run-time compilation of the kernels with NVRTC, straight to a cubin for one architecture,
//! cached on disk.
//!
//! The sources (`symm-kernels`) are self-contained: NVRTC gets the headers as strings under
//! their include names, so no CUDA toolkit or include path is needed. The cache key is a hash of
//! the source, the headers, the options and the NVRTC version, plus the architecture and the
//! driver version, so a changed kernel, compiler or driver never loads a stale cubin. Cubins (not
//! PTX) are loaded because a driver rejects PTX from a newer compiler than itself.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use symm_kernels::Variant;

use super::error::{CudaError, Result};
use super::ffi::nvrtc::{Nvrtc, Program};

/// A loaded NVRTC.
pub struct Compiler {
    nvrtc: Nvrtc,
}

impl Compiler {
    /// Loads NVRTC from `path`, or by the usual names on the loader path when `None`.
    pub fn load(path: Option<&Path>) -> Result<Compiler> {
        Ok(Compiler {
            nvrtc: Nvrtc::load(path).map_err(CudaError::Unavailable)?,
        })
    }

    /// NVRTC's (major, minor) version.
    pub fn version(&self) -> (i32, i32) {
        self.nvrtc.version
    }

    /// The options a variant is compiled with for `sm_{arch}`.
    pub fn options(v: &Variant, arch: u32) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture=sm_{arch}"),
            "--std=c++17".into(),
            "--fmad=false".into(),
            "--device-as-default-execution-space".into(),
            format!("-DSYMM_THREADS={}", symm_kernels::INTERP_THREADS),
        ];
        o.extend(v.defines.iter().map(|d| format!("-D{d}")));
        o
    }

    /// Compiles a variant to a cubin for `sm_{arch}` (e.g. 90).
    pub fn compile(&self, v: &Variant, arch: u32) -> Result<Vec<u8>> {
        let api = &self.nvrtc.api;
        let cstr =
            |s: &str| CString::new(s).map_err(|_| CudaError::Invalid(format!("NUL in {s:?}")));
        let src = cstr(v.source)?;
        let name = cstr(v.file)?;
        let mut hdr_src = Vec::new();
        let mut hdr_name = Vec::new();
        for (n, s) in symm_kernels::HEADERS {
            hdr_name.push(cstr(n)?);
            hdr_src.push(cstr(s)?);
        }
        let hdr_src_p: Vec<_> = hdr_src.iter().map(|c| c.as_ptr()).collect();
        let hdr_name_p: Vec<_> = hdr_name.iter().map(|c| c.as_ptr()).collect();
        let opts: Vec<CString> = Self::options(v, arch)
            .iter()
            .map(|o| cstr(o))
            .collect::<Result<_>>()?;
        let opts_p: Vec<_> = opts.iter().map(|c| c.as_ptr()).collect();
        let mut prog: Program = core::ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string for the duration of the call and
        // the two header arrays have the length passed.
        let rc = unsafe {
            (api.create_program)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                hdr_src_p.len() as i32,
                hdr_src_p.as_ptr(),
                hdr_name_p.as_ptr(),
            )
        };
        if rc != 0 {
            return Err(CudaError::Compile {
                variant: v.name,
                log: format!("nvrtcCreateProgram returned {rc}"),
            });
        }
        // SAFETY: `prog` was created above; the options array has the length passed.
        let rc = unsafe { (api.compile_program)(prog, opts_p.len() as i32, opts_p.as_ptr()) };
        let out = if rc != 0 {
            Err(CudaError::Compile {
                variant: v.name,
                log: self.log(prog),
            })
        } else {
            self.cubin(prog, v.name)
        };
        // SAFETY: `prog` is a valid program, destroyed exactly once.
        unsafe { (api.destroy_program)(&mut prog) };
        out
    }

    fn log(&self, prog: Program) -> String {
        let api = &self.nvrtc.api;
        let mut n = 0usize;
        // SAFETY: valid program and out-pointer.
        if unsafe { (api.get_program_log_size)(prog, &mut n) } != 0 || n == 0 {
            return "(no log)".into();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes NVRTC said the log needs.
        if unsafe { (api.get_program_log)(prog, buf.as_mut_ptr().cast()) } != 0 {
            return "(log unavailable)".into();
        }
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    fn cubin(&self, prog: Program, variant: &'static str) -> Result<Vec<u8>> {
        let api = &self.nvrtc.api;
        let mut n = 0usize;
        // SAFETY: valid program and out-pointer.
        let rc = unsafe { (api.get_cubin_size)(prog, &mut n) };
        if rc != 0 || n == 0 {
            return Err(CudaError::Compile {
                variant,
                log: format!("no cubin (code {rc}); was a real sm_ architecture given?"),
            });
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes NVRTC reported.
        let rc = unsafe { (api.get_cubin)(prog, buf.as_mut_ptr().cast()) };
        if rc != 0 {
            return Err(CudaError::Compile {
                variant,
                log: format!("nvrtcGetCUBIN returned {rc}"),
            });
        }
        Ok(buf)
    }
}

/// FNV-1a, 64 bit (stable across builds, unlike std's hasher).
fn fnv(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= b as u64;
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

/// The cache key of a variant for an architecture, compiler and driver.
pub fn cache_key(v: &Variant, arch: u32, nvrtc: (i32, i32), driver: i32) -> String {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    fnv(&mut h, v.source.as_bytes());
    for (n, s) in symm_kernels::HEADERS {
        fnv(&mut h, n.as_bytes());
        fnv(&mut h, s.as_bytes());
    }
    for o in Compiler::options(v, arch) {
        fnv(&mut h, o.as_bytes());
    }
    fnv(&mut h, &nvrtc.0.to_le_bytes());
    fnv(&mut h, &nvrtc.1.to_le_bytes());
    format!("{}-sm{arch}-drv{driver}-{h:016x}.cubin", v.name)
}

/// The kernel cache folder: `$SYMM_KERNEL_CACHE`, else `$XDG_CACHE_HOME/symm/kernels`, else
/// `$HOME/.cache/symm/kernels`, else a folder under the system temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SYMM_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("symm/kernels");
    }
    if let Some(d) = std::env::var_os("HOME") {
        return PathBuf::from(d).join(".cache/symm/kernels");
    }
    std::env::temp_dir().join("symm-kernels")
}

/// A cubin for the variant: from the cache when present, else compiled and stored. Returns the
/// cubin and whether it came from the cache.
pub fn cubin(compiler: &Compiler, v: &Variant, arch: u32, driver: i32) -> Result<(Vec<u8>, bool)> {
    let dir = cache_dir();
    let path = dir.join(cache_key(v, arch, compiler.version(), driver));
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok((bytes, true));
        }
    }
    let bin = compiler.compile(v, arch)?;
    // A cache that cannot be written only costs a recompile next time.
    if std::fs::create_dir_all(&dir).is_ok() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &bin).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    Ok((bin, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_changes_with_variant_arch_compiler_and_driver() {
        let base = cache_key(&symm_kernels::INTERP, 90, (12, 9), 13000);
        assert_ne!(
            base,
            cache_key(&symm_kernels::INTERP_TRACE, 90, (12, 9), 13000)
        );
        assert_ne!(base, cache_key(&symm_kernels::INTERP, 100, (12, 9), 13000));
        assert_ne!(base, cache_key(&symm_kernels::INTERP, 90, (13, 0), 13000));
        assert_ne!(base, cache_key(&symm_kernels::INTERP, 90, (12, 9), 13010));
        assert_eq!(base, cache_key(&symm_kernels::INTERP, 90, (12, 9), 13000));
    }

    #[test]
    fn options_name_a_real_architecture_and_the_defines() {
        let o = Compiler::options(&symm_kernels::INTERP_TRACE, 90);
        assert!(o.iter().any(|x| x == "--gpu-architecture=sm_90"));
        assert!(o.iter().any(|x| x == "-DSYMM_TRACE=1"));
        assert!(o.iter().any(|x| x == "--fmad=false"));
    }
}
