//! Elementwise kernels (`gpu/src/activation.rs`): GELU, the SwiGLU gate, the residual add and
//! the f32 → f16 cast, as grid-stride loops.

use super::launch::{ceil_div, need, Launcher};
use super::{CudaBackend, DeviceBuffer};
use crate::backend::Gelu;
use crate::kernels::Kernel;
use crate::{ops, DType, Result, Tensor};
use gpu::params::{BinaryParams, CastParams, UnaryParams, ELEMENTWISE_THREADS};

fn blocks(len: usize) -> u32 {
    ceil_div(len, ELEMENTWISE_THREADS as usize).min(65_535 * 8) as u32
}

/// An elementwise unary kernel (`gelu_tanh_f32`, `gelu_erf_f32`) over `len` f32.
pub fn unary(l: &Launcher<'_>, kernel: Kernel, x: &DeviceBuffer, out: &DeviceBuffer, len: usize) -> Result<()> {
    need(kernel, "x", x, len * 4)?;
    need(kernel, "out", out, len * 4)?;
    if len == 0 {
        return Ok(());
    }
    let p = UnaryParams { x: x.addr(), out: out.addr(), len: len as u64 };
    l.launch(kernel, [blocks(len), 1, 1], ELEMENTWISE_THREADS, &p)
}

/// An elementwise binary kernel (`silu_mul_f32`: a = gate, b = up; `add_f32`) over `len` f32.
pub fn binary(l: &Launcher<'_>, kernel: Kernel, a: &DeviceBuffer, b: &DeviceBuffer, out: &DeviceBuffer, len: usize) -> Result<()> {
    for (what, buf) in [("a", a), ("b", b), ("out", out)] {
        need(kernel, what, buf, len * 4)?;
    }
    if len == 0 {
        return Ok(());
    }
    let p = BinaryParams { a: a.addr(), b: b.addr(), out: out.addr(), len: len as u64 };
    l.launch(kernel, [blocks(len), 1, 1], ELEMENTWISE_THREADS, &p)
}

/// `len` f32 at `x` into f16 bits at `out` (an address inside a buffer the caller checked).
pub fn cast_f16(l: &Launcher<'_>, x: &DeviceBuffer, out: u64, len: usize) -> Result<()> {
    let kernel = Kernel::CastF16F32;
    need(kernel, "x", x, len * 4)?;
    if len == 0 {
        return Ok(());
    }
    let p = CastParams { x: x.addr(), out, len: len as u64 };
    l.launch(kernel, [blocks(len), 1, 1], ELEMENTWISE_THREADS, &p)
}

impl CudaBackend {
    pub(super) fn gelu_op(&self, x: &Tensor, kind: Gelu) -> Result<Tensor> {
        ops::expect_f32("gelu", x)?;
        let kernel = match kind {
            Gelu::Tanh => Kernel::GeluTanhF32,
            Gelu::Erf => Kernel::GeluErfF32,
        };
        let l = self.enter()?;
        let out = self.output(x.elem_count())?;
        unary(&l, kernel, self.buffer("gelu", x)?, &out, x.elem_count())?;
        Ok(Self::wrap(x.shape().to_vec(), DType::F32, out))
    }

    pub(super) fn silu_mul_op(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        let len = ops::silu_mul_len(gate, up)?;
        let l = self.enter()?;
        let out = self.output(len)?;
        binary(&l, Kernel::SiluMulF32, self.buffer("silu_mul", gate)?, self.buffer("silu_mul", up)?, &out, len)?;
        Ok(Self::wrap(gate.shape().to_vec(), DType::F32, out))
    }

    pub(super) fn add_op(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let len = ops::add_len(a, b)?;
        let l = self.enter()?;
        let out = self.output(len)?;
        binary(&l, Kernel::AddF32, self.buffer("add", a)?, self.buffer("add", b)?, &out, len)?;
        Ok(Self::wrap(a.shape().to_vec(), DType::F32, out))
    }
}
