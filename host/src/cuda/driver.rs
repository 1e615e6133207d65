//! The CUDA driver, opened at run time. The binary does not link `libcuda.so.1`: this module
//! defines every driver entry point the backend (and `cust` beneath it) calls, and each one
//! forwards to the symbol of the same name in the library `dlopen` found, so a `--features
//! cuda` build starts on machines without an NVIDIA driver and falls back to the CPU with the
//! reason. The root `build.rs` reads the `fn cu…(` lines below and asks the linker to take these
//! definitions first (`--undefined=NAME`), so the shared library is never needed at link time;
//! a CI check (`readelf`) fails when a new entry point slips through unshimmed.
//!
//! Until [`load`] succeeds every entry point answers `CUDA_ERROR_NOT_INITIALIZED`.

use cust::sys::*;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

/// `CUlaunchAttribute` (CUDA 12.0): an attribute id, padding, a 64-byte value union.
#[repr(C)]
pub struct LaunchAttribute {
    pub id: u32,
    pub pad: [u8; 4],
    pub value: [u8; 64],
}

/// `CUlaunchConfig` (CUDA 12.0), what `cuLaunchKernelEx` takes; the bindings `cust` uses
/// predate it.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_bytes: c_uint,
    pub stream: CUstream,
    pub attrs: *mut LaunchAttribute,
    pub num_attrs: c_uint,
}

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`.
pub const PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;
/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION` (value: three u32, the cluster's blocks per axis).
pub const CLUSTER_DIMENSION: u32 = 4;

/// Whether the opened driver has `cuLaunchKernelEx` (CUDA 12.0 and newer).
pub fn has_launch_kernel_ex() -> bool {
    matches!(state(), Some(Ok((t, _))) if t.cuLaunchKernelEx.is_some())
}

/// Library names tried in order; `QWEN3_VL_LIBCUDA` names the one to open instead.
const LIBRARY_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

macro_rules! driver_api {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(,)?); )*) => {
        /// One function pointer per entry point, resolved from the opened library.
        #[allow(non_snake_case)]
        struct Table {
            $( $name: Option<unsafe extern "C" fn($($ty),*) -> CUresult>, )*
        }

        impl Table {
            /// Every entry point the library has; `cuInit` must be there, others a driver
            /// too old for them lacks answer `CUDA_ERROR_NOT_SUPPORTED` when called.
            fn resolve(lib: *mut c_void, path: &str) -> Result<Table, String> {
                let table = Table {
                    // SAFETY: the symbol comes from the CUDA driver, whose entry point of this
                    // name has exactly this C signature (the bindings `cust` uses).
                    $( $name: symbol(lib, stringify!($name)).map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> CUresult>(p) }), )*
                };
                if table.cuInit.is_none() {
                    return Err(format!("{} has no cuInit: not a CUDA driver library", path));
                }
                let missing: Vec<&str> = [$( (stringify!($name), table.$name.is_none()), )*].iter().filter(|m| m.1).map(|m| m.0).collect();
                if !missing.is_empty() {
                    log::debug!("{} lacks {} (a driver older than their API: CUDA 11.4, or 12.0 for cuLaunchKernelEx; those calls will fail)", path, missing.join(", "));
                }
                Ok(table)
            }
        }

        $(
            /// Forwards to the driver's entry point of the same name.
            ///
            /// # Safety
            /// As the driver API's function.
            #[no_mangle]
            #[allow(non_snake_case)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                match state() {
                    Some(Ok((t, _))) => match t.$name {
                        Some(f) => f($($arg),*),
                        None => CUresult::CUDA_ERROR_NOT_SUPPORTED,
                    },
                    _ => CUresult::CUDA_ERROR_NOT_INITIALIZED,
                }
            }
        )*
    };
}

