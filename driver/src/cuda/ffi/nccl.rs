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

api_table! {
    /// The NCCL entry points symm uses.
    NcclApi {
        get_version = "ncclGetVersion"(*mut c_int);
        comm_init_all = "ncclCommInitAll"(*mut Comm, c_int, *const c_int);
        comm_destroy = "ncclCommDestroy"(Comm);
        group_start = "ncclGroupStart"();
        group_end = "ncclGroupEnd"();
        all_reduce = "ncclAllReduce"(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Handle);
    }
}

/// The loaded NCCL; `Err` names why it is unavailable.
pub fn api() -> Result<&'static NcclApi, &'static str> {
    static API: OnceLock<Result<NcclApi, &'static str>> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: probing only dlopens candidate names.
        if !unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Err("libnccl not found on the loader path");
        }
        // SAFETY: presence was checked, so cudarc's loader does not panic; it keeps the library.
        let lib = unsafe { cudarc::nccl::sys::culib() };
        // SAFETY: `lib` is libnccl with the declared signatures.
        unsafe { NcclApi::load(lib) }
    })
    .as_ref()
    .map_err(|e| *e)
}
