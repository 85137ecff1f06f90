//! libnccl, loaded through cudarc's library search: NCCL beside symm in the benchmarks, and the
//! real library behind the NCCL-API shim (`symm-nccl`), which forwards what symm does not serve.

use core::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;
use symm_core::dtype::{DType, ReduceOp};

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
        reduce = "ncclReduce"(*const c_void, *mut c_void, usize, c_int, c_int, c_int, Comm, Handle);
        comm_init_rank_config = "ncclCommInitRankConfig"(*mut Comm, c_int, UniqueId, c_int, *mut c_void);
        comm_abort = "ncclCommAbort"(Comm);
        comm_split = "ncclCommSplit"(Comm, c_int, c_int, *mut Comm, *mut c_void);
        comm_finalize = "ncclCommFinalize"(Comm);
        comm_count = "ncclCommCount"(Comm, *mut c_int);
        comm_cu_device = "ncclCommCuDevice"(Comm, *mut c_int);
        comm_user_rank = "ncclCommUserRank"(Comm, *mut c_int);
        comm_get_async_error = "ncclCommGetAsyncError"(Comm, *mut c_int);
        get_error_string = "ncclGetErrorString"(c_int) -> *const c_char;
        get_last_error = "ncclGetLastError"(Comm) -> *const c_char;
    }
}

/// NCCL's element types (`ncclDataType_t`) that are symm's too, code for code.
pub const TYPES: [(c_int, DType); 9] = [
    (1, DType::U8),
    (2, DType::I32),
    (3, DType::U32),
    (4, DType::I64),
    (5, DType::U64),
    (6, DType::F16),
    (7, DType::F32),
    (8, DType::F64),
    (9, DType::Bf16),
];

/// NCCL's reductions (`ncclRedOp_t`) that are symm's too (codes from 5 are user-made
/// pre-multiplied sums, which symm does not serve).
pub const OPS: [(c_int, ReduceOp); 5] = [
    (0, ReduceOp::Sum),
    (1, ReduceOp::Prod),
    (2, ReduceOp::Max),
    (3, ReduceOp::Min),
    (4, ReduceOp::Avg),
];

/// symm's element type for NCCL's `code`, when symm has it.
pub fn dtype_of(code: c_int) -> Option<DType> {
    TYPES.iter().find(|(c, _)| *c == code).map(|(_, t)| *t)
}

/// NCCL's code for symm's element type `t`, when NCCL has it.
pub fn type_code(t: DType) -> Option<c_int> {
    TYPES.iter().find(|(_, x)| *x == t).map(|(c, _)| *c)
}

/// symm's reduction for NCCL's `code`, when symm has it.
pub fn reduce_of(code: c_int) -> Option<ReduceOp> {
    OPS.iter().find(|(c, _)| *c == code).map(|(_, o)| *o)
}

/// NCCL's code for symm's reduction `op`.
pub fn op_code(op: ReduceOp) -> Option<c_int> {
    OPS.iter().find(|(_, x)| *x == op).map(|(c, _)| *c)
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
