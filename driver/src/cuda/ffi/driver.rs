//! libcuda (the CUDA driver API), loaded through cudarc's library search.

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use super::api_table;

/// `CUdevice`.
pub type Device = c_int;
/// `CUdeviceptr`.
pub type DevPtr = u64;
/// An opaque driver handle (`CUcontext`, `CUstream`, `CUmodule`, `CUfunction`, `CUevent`,
/// `CUgraph`, `CUgraphExec`).
pub type Handle = *mut c_void;
/// `CUmemGenericAllocationHandle`.
pub type MemHandle = u64;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
pub const ATTR_CC_MAJOR: c_int = 75;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
pub const ATTR_CC_MINOR: c_int = 76;
/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
pub const ATTR_VMM: c_int = 102;
/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
pub const ATTR_POSIX_FD: c_int = 103;
/// `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID`.
pub const ATTR_PCI_BUS_ID: c_int = 33;
/// `CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID`.
pub const ATTR_PCI_DEVICE_ID: c_int = 34;
/// `CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID`.
pub const ATTR_PCI_DOMAIN_ID: c_int = 50;
/// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`: contexts on the device are served by MPS.
pub const ATTR_MPS_ENABLED: c_int = 133;
/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
pub const ATTR_SM_COUNT: c_int = 16;
/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`.
pub const HOSTALLOC_PORTABLE_DEVICEMAP: c_uint = 0x01 | 0x02;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const GRANULARITY_MINIMUM: c_int = 0;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
pub const GRANULARITY_RECOMMENDED: c_int = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const HANDLE_POSIX_FD: c_int = 1;
/// `CU_STREAM_NON_BLOCKING`.
pub const STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
pub const CAPTURE_THREAD_LOCAL: c_int = 1;
/// `CU_EVENT_DEFAULT`.
pub const EVENT_DEFAULT: c_uint = 0;
/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CAPTURE_STATUS_NONE: c_int = 0;

/// `CUmemLocation` for a device.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemLocation {
    /// `CU_MEM_LOCATION_TYPE_DEVICE` = 1.
    pub kind: c_int,
    /// Device ordinal.
    pub id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemAllocationProp {
    /// `CU_MEM_ALLOCATION_TYPE_PINNED` = 1.
    pub kind: c_int,
    /// Requested shareable handle types.
    pub handle_types: c_int,
    /// Where the memory lives.
    pub location: MemLocation,
    /// Windows only; null.
    pub win32_meta: *mut c_void,
    /// compressionType, gpuDirectRDMACapable, usage (u16), reserved\[4\].
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemAccessDesc {
    /// The device granted access.
    pub location: MemLocation,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE` = 3.
    pub flags: c_int,
}

// The layouts above must match cudarc's bindings of the same structs.
const _: () = {
    use cudarc::driver::sys as s;
    assert!(
        core::mem::size_of::<MemAllocationProp>() == core::mem::size_of::<s::CUmemAllocationProp>()
    );
    assert!(core::mem::size_of::<MemAccessDesc>() == core::mem::size_of::<s::CUmemAccessDesc>());
    assert!(core::mem::size_of::<MemLocation>() == core::mem::size_of::<s::CUmemLocation>());
};

