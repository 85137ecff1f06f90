//! Modules, the interpreter's parameter block, kernel launch and CUDA graphs.

use core::ffi::c_void;
use std::ffi::CString;

use super::device::{keep_current, Ctx, Device, Stream};
use super::error::{check, driver, CudaError, Result};
use super::ffi::driver::{self as ffi, Handle};

/// A loaded module (a cubin in one context) and one of its kernels.
pub struct Kernel {
    module: Handle,
    /// The kernel.
    pub func: Handle,
    ctx: Ctx,
}

// SAFETY: module and function handles may be used from any thread with their context bound.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// Loads `cubin` into `dev`'s context and looks up `entry`.
    pub fn load(dev: &Device, cubin: &[u8], entry: &str) -> Result<Kernel> {
        let _ctx = keep_current()?;
        let ctx = dev.retain()?;
        ctx.bind()?;
        let api = driver()?;
        let mut module = core::ptr::null_mut();
        // SAFETY: `cubin` is a complete ELF image that outlives the call (the driver copies it).
        check("cuModuleLoadData", unsafe {
            (api.module_load_data)(&mut module, cubin.as_ptr().cast())
        })?;
        let name = CString::new(entry).map_err(|_| CudaError::NulByte { what: "entry name" })?;
        let mut func = core::ptr::null_mut();
        // SAFETY: valid module and NUL-terminated name.
        let rc = unsafe { (api.module_get_function)(&mut func, module, name.as_ptr()) };
        if rc != 0 {
            // SAFETY: unloading the module loaded above.
            unsafe { (api.module_unload)(module) };
            check("cuModuleGetFunction", rc)?;
        }
        Ok(Kernel { module, func, ctx })
    }

    /// Launches with one parameter block passed by value (context bound by the caller).
    ///
    /// # Safety
    /// `P` must match the kernel's parameter list exactly (one struct parameter), and every
    /// address in it must be valid for what the kernel does with it.
    pub unsafe fn launch<P>(
        &self,
        stream: &Stream,
        grid: u32,
        block: u32,
        params: &P,
    ) -> Result<()> {
        let mut args = [params as *const P as *mut c_void];
        // SAFETY: the caller guarantees that `params` is the kernel's parameter block; the
        // pointer array outlives the call.
        unsafe { self.launch_args(stream, grid, block, &mut args) }
    }

    /// Launches with one parameter block passed by value and `shared` bytes of dynamic shared
    /// memory (context bound by the caller).
    ///
    /// # Safety
    /// As [`Kernel::launch`]; `shared` must be what the kernel expects and at most 48 KiB.
    pub unsafe fn launch_smem<P>(
        &self,
        stream: &Stream,
        grid: u32,
        block: u32,
        shared: u32,
        params: &P,
    ) -> Result<()> {
        let mut args = [params as *const P as *mut c_void];
        // SAFETY: as in `launch`.
        unsafe { self.launch_with(stream, grid, block, shared, &mut args) }
    }

    /// Launches with an argument list of pointers to each parameter.
    ///
    /// # Safety
    /// `args` must point to values matching the kernel's parameter list, in order.
    pub unsafe fn launch_args(
        &self,
        stream: &Stream,
        grid: u32,
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_with(stream, grid, block, 0, args) }
    }

    /// Launches with an argument list and `shared` bytes of dynamic shared memory.
    ///
    /// # Safety
    /// As [`Kernel::launch_args`].
    unsafe fn launch_with(
        &self,
        stream: &Stream,
        grid: u32,
        block: u32,
        shared: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let api = driver()?;
        // SAFETY: forwarded from the caller.
        check("cuLaunchKernel", unsafe {
            (api.launch_kernel)(
                self.func,
                grid,
                1,
                1,
                block,
                1,
                1,
                shared,
                stream.raw,
                args.as_mut_ptr(),
                core::ptr::null_mut(),
            )
        })
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: unloads the module once, with its context (retained by `self.ctx`) bound.
            self.ctx.with(api, || unsafe {
                (api.module_unload)(self.module);
            });
        }
    }
}

/// The interpreter's parameter block, defined once in `symm_kernels::abi` (the C++ struct in
/// `symm/plan.cuh` is generated from it).
pub use symm_kernels::abi::InterpParams;
/// Size of one trace event (`symm_trace_event`).
pub use symm_kernels::abi::EVENT_BYTES;
/// Size of one timeout record (`symm_timeout_record`).
pub use symm_kernels::abi::RECORD_BYTES;

/// A captured and instantiated graph of one rank. Crate-private: a graph replays raw device
/// addresses, so only a capture that pins what it uses and borrows its owner
/// ([`super::comm::CommGraph`], the test harness's `Captured`) may hold one.
pub struct Graph {
    graph: Handle,
    exec: Handle,
    ctx: Ctx,
}

// SAFETY: graph handles may be used from any thread with their context bound.
unsafe impl Send for Graph {}

impl Graph {
    /// Captures what `body` enqueues on `stream` (context of `dev` bound) into a graph.
    pub fn capture(
        dev: &Device,
        stream: &Stream,
        body: impl FnOnce() -> Result<()>,
    ) -> Result<Graph> {
        let _ctx = keep_current()?;
        let ctx = dev.retain()?;
        ctx.bind()?;
        let api = driver()?;
        // SAFETY: valid stream of the bound context.
        check("cuStreamBeginCapture", unsafe {
            (api.stream_begin_capture)(stream.raw, ffi::CAPTURE_THREAD_LOCAL)
        })?;
        let body_result = body();
        let mut graph = core::ptr::null_mut();
        // SAFETY: ends the capture begun above (always, even when the body failed).
        let rc = unsafe { (api.stream_end_capture)(stream.raw, &mut graph) };
        body_result?;
        check("cuStreamEndCapture", rc)?;
        let mut exec = core::ptr::null_mut();
        // SAFETY: `graph` is the captured graph; valid out-pointer.
        let rc = unsafe { (api.graph_instantiate)(&mut exec, graph, 0) };
        if rc != 0 {
            // SAFETY: destroying the graph created by the capture.
            unsafe { (api.graph_destroy)(graph) };
            check("cuGraphInstantiate", rc)?;
        }
        Ok(Graph { graph, exec, ctx })
    }

    /// `Graph::launch` for an owner outside this crate (the test harness's `World`).
    ///
    /// # Safety
    ///
    /// Every buffer, plan and pad the captured work names must still be alive and unchanged in
    /// place, as when it was captured (the owner pins them while the graph lives), and `stream`
    /// must be a stream of the graph's device.
    pub unsafe fn replay(&self, stream: &Stream) -> Result<()> {
        self.launch(stream)
    }

    /// Launches the graph on `stream`.
    pub(crate) fn launch(&self, stream: &Stream) -> Result<()> {
        let _ctx = keep_current()?;
        let api = driver()?;
        // SAFETY: instantiated graph and stream of the same context, bound first.
        check("cuGraphLaunch", unsafe {
            (api.ctx_set_current)(self.ctx.raw());
            (api.graph_launch)(self.exec, stream.raw)
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: destroyed once each, with the context (retained by `self.ctx`) bound.
            self.ctx.with(api, || unsafe {
                (api.graph_exec_destroy)(self.exec);
                (api.graph_destroy)(self.graph);
            });
        }
    }
}
