//! libnccl, loaded through cudarc's library search; used to time NCCL beside symm.

use core::ffi::{c_int, c_void};
use std::sync::OnceLock;

use super::api_table;
use super::driver::Handle;

/// `ncclComm_t`.
pub type Comm = *mut c_void;

/// `ncclFloat32`.
pub const FLOAT32: c_int = 7;
/// `ncclBfloat16`.
pub const BFLOAT16: c_int = 9;
/// `ncclInt32`.
pub const INT32: c_int = 2;
/// `ncclSum`.
pub const SUM: c_int = 0;
/// `ncclMax`.
pub const MAX: c_int = 2;

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

/// The loaded NCCL; `Err` names why it is unavailable. Looked up as `$SYMM_NCCL` (a path), then
/// libnccl.so.2 and cudarc's candidate names on the loader path.
pub fn api() -> Result<&'static NcclApi, &'static str> {
    static API: OnceLock<Result<Loaded, &'static str>> = OnceLock::new();
    API.get_or_init(|| {
        let mut names: Vec<std::ffi::OsString> = Vec::new();
        if let Some(p) = std::env::var_os("SYMM_NCCL") {
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
    .map_err(|e| *e)
}