driver_api! {
    fn cuArray3DCreate_v2(p_handle: *mut CUarray, p_allocate_array: *const CUDA_ARRAY3D_DESCRIPTOR);
    fn cuArray3DGetDescriptor_v2(p_array_descriptor: *mut CUDA_ARRAY3D_DESCRIPTOR, h_array: CUarray);
    fn cuArrayDestroy(h_array: CUarray);
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
    fn cuCtxDestroy_v2(ctx: CUcontext);
    fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint);
    fn cuCtxGetCacheConfig(pconfig: *mut CUfunc_cache);
    fn cuCtxGetCurrent(pctx: *mut CUcontext);
    fn cuCtxGetDevice(device: *mut CUdevice);
    fn cuCtxGetFlags(flags: *mut c_uint);
    fn cuCtxGetLimit(pvalue: *mut usize, limit: CUlimit);
    fn cuCtxGetSharedMemConfig(p_config: *mut CUsharedconfig);
    fn cuCtxGetStreamPriorityRange(least_priority: *mut c_int, greatest_priority: *mut c_int);
    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext);
    fn cuCtxSetCacheConfig(config: CUfunc_cache);
    fn cuCtxSetCurrent(ctx: CUcontext);
    fn cuCtxSetLimit(limit: CUlimit, value: usize);
    fn cuCtxSetSharedMemConfig(config: CUsharedconfig);
    fn cuCtxSynchronize();
    fn cuDestroyExternalMemory(ext_mem: CUexternalMemory);
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice);
    fn cuDeviceGetCount(count: *mut c_int);
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice);
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice);
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice);
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint);
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice);
    fn cuDriverGetVersion(driver_version: *mut c_int);
    fn cuEventCreate(ph_event: *mut CUevent, flags: c_uint);
    fn cuEventDestroy_v2(h_event: CUevent);
    fn cuEventElapsedTime(p_milliseconds: *mut f32, h_start: CUevent, h_end: CUevent);
    fn cuEventQuery(h_event: CUevent);
    fn cuEventRecord(h_event: CUevent, h_stream: CUstream);
    fn cuEventSynchronize(h_event: CUevent);
    fn cuFuncGetAttribute(pi: *mut c_int, attrib: CUfunction_attribute, hfunc: CUfunction);
    fn cuFuncSetAttribute(hfunc: CUfunction, attrib: CUfunction_attribute, value: c_int);
    fn cuFuncSetCacheConfig(hfunc: CUfunction, config: CUfunc_cache);
    fn cuFuncSetSharedMemConfig(hfunc: CUfunction, config: CUsharedconfig);
    fn cuGetErrorString(error: CUresult, p_str: *mut *const c_char);
    fn cuGraphDestroy(h_graph: CUgraph);
    fn cuGraphExecDestroy(h_graph_exec: CUgraphExec);
    fn cuGraphInstantiateWithFlags(ph_graph_exec: *mut CUgraphExec, h_graph: CUgraph, flags: c_ulonglong);
    fn cuGraphLaunch(h_graph_exec: CUgraphExec, h_stream: CUstream);
    fn cuImportExternalMemory(ext_mem_out: *mut CUexternalMemory, mem_handle_desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC);
    fn cuInit(flags: c_uint);
    fn cuLaunchKernelEx(config: *const LaunchConfig, f: CUfunction, kernel_params: *mut *mut c_void, extra: *mut *mut c_void);
    fn cuLaunchKernel(f: CUfunction, grid_dim_x: c_uint, grid_dim_y: c_uint, grid_dim_z: c_uint, block_dim_x: c_uint, block_dim_y: c_uint, block_dim_z: c_uint, shared_mem_bytes: c_uint, h_stream: CUstream, kernel_params: *mut *mut c_void, extra: *mut *mut c_void);
    fn cuLinkComplete(state: CUlinkState, cubin_out: *mut *mut c_void, size_out: *mut usize);
    fn cuLinkCreate_v2(num_options: c_uint, options: *mut CUjit_option, option_values: *mut *mut c_void, state_out: *mut CUlinkState);
    fn cuLinkDestroy(state: CUlinkState);
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize);
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize);
    fn cuMemFreeHost(p: *mut c_void);
    fn cuMemFree_v2(dptr: CUdeviceptr);
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
    fn cuMemcpy2DAsync_v2(p_copy: *const CUDA_MEMCPY2D, h_stream: CUstream);
    fn cuMemcpyDtoDAsync_v2(dst_device: CUdeviceptr, src_device: CUdeviceptr, byte_count: usize, h_stream: CUstream);
    fn cuMemcpyDtoHAsync_v2(dst_host: *mut c_void, src_device: CUdeviceptr, byte_count: usize, h_stream: CUstream);
    fn cuMemcpyHtoDAsync_v2(dst_device: CUdeviceptr, src_host: *const c_void, byte_count: usize, h_stream: CUstream);
    fn cuMemcpyHtoD_v2(dst_device: CUdeviceptr, src_host: *const c_void, byte_count: usize);
    fn cuMemsetD32Async(dst_device: CUdeviceptr, ui: c_uint, n: usize, h_stream: CUstream);
    fn cuMemsetD32_v2(dst_device: CUdeviceptr, ui: c_uint, n: usize);
    fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char);
    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
    fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, num_options: c_uint, options: *mut CUjit_option, option_values: *mut *mut c_void);
    fn cuModuleUnload(hmod: CUmodule);
    fn cuOccupancyAvailableDynamicSMemPerBlock(dynamic_smem_size: *mut usize, func: CUfunction, num_blocks: c_int, block_size: c_int);
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks: *mut c_int, func: CUfunction, block_size: c_int, dynamic_s_mem_size: usize);
    fn cuOccupancyMaxPotentialBlockSize(min_grid_size: *mut c_int, block_size: *mut c_int, func: CUfunction, block_size_to_dynamic_s_mem_size: CUoccupancyB2DSize, dynamic_s_mem_size: usize, block_size_limit: c_int);
    fn cuStreamBeginCapture_v2(h_stream: CUstream, mode: CUstreamCaptureMode);
    fn cuStreamCreateWithPriority(ph_stream: *mut CUstream, flags: c_uint, priority: c_int);
    fn cuStreamDestroy_v2(h_stream: CUstream);
    fn cuStreamEndCapture(h_stream: CUstream, ph_graph: *mut CUgraph);
    fn cuStreamGetFlags(h_stream: CUstream, flags: *mut c_uint);
    fn cuStreamGetPriority(h_stream: CUstream, priority: *mut c_int);
    fn cuStreamSynchronize(h_stream: CUstream);
    fn cuProfilerStart();
    fn cuProfilerStop();
    fn cuStreamWaitEvent(h_stream: CUstream, h_event: CUevent, flags: c_uint);
    fn cuSurfObjectCreate(p_surf_object: *mut CUsurfObject, p_res_desc: *const CUDA_RESOURCE_DESC);
    fn cuSurfObjectDestroy(surf_object: CUsurfObject);
    fn cuSurfObjectGetResourceDesc(p_res_desc: *mut CUDA_RESOURCE_DESC, surf_object: CUsurfObject);
    fn cuTexObjectCreate(p_tex_object: *mut CUtexObject, p_res_desc: *const CUDA_RESOURCE_DESC, p_tex_desc: *const CUDA_TEXTURE_DESC, p_res_view_desc: *const CUDA_RESOURCE_VIEW_DESC);
    fn cuTexObjectDestroy(tex_object: CUtexObject);
    fn cuTexObjectGetResourceDesc(p_res_desc: *mut CUDA_RESOURCE_DESC, tex_object: CUtexObject);
}

