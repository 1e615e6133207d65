//! The GGUF writer (version 3): metadata in the order added, tensor infos, then the data of
//! each tensor at 32-byte-aligned offsets. Tensor data is produced one tensor at a time while
//! writing, so a model never has to be in memory at once.

use super::{ggml_of_dtype, vtype, Array, Value};
use crate::{DType, Error, Result};
use std::io::Write;
use std::path::Path;

const ALIGN: usize = 32;

/// A GGUF file being described: metadata, then the tensors' names, shapes and types.
#[derive(Default)]
pub struct Writer {
    kv: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<usize>, DType)>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    /// Adds (or replaces) a metadata value.
    pub fn set(&mut self, key: &str, v: Value) {
        match self.kv.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = v,
            None => self.kv.push((key.to_string(), v)),
        }
    }

    /// Declares a tensor of row-major `shape` (elements) and `dtype`; its bytes are asked for
    /// in [`Writer::write`], in declaration order.
    pub fn add_tensor(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<()> {
        if ggml_of_dtype(dtype).is_none() || shape.is_empty() || shape.len() > super::read::MAX_DIMS {
            return Err(Error::Checkpoint { file: "gguf writer".into(), tensor: name.into(), msg: format!("cannot store {} of shape {:?}", dtype, shape) });
        }
        crate::tensor::quantized_bytes("gguf writer", shape, dtype).or_else(|e| if dtype.is_quantized() { Err(e) } else { Ok(0) })?;
        self.tensors.push((name.to_string(), shape.to_vec(), dtype));
        Ok(())
    }

    /// Bytes of a declared tensor.
    fn tensor_bytes(shape: &[usize], dtype: DType) -> usize {
        let cols = *shape.last().unwrap_or(&1);
        dtype.row_bytes(cols).unwrap_or(0) * shape[..shape.len() - 1].iter().product::<usize>()
    }

    /// Writes the file: `data(i)` gives the bytes of tensor `i` (checked against its size).
    pub fn write(&self, path: &Path, mut data: impl FnMut(usize) -> Result<Vec<u8>>) -> Result<()> {
        let io = |e| Error::io(path, e);
        let f = std::fs::File::create(path).map_err(io)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut head, k);
            put_value(&mut head, v);
        }
        let mut off = 0usize;
        for (name, shape, dtype) in &self.tensors {
            put_str(&mut head, name);
            head.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                head.extend_from_slice(&(d as u64).to_le_bytes());
            }
            head.extend_from_slice(&ggml_of_dtype(*dtype).unwrap_or(0).to_le_bytes());
            head.extend_from_slice(&(off as u64).to_le_bytes());
            off += pad(Writer::tensor_bytes(shape, *dtype));
        }
        head.resize(pad(head.len()), 0);
        w.write_all(&head).map_err(io)?;
        for (i, (name, shape, dtype)) in self.tensors.iter().enumerate() {
            let bytes = data(i)?;
            let want = Writer::tensor_bytes(shape, *dtype);
            if bytes.len() != want {
                return Err(Error::Checkpoint { file: path.display().to_string(), tensor: name.clone(), msg: format!("{} bytes given, {} of shape {:?} needs {}", bytes.len(), dtype, shape, want) });
            }
            w.write_all(&bytes).map_err(io)?;
            w.write_all(&vec![0u8; pad(want) - want]).map_err(io)?;
        }
        w.flush().map_err(io)
    }
}

