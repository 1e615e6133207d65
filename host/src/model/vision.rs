//! The Qwen3-VL vision tower: Conv3d patch embedding (as a linear layer), learned position
//! embeddings bilinearly interpolated to each image's grid, `depth` pre-norm LayerNorm blocks
//! with 2-D rotary attention (full, within each image only: one block-sparse pass over all the
//! images, a diagonal block per image or frame) and a tanh-GELU MLP, the patch merger, and the
//! DeepStack mergers taken after the configured blocks.
//!
//! Patch rows arrive in merge-window order `(t, h/m, w/m, m, m)` (m = spatial_merge_size),
//! each row `(C, T, P, P)` values; every position table below is built in that order.

use super::checkpoint::Loader;
use super::config::VisionConfig;
use crate::backend::transfer;
use crate::{Backend, BlockMask, Error, Gelu, Result, Tensor};
use std::sync::Arc;

/// Checkpoint names of the vision tower.
pub const PREFIX: &str = super::names::VISION_PREFIX;

const LN_EPS: f32 = 1e-6;

struct Linear {
    w: Tensor, // [out, in]
    b: Tensor, // [out] f32
}

impl Linear {
    fn load(ld: &mut Loader<'_>, name: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear { w: ld.weight(&format!("{}.weight", name), &[out, inp])?, b: ld.f32(&format!("{}.bias", name), &[out])? })
    }
    fn forward(&self, b: &dyn Backend, x: &Tensor) -> Result<Tensor> {
        b.linear(x, &self.w, Some(&self.b))
    }
    /// `gelu(x · wᵀ + b)`, the activation fused where the backend can.
    fn forward_gelu(&self, b: &dyn Backend, x: &Tensor, kind: Gelu) -> Result<Tensor> {
        b.linear_gelu(x, &self.w, Some(&self.b), kind)
    }
    /// `residual + x · wᵀ + b`, the add fused where the backend can.
    fn forward_residual(&self, b: &dyn Backend, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        b.linear_residual(x, &self.w, Some(&self.b), residual)
    }
}

struct Norm {
    w: Tensor, // [n] f32
    b: Tensor, // [n] f32
}

impl Norm {
    fn load(ld: &mut Loader<'_>, name: &str, n: usize) -> Result<Norm> {
        Ok(Norm { w: ld.f32(&format!("{}.weight", name), &[n])?, b: ld.f32(&format!("{}.bias", name), &[n])? })
    }
    fn forward(&self, b: &dyn Backend, x: &Tensor) -> Result<Tensor> {
        b.layer_norm(x, &self.w, &self.b, LN_EPS)
    }
    /// The normed `x` through each linear layer (with its GELU, if any), the norm fused where
    /// the backend can.
    fn through(&self, b: &dyn Backend, x: &Tensor, linears: &[(&Linear, Option<Gelu>)]) -> Result<Vec<Tensor>> {
        let ls: Vec<(&Tensor, Option<&Tensor>, Option<Gelu>)> = linears.iter().map(|(l, g)| (&l.w, Some(&l.b), *g)).collect();
        b.layer_norm_linears(x, (&self.w, &self.b, LN_EPS), &ls)
    }
}

struct Block {
    norm1: Norm, // [hidden]
    q: Linear,   // [hidden, hidden]: rows 0..hidden of the fused qkv
    k: Linear,   // rows hidden..2·hidden
    v: Linear,   // rows 2·hidden..3·hidden
    proj: Linear, // [hidden, hidden]
    norm2: Norm, // [hidden]
    fc1: Linear, // [intermediate, hidden]
    fc2: Linear, // [hidden, intermediate]
}

/// Patch merger: 2×2 neighbouring patches concatenated (`m²·hidden`), MLP with exact GELU.
struct Merger {
    /// LayerNorm over `hidden` per patch before the concatenation (main merger), or over the
    /// concatenated `m²·hidden` after it (DeepStack mergers).
    norm: Norm,
    post_shuffle: bool,
    fc1: Linear, // [m²·hidden, m²·hidden]
    fc2: Linear, // [out_hidden, m²·hidden]
}

