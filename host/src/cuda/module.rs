//! The loaded kernel module: one PTX module chosen for the device, every kernel's function
//! handle looked up once at load, and the launch call itself.

use super::error::OkOrCuda;
use crate::kernels::{Arch, Kernel, KernelsRequest, Ptx};
use crate::{Error, Result};
use cust::module::Module;
use std::ffi::c_void;

/// A loaded PTX module and the handle of every kernel it carries (indexed by `Kernel as usize`).
pub struct Kernels {
    // The handles are valid while `module` lives.
    funcs: Vec<cust::sys::CUfunction>,
    arch: Arch,
    module: Module,
}

impl Kernels {
    /// Chooses the module for a device of compute capability `cc` (the newest it supports, or
    /// the forced one, which must be embedded and supported), loads it (the driver JIT-compiles
    /// the PTX for the device) and looks up every kernel it must carry. Returns the module and
    /// the reason it was chosen.
    pub fn load(ptx: &[Ptx], request: KernelsRequest, cc: (u32, u32), device: &str) -> Result<(Kernels, String)> {
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
        let module = Module::from_ptx(&chosen.text_with_caps(), &[]).map_err(|e| Error::Unavailable(format!("loading the {} PTX on {} failed: {}", chosen.arch, device, e)))?;
        let mut funcs = vec![std::ptr::null_mut(); Kernel::ALL.len()];
        for k in Kernel::in_module(chosen.arch) {
            let f = module
                .get_function(k.name())
                .map_err(|e| Error::Unavailable(format!("kernel {} is missing from the {} PTX ({})", k.name(), chosen.arch, e)))?;
            funcs[k as usize] = f.to_raw();
            let shared = k.large_shared_bytes();
            if shared > 0 {
                // SAFETY: a function handle of the live module; the attribute takes an int
                unsafe { cust::sys::cuFuncSetAttribute(f.to_raw(), cust::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared as i32) }
                    .ok_or_cuda(&format!("cuFuncSetAttribute ({} KiB of shared memory for {} on {})", shared / 1024, k.name(), device))
                    .map_err(|e| Error::Unavailable(e.to_string()))?;
            }
        }
        Ok((Kernels { funcs, arch: chosen.arch, module }, why))
    }

    /// The module's architecture.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// Launches `kernel` with its single parameter struct `params` on `stream`.
    pub fn launch<P: Copy>(&self, stream: cust::sys::CUstream, kernel: Kernel, grid: [u32; 3], block: u32, shared_bytes: u32, params: &P) -> Result<()> {
        let f = self.funcs[kernel as usize];
        if f.is_null() {
            return Err(Error::Limit { op: kernel.name(), msg: format!("needs the {} module; {} is loaded", kernel.arch(), self.arch) });
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