fn pad(x: usize) -> usize {
    (x + ALIGN - 1) / ALIGN * ALIGN
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_of(v: &Value) -> u32 {
    match v {
        Value::U8(_) => vtype::U8,
        Value::I8(_) => vtype::I8,
        Value::U16(_) => vtype::U16,
        Value::I16(_) => vtype::I16,
        Value::U32(_) => vtype::U32,
        Value::I32(_) => vtype::I32,
        Value::F32(_) => vtype::F32,
        Value::Bool(_) => vtype::BOOL,
        Value::String(_) => vtype::STRING,
        Value::U64(_) => vtype::U64,
        Value::I64(_) => vtype::I64,
        Value::F64(_) => vtype::F64,
        Value::Array(_) => vtype::ARRAY,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    out.extend_from_slice(&type_of(v).to_le_bytes());
    put_payload(out, v);
}

fn put_payload(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            macro_rules! arr {
                ($t:expr, $v:expr, $f:expr) => {{
                    out.extend_from_slice(&($t as u32).to_le_bytes());
                    out.extend_from_slice(&($v.len() as u64).to_le_bytes());
                    for x in $v {
                        $f(out, x);
                    }
                }};
            }
            match a {
                Array::U8(v) => arr!(vtype::U8, v, |o: &mut Vec<u8>, x: &u8| o.push(*x)),
                Array::I8(v) => arr!(vtype::I8, v, |o: &mut Vec<u8>, x: &i8| o.push(*x as u8)),
                Array::U16(v) => arr!(vtype::U16, v, |o: &mut Vec<u8>, x: &u16| o.extend_from_slice(&x.to_le_bytes())),
                Array::I16(v) => arr!(vtype::I16, v, |o: &mut Vec<u8>, x: &i16| o.extend_from_slice(&x.to_le_bytes())),
                Array::U32(v) => arr!(vtype::U32, v, |o: &mut Vec<u8>, x: &u32| o.extend_from_slice(&x.to_le_bytes())),
                Array::I32(v) => arr!(vtype::I32, v, |o: &mut Vec<u8>, x: &i32| o.extend_from_slice(&x.to_le_bytes())),
                Array::F32(v) => arr!(vtype::F32, v, |o: &mut Vec<u8>, x: &f32| o.extend_from_slice(&x.to_le_bytes())),
                Array::Bool(v) => arr!(vtype::BOOL, v, |o: &mut Vec<u8>, x: &bool| o.push(*x as u8)),
                Array::String(v) => arr!(vtype::STRING, v, |o: &mut Vec<u8>, x: &String| put_str(o, x)),
                Array::U64(v) => arr!(vtype::U64, v, |o: &mut Vec<u8>, x: &u64| o.extend_from_slice(&x.to_le_bytes())),
                Array::I64(v) => arr!(vtype::I64, v, |o: &mut Vec<u8>, x: &i64| o.extend_from_slice(&x.to_le_bytes())),
                Array::F64(v) => arr!(vtype::F64, v, |o: &mut Vec<u8>, x: &f64| o.extend_from_slice(&x.to_le_bytes())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Gguf;

    #[test]
    fn written_files_read_back() {
        let path = std::env::temp_dir().join(format!("qwen3-vl-gguf-rt-{}.gguf", std::process::id()));
        let mut w = Writer::new();
        let values = vec![
            Value::U8(7), Value::I8(-3), Value::U16(65535), Value::I16(-300), Value::U32(1 << 31), Value::I32(-5), Value::F32(1.5),
            Value::Bool(true), Value::String("héllo".into()), Value::U64(u64::MAX), Value::I64(i64::MIN), Value::F64(-2.25),
            Value::Array(Array::String(vec!["a b".into(), "".into()])), Value::Array(Array::F32(vec![0.5, 0.25])), Value::Array(Array::Bool(vec![true, false])),
            Value::Array(Array::I32(vec![-1, 2])), Value::Array(Array::U64(vec![])),
        ];
        for (i, v) in values.iter().enumerate() {
            w.set(&format!("k.{}", i), v.clone());
        }
        let q = crate::quant::quantize_vec(DType::Q4K, &(0..512).map(|i| i as f32 / 100.0).collect::<Vec<_>>()).unwrap();
        w.add_tensor("a", &[2, 256], DType::Q4K).unwrap();
        w.add_tensor("b", &[3], DType::F32).unwrap();
        let data = [q.clone(), [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect()];
        w.write(&path, |i| Ok(data[i].clone())).unwrap();
        let g = Gguf::open(&path).unwrap();
        for (i, v) in values.iter().enumerate() {
            assert_eq!(g.get(&format!("k.{}", i)), Some(v));
        }
        let a = g.tensor("a").unwrap();
        assert_eq!((a.shape.clone(), a.dtype, g.bytes(a)), (vec![2, 256], DType::Q4K, &q[..]));
        assert_eq!(a.start % 32, 0);
        let b = g.tensor("b").unwrap();
        assert_eq!((b.shape.clone(), b.dtype, b.start % 32), (vec![3], DType::F32, 0));
        let _ = std::fs::remove_file(&path);
    }
}
