//! Run-time compilation of the kernels with NVRTC, straight to a cubin for one architecture,
//! cached on disk.
//!
//! The sources (`symm-kernels`) are self-contained: NVRTC gets the headers as strings under
//! their include names, so no CUDA toolkit or include path is needed. The cache key is a SHA-256
//! of the source, the headers, the options and the NVRTC version, plus the architecture and the
//! driver version, so a changed kernel, compiler or driver never loads a stale cubin. The cache
//! itself ([`crate::kernel_cache`]) is a private folder of the user's and every cubin in it is
//! checked against its stored SHA-256 before it is loaded. Cubins (not PTX) are loaded because a
//! driver rejects PTX from a newer compiler than itself.

use std::ffi::{CStr, CString};
use std::path::Path;

use symm_kernels::Variant;

use crate::kernel_cache::{self, KernelCache, Origin};
use sha2::{Digest, Sha256};

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
        Self::options_with(v.defines, arch)
    }

    /// The options of a source with `defines` (`NAME=VALUE`) for `sm_{arch}`.
    pub fn options_with(defines: &[&str], arch: u32) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture=sm_{arch}"),
            "--std=c++17".into(),
            "--fmad=false".into(),
            "--device-as-default-execution-space".into(),
            format!("-DSYMM_THREADS={}", symm_kernels::INTERP_THREADS),
        ];
        o.extend(defines.iter().map(|d| format!("-D{d}")));
        o
    }

    /// Compiles a variant to a cubin for `sm_{arch}` (e.g. 90).
    pub fn compile(&self, v: &Variant, arch: u32) -> Result<Vec<u8>> {
        self.compile_source(v.name, v.file, v.source, v.defines, arch)
    }

    /// Compiles `source` (named `file` in messages; it may include symm's headers) with
    /// `defines` to a cubin for `sm_{arch}`; `name` names it in errors.
    pub fn compile_source(
        &self,
        name_of: &'static str,
        file: &str,
        source: &str,
        defines: &[&str],
        arch: u32,
    ) -> Result<Vec<u8>> {
        let api = &self.nvrtc.api;
        let cstr = |s: &str| {
            CString::new(s).map_err(|_| CudaError::NulByte {
                what: "kernel source or name",
            })
        };
        let src = cstr(source)?;
        let name = cstr(file)?;
        let mut hdr_src = Vec::new();
        let mut hdr_name = Vec::new();
        for (n, s) in symm_kernels::HEADERS {
            hdr_name.push(cstr(n)?);
            hdr_src.push(cstr(s)?);
        }
        let hdr_src_p: Vec<_> = hdr_src.iter().map(|c| c.as_ptr()).collect();
        let hdr_name_p: Vec<_> = hdr_name.iter().map(|c| c.as_ptr()).collect();
        let opts: Vec<CString> = Self::options_with(defines, arch)
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
                variant: name_of,
                log: format!("nvrtcCreateProgram returned {rc}"),
            });
        }
        // SAFETY: `prog` was created above; the options array has the length passed.
        let rc = unsafe { (api.compile_program)(prog, opts_p.len() as i32, opts_p.as_ptr()) };
        let out = if rc != 0 {
            Err(CudaError::Compile {
                variant: name_of,
                log: self.log(prog),
            })
        } else {
            self.cubin(prog, name_of)
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

/// The cache key of a variant for an architecture, compiler and driver: the name, the
/// architecture, the driver and a SHA-256 prefix of source, headers, options and NVRTC version.
pub fn cache_key(v: &Variant, arch: u32, nvrtc: (i32, i32), driver: i32) -> String {
    source_key(v.name, v.source, v.defines, arch, nvrtc, driver)
}

/// [`cache_key`] of any source (a compiled plan's): `name`, then the same hash.
pub fn source_key(
    name: &str,
    source: &str,
    defines: &[&str],
    arch: u32,
    nvrtc: (i32, i32),
    driver: i32,
) -> String {
    let hash = source_hash(source, defines, arch, Some(nvrtc));
    format!("{name}-sm{arch}-drv{driver}-{hash}.cubin")
}

/// The oldest driver (CUDA 12.0) that loads the shipped kernels: they are built by a CUDA 12
/// NVRTC, whose cubins load on any CUDA 12 driver or later; an older driver compiles its own.
pub const BUNDLED_MIN_DRIVER: i32 = 12000;

/// The name of a variant's kernel among those a package ships (see
/// [`crate::kernel_cache::bundled`]): name, architecture and the hash of source, headers and
/// options, whichever NVRTC built it (the cubin runs on any driver of its CUDA major or later).
pub fn bundled_key(v: &Variant, arch: u32) -> String {
    let hash = source_hash(v.source, v.defines, arch, None);
    format!("{}-sm{arch}-{hash}.cubin", v.name)
}

/// A SHA-256 prefix of the source, the headers, the options and (when given) NVRTC's version.
fn source_hash(source: &str, defines: &[&str], arch: u32, nvrtc: Option<(i32, i32)>) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(source.as_bytes());
    for (n, s) in symm_kernels::HEADERS {
        field(n.as_bytes());
        field(s.as_bytes());
    }
    for o in Compiler::options_with(defines, arch) {
        field(o.as_bytes());
    }
    if let Some((major, minor)) = nvrtc {
        field(&major.to_le_bytes());
        field(&minor.to_le_bytes());
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A cubin for the variant: from the private disk cache (see [`crate::kernel_cache`]) when it
/// holds one whose hash matches, else from the kernels the package ships
/// ([`crate::kernel_cache::bundled`]) or compiled, and stored. The [`Origin`] says which, or why the
/// cache was not used (then the cubin is compiled every time).
pub fn cubin(
    compiler: &Compiler,
    v: &Variant,
    arch: u32,
    driver: i32,
) -> Result<(Vec<u8>, Origin)> {
    let key = cache_key(v, arch, compiler.version(), driver);
    let cache = KernelCache::open_default();
    kernel_cache::fetch(cache.as_ref(), &key, || {
        let shipped = (driver >= BUNDLED_MIN_DRIVER)
            .then(|| kernel_cache::bundled::load(&bundled_key(v, arch)))
            .flatten();
        match shipped {
            Some(kernel) if kernel.starts_with(b"\x7fELF") => Ok(kernel),
            _ => compiler.compile(v, arch),
        }
    })
}

/// A cubin for a generated source (see [`cubin`]), cached under [`source_key`].
pub fn cubin_of_source(
    compiler: &Compiler,
    name: &'static str,
    source: &str,
    defines: &[&str],
    arch: u32,
    driver: i32,
) -> Result<(Vec<u8>, Origin)> {
    let key = source_key(name, source, defines, arch, compiler.version(), driver);
    let cache = KernelCache::open_default();
    kernel_cache::fetch(cache.as_ref(), &key, || {
        compiler.compile_source(name, "symm/compiled_plan.cu", source, defines, arch)
    })
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
    fn a_bundled_key_names_variant_and_architecture_and_no_compiler_or_driver() {
        let k = bundled_key(&symm_kernels::INTERP, 90);
        assert!(
            k.starts_with("interp-sm90-") && k.ends_with(".cubin"),
            "{k}"
        );
        assert_ne!(k, bundled_key(&symm_kernels::INTERP_TRACE, 90));
        assert_ne!(k, bundled_key(&symm_kernels::INTERP, 100));
        assert!(!k.contains("drv"));
        // A plain file name the bundled folder accepts.
        let dir = std::env::temp_dir();
        assert_eq!(kernel_cache::bundled::load_from(&dir, &k, 0), None);
        // The disk cache's key still names the driver.
        assert!(cache_key(&symm_kernels::INTERP, 90, (12, 9), 13000)
            .starts_with("interp-sm90-drv13000-"));
    }

    #[test]
    fn options_name_a_real_architecture_and_the_defines() {
        let o = Compiler::options(&symm_kernels::INTERP_TRACE, 90);
        assert!(o.iter().any(|x| x == "--gpu-architecture=sm_90"));
        assert!(o.iter().any(|x| x == "-DSYMM_TRACE=1"));
        assert!(o.iter().any(|x| x == "--fmad=false"));
    }
}