impl Merger {
    fn load(ld: &mut Loader<'_>, name: &str, cfg: &VisionConfig, post_shuffle: bool) -> Result<Merger> {
        let m = cfg.hidden_size * cfg.spatial_merge_size * cfg.spatial_merge_size;
        Ok(Merger {
            norm: Norm::load(ld, &format!("{}.norm", name), if post_shuffle { m } else { cfg.hidden_size })?,
            post_shuffle,
            fc1: Linear::load(ld, &format!("{}.linear_fc1", name), m, m)?,
            fc2: Linear::load(ld, &format!("{}.linear_fc2", name), cfg.out_hidden_size, m)?,
        })
    }

    /// `x [n, hidden]` (n a multiple of m²) → `[n / m², out_hidden]`.
    fn forward(&self, b: &dyn Backend, x: &Tensor, group: usize) -> Result<Tensor> {
        let (n, hidden) = x.rows_cols();
        let h = if self.post_shuffle {
            self.norm.through(b, &x.reshape(&[n / group, group * hidden])?, &[(&self.fc1, Some(Gelu::Erf))])?.remove(0)
        } else {
            let x = self.norm.forward(b, x)?.reshape(&[n / group, group * hidden])?;
            self.fc1.forward_gelu(b, &x, Gelu::Erf)?
        };
        self.fc2.forward(b, &h)
    }
}

/// A batch of preprocessed images: patch rows of all images concatenated, and each image's patch
/// grid (t, h, w).
#[derive(Clone, Copy, Debug)]
pub struct Images<'a> {
    /// `[Σ t·h·w, row_len]` row-major, rows in merge-window order.
    pub patches: &'a [f32],
    pub row_len: usize,
    pub grids: &'a [[usize; 3]],
}

/// What the tower produces for a batch of images (cheap to clone: the tensors share storage).
#[derive(Clone)]
pub struct VisionOutput {
    /// `[tokens, out_hidden]`: one embedding per merged 2×2 window, images in order.
    pub embeds: Tensor,
    /// One `[tokens, out_hidden]` tensor per DeepStack merger, in `deepstack_visual_indexes` order.
    pub deepstack: Vec<Tensor>,
}

/// Most merged tokens the tower takes in one pass when an input can be cut between frames
/// ([`VisionModel::encode`]): 4096, a 2048² image's worth.
pub const TOWER_SLICE_TOKENS: usize = 4096;

/// Each grid `(t, h, w)` as `t` frames `(1, h, w)`, in order.
fn frames_of(grids: &[[usize; 3]]) -> Vec<[usize; 3]> {
    grids.iter().flat_map(|g| std::iter::repeat([1, g[1], g[2]]).take(g[0])).collect()
}

/// Runs of equal frames `(1, h, w)` back into grids `(t, h, w)` (the position tables are made
/// once per grid).
fn regroup(frames: &[[usize; 3]]) -> Vec<[usize; 3]> {
    let mut out: Vec<[usize; 3]> = Vec::new();
    for f in frames {
        match out.last_mut() {
            Some(g) if g[1] == f[1] && g[2] == f[2] => g[0] += 1,
            _ => out.push(*f),
        }
    }
    out
}

/// The tokens of the largest tower pass [`VisionModel::encode`] makes for inputs of these grids
/// (what the tower's activations must be planned for): all of them up to
/// [`TOWER_SLICE_TOKENS`], else that many (or the largest single frame).
pub fn tower_tokens(grids: &[[usize; 3]], merge: usize) -> usize {
    let group = (merge * merge).max(1);
    let frames = frames_of(grids);
    let total: usize = frames.iter().map(|g| g[1] * g[2] / group).sum();
    let largest = frames.iter().map(|g| g[1] * g[2] / group).max().unwrap_or(0);
    if total <= TOWER_SLICE_TOKENS || frames.len() < 2 {
        total
    } else {
        TOWER_SLICE_TOKENS.max(largest)
    }
}

pub struct VisionModel {
    pub cfg: VisionConfig,
    patch_embed: Linear, // [hidden, C·T·P·P]
    pos_embed: Tensor, // [num_position_embeddings, hidden] f32 (interpolated per grid)
    blocks: Vec<Block>,
    merger: Merger,
    deepstack: Vec<Merger>,
    /// The backend the tower was loaded on when that is the host, not the device.
    host: Option<Arc<dyn Backend>>,
}

