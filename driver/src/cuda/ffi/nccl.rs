//! libnccl, loaded through cudarc's library search; used to time NCCL beside symm.

use core::ffi::{c_int, c_void};
use std::sync::OnceLock;

use super::api_table;
use super::driver::Handle;

/// `ncclComm_t`.
pub type Comm = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes rank 0 draws and every rank passes to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// The bytes.
    pub internal: [u8; 128],
}

api_table! {
    /// The NCCL entry points symm uses.
    NcclApi {
        get_version = "ncclGetVersion"(*mut c_int);
        get_unique_id = "ncclGetUniqueId"(*mut UniqueId);
        comm_init_rank = "ncclCommInitRank"(*mut Comm, c_int, UniqueId, c_int);
        comm_init_all = "ncclCommInitAll"(*mut Comm, c_int, *const c_int);
        comm_destroy = "ncclCommDestroy"(Comm);
        group_start = "ncclGroupStart"();
        group_end = "ncclGroupEnd"();
        all_reduce = "ncclAllReduce"(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Handle);
        all_gather = "ncclAllGather"(*const c_void, *mut c_void, usize, c_int, Comm, Handle);
        reduce_scatter = "ncclReduceScatter"(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Handle);
        broadcast = "ncclBroadcast"(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Handle);
        send = "ncclSend"(*const c_void, usize, c_int, c_int, Comm, Handle);
        recv = "ncclRecv"(*mut c_void, usize, c_int, c_int, Comm, Handle);
    }
}

struct Loaded {
    api: NcclApi,
    _lib: libloading::Library,
}

/// Why NCCL cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NcclLoadError {
    /// The multicast-off variables are not all set: NCCL is never loaded without them
    /// ([`crate::safety_env`]).
    MulticastEnv(crate::safety_env::MulticastEnvError),
    /// The library or one of its entry points was not found; the text names which.
    NotFound(&'static str),
}

impl core::fmt::Display for NcclLoadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NcclLoadError::MulticastEnv(e) => write!(f, "NCCL refused: {e}"),
            NcclLoadError::NotFound(s) => write!(f, "NCCL unavailable: {s}"),
        }
    }
}

impl std::error::Error for NcclLoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NcclLoadError::MulticastEnv(e) => Some(e),
            NcclLoadError::NotFound(_) => None,
        }
    }
}

static API: OnceLock<Result<Loaded, &'static str>> = OnceLock::new();

/// The table when NCCL was loaded before (to destroy what was made with it), whatever the
/// environment holds now.
pub fn loaded() -> Option<&'static NcclApi> {
    API.get().and_then(|r| r.as_ref().ok()).map(|l| &l.api)
}

/// The loaded NCCL. Refused unless the multicast-off variables are set in this process
/// ([`crate::safety_env::check`], asked on every call, before the library is loaded and before
/// any communicator is made); else looked up as `$SYMM_NCCL` (a path), then libnccl.so.2 and
/// cudarc's candidate names on the loader path.
pub fn api() -> Result<&'static NcclApi, NcclLoadError> {
    api_with(|k| std::env::var_os(k))
}

/// [`api`] with the process environment read through `get`.
pub(crate) fn api_with(
    get: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<&'static NcclApi, NcclLoadError> {
    crate::safety_env::check_with(&get).map_err(NcclLoadError::MulticastEnv)?;
    API.get_or_init(|| {
        let mut names: Vec<std::ffi::OsString> = Vec::new();
        if let Some(p) = get("SYMM_NCCL") {
            names.push(p);
        }
        names.push("libnccl.so.2".into());
        names.extend(
            cudarc::get_lib_name_candidates("nccl")
                .into_iter()
                .map(Into::into),
        );
        for n in names {
            // SAFETY: loading libnccl runs only its initialisers, which have no preconditions.
            if let Ok(lib) = unsafe { libloading::Library::new(&n) } {
                // SAFETY: `lib` is libnccl with the declared signatures; the table is kept beside
                // the library in a static, so the library outlives it.
                let api = unsafe { NcclApi::load(&lib)? };
                return Ok(Loaded { api, _lib: lib });
            }
        }
        Err("libnccl not found (set SYMM_NCCL or LD_LIBRARY_PATH)")
    })
    .as_ref()
    .map(|l| &l.api)
    .map_err(|e| NcclLoadError::NotFound(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safety_env::{MulticastEnvError, SAFETY_ENV};

    #[test]
    fn nccl_is_never_loaded_without_the_multicast_off_variables() {
        // A path that would load if the guard let it through: the refusal comes first.
        let r = api_with(|k| (k == "SYMM_NCCL").then(|| "/nonexistent/libnccl.so".into()));
        assert!(
            matches!(
                r,
                Err(NcclLoadError::MulticastEnv(MulticastEnvError::Missing {
                    var: "NCCL_NVLS_ENABLE",
                    ..
                }))
            ),
            "{:?}",
            r.err()
        );
        let r = api_with(|k| match k {
            "NCCL_NVLS_ENABLE" => Some("1".into()),
            _ => SAFETY_ENV
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.into()),
        });
        assert!(
            matches!(
                &r,
                Err(NcclLoadError::MulticastEnv(
                    MulticastEnvError::Different { .. }
                ))
            ),
            "{:?}",
            r.err()
        );
    }
}