api_table! {
    /// The driver entry points symm uses (the `_v2` names are the current ABI).
    DriverApi {
        init = "cuInit"(c_uint);
        driver_get_version = "cuDriverGetVersion"(*mut c_int);
        device_get_count = "cuDeviceGetCount"(*mut c_int);
        device_get = "cuDeviceGet"(*mut Device, c_int);
        device_get_name = "cuDeviceGetName"(*mut c_char, c_int, Device);
        device_get_attribute = "cuDeviceGetAttribute"(*mut c_int, c_int, Device);
        device_can_access_peer = "cuDeviceCanAccessPeer"(*mut c_int, Device, Device);
        primary_ctx_retain = "cuDevicePrimaryCtxRetain"(*mut Handle, Device);
        primary_ctx_release = "cuDevicePrimaryCtxRelease_v2"(Device);
        ctx_set_current = "cuCtxSetCurrent"(Handle);
        ctx_get_current = "cuCtxGetCurrent"(*mut Handle);
        ctx_get_device = "cuCtxGetDevice"(*mut c_int);
        ctx_synchronize = "cuCtxSynchronize"();
        mem_get_info = "cuMemGetInfo_v2"(*mut usize, *mut usize);
        mem_get_allocation_granularity = "cuMemGetAllocationGranularity"(*mut usize, *const MemAllocationProp, c_int);
        mem_create = "cuMemCreate"(*mut MemHandle, usize, *const MemAllocationProp, u64);
        mem_release = "cuMemRelease"(MemHandle);
        mem_export = "cuMemExportToShareableHandle"(*mut c_void, MemHandle, c_int, u64);
        mem_import = "cuMemImportFromShareableHandle"(*mut MemHandle, *mut c_void, c_int);
        mem_address_reserve = "cuMemAddressReserve"(*mut DevPtr, usize, usize, DevPtr, u64);
        mem_address_free = "cuMemAddressFree"(DevPtr, usize);
        mem_map = "cuMemMap"(DevPtr, usize, usize, MemHandle, u64);
        mem_unmap = "cuMemUnmap"(DevPtr, usize);
        mem_set_access = "cuMemSetAccess"(DevPtr, usize, *const MemAccessDesc, usize);
        mem_alloc = "cuMemAlloc_v2"(*mut DevPtr, usize);
        mem_free = "cuMemFree_v2"(DevPtr);
        memcpy_htod = "cuMemcpyHtoD_v2"(DevPtr, *const c_void, usize);
        memcpy_dtoh = "cuMemcpyDtoH_v2"(*mut c_void, DevPtr, usize);
        memset_d8 = "cuMemsetD8_v2"(DevPtr, u8, usize);
        memcpy_dtod_async = "cuMemcpyDtoDAsync_v2"(DevPtr, DevPtr, usize, Handle);
        mem_host_alloc = "cuMemHostAlloc"(*mut *mut c_void, usize, c_uint);
        mem_free_host = "cuMemFreeHost"(*mut c_void);
        mem_host_get_device_pointer = "cuMemHostGetDevicePointer_v2"(*mut DevPtr, *mut c_void, c_uint);
        stream_create = "cuStreamCreate"(*mut Handle, c_uint);
        stream_destroy = "cuStreamDestroy_v2"(Handle);
        stream_synchronize = "cuStreamSynchronize"(Handle);
        stream_query = "cuStreamQuery"(Handle);
        stream_is_capturing = "cuStreamIsCapturing"(Handle, *mut c_int);
        stream_wait_event = "cuStreamWaitEvent"(Handle, Handle, c_uint);
        stream_begin_capture = "cuStreamBeginCapture_v2"(Handle, c_int);
        stream_end_capture = "cuStreamEndCapture"(Handle, *mut Handle);
        graph_instantiate = "cuGraphInstantiateWithFlags"(*mut Handle, Handle, u64);
        graph_launch = "cuGraphLaunch"(Handle, Handle);
        graph_exec_destroy = "cuGraphExecDestroy"(Handle);
        graph_destroy = "cuGraphDestroy"(Handle);
        module_load_data = "cuModuleLoadData"(*mut Handle, *const c_void);
        module_unload = "cuModuleUnload"(Handle);
        module_get_function = "cuModuleGetFunction"(*mut Handle, Handle, *const c_char);
        launch_kernel = "cuLaunchKernel"(Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void);
        event_create = "cuEventCreate"(*mut Handle, c_uint);
        event_destroy = "cuEventDestroy_v2"(Handle);
        event_record = "cuEventRecord"(Handle, Handle);
        event_synchronize = "cuEventSynchronize"(Handle);
        event_elapsed_time = "cuEventElapsedTime"(*mut f32, Handle, Handle);
        get_error_name = "cuGetErrorName"(c_int, *mut *const c_char);
    }
}

