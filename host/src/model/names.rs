//! Where each part's tensors live in a Hugging Face Qwen3-VL checkpoint: the name prefixes that
//! the model code (`text.rs`, `vision.rs`) loads from and the placement plan (`placement.rs`)
//! sizes before anything loads. A leaf, so the plan needs neither part's code.

/// The text decoder's tensors: `model.language_model.layers.N.…`, `…embed_tokens.weight`.
pub const TEXT_PREFIX: &str = "model.language_model.";
/// The vision tower's tensors: `model.visual.blocks.N.…`, `…patch_embed.proj.weight`.
pub const VISION_PREFIX: &str = "model.visual.";
