//! libnvrtc (run-time compilation), loaded from an explicit path or by cudarc's search list.

use core::ffi::{c_char, c_int, c_void};
use std::path::Path;

use super::api_table;

/// `nvrtcProgram`.
pub type Program = *mut c_void;

api_table! {
    /// The NVRTC entry points symm uses.
    NvrtcApi {
        version = "nvrtcVersion"(*mut c_int, *mut c_int);
        create_program = "nvrtcCreateProgram"(*mut Program, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char);
        destroy_program = "nvrtcDestroyProgram"(*mut Program);
        compile_program = "nvrtcCompileProgram"(Program, c_int, *const *const c_char);
        get_program_log_size = "nvrtcGetProgramLogSize"(Program, *mut usize);
        get_program_log = "nvrtcGetProgramLog"(Program, *mut c_char);
        get_cubin_size = "nvrtcGetCUBINSize"(Program, *mut usize);
        get_cubin = "nvrtcGetCUBIN"(Program, *mut c_char);
    }
}

/// A loaded NVRTC: the library and its entry points, kept together.
pub struct Nvrtc {
    /// The entry points (valid while `_lib` is loaded).
    pub api: NvrtcApi,
    /// (major, minor).
    pub version: (i32, i32),
    _lib: libloading::Library,
}

impl Nvrtc {
    /// Loads NVRTC from `path`, or when `None` from `$SYMM_NVRTC` or by the names cudarc searches
    /// (libnvrtc.so.13, .so.12, ...) through the dynamic loader's path.
    pub fn load(path: Option<&Path>) -> Result<Nvrtc, String> {
        let lib = match path {
            // SAFETY: loading NVRTC runs only its initialisers, which have no preconditions.
            Some(p) => unsafe { libloading::Library::new(p) }
                .map_err(|e| format!("{}: {e}", p.display()))?,
            None => {
                let mut found = None;
                let mut names: Vec<std::ffi::OsString> = Vec::new();
                if let Some(p) = std::env::var_os("SYMM_NVRTC") {
                    names.push(p);
                }
                names.extend(
                    cudarc::get_lib_name_candidates("nvrtc")
                        .into_iter()
                        .map(Into::into),
                );
                for name in names {
                    // SAFETY: as above.
                    if let Ok(l) = unsafe { libloading::Library::new(&name) } {
                        found = Some(l);
                        break;
                    }
                }
                found.ok_or_else(|| "libnvrtc not found on the loader path".to_string())?
            }
        };
        // SAFETY: `lib` is libnvrtc; the table is stored beside the library, which outlives it.
        let api = unsafe { NvrtcApi::load(&lib) }.map_err(|s| format!("libnvrtc lacks {s}"))?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        let rc = unsafe { (api.version)(&mut major, &mut minor) };
        if rc != 0 {
            return Err(format!("nvrtcVersion failed with code {rc}"));
        }
        Ok(Nvrtc {
            api,
            version: (major, minor),
            _lib: lib,
        })
    }
}
