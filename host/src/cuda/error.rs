//! CUDA driver results as the crate's errors, naming the operation that failed. Below the
//! launcher and the module loader, which both use it.

use crate::{Error, Result};

/// A `cust` error as [`Error::Cuda`] naming the call.
pub fn cuda_err(op: &str, e: cust::error::CudaError) -> Error {
    Error::Cuda { op: op.to_string(), msg: e.to_string() }
}

/// Turns a raw driver status into a `Result` naming the call.
pub trait OkOrCuda {
    fn ok_or_cuda(self, op: &str) -> Result<()>;
}

impl OkOrCuda for cust::sys::CUresult {
    fn ok_or_cuda(self, op: &str) -> Result<()> {
        if self == cust::sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(Error::Cuda { op: op.to_string(), msg: format!("{:?}", self) })
        }
    }
}
