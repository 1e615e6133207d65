//! The engine's images: each prompt's tower outputs from the image-embedding cache or from one
//! tower run batched over the requests that need theirs, and their rows in a step's forward.

use super::{Engine, Part, Seq};
use crate::model::vision::{VisionOutput, TOWER_SLICE_TOKENS};
use crate::{Backend, Error, Result, Tensor};
use std::collections::HashMap;

impl Engine<'_> {
    /// Gives every sequence whose images this step reads (`parts`) each image's tower output:
    /// from the image-embedding cache, else from one batched run of the tower over the missing
    /// images ([`crate::model::vision::VisionModel::encode_batch`]). Images of other running
    /// sequences that read theirs in a later step join the run while it stays within one
    /// pass ([`TOWER_SLICE_TOKENS`] merged tokens), so the towers of several requests run
    /// together; an image in several prompts goes through once.
    pub(super) fn encode_images(&mut self, parts: &[Part]) -> Result<()> {
        let (b, m) = (self.backend, self.model);
        let unread = |s: &Seq| s.images_unread() && s.vision.is_none();
        // 1. the sequences: this step's readers first, then the others still to read theirs
        let mut seqs: Vec<usize> = parts.iter().filter(|p| !p.decode && unread(&self.running[p.seq])).map(|p| p.seq).collect();
        let now = seqs.len();
        if now == 0 {
            return Ok(());
        }
        let later: Vec<usize> = (0..self.running.len()).filter(|&i| unread(&self.running[i]) && !seqs.contains(&i)).collect();
        seqs.extend(later);
        // 2. each image from the cache, else queued for the tower once per content; a later
        //    sequence only when its new images keep the run within one pass
        let mut have: HashMap<u64, VisionOutput> = HashMap::new();
        let mut todo: Vec<(u64, usize, usize)> = Vec::new(); // (key, sequence, image)
        let (mut tokens, mut served) = (0, 0);
        for (n, &i) in seqs.iter().enumerate() {
            let im = self.running[i].images.as_ref().expect("a sequence with unread images has images");
            let mut new = Vec::new();
            for (k, &key) in im.keys.iter().enumerate() {
                if have.contains_key(&key) || todo.iter().chain(&new).any(|t: &(u64, usize, usize)| t.0 == key) {
                    continue;
                }
                match self.vision_cache.get(key) {
                    Some(out) => {
                        have.insert(key, out);
                    }
                    None => new.push((key, i, k)),
                }
            }
            let more: usize = new.iter().map(|&(_, _, k)| m.vision.tokens_for(im.grids[k])).sum();
            if n >= now && more > 0 && tokens + more > TOWER_SLICE_TOKENS {
                break;
            }
            tokens += more;
            todo.extend(new);
            served = n + 1;
        }
        // 3. the tower over the missing images, their outputs kept by content
        if !todo.is_empty() {
            let row_len = self.running[todo[0].1].images.as_ref().expect("checked").row_len;
            let inputs: Vec<(&[f32], [usize; 3])> = todo.iter().map(|&(_, i, k)| {
                let im = self.running[i].images.as_ref().expect("checked");
                (im.part(k), im.grids[k])
            }).collect();
            if let Some(&(_, i, _)) = todo.iter().find(|&&(_, i, _)| self.running[i].images.as_ref().map_or(0, |im| im.row_len) != row_len) {
                return Err(Error::Limit { op: "engine images", msg: format!("sequence {}'s patch rows differ in length from the others' ({})", self.running[i].id, row_len) });
            }
            let outs = m.vision.encode_batch(b, &inputs, row_len)?;
            self.stats.vision_runs += 1;
            self.stats.vision_images += todo.len() as u64;
            for (&(key, _, _), out) in todo.iter().zip(outs) {
                self.vision_cache.put(key, &out);
                have.insert(key, out);
            }
        }
        // 4. each served sequence's outputs, image by image
        for &i in &seqs[..served] {
            let s = &mut self.running[i];
            let im = s.images.as_ref().expect("checked");
            let outs: Vec<VisionOutput> = im.keys.iter().map(|k| have[k].clone()).collect();
            self.stats.vision_cache_hits += im.keys.iter().filter(|k| !todo.iter().any(|t| t.0 == **k)).count() as u64;
            s.vision = Some(outs);
        }
        Ok(())
    }
}

/// The images' rows of a step: `x [rows, hidden]` with the rows `image_rows` (every image
/// token read this step, in order) replaced by the images' embeddings (`images` in the same
/// order, each `[tokens, hidden]`), and the DeepStack features of those rows, one
/// `[image_rows, hidden]` tensor per layer (`None` without images).
pub(super) fn place_images(b: &dyn Backend, mut x: Tensor, image_rows: &[usize], images: &[&VisionOutput]) -> Result<(Tensor, Option<Vec<Tensor>>)> {
    if images.is_empty() {
        return Ok((x, None));
    }
    let counts: Vec<usize> = images.iter().map(|o| o.embeds.shape()[0]).collect();
    let total: usize = counts.iter().sum();
    if total != image_rows.len() {
        return Err(Error::Limit { op: "engine images", msg: format!("the step reads {} image tokens but its images' tower outputs have {} rows", image_rows.len(), total) });
    }
    let mut r0 = 0;
    for (o, &n) in images.iter().zip(&counts) {
        x = b.scatter_rows(&x, &image_rows[r0..r0 + n], &o.embeds, false)?;
        r0 += n;
    }
    if images.len() == 1 {
        return Ok((x, Some(images[0].deepstack.clone())));
    }
    // several images: each layer's features stacked in row order
    let layers = images[0].deepstack.len();
    let mut features = Vec::with_capacity(layers);
    for l in 0..layers {
        let width = images[0].deepstack[l].shape()[1];
        let mut f = b.zeros(&[total, width])?;
        let mut r0 = 0;
        for (o, &n) in images.iter().zip(&counts) {
            f = b.scatter_rows(&f, &(r0..r0 + n).collect::<Vec<_>>(), &o.deepstack[l], false)?;
            r0 += n;
        }
        features.push(f);
    }
    Ok((x, Some(features)))
}