/// `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`.
#[cfg(feature = "multicast")]
pub const ATTR_MULTICAST_SUPPORTED: c_int = 132;
/// `CU_MULTICAST_GRANULARITY_MINIMUM`.
#[cfg(feature = "multicast")]
pub const MC_GRANULARITY_MINIMUM: c_int = 0;
/// `CU_MULTICAST_GRANULARITY_RECOMMENDED`.
#[cfg(feature = "multicast")]
pub const MC_GRANULARITY_RECOMMENDED: c_int = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
#[cfg(feature = "multicast")]
pub const LOCATION_DEVICE: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
#[cfg(feature = "multicast")]
pub const ACCESS_READWRITE: c_int = 3;

/// `CUmulticastObjectProp` (v1).
#[cfg(feature = "multicast")]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MulticastObjectProp {
    /// Devices in the multicast team (each binds memory to the object).
    pub num_devices: c_uint,
    /// Bytes that may be bound per device, a multiple of the minimum multicast granularity.
    pub size: usize,
    /// Exportable handle types (`CUmemAllocationHandleType` bits); 0: not exportable.
    pub handle_types: u64,
    /// Must be 0.
    pub flags: u64,
}

// The layout must match cudarc's binding of the same struct, field for field.
#[cfg(feature = "multicast")]
const _: () = {
    use core::mem::{offset_of, size_of};
    use cudarc::driver::sys as s;
    assert!(size_of::<MulticastObjectProp>() == size_of::<s::CUmulticastObjectProp>());
    assert!(
        offset_of!(MulticastObjectProp, num_devices)
            == offset_of!(s::CUmulticastObjectProp, numDevices)
    );
    assert!(offset_of!(MulticastObjectProp, size) == offset_of!(s::CUmulticastObjectProp, size));
    assert!(
        offset_of!(MulticastObjectProp, handle_types)
            == offset_of!(s::CUmulticastObjectProp, handleTypes)
    );
    assert!(offset_of!(MulticastObjectProp, flags) == offset_of!(s::CUmulticastObjectProp, flags));
};

#[cfg(feature = "multicast")]
api_table! {
    /// The multicast entry points (CUDA 12.1 and later), a table of their own so that a driver
    /// without them still loads [`DriverApi`]. Only `cuda::multicast` calls them.
    MulticastApi {
        get_granularity = "cuMulticastGetGranularity"(*mut usize, *const MulticastObjectProp, c_int);
        create = "cuMulticastCreate"(*mut MemHandle, *const MulticastObjectProp);
        add_device = "cuMulticastAddDevice"(MemHandle, Device);
        bind_mem = "cuMulticastBindMem"(MemHandle, usize, MemHandle, usize, usize, u64);
        unbind = "cuMulticastUnbind"(MemHandle, Device, usize, usize);
    }
}

/// The multicast entry points of the loaded driver, resolved once; `Err` names why they are
/// unavailable (no driver, or a driver older than CUDA 12.1).
#[cfg(feature = "multicast")]
pub fn multicast_api() -> Result<&'static MulticastApi, &'static str> {
    static API: OnceLock<Result<MulticastApi, &'static str>> = OnceLock::new();
    API.get_or_init(|| {
        api()?;
        // SAFETY: `api()` succeeded, so libcuda is present and cudarc's loader returns it (kept
        // loaded for the process in cudarc's static).
        let lib = unsafe { cudarc::driver::sys::culib() };
        // SAFETY: `lib` is libcuda, whose multicast entry points have the declared signatures.
        unsafe { MulticastApi::load(lib) }
    })
    .as_ref()
    .map_err(|e| *e)
}

api_table! {
    /// Entry points of the framework-facing runtime (`crate::cuda::comm` spans and graph pins),
    /// loaded on their first use: a driver without them fails only what needs them.
    GraphApi {
        stream_get_capture_info = "cuStreamGetCaptureInfo_v2"(Handle, *mut c_int, *mut u64, *mut Handle, *mut *const Handle, *mut usize);
        user_object_create = "cuUserObjectCreate"(*mut Handle, *mut c_void, HostFn, c_uint, c_uint);
        user_object_release = "cuUserObjectRelease"(Handle, c_uint);
        graph_retain_user_object = "cuGraphRetainUserObject"(Handle, Handle, c_uint, c_uint);
        pointer_get_attributes = "cuPointerGetAttributes"(c_uint, *mut c_int, *mut *mut c_void, DevPtr);
    }
}