impl VisionModel {
    pub fn new(cfg: &VisionConfig, ld: &mut Loader<'_>) -> Result<VisionModel> {
        VisionModel::new_placed(cfg, ld, None)
    }

    /// [`VisionModel::new`] onto `host` when given (the tower then runs there), else onto the
    /// loader's backend.
    pub fn new_placed<'a>(cfg: &VisionConfig, ld: &mut Loader<'a>, host: Option<&'a Arc<dyn Backend>>) -> Result<VisionModel> {
        let device: &'a dyn Backend = ld.backend;
        if let Some(h) = host {
            ld.backend = &**h;
        }
        let model = VisionModel::load(cfg, ld, host.cloned());
        ld.backend = device;
        model
    }

    fn load(cfg: &VisionConfig, ld: &mut Loader<'_>, host: Option<Arc<dyn Backend>>) -> Result<VisionModel> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let row = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size;
        let side = (cfg.num_position_embeddings as f64).sqrt() as usize;
        if side * side != cfg.num_position_embeddings {
            return Err(Error::Config { file: "config.json".into(), msg: format!("vision_config.num_position_embeddings {} is not a square", cfg.num_position_embeddings) });
        }
        let conv = format!("{}patch_embed.proj.weight", PREFIX);
        let patch_embed = Linear {
            // a stride = kernel Conv3d is a linear layer over flattened (C, T, P, P) patches
            w: ld.weight(&conv, &[h, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size])?.reshape(&[h, row])?,
            b: ld.f32(&format!("{}patch_embed.proj.bias", PREFIX), &[h])?,
        };
        let pos_embed = ld.f32(&format!("{}pos_embed.weight", PREFIX), &[cfg.num_position_embeddings, h])?;
        let mut blocks = Vec::with_capacity(cfg.depth);
        for k in 0..cfg.depth {
            let p = format!("{}blocks.{}.", PREFIX, k);
            let qkv = format!("{}attn.qkv.weight", p);
            let qkv_b = ld.host_f32(&format!("{}attn.qkv.bias", p), &[3 * h])?;
            let part = |ld: &mut Loader<'_>, n: usize| -> Result<Linear> {
                Ok(Linear { w: ld.weight_rows(&qkv, &[3 * h, h], n * h, h)?, b: ld.backend.upload_f32(&[h], &qkv_b[n * h..(n + 1) * h])? })
            };
            let (q, k_, v) = (part(ld, 0)?, part(ld, 1)?, part(ld, 2)?);
            blocks.push(Block {
                norm1: Norm::load(ld, &format!("{}norm1", p), h)?,
                q,
                k: k_,
                v,
                proj: Linear::load(ld, &format!("{}attn.proj", p), h, h)?,
                norm2: Norm::load(ld, &format!("{}norm2", p), h)?,
                fc1: Linear::load(ld, &format!("{}mlp.linear_fc1", p), i, h)?,
                fc2: Linear::load(ld, &format!("{}mlp.linear_fc2", p), h, i)?,
            });
        }
        let merger = Merger::load(ld, &format!("{}merger", PREFIX), cfg, false)?;
        let deepstack = (0..cfg.deepstack_visual_indexes.len())
            .map(|k| Merger::load(ld, &format!("{}deepstack_merger_list.{}", PREFIX, k), cfg, true))
            .collect::<Result<Vec<_>>>()?;
        Ok(VisionModel { cfg: cfg.clone(), patch_embed, pos_embed, blocks, merger, deepstack, host })
    }

    /// Merged tokens an image of patch grid `grid` becomes.
    pub fn tokens_for(&self, grid: [usize; 3]) -> usize {
        grid[0] * grid[1] * grid[2] / (self.cfg.spatial_merge_size * self.cfg.spatial_merge_size)
    }

    /// Checks a batch's grids against the patch rows: every h and w a multiple of the merge size.
    fn check_grids(&self, rows: usize, row_len: usize, grids: &[[usize; 3]]) -> Result<()> {
        let m = self.cfg.spatial_merge_size;
        let want_len = self.cfg.in_channels * self.cfg.temporal_patch_size * self.cfg.patch_size * self.cfg.patch_size;
        let total: usize = grids.iter().map(|g| g[0] * g[1] * g[2]).sum();
        if row_len != want_len || total != rows || grids.iter().any(|g| g[0] == 0 || g[1] % m != 0 || g[2] % m != 0 || g[1] == 0 || g[2] == 0) {
            return Err(Error::shape("vision forward", &[&[rows, row_len]], format!("grids {:?} (merge {}) need {} rows of {} values", grids, m, total, want_len)));
        }
        Ok(())
    }

    /// Patch embedding plus interpolated position embedding: `[patches, hidden]` (before the
    /// blocks; exposed for stage-by-stage tests).
    pub fn embed_patches(&self, b: &dyn Backend, patches: &Tensor, grids: &[[usize; 3]]) -> Result<Tensor> {
        let (rows, row_len) = patches.rows_cols();
        self.check_grids(rows, row_len, grids)?;
        let (ids, weights) = self.position_corners(grids);
        let pos = b.blend_rows(&self.pos_embed, &ids, &weights, 4)?; // [N, hidden]
        self.patch_embed.forward_residual(b, patches, &pos)
    }

    /// The backend the tower runs on when the caller's is `b`: `b`, or the host when the tower
    /// was placed there.
    pub fn backend<'s>(&'s self, b: &'s dyn Backend) -> &'s dyn Backend {
        self.host.as_deref().unwrap_or(b)
    }

    /// Whether the tower runs on the host backend.
    pub fn on_host(&self) -> bool {
        self.host.is_some()
    }

    /// Weight bytes of the tower on its backend (rounded as `b`'s pool allocates when the tower
    /// is on `b`).
    pub fn placed_bytes(&self, b: &dyn Backend) -> usize {
        let mut all: Vec<&Tensor> = vec![&self.patch_embed.w, &self.patch_embed.b, &self.pos_embed];
        for blk in &self.blocks {
            for l in [&blk.q, &blk.k, &blk.v, &blk.proj, &blk.fc1, &blk.fc2] {
                all.extend([&l.w, &l.b]);
            }
            for n in [&blk.norm1, &blk.norm2] {
                all.extend([&n.w, &n.b]);
            }
        }
        for m in std::iter::once(&self.merger).chain(&self.deepstack) {
            all.extend([&m.norm.w, &m.norm.b, &m.fc1.w, &m.fc1.b, &m.fc2.w, &m.fc2.b]);
        }
        let vb = self.backend(b);
        all.into_iter().map(|t| vb.weight_alloc_size(super::text::tensor_bytes(t))).sum()
    }

    /// [`VisionModel::forward`] on host patches `[N, row_len]` (row-major f32): uploads them to
    /// the tower's backend and runs the tower there as one step ([`Backend::within`]). Inputs of
    /// more than [`TOWER_SLICE_TOKENS`] tokens over several frames (videos, many images) go
    /// through in slices of whole frames, each at most that many tokens (a larger single frame
    /// whole): every op but attention is per row and attention stays within a frame, so the
    /// output is the same while the activations stay bounded (see [`tower_tokens`]).
    pub fn encode(&self, b: &dyn Backend, patches: &[f32], row_len: usize, grids: &[[usize; 3]]) -> Result<VisionOutput> {
        self.encode_in_slices(b, patches, row_len, grids, TOWER_SLICE_TOKENS)
    }

    /// [`VisionModel::encode`] with slices of at most `max_tokens` merged tokens.
    pub fn encode_in_slices(&self, b: &dyn Backend, patches: &[f32], row_len: usize, grids: &[[usize; 3]], max_tokens: usize) -> Result<VisionOutput> {
        let group = self.cfg.spatial_merge_size * self.cfg.spatial_merge_size;
        let frames = frames_of(grids);
        let total: usize = frames.iter().map(|g| g[1] * g[2]).sum::<usize>() / group.max(1);
        if total <= max_tokens || frames.len() < 2 || row_len == 0 || patches.len() != total * group * row_len {
            return self.encode_whole(b, patches, row_len, grids);
        }
        // the merged outputs of each slice land in their rows of the whole output
        let out_hidden = self.cfg.out_hidden_size;
        let mut embeds = b.zeros(&[total, out_hidden])?;
        let mut deepstack = (0..self.deepstack.len()).map(|_| b.zeros(&[total, out_hidden])).collect::<Result<Vec<_>>>()?;
        let (mut f0, mut row0, mut tok0) = (0usize, 0usize, 0usize);
        while f0 < frames.len() {
            let mut f1 = f0 + 1;
            let mut toks = frames[f0][1] * frames[f0][2] / group;
            while f1 < frames.len() && toks + frames[f1][1] * frames[f1][2] / group <= max_tokens {
                toks += frames[f1][1] * frames[f1][2] / group;
                f1 += 1;
            }
            let rows = toks * group;
            let part = self.encode_whole(b, &patches[row0 * row_len..(row0 + rows) * row_len], row_len, &regroup(&frames[f0..f1]))?;
            let dst: Vec<usize> = (tok0..tok0 + toks).collect();
            embeds = b.scatter_rows(&embeds, &dst, &part.embeds, false)?;
            for (d, p) in deepstack.iter_mut().zip(&part.deepstack) {
                *d = b.scatter_rows(d, &dst, p, false)?;
            }
            f0 = f1;
            row0 += rows;
            tok0 += toks;
        }
        Ok(VisionOutput { embeds, deepstack })
    }

    /// The tower over several inputs (images, or videos as a whole), one [`VisionOutput`] per
    /// input: `inputs` are each input's patch rows `[t·h·w, row_len]` and grid `(t, h, w)`.
    /// Consecutive inputs go through together, one pass of at most [`TOWER_SLICE_TOKENS`]
    /// merged tokens (each input's patches uploaded to its rows of the pass, attention kept
    /// within each input's frames); an input larger than that goes through
    /// [`VisionModel::encode`] alone (sliced by frames). Every op but attention is per row, so
    /// each output equals the input's tower run alone.
    pub fn encode_batch(&self, b: &dyn Backend, inputs: &[(&[f32], [usize; 3])], row_len: usize) -> Result<Vec<VisionOutput>> {
        let group = (self.cfg.spatial_merge_size * self.cfg.spatial_merge_size).max(1);
        let mut out = Vec::with_capacity(inputs.len());
        let mut i = 0;
        while i < inputs.len() {
            // 1. the inputs of this pass: as many as fit the slice, at least one
            let mut j = i + 1;
            let mut toks = self.tokens_for(inputs[i].1);
            while j < inputs.len() && toks + self.tokens_for(inputs[j].1) <= TOWER_SLICE_TOKENS {
                toks += self.tokens_for(inputs[j].1);
                j += 1;
            }
            if j == i + 1 {
                out.push(self.encode(b, inputs[i].0, row_len, &[inputs[i].1])?);
                i = j;
                continue;
            }
            // 2. their patches in one tensor [Σ rows, row_len] on the tower's backend: each
            //    uploaded, then copied to its rows there
            let vb = self.backend(b);
            let rows: Vec<usize> = inputs[i..j].iter().map(|(px, g)| {
                if px.len() != g[0] * g[1] * g[2] * row_len {
                    Err(Error::shape("vision encode_batch", &[&[px.len()]], format!("grid {:?} needs {} rows of {} values", g, g[0] * g[1] * g[2], row_len)))
                } else {
                    Ok(g[0] * g[1] * g[2])
                }
            }).collect::<Result<_>>()?;
            let total: usize = rows.iter().sum();
            let ups = inputs[i..j].iter().zip(&rows).map(|((px, _), &n)| vb.upload_f32(&[n, row_len], px)).collect::<Result<Vec<_>>>()?;
            let grids: Vec<[usize; 3]> = inputs[i..j].iter().map(|(_, g)| *g).collect();
            let mut pass = None;
            vb.within(&mut || {
                let mut x = vb.zeros(&[total, row_len])?;
                let mut r0 = 0;
                for (u, &n) in ups.iter().zip(&rows) {
                    x = vb.scatter_rows(&x, &(r0..r0 + n).collect::<Vec<_>>(), u, false)?;
                    r0 += n;
                }
                pass = Some(self.forward(b, &x, &grids)?);
                Ok(())
            })?;
            let pass = pass.expect("set by the forward");
            // 3. each input's merged rows of the pass's outputs
            let mut t0 = 0;
            for &n in &rows {
                let t = n / group;
                let take = |x: &Tensor| b.take_rows(x, t0, t);
                out.push(VisionOutput { embeds: take(&pass.embeds)?, deepstack: pass.deepstack.iter().map(take).collect::<Result<_>>()? });
                t0 += t;
            }
            i = j;
        }
        Ok(out)
    }

    fn encode_whole(&self, b: &dyn Backend, patches: &[f32], row_len: usize, grids: &[[usize; 3]]) -> Result<VisionOutput> {
        let vb = self.backend(b);
        let x = vb.upload_f32(&[patches.len() / row_len.max(1), row_len], patches)?;
        let mut out = None;
        vb.within(&mut || {
            out = Some(self.forward(b, &x, grids)?);
            Ok(())
        })?;
        Ok(out.expect("set by the forward"))
    }

    /// Runs the tower on `patches [N, C·T·P·P]` of the images with patch grids `grids` (t, h, w).
    /// The patches are on the tower's backend ([`VisionModel::backend`]); the output is on `b`.
    pub fn forward(&self, b: &dyn Backend, patches: &Tensor, grids: &[[usize; 3]]) -> Result<VisionOutput> {
        let vb = self.backend(b);
        let out = self.forward_on(vb, patches, grids)?;
        if self.host.is_none() {
            return Ok(out);
        }
        let deepstack = out.deepstack.iter().map(|t| transfer(vb, b, t)).collect::<Result<Vec<_>>>()?;
        Ok(VisionOutput { embeds: transfer(vb, b, &out.embeds)?, deepstack })
    }

    fn forward_on(&self, b: &dyn Backend, patches: &Tensor, grids: &[[usize; 3]]) -> Result<VisionOutput> {
        let c = &self.cfg;
        let (hidden, heads) = (c.hidden_size, c.num_heads);
        let d = hidden / heads;
        // 1. what the host prepares (uploads wait for the device's queue, so they all go before
        //    the first launch): 2-D rotary tables over (row, col), cos, sin [N, d / 2]; the
        //    attention mask, a diagonal block per (image, frame) since attention never crosses
        //    them, made once for every block
        let (n, row_len) = patches.rows_cols();
        self.check_grids(n, row_len, grids)?;
        let (cos, sin) = self.rotary_tables(grids);
        let (cos, sin) = (b.upload_f32(&[n, d / 2], &cos)?, b.upload_f32(&[n, d / 2], &sin)?);
        let segments: Vec<usize> = grids.iter().flat_map(|g| std::iter::repeat(g[1] * g[2]).take(g[0])).collect();
        let mask = BlockMask::block_diagonal(b, &segments)?;
        // 2. patch + position embeddings: x [N, hidden]
        let mut x = self.embed_patches(b, patches, grids)?;
        let scale = 1.0 / (d as f32).sqrt();
        let group = c.spatial_merge_size * c.spatial_merge_size;
        let mut deepstack = Vec::new();
        for (k, blk) in self.blocks.iter().enumerate() {
            // 3. attention: x += proj(attn(rope(q), rope(k), v)) within each segment, the rotary
            //    embedding applied by the attention op
            let qkv = blk.norm1.through(b, &x, &[(&blk.q, None), (&blk.k, None), (&blk.v, None)])?;
            let [q, kk, v] = [0, 1, 2].map(|i| qkv[i].reshape(&[n, heads, d]));
            let o = b.attention_block_sparse(&q?, &kk?, &v?, &mask, scale, Some((&cos, &sin)))?.reshape(&[n, hidden])?;
            x = blk.proj.forward_residual(b, &o, &x)?;
            // 4. MLP: x += fc2(gelu_tanh(fc1(norm2(x))))
            x = b.layer_norm_gelu_mlp(&x, (&blk.norm2.w, &blk.norm2.b, LN_EPS), (&blk.fc1.w, Some(&blk.fc1.b)), Gelu::Tanh, (&blk.fc2.w, Some(&blk.fc2.b)))?;
            // 5. DeepStack features from the configured blocks
            if let Some(j) = c.deepstack_visual_indexes.iter().position(|&i| i == k) {
                deepstack.push(self.deepstack[j].forward(b, &x, group)?);
            }
        }
        // 6. main merger: [N / m², out_hidden]
        let embeds = self.merger.forward(b, &x, group)?;
        Ok(VisionOutput { embeds, deepstack })
    }

    /// The bilinear interpolation of the learned position embeddings to each grid, as
    /// [`Backend::blend_rows`] takes it: per patch (merge order, repeated over t) the table rows
    /// of its four corners and their weights. The corners are floor and min(floor + 1, side - 1)
    /// of `linspace(0, side - 1, n)` along each axis.
    fn position_corners(&self, grids: &[[usize; 3]]) -> (Vec<u32>, Vec<f32>) {
        let side = (self.cfg.num_position_embeddings as f64).sqrt() as usize;
        let m = self.cfg.spatial_merge_size;
        let (mut ids, mut weights) = (Vec::new(), Vec::new());
        for g in grids {
            let (t, h, w) = (g[0], g[1], g[2]);
            let (hi, wi) = (linspace(side, h), linspace(side, w));
            for _ in 0..t {
                for_each_merge_order(h, w, m, |r, col| {
                    let (hy, wx) = (hi[r], wi[col]);
                    let (h0, dh) = (hy as usize, hy - (hy as usize) as f32);
                    let (w0, dw) = (wx as usize, wx - (wx as usize) as f32);
                    let (h1, w1) = ((h0 + 1).min(side - 1), (w0 + 1).min(side - 1));
                    ids.extend([h0 * side + w0, h0 * side + w1, h1 * side + w0, h1 * side + w1].iter().map(|&i| i as u32));
                    weights.extend([(1.0 - dh) * (1.0 - dw), (1.0 - dh) * dw, dh * (1.0 - dw), dh * dw]);
                });
            }
        }
        (ids, weights)
    }

    /// cos, sin `[N, head_dim / 2]`: the first half of each row rotates by the patch's row, the
    /// second by its column, with frequencies `1 / 10000^(2j / (head_dim / 2))`.
    fn rotary_tables(&self, grids: &[[usize; 3]]) -> (Vec<f32>, Vec<f32>) {
        let d = self.cfg.hidden_size / self.cfg.num_heads;
        let dim = d / 2;
        let inv: Vec<f32> = (0..dim / 2).map(|j| (1.0 / 10_000f64.powf((2 * j) as f64 / dim as f64)) as f32).collect();
        // the angles of each position along a side, computed once and copied per patch
        let longest = grids.iter().map(|g| g[1].max(g[2])).max().unwrap_or(0);
        let angles = |f: fn(f32) -> f32| -> Vec<f32> { (0..longest).flat_map(|p| inv.iter().map(move |&v| f(p as f32 * v))).collect() };
        let (cos_at, sin_at) = (angles(f32::cos), angles(f32::sin));
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        let q = inv.len();
        for g in grids {
            for _ in 0..g[0] {
                for_each_merge_order(g[1], g[2], self.cfg.spatial_merge_size, |r, col| {
                    for &p in &[r, col] {
                        cos.extend_from_slice(&cos_at[p * q..(p + 1) * q]);
                        sin.extend_from_slice(&sin_at[p * q..(p + 1) * q]);
                    }
                });
            }
        }
        (cos, sin)
    }
}