/// The opened library's table and path, or why none could be opened: set once, by the first
/// [`load`].
static STATE: OnceLock<Result<(Table, String), String>> = OnceLock::new();

fn state() -> Option<&'static Result<(Table, String), String>> {
    STATE.get()
}

/// Opens the CUDA driver library and resolves every entry point (once per process; later
/// calls return the first answer). Returns the library opened, or an error naming the
/// libraries tried and what the loader said, e.g. "libcuda.so.1: cannot open shared object
/// file" on a machine without an NVIDIA driver.
pub fn load() -> Result<&'static str, String> {
    let opened = STATE.get_or_init(|| {
        let names: Vec<String> = match std::env::var("QWEN3_VL_LIBCUDA") {
            Ok(path) => vec![path],
            Err(_) => LIBRARY_NAMES.iter().map(|s| s.to_string()).collect(),
        };
        open(&names)
    });
    match opened {
        Ok((_, path)) => Ok(path.as_str()),
        Err(e) => Err(e.clone()),
    }
}

/// What `info` shows: the library opened and the CUDA version its driver supports, or why
/// none was opened.
pub fn describe() -> String {
    match load() {
        Ok(path) => {
            let mut v = 0;
            // SAFETY: the driver is loaded; cuDriverGetVersion writes one int.
            match unsafe { cuDriverGetVersion(&mut v) } {
                CUresult::CUDA_SUCCESS => format!("{} (CUDA {}.{} driver)", path, v / 1000, v % 1000 / 10),
                e => format!("{} (version unknown: {:?})", path, e),
            }
        }
        Err(e) => format!("none: {}", e),
    }
}

/// Tries `names` in order; the first that opens must have every entry point.
fn open(names: &[String]) -> Result<(Table, String), String> {
    let mut tried = Vec::new();
    for name in names {
        let c = CString::new(name.as_str()).map_err(|_| format!("library name {:?} holds a NUL byte", name))?;
        // SAFETY: a NUL-terminated name; RTLD_NOW resolves the library's own dependencies now.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            tried.push(loader_error());
            continue;
        }
        return Ok((Table::resolve(lib, name)?, name.clone()));
    }
    Err(format!("no NVIDIA driver library could be opened ({})", tried.join("; ")))
}

fn symbol(lib: *mut c_void, name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: `lib` is a live handle from dlopen; the name is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    if p.is_null() {
        None
    } else {
        Some(p)
    }
}

/// The dynamic loader's last error message.
fn loader_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn missing_libraries_are_named() {
        let names = ["/nonexistent/libcuda-a.so.1".to_string(), "/nonexistent/libcuda-b.so".to_string()];
        let e = super::open(&names).err().expect("no such library");
        assert!(e.contains("libcuda-a.so.1") && e.contains("libcuda-b.so"), "{}", e);
    }

    #[test]
    fn a_library_without_the_entry_points_is_named() {
        let names = ["libc.so.6".to_string()];
        let e = super::open(&names).err().expect("libc has no cuInit");
        assert!(e.contains("libc.so.6 has no cuInit"), "{}", e);
    }
}
