//! The image-embedding cache: the vision tower's output per image, keyed by the image's
//! content ([`super::image_key`]), within a byte budget, least recently used out first. A prompt
//! that asks about an image seen before (a new question, another turn whose prefix is not
//! cached, a preempted sequence) takes the embeddings from here instead of running the tower.
//!
//! The prefix cache ([`super::blocks`]) already skips the tower when a prompt's cached blocks
//! cover all of its image tokens; this cache covers the rest: the same image after other text.

use crate::model::text::tensor_bytes;
use crate::model::vision::VisionOutput;
use std::collections::HashMap;

/// Per-image tower outputs by content key, at most `budget` bytes of tensors.
pub struct VisionCache {
    budget: usize,
    used: usize,
    tick: u64,
    /// key → (output, its bytes, last use)
    map: HashMap<u64, (VisionOutput, usize, u64)>,
}

/// The bytes an output's tensors hold.
pub fn output_bytes(o: &VisionOutput) -> usize {
    tensor_bytes(&o.embeds) + o.deepstack.iter().map(tensor_bytes).sum::<usize>()
}

impl VisionCache {
    /// An empty cache of `budget` bytes (0: nothing is kept).
    pub fn new(budget: usize) -> VisionCache {
        VisionCache { budget, used: 0, tick: 0, map: HashMap::new() }
    }

    /// The output for `key`, marked as just used.
    pub fn get(&mut self, key: u64) -> Option<VisionOutput> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(&key).map(|e| {
            e.2 = tick;
            e.0.clone()
        })
    }

    /// Keeps `out` under `key`, evicting the least recently used outputs for room; an output
    /// larger than the whole budget is not kept.
    pub fn put(&mut self, key: u64, out: &VisionOutput) {
        let bytes = output_bytes(out);
        if bytes > self.budget || self.map.contains_key(&key) {
            return;
        }
        while self.used + bytes > self.budget {
            let oldest = self.map.iter().min_by_key(|(_, e)| e.2).map(|(k, _)| *k);
            match oldest.and_then(|k| self.map.remove(&k)) {
                Some(e) => self.used -= e.1,
                None => break,
            }
        }
        self.tick += 1;
        self.used += bytes;
        self.map.insert(key, (out.clone(), bytes, self.tick));
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.used
    }

    /// Images held now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    fn out(rows: usize) -> VisionOutput {
        VisionOutput { embeds: Tensor::cpu_f32(&[rows, 4], vec![0.0; rows * 4]).unwrap(), deepstack: vec![Tensor::cpu_f32(&[rows, 4], vec![1.0; rows * 4]).unwrap()] }
    }

    #[test]
    fn keeps_within_the_budget_least_recently_used_out_first() {
        // each output of 2 rows: 2 tensors of 2 × 4 f32 = 64 bytes
        let mut c = VisionCache::new(160);
        c.put(1, &out(2));
        c.put(2, &out(2));
        assert_eq!((c.len(), c.bytes()), (2, 128));
        assert!(c.get(1).is_some()); // 2 is now the least recently used
        c.put(3, &out(2));
        assert_eq!((c.len(), c.bytes()), (2, 128));
        assert!(c.get(2).is_none() && c.get(1).is_some() && c.get(3).is_some());
        c.put(4, &out(3)); // 96 bytes: 1, the least recently used, goes
        assert_eq!((c.len(), c.bytes()), (2, 160));
        assert!(c.get(1).is_none() && c.get(3).is_some());
        c.put(5, &out(6)); // larger than the budget: not kept, nothing evicted
        assert_eq!((c.len(), c.bytes()), (2, 160));
        assert!(c.get(5).is_none() && c.get(4).is_some());
        let mut off = VisionCache::new(0);
        off.put(1, &out(1));
        assert!(off.is_empty());
    }
}
