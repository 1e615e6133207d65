//! Where weights come from: a [`TensorSource`] hands out a checkpoint tensor by its Hugging Face
//! name, checked to have the shape the model asks for, as raw bytes of its stored dtype. The
//! safetensors [`Checkpoint`](super::Checkpoint), a GGUF pair ([`super::gguf_source`]) and
//! load-time quantization ([`super::quantize`]) implement it; the functions here turn raw
//! tensors into backend tensors once for all of them.

use crate::{Backend, Blocks, DType, Error, MappedBytes, Result, Tensor};
use std::borrow::Cow;

/// A tensor's stored bytes.
pub struct Raw<'a> {
    pub dtype: DType,
    pub bytes: Cow<'a, [u8]>,
    /// The same bytes as a window of a mapped file, when they are one (zero-copy loads).
    pub mapped: Option<MappedBytes>,
    /// The file it came from (for errors).
    pub file: String,
}

pub trait TensorSource: Send + Sync {
    /// The files, for messages.
    fn describe(&self) -> String;
    fn contains(&self, name: &str) -> bool;
    /// Stored bytes of `name` (0 when absent), for progress.
    fn bytes_of(&self, name: &str) -> usize;
    fn total_bytes(&self) -> usize;
    /// Bytes `name` takes once loaded as `shape` (its stored type, or what a load-time
    /// quantization makes of it); 0 when absent. For memory placement.
    fn stored_bytes(&self, name: &str, _shape: &[usize]) -> usize {
        self.bytes_of(name)
    }
    /// `name`'s bytes, checked to hold `shape`; marks it used.
    fn raw(&self, name: &str, shape: &[usize]) -> Result<Raw<'_>>;
    /// Names not loaded so far that do not start with any of `ignored_prefixes`.
    fn unused(&self, ignored_prefixes: &[&str]) -> Vec<String>;
}

