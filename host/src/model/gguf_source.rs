//! A GGUF text model and its mmproj as one [`TensorSource`] under the checkpoint's names
//! ([`crate::gguf::names`]): shapes are checked against the files' (GGUF dims reversed), and
//! the Conv3d patch embedding is put back together from its two temporal slices.

use super::source::{Raw, TensorSource};
use crate::gguf::names::{text_name, vision_name, PATCH_EMBED, PATCH_SLICES};
use crate::gguf::{Gguf, TensorInfo};
use crate::{DType, Error, Result};
use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Mutex;

pub struct GgufPair {
    pub text: Gguf,
    pub mmproj: Gguf,
    /// DeepStack merger `k` follows vision block `deepstack[k]`.
    deepstack: Vec<usize>,
    taken: Mutex<HashSet<(bool, String)>>,
}

impl GgufPair {
    pub fn new(text: Gguf, mmproj: Gguf, deepstack: Vec<usize>) -> GgufPair {
        GgufPair { text, mmproj, deepstack, taken: Mutex::new(HashSet::new()) }
    }

    /// The file and tensor a checkpoint name maps to.
    fn find(&self, hf: &str) -> Option<(&Gguf, &TensorInfo)> {
        if let Some(n) = text_name(hf) {
            return self.text.tensor(&n).map(|t| (&self.text, t));
        }
        let n = vision_name(hf, &self.deepstack)?;
        self.mmproj.tensor(&n).map(|t| (&self.mmproj, t))
    }

    fn mark(&self, g: &Gguf, name: &str) {
        let is_text = std::ptr::eq(g, &self.text);
        self.taken.lock().unwrap_or_else(|p| p.into_inner()).insert((is_text, name.to_string()));
    }

    /// `[hidden, C, T, P, P]` from the T slices `[hidden, C, P, P]`, as f32.
    fn patch_embed(&self, shape: &[usize]) -> Result<Raw<'_>> {
        let g = &self.mmproj;
        if shape.len() != 5 {
            return Err(g.error(PATCH_SLICES[0], format!("the patch embedding must be 5-D, asked for {:?}", shape)));
        }
        let (h, c, t, p) = (shape[0], shape[1], shape[2], shape[3] * shape[4]);
        let want = [shape[0], shape[1], shape[3], shape[4]];
        let mut slices = Vec::with_capacity(t);
        for (i, name) in PATCH_SLICES.iter().enumerate().take(t) {
            let info = g.tensor(name).ok_or_else(|| g.error(name, format!("missing (temporal slice {} of the patch embedding)", i)))?;
            if info.shape != want {
                return Err(g.error(name, format!("shape {:?}, expected {:?}", info.shape, want)));
            }
            let f = crate::quant::dequantize_vec(info.dtype, g.bytes(info), h * c * p).ok_or_else(|| g.error(name, "cannot be dequantized"))?;
            self.mark(g, name);
            slices.push(f);
        }
        if t > PATCH_SLICES.len() {
            return Err(g.error(PATCH_SLICES[0], format!("temporal patch size {} is not supported (at most {})", t, PATCH_SLICES.len())));
        }
        let mut out = Vec::with_capacity(h * c * t * p * 4);
        for hc in 0..h * c {
            for s in &slices {
                for &x in &s[hc * p..(hc + 1) * p] {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        Ok(Raw { dtype: DType::F32, bytes: Cow::Owned(out), mapped: None, file: g.file() })
    }
}

impl TensorSource for GgufPair {
    fn describe(&self) -> String {
        format!("{} + {}", self.text.file(), self.mmproj.file())
    }

    fn contains(&self, name: &str) -> bool {
        name == PATCH_EMBED && self.mmproj.tensor(PATCH_SLICES[0]).is_some() || self.find(name).is_some()
    }

    fn bytes_of(&self, name: &str) -> usize {
        if name == PATCH_EMBED {
            return PATCH_SLICES.iter().filter_map(|n| self.mmproj.tensor(n)).map(|t| t.len).sum();
        }
        self.find(name).map_or(0, |(_, t)| t.len)
    }

    fn total_bytes(&self) -> usize {
        self.text.total_bytes() + self.mmproj.total_bytes()
    }

    fn raw(&self, name: &str, shape: &[usize]) -> Result<Raw<'_>> {
        if name == PATCH_EMBED {
            return self.patch_embed(shape);
        }
        let (g, t) = match self.find(name) {
            Some(x) => x,
            None => {
                let (g, n) = match text_name(name) {
                    Some(n) => (&self.text, n),
                    None => (&self.mmproj, vision_name(name, &self.deepstack).unwrap_or_else(|| name.to_string())),
                };
                return Err(Error::Checkpoint { file: g.file(), tensor: n, msg: format!("missing (the model's '{}')", name) });
            }
        };
        if t.shape != shape {
            return Err(g.error(&t.name, format!("shape {:?}, expected {:?}", t.shape, shape)));
        }
        self.mark(g, &t.name);
        Ok(Raw { dtype: t.dtype, bytes: Cow::Borrowed(g.bytes(t)), mapped: Some(g.mapped(t)), file: g.file() })
    }

    fn unused(&self, ignored_prefixes: &[&str]) -> Vec<String> {
        let taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (is_text, g) in [(true, &self.text), (false, &self.mmproj)] {
            for t in g.tensors() {
                if !taken.contains(&(is_text, t.name.clone())) && !ignored_prefixes.iter().any(|p| t.name.starts_with(p)) {
                    out.push(format!("{} in {}", t.name, g.file()));
                }
            }
        }
        out
    }
}
