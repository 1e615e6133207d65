//! The loaded kernel module: one PTX module chosen for the device, every kernel's function
//! handle looked up once at load, and the launch call itself. On compute 9.0 devices the
//! kernels that wait for the one before them (`grid_dep_wait` in `gpu/src/mem.rs`) are launched
//! with programmatic stream serialization (`cuLaunchKernelEx`), so their blocks start while
//! that kernel finishes (recorded graphs keep it as a programmatic edge).

use super::driver::{cuLaunchKernelEx, has_launch_kernel_ex, LaunchAttribute, LaunchConfig, CLUSTER_DIMENSION, PROGRAMMATIC_STREAM_SERIALIZATION};
use super::error::OkOrCuda;
use crate::kernels::{clusters_enabled, grid_dep_enabled, Arch, Kernel, KernelsRequest, Ptx};
use crate::{Error, Result};
use cust::module::Module;
use std::ffi::c_void;

/// A loaded PTX module and the handle of every kernel it carries (indexed by `Kernel as usize`).
pub struct Kernels {
    // The handles are valid while `module` lives.
    funcs: Vec<cust::sys::CUfunction>,
    /// Per kernel: launched to overlap the kernel before it (its code waits for it).
    overlap: Vec<bool>,
    /// The module was loaded as sm_90 (`Ptx::text_for`): its thread-block cluster kernels run.
    clusters: bool,
    /// The module was loaded as sm_90a (`Ptx::is_sm90a`): its warpgroup kernels run.
    sm90a: bool,
    /// The most dynamic shared memory a block may opt in to on this device.
    shared_limit: u32,
    /// Launches (and recordings) of each kernel so far, indexed as `funcs`: how a test tells
    /// which of two variants ran.
    launches: Vec<std::sync::atomic::AtomicU64>,
    arch: Arch,
    module: Module,
}