/// Bytes as little-endian u16 words.
fn words(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

/// Uploads raw bytes of `shape` to `backend` in their dtype (zero-copy where mapped on the CPU).
pub fn upload(backend: &dyn Backend, shape: &[usize], r: Raw<'_>) -> Result<Tensor> {
    match (r.dtype, r.mapped) {
        (d, Some(m)) if d.is_quantized() => backend.upload_blocks(shape, d, Blocks::Mapped(m)),
        (d, None) if d.is_quantized() => backend.upload_blocks(shape, d, Blocks::Owned(r.bytes.into_owned())),
        (d, Some(m)) => backend.upload_mapped(shape, d, m),
        (DType::F32, None) => backend.upload_f32(shape, &r.bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>()),
        (d, None) => backend.upload_half(shape, d, &words(&r.bytes)),
    }
}

/// The tensor in its stored dtype.
pub fn load(src: &dyn TensorSource, backend: &dyn Backend, name: &str, shape: &[usize]) -> Result<Tensor> {
    upload(backend, shape, src.raw(name, shape)?)
}

/// Raw bytes dequantized (or widened) to f32.
pub fn to_f32(name: &str, shape: &[usize], r: &Raw<'_>) -> Result<Vec<f32>> {
    let elems: usize = shape.iter().product();
    crate::quant::dequantize_vec(r.dtype, &r.bytes, elems).ok_or_else(|| Error::Checkpoint { file: r.file.clone(), tensor: name.into(), msg: format!("{} bytes do not hold {:?} of {}", r.bytes.len(), shape, r.dtype) })
}

/// The tensor as f32 in host memory.
pub fn read_f32(src: &dyn TensorSource, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    to_f32(name, shape, &src.raw(name, shape)?)
}

/// The tensor as an f32 backend tensor (norm weights, biases).
pub fn load_f32(src: &dyn TensorSource, backend: &dyn Backend, name: &str, shape: &[usize]) -> Result<Tensor> {
    let r = src.raw(name, shape)?;
    if r.dtype == DType::F32 {
        return upload(backend, shape, r);
    }
    backend.upload_f32(shape, &to_f32(name, shape, &r)?)
}

/// Rows `row0 .. row0 + rows` of a 2-D (or higher) tensor, in its stored dtype.
pub fn load_rows(src: &dyn TensorSource, backend: &dyn Backend, name: &str, shape: &[usize], row0: usize, rows: usize) -> Result<Tensor> {
    let r = src.raw(name, shape)?;
    let bad = |msg: String| Error::Checkpoint { file: r.file.clone(), tensor: name.into(), msg };
    if shape.len() < 2 || row0.checked_add(rows).map_or(true, |e| e > shape[0]) {
        return Err(bad(format!("rows {}..{} are outside shape {:?}", row0, row0.saturating_add(rows), shape)));
    }
    let row_bytes = r.dtype.row_bytes(shape[shape.len() - 1]).map(|b| b * shape[1..shape.len() - 1].iter().product::<usize>()).ok_or_else(|| bad("rows are not whole blocks".into()))?;
    let mut out_shape = shape.to_vec();
    out_shape[0] = rows;
    let (a, n) = (row0 * row_bytes, rows * row_bytes);
    let part = Raw {
        dtype: r.dtype,
        mapped: r.mapped.as_ref().and_then(|m| m.slice(a, n)),
        bytes: Cow::Owned(r.bytes[a..a + n].to_vec()),
        file: r.file.clone(),
    };
    upload(backend, &out_shape, part)
}

/// Precision rank for stacking parts of different types: the part with the most bits decides.
fn rank(d: DType) -> u8 {
    match d {
        DType::Q4K => 0,
        DType::Q6K => 1,
        DType::Q8_0 => 2,
        DType::BF16 => 3,
        DType::F16 => 4,
        _ => 5,
    }
}

/// The 2-D tensors `parts` stacked along rows into one `[Σ rows, cols]` tensor (the decoder's
/// q, k and v become one weight). Parts of one dtype are stacked as stored (rows are whole
/// blocks); parts of different dtypes (a llama.cpp Q4_K_M file keeps `attn_v` in Q6_K beside
/// Q4_K `attn_q` / `attn_k` in some layers) are converted to the most precise of their types
/// (dequantized and quantized again), which is logged.
pub fn load_concat(src: &dyn TensorSource, backend: &dyn Backend, parts: &[(&str, &[usize])]) -> Result<Tensor> {
    let mut raws: Vec<(&str, &[usize], Raw<'_>)> = Vec::with_capacity(parts.len());
    for &(name, shape) in parts {
        let r = src.raw(name, shape)?;
        if let Some(&(first_name, fs, _)) = raws.first().map(|(a, b, c)| (a, b, c)).as_ref() {
            if shape.len() != 2 || fs.len() != 2 || shape[1] != fs[1] {
                return Err(Error::Checkpoint { file: r.file.clone(), tensor: name.to_string(), msg: format!("{:?} cannot be stacked with {:?} of '{}' (2-D, one width)", shape, fs, first_name) });
            }
        } else if shape.len() != 2 {
            return Err(Error::Checkpoint { file: r.file.clone(), tensor: name.to_string(), msg: format!("{:?} is not 2-D", shape) });
        }
        raws.push((name, shape, r));
    }
    let rows: usize = raws.iter().map(|(_, s, _)| s[0]).sum();
    let cols = raws.first().map_or(0, |(_, s, _)| s[1]);
    let target = raws.iter().map(|(_, _, r)| r.dtype).max_by_key(|&d| rank(d)).unwrap_or(DType::F32);
    let mut bytes = Vec::new();
    for (name, shape, r) in &raws {
        if r.dtype == target {
            bytes.extend_from_slice(&r.bytes);
        } else {
            log::info!("{}: {} converted to {} to stack with the other parts of the fused weight", name, r.dtype, target);
            let f = to_f32(name, shape, r)?;
            let q = crate::quant::quantize_vec(target, &f).ok_or_else(|| Error::Checkpoint { file: r.file.clone(), tensor: name.to_string(), msg: format!("rows of {} values cannot be {}", cols, target) })?;
            bytes.extend_from_slice(&q);
        }
    }
    let file = raws.first().map_or_else(String::new, |(_, _, r)| r.file.clone());
    upload(backend, &[rows, cols], Raw { dtype: target, bytes: Cow::Owned(bytes), mapped: None, file })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Tensors held in memory.
    struct Mem(HashMap<String, (DType, Vec<usize>, Vec<u8>)>);

    impl TensorSource for Mem {
        fn describe(&self) -> String {
            "memory".into()
        }
        fn contains(&self, name: &str) -> bool {
            self.0.contains_key(name)
        }
        fn bytes_of(&self, name: &str) -> usize {
            self.0.get(name).map_or(0, |t| t.2.len())
        }
        fn total_bytes(&self) -> usize {
            self.0.values().map(|t| t.2.len()).sum()
        }
        fn raw(&self, name: &str, shape: &[usize]) -> Result<Raw<'_>> {
            let (d, s, b) = self.0.get(name).ok_or_else(|| Error::Checkpoint { file: "memory".into(), tensor: name.into(), msg: "missing".into() })?;
            assert_eq!(s, shape);
            Ok(Raw { dtype: *d, bytes: Cow::Borrowed(b), mapped: None, file: "memory".into() })
        }
        fn unused(&self, _: &[&str]) -> Vec<String> {
            Vec::new()
        }
    }

    /// A llama.cpp Q4_K_M layer: Q4_K q and k with a Q6_K v stack into one Q6_K weight; the v
    /// rows keep their bits, q and k move by at most Q6_K's rounding of their values.
    #[test]
    fn mixed_block_types_stack_into_the_most_precise() {
        let (k, rows) = (512, [8usize, 4, 4]);
        let vals = |seed: usize, n: usize| -> Vec<f32> { (0..n * k).map(|i| (((i * 7919 + seed * 104729) % 1001) as f32 / 500.0 - 1.0) * (1.0 + (i / 32 % 5) as f32)).collect() };
        let types = [DType::Q4K, DType::Q4K, DType::Q6K];
        let mut m = HashMap::new();
        let mut want = Vec::new();
        for (i, (&n, &t)) in rows.iter().zip(&types).enumerate() {
            let q = crate::quant::quantize_vec(t, &vals(i, n)).unwrap();
            want.push(crate::quant::dequantize_vec(t, &q, n * k).unwrap());
            m.insert(format!("p{}", i), (t, vec![n, k], q));
        }
        let src = Mem(m);
        let b = crate::cpu::CpuBackend::new(Some(1)).unwrap();
        let shapes: Vec<Vec<usize>> = rows.iter().map(|&n| vec![n, k]).collect();
        let parts: Vec<(&str, &[usize])> = vec![("p0", &shapes[0]), ("p1", &shapes[1]), ("p2", &shapes[2])];
        let t = load_concat(&src, &b, &parts).unwrap();
        assert_eq!((t.dtype(), t.shape()), (DType::Q6K, &[16, k][..]));
        let got = crate::quant::dequantize_vec(DType::Q6K, t.as_cpu_blocks("test").unwrap(), 16 * k).unwrap();
        let want: Vec<f32> = want.concat();
        assert_eq!(&got[12 * k..], &want[12 * k..], "the Q6_K part is stacked as stored");
        for (i, (g, w)) in got[..12 * k].iter().zip(&want[..12 * k]).enumerate() {
            // Q6_K's step is at most max|x| / 32 of its 16-value group (and its scale rounding)
            let group = &want[i / 16 * 16..i / 16 * 16 + 16];
            let amax = group.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            assert!((g - w).abs() <= amax / 32.0 + 1e-6, "{}: {} vs {}", i, g, w);
        }
        // a part that is not 2-D, or of another width, is refused with its name
        let mut m2 = src.0;
        m2.insert("bad".into(), (DType::F32, vec![3, 4], vec![0; 48]));
        let src = Mem(m2);
        let e = load_concat(&src, &b, &[("p0", &shapes[0]), ("bad", &[3, 4])]).unwrap_err().to_string();
        assert!(e.contains("bad") && e.contains("stacked"), "{}", e);
    }
}