api_table! {
    /// Stream memory operations (the copy-engine path's flags), loaded on their first use: a
    /// driver without them fails only that path.
    StreamMemApi {
        write_value_32 = "cuStreamWriteValue32_v2"(Handle, DevPtr, u32, c_uint);
        wait_value_32 = "cuStreamWaitValue32_v2"(Handle, DevPtr, u32, c_uint);
    }
}

/// `CU_STREAM_WAIT_VALUE_GEQ`: wait until `(int32)(*addr - value) >= 0`.
pub const WAIT_VALUE_GEQ: c_uint = 0x0;
/// `CU_STREAM_WAIT_VALUE_FLUSH`: after the wait, flush remote writes that reached the device.
pub const WAIT_VALUE_FLUSH: c_uint = 1 << 30;
/// `CU_STREAM_WRITE_VALUE_DEFAULT`: the write follows a system-wide memory barrier.
pub const WRITE_VALUE_DEFAULT: c_uint = 0x0;
/// `CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES`.
pub const ATTR_CAN_FLUSH_REMOTE_WRITES: c_int = 98;

/// The stream memory operations of the loaded driver, resolved once; `Err` names why they are
/// unavailable.
pub fn stream_mem_api() -> Result<&'static StreamMemApi, &'static str> {
    static API: OnceLock<Result<StreamMemApi, &'static str>> = OnceLock::new();
    API.get_or_init(|| {
        api()?;
        // SAFETY: `api()` succeeded, so libcuda is present and cudarc's loader finds it.
        let lib = unsafe { cudarc::driver::sys::culib() };
        // SAFETY: `lib` is libcuda, whose exported entry points have the declared signatures.
        unsafe { StreamMemApi::load(lib) }
    })
    .as_ref()
    .map_err(|e| *e)
}

/// `CUhostFn`: a host function the driver calls (a user object's destructor).
pub type HostFn = unsafe extern "C" fn(*mut c_void);
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
pub const CAPTURE_STATUS_ACTIVE: c_int = 1;
/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`: the only flag `cuUserObjectCreate` takes.
pub const USER_OBJECT_NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`: the graph takes over the caller's reference.
pub const GRAPH_USER_OBJECT_MOVE: c_uint = 1;
/// `CU_POINTER_ATTRIBUTE_CONTEXT`.
pub const POINTER_CONTEXT: c_int = 1;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
pub const POINTER_DEVICE_ORDINAL: c_int = 9;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`.
pub const POINTER_RANGE_START: c_int = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`.
pub const POINTER_RANGE_SIZE: c_int = 12;

/// The graph and pointer entry points, loaded once; `Err` names the first missing one.
pub fn graph_api() -> Result<&'static GraphApi, &'static str> {
    static API: OnceLock<Result<GraphApi, &'static str>> = OnceLock::new();
    API.get_or_init(|| {
        api()?;
        // SAFETY: `api()` succeeded, so libcuda is present and cudarc's loader finds it.
        let lib = unsafe { cudarc::driver::sys::culib() };
        // SAFETY: `lib` is libcuda, whose exported entry points have the declared signatures.
        unsafe { GraphApi::load(lib) }
    })
    .as_ref()
    .map_err(|e| *e)
}

/// The loaded driver, initialised once; `Err` names why it is unavailable.
pub fn api() -> Result<&'static DriverApi, &'static str> {
    static API: OnceLock<Result<DriverApi, &'static str>> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: probing only dlopens candidate names and closes them again.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("libcuda not found (is an NVIDIA driver installed?)");
        }
        // SAFETY: presence was checked just above, so cudarc's loader finds the library instead
        // of panicking; the library stays loaded for the process (cudarc keeps it in a static).
        let lib = unsafe { cudarc::driver::sys::culib() };
        // SAFETY: `lib` is libcuda, whose exported entry points have the declared signatures.
        let api = unsafe { DriverApi::load(lib)? };
        // SAFETY: cuInit takes a flags word that must be 0.
        let rc = unsafe { (api.init)(0) };
        if rc != 0 {
            return Err("cuInit failed (no usable GPU?)");
        }
        Ok(api)
    })
    .as_ref()
    .map_err(|e| *e)
}