impl Kernels {
    /// Chooses the module for a device of compute capability `cc` (the newest it supports, or
    /// the forced one, which must be embedded and supported), loads it (the driver JIT-compiles
    /// the PTX for the device) and looks up every kernel it must carry. Returns the module and
    /// the reason it was chosen.
    /// Kernels that always launch with more dynamic shared memory than the device's
    /// `shared_limit` (bytes a block may opt in to) stay at the default limit: their launches
    /// would fail, so the callers do not pick them ([`Kernels::fits_shared`]).
    pub fn load(ptx: &[Ptx], request: KernelsRequest, cc: (u32, u32), shared_limit: u32, device: &str) -> Result<(Kernels, String)> {
        let supported = |p: &&Ptx| p.arch.capability() <= cc;
        let (chosen, why) = match request {
            KernelsRequest::Auto => {
                let best = ptx.iter().filter(supported).max_by_key(|p| p.arch).ok_or_else(|| {
                    Error::Unavailable(format!("{} has compute capability {}.{}; the kernels need at least 6.1", device, cc.0, cc.1))
                })?;
                (best, format!("the newest module compute capability {}.{} supports", cc.0, cc.1))
            }
            KernelsRequest::Force(arch) => {
                let p = ptx.iter().find(|p| p.arch == arch).ok_or_else(|| Error::Unavailable(format!("this build has no {} module", arch)))?;
                if !supported(&p) {
                    let (ma, mi) = arch.capability();
                    return Err(Error::Unavailable(format!("{} needs compute capability {}.{}; {} has {}.{}", arch, ma, mi, device, cc.0, cc.1)));
                }
                (p, "forced with --kernels".to_string())
            }
        };
        // compute 9.0: the module whose kernels overlap the ones before them, when the driver
        // can launch them so (else the plain module, and the log says why)
        let mut why = why;
        let want_overlap = chosen.arch == Arch::Compute80 && cc >= (9, 0) && grid_dep_enabled();
        let can_overlap = want_overlap && has_launch_kernel_ex();
        if want_overlap && !can_overlap {
            log::warn!("kernels on {} run one after another: the driver has no cuLaunchKernelEx (CUDA 12.0)", device);
        }
        let (mut text, overlap) = chosen.text_for(cc, can_overlap);
        if overlap {
            why.push_str("; launches overlap the kernel before (sm_90 grid dependencies)");
        }
        let mut loaded = Module::from_ptx(&text, &[]);
        if let (Err(e), true) = (&loaded, Ptx::is_sm90a(&text)) {
            // a driver that takes sm_90 but not sm_90a (PTX 8.0): the pipelined GEMMs instead
            log::warn!("{}: the sm_90a module did not load ({}); loading it as sm_90, without the warpgroup kernels", device, e);
            text = chosen.text_for_with(cc, can_overlap, false).0;
            loaded = Module::from_ptx(&text, &[]);
        }
        let sm90a = overlap && Ptx::is_sm90a(&text);
        if sm90a {
            why.push_str("; loaded as sm_90a (warpgroup GEMMs and flash attention)");
        }
        let module = loaded.map_err(|e| Error::Unavailable(format!("loading the {} PTX on {} failed: {}", chosen.arch, device, e)))?;
        let mut funcs = vec![std::ptr::null_mut(); Kernel::ALL.len()];
        let mut overlaps = vec![false; Kernel::ALL.len()];
        let waiting = if overlap { Ptx::waiting_entries(&text) } else { Default::default() };
        // `QWEN3_VL_PDL_SKIP=prefix,...`: kernels whose names start so launch one after another
        // (their waits are then no-ops; an A/B aid for benchmarks)
        let skip: Vec<String> = std::env::var("QWEN3_VL_PDL_SKIP").map(|v| v.split(',').filter(|p| !p.is_empty()).map(str::to_string).collect()).unwrap_or_default();
        if overlap && !skip.is_empty() {
            log::info!("QWEN3_VL_PDL_SKIP: kernels named {:?}... launch one after another", skip);
        }
        for k in Kernel::in_module(chosen.arch) {
            overlaps[k as usize] = waiting.contains(k.name()) && !skip.iter().any(|p| k.name().starts_with(p.as_str()));
            let f = module
                .get_function(k.name())
                .map_err(|e| Error::Unavailable(format!("kernel {} is missing from the {} PTX ({})", k.name(), chosen.arch, e)))?;
            funcs[k as usize] = f.to_raw();
            let shared = k.large_shared_bytes();
            if shared > shared_limit {
                log::debug!("{}: {} KiB of shared memory is past the {} KiB a block may have on {}; not used", k.name(), shared / 1024, shared_limit / 1024, device);
            } else if shared > 0 {
                // SAFETY: a function handle of the live module; the attribute takes an int
                unsafe { cust::sys::cuFuncSetAttribute(f.to_raw(), cust::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared as i32) }
                    .ok_or_cuda(&format!("cuFuncSetAttribute ({} KiB of shared memory for {} on {})", shared / 1024, k.name(), device))
                    .map_err(|e| Error::Unavailable(e.to_string()))?;
            }
        }
        let clusters = overlap && clusters_enabled();
        let launches = (0..Kernel::ALL.len()).map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
        Ok((Kernels { funcs, overlap: overlaps, clusters, sm90a, shared_limit, launches, arch: chosen.arch, module }, why))
    }

    /// The module's architecture.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// Whether a block of `bytes` of dynamic shared memory fits this device (kernels past it were
    /// loaded at the default limit and cannot launch).
    pub fn fits_shared(&self, bytes: u32) -> bool {
        bytes <= self.shared_limit
    }

    /// Whether kernels that merge through a thread-block cluster can launch: the module was
    /// loaded as sm_90, where their cluster instructions are real (not with `QWEN3_VL_PDL=0`,
    /// which keeps the compute_80 text, nor `QWEN3_VL_CLUSTERS=0`).
    pub fn clusters(&self) -> bool {
        self.clusters
    }

    /// Whether the warpgroup kernels can launch: the module was loaded as sm_90a (exactly compute
    /// 9.0, not with `QWEN3_VL_WGMMA=0` or `QWEN3_VL_PDL=0`).
    pub fn sm90a(&self) -> bool {
        self.sm90a
    }

    /// An error naming what `kernel` needs where it is a warpgroup kernel and the module was
    /// not loaded as sm_90a (both launch paths check it).
    fn check_sm90a(&self, kernel: Kernel) -> Result<()> {
        if kernel.needs_sm90a() && !self.sm90a {
            return Err(Error::Limit { op: kernel.name(), msg: format!("needs a compute 9.0 device with the {} module loaded as sm_90a (warpgroup multiplies)", kernel.arch()) });
        }
        Ok(())
    }