/// `torch.linspace(0, side - 1, n)` in f32 (first half from the start, second from the end).
fn linspace(side: usize, n: usize) -> Vec<f32> {
    let end = (side - 1) as f32;
    if n == 1 {
        return vec![0.0];
    }
    let step = end / (n - 1) as f32;
    (0..n).map(|i| if i < n / 2 { i as f32 * step } else { end - (n - 1 - i) as f32 * step }).collect()
}

/// Visits the (row, col) of an `h × w` grid in merge-window order `(h/m, w/m, m, m)`.
fn for_each_merge_order(h: usize, w: usize, m: usize, mut f: impl FnMut(usize, usize)) {
    for bh in 0..h / m {
        for bw in 0..w / m {
            for ir in 0..m {
                for ic in 0..m {
                    f(bh * m + ir, bw * m + ic);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_order_visits_2x2_windows() {
        let mut v = Vec::new();
        for_each_merge_order(2, 4, 2, |r, c| v.push((r, c)));
        assert_eq!(v, vec![(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]);
    }

    #[test]
    fn linspace_matches_torch_endpoints() {
        assert_eq!(linspace(48, 1), vec![0.0]);
        let l = linspace(48, 5);
        assert_eq!(l[0], 0.0);
        assert_eq!(l[4], 47.0);
        assert!((l[2] - 23.5).abs() < 1e-6);
    }
}
