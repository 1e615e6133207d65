//! Image input for the vision encoder: files to RGB, and RGB to the patches the model reads,
//! exactly as Hugging Face transformers prepares them for Qwen3-VL.
//!
//! The reference is transformers' `load_image` (Pillow decode, `ImageOps.exif_transpose`,
//! `convert("RGB")`) followed by the slow, Pillow-based `Qwen2VLImageProcessorPil` that Qwen3-VL
//! uses: [`smart_resize`] to multiples of `patch_size * merge_size`, Pillow's bicubic resize of the
//! 8-bit image (reproduced bit for bit in `resize.rs`), rescale by 1/255, normalize with the
//! mean and std, repeat the frame `temporal_patch_size` times and cut it into patches in
//! merge-window order ([`preprocess`]). `tests/image_preprocess.rs` checks all of it against
//! reference data from `tools/image_reference.py`.
//!
//! ```no_run
//! # fn main() -> host::Result<()> {
//! use host::image::{load_image, preprocess, PreprocessConfig};
//! let cfg = PreprocessConfig::from_file("model/preprocessor_config.json".as_ref())?;
//! let patches = preprocess(&load_image("cat.jpg".as_ref())?, &cfg)?;
//! let image_pad_tokens = patches.num_tokens(cfg.merge_size);
//! # let _ = image_pad_tokens; Ok(()) }
//! ```

mod decode;
mod format;
mod meta;
pub(crate) mod preprocess;
mod resize;
mod webp;

pub use decode::{decode_image, decode_image_limited, image_dimensions, load_image, DEFAULT_MAX_PIXELS};
pub use preprocess::{preprocess, smart_resize, PreprocessConfig};
pub use resize::resize_bicubic;

/// An RGB image, 8 bits per channel, row-major (`data[(y * width + x) * 3 + c]`), upright
/// (after its EXIF orientation was applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    /// `height * width * 3` bytes.
    pub data: Vec<u8>,
}

impl RgbImage {
    /// An image of the given size from its pixels; `None` when `data` is not `height * width * 3`
    /// bytes long.
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> Option<RgbImage> {
        let len = width.checked_mul(height).and_then(|n| n.checked_mul(3));
        if len == Some(data.len()) {
            Some(RgbImage { width, height, data })
        } else {
            None
        }
    }

    /// The pixel at column `x`, row `y`.
    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        let i = (y * self.width + x) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }
}

/// What the processor makes of one image: its patches and their grid.
#[derive(Clone, Debug, PartialEq)]
pub struct ImagePatches {
    /// `grid_t * grid_h * grid_w` rows of `row_len` values. Rows are in merge-window order
    /// (t, h / merge, w / merge, merge, merge): the `merge * merge` patches that the vision
    /// merger folds into one token are consecutive. Each row is laid out (channel,
    /// temporal_patch_size, patch_size, patch_size).
    pub patches: Vec<f32>,
    /// (frames / temporal_patch_size, height / patch_size, width / patch_size); transformers'
    /// `image_grid_thw`. `grid_t` is 1 for an image.
    pub grid_thw: [usize; 3],
    /// Values per row: `3 * temporal_patch_size * patch_size * patch_size`.
    pub row_len: usize,
}

impl ImagePatches {
    /// The number of patch rows, `grid_t * grid_h * grid_w`.
    pub fn rows(&self) -> usize {
        self.grid_thw.iter().product()
    }

    /// The number of `<|image_pad|>` tokens that stand for this image in the prompt:
    /// `grid_t * grid_h * grid_w / merge_size²`, as the Qwen3-VL processor counts them.
    pub fn num_tokens(&self, merge_size: usize) -> usize {
        self.rows() / (merge_size * merge_size).max(1)
    }

    /// Row `i` of the patches.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.patches[i * self.row_len..(i + 1) * self.row_len]
    }
}