    /// How many times `kernel` was launched (or recorded into a graph) on this module.
    pub fn launches(&self, kernel: Kernel) -> u64 {
        self.launches[kernel as usize].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Launches `kernel` as [`Kernels::launch`] does, in thread-block clusters of `cluster`
    /// blocks per axis (each grid axis a multiple of it; compute 9.0, [`Kernels::clusters`]).
    #[allow(clippy::too_many_arguments)]
    pub fn launch_cluster<P: Copy>(&self, stream: cust::sys::CUstream, kernel: Kernel, grid: [u32; 3], block: u32, shared_bytes: u32, params: &P, cluster: [u32; 3]) -> Result<()> {
        let f = self.funcs[kernel as usize];
        if f.is_null() || !self.clusters {
            return Err(Error::Limit { op: kernel.name(), msg: format!("needs a compute 9.0 device with the {} module loaded as sm_90 (thread-block clusters)", kernel.arch()) });
        }
        self.check_sm90a(kernel)?;
        if (0..3).any(|i| cluster[i] == 0 || !grid[i].is_multiple_of(cluster[i])) || cluster.iter().product::<u32>() > 8 {
            return Err(Error::Limit { op: kernel.name(), msg: format!("clusters of {:?} blocks for a grid of {:?}: each axis a multiple, at most 8 blocks", cluster, grid) });
        }
        self.launches[kernel as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // the grid is whole clusters of at most 8 blocks (checked above)
        launch_ex(kernel, f, (grid, block, shared_bytes, stream), params, CLUSTER_DIMENSION, &cluster)
    }

    /// Launches `kernel` with its single parameter struct `params` on `stream`.
    pub fn launch<P: Copy>(&self, stream: cust::sys::CUstream, kernel: Kernel, grid: [u32; 3], block: u32, shared_bytes: u32, params: &P) -> Result<()> {
        let f = self.funcs[kernel as usize];
        if f.is_null() {
            return Err(Error::Limit { op: kernel.name(), msg: format!("needs the {} module; {} is loaded", kernel.arch(), self.arch) });
        }
        self.check_sm90a(kernel)?;
        self.launches[kernel as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.overlap[kernel as usize] {
            // the kernel waits for the one before it before reading its output (`overlap` is
            // set only for those)
            return launch_ex(kernel, f, (grid, block, shared_bytes, stream), params, PROGRAMMATIC_STREAM_SERIALIZATION, &[1]);
        }
        let mut args = [params as *const P as *mut c_void];
        // SAFETY: `f` belongs to the live module; `params` is the `#[repr(C)]` struct the kernel
        // takes by value, validated by the checked launcher that built it; the driver copies it
        // before returning.
        unsafe { cust::sys::cuLaunchKernel(f, grid[0], grid[1], grid[2], block, 1, 1, shared_bytes, stream, args.as_mut_ptr(), std::ptr::null_mut()) }
            .ok_or_cuda(kernel.name())
    }

    /// The module (kept for its lifetime; the handles above point into it).
    #[allow(dead_code)]
    pub fn module(&self) -> &Module {
        &self.module
    }
}

/// Launches `f` (the handle of `kernel`) with its single parameter struct `params` through
/// `cuLaunchKernelEx` with one launch attribute: `id`, its value's leading 32-bit words `words`.
fn launch_ex<P: Copy>(kernel: Kernel, f: cust::sys::CUfunction, (grid, block, shared_bytes, stream): ([u32; 3], u32, u32, cust::sys::CUstream), params: &P, id: u32, words: &[u32]) -> Result<()> {
    let mut value = [0u8; 64];
    for (i, w) in words.iter().enumerate() {
        value[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
    }
    let mut attr = LaunchAttribute { id, pad: [0; 4], value };
    let config = LaunchConfig { grid, block: [block, 1, 1], shared_bytes, stream, attrs: &mut attr, num_attrs: 1 };
    let mut args = [params as *const P as *mut c_void];
    // SAFETY: `f` belongs to the live module and `params` is the `#[repr(C)]` struct the kernel
    // takes by value, as in `Kernels::launch`; `config`, `attr` and `args` outlive the call,
    // and the caller checked what the attribute needs of the launch
    unsafe { cuLaunchKernelEx(&config, f, args.as_mut_ptr(), std::ptr::null_mut()) }.ok_or_cuda(kernel.name())
}
