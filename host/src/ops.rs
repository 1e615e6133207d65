//! Shape and dtype rules of every op, checked once here and by both backends before any work.

use crate::{DType, Error, Result, Tensor};

/// `(m, n, k)` of a linear layer, after checking `a [.., k]` f32, `w [n, k]`, `bias [n]` f32.
pub fn linear_dims(a: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<(usize, usize, usize)> {
    const OP: &str = "linear";
    expect_f32(OP, a)?;
    if w.shape().len() != 2 {
        return Err(Error::shape(OP, &[a.shape(), w.shape()], "weight must be 2-D [out, in]"));
    }
    let (m, k) = a.rows_cols();
    let (n, wk) = (w.shape()[0], w.shape()[1]);
    if a.shape().is_empty() || wk != k {
        return Err(Error::shape(OP, &[a.shape(), w.shape()], format!("input has {} features, weight expects {}", k, wk)));
    }
    if let Some(b) = bias {
        expect_f32(OP, b)?;
        if b.shape() != [n] {
            return Err(Error::shape(OP, &[w.shape(), b.shape()], format!("bias must be [{}]", n)));
        }
    }
    Ok((m, n, k))
}

/// The output shape of a linear layer: `a`'s leading axes then `n`.
pub fn linear_out_shape(a: &Tensor, n: usize) -> Vec<usize> {
    let mut s = a.shape().to_vec();
    if let Some(last) = s.last_mut() {
        *last = n;
    }
    s
}

/// `(rows, cols)` of an RMSNorm, after checking `x [.., cols]` f32 and `w [cols]` f32.
pub fn rms_norm_dims(x: &Tensor, w: &Tensor) -> Result<(usize, usize)> {
    const OP: &str = "rms_norm";
    expect_f32(OP, x)?;
    expect_f32(OP, w)?;
    let (rows, cols) = x.rows_cols();
    if w.shape() != [cols] {
        return Err(Error::shape(OP, &[x.shape(), w.shape()], format!("weight must be [{}]", cols)));
    }
    Ok((rows, cols))
}

/// `(rows, cols)` of a row softmax of f32 `x`.
pub fn softmax_dims(x: &Tensor) -> Result<(usize, usize)> {
    expect_f32("softmax", x)?;
    Ok(x.rows_cols())
}

/// Element count of `silu(gate) * up`, after checking both are f32 of one shape.
pub fn silu_mul_len(gate: &Tensor, up: &Tensor) -> Result<usize> {
    const OP: &str = "silu_mul";
    expect_f32(OP, gate)?;
    expect_f32(OP, up)?;
    if gate.shape() != up.shape() {
        return Err(Error::shape(OP, &[gate.shape(), up.shape()], "gate and up must have one shape"));
    }
    Ok(gate.elem_count())
}

pub fn expect_f32(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::DType { op, expected: "f32", got: t.dtype() });
    }
    Ok(())
}
