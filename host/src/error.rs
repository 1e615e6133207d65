//! The one error type of the engine. Every variant names the operation (kernel, file, tensor)
//! and carries the shapes, dtypes or limits involved, so a message is actionable on its own.

use crate::DType;
use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// Operands whose shapes do not fit the operation.
    Shape { op: &'static str, shapes: Vec<Vec<usize>>, msg: String },
    /// An operand of a dtype the operation does not take.
    DType { op: &'static str, expected: &'static str, got: DType },
    /// An operand that lives on another device than the backend running the operation.
    Device { op: &'static str, msg: String },
    /// A size beyond what a kernel or format can address.
    Limit { op: &'static str, msg: String },
    /// A CUDA driver call or kernel launch that failed; `op` names the kernel or the call.
    Cuda { op: String, msg: String },
    /// A device allocation that failed even after the cache was emptied.
    OutOfMemory { requested: usize, in_use: usize, cached: usize, msg: String },
    /// A device memory budget (`--gpu-memory`) that cannot hold the placement asked for.
    Budget { needed: usize, available: usize, msg: String },
    /// The CUDA backend was asked for but is not available (reason inside).
    Unavailable(String),
    /// A file that could not be read.
    Io { path: String, source: std::io::Error },
    /// A model configuration file that is malformed or describes an unsupported model.
    Config { file: String, msg: String },
    /// A checkpoint tensor that is missing, malformed, or of the wrong shape or dtype.
    Checkpoint { file: String, tensor: String, msg: String },
    /// A tokenizer file that cannot be used, or text/ids it cannot handle.
    Tokenizer { msg: String },
    /// An image that cannot be read or decoded.
    Image { file: String, msg: String },
    /// A video that cannot be read, decoded or sampled (or the tool that decodes it is missing).
    Video { file: String, msg: String },
    /// A prompt (plus the tokens to generate) longer than the model's context.
    Context { tokens: usize, limit: usize, msg: String },
    /// A chat template that does not compile, or a conversation it cannot render (`origin`:
    /// where the template came from).
    Template { origin: String, msg: String },
    /// A grammar (JSON schema, regex, Lark) that cannot be compiled, or a token it rejects.
    Grammar { msg: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Error {
        Error::Io { path: path.as_ref().display().to_string(), source }
    }

    pub(crate) fn shape(op: &'static str, shapes: &[&[usize]], msg: impl Into<String>) -> Error {
        Error::Shape { op, shapes: shapes.iter().map(|s| s.to_vec()).collect(), msg: msg.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Shape { op, shapes, msg } => write!(f, "{}: shape mismatch {:?}: {}", op, shapes, msg),
            Error::DType { op, expected, got } => write!(f, "{}: expected dtype {}, got {}", op, expected, got),
            Error::Device { op, msg } => write!(f, "{}: {}", op, msg),
            Error::Limit { op, msg } => write!(f, "{}: {}", op, msg),
            Error::Cuda { op, msg } => write!(f, "CUDA error in {}: {}", op, msg),
            Error::OutOfMemory { requested, in_use, cached, msg } => write!(
                f,
                "out of device memory: asked for {} bytes with {} bytes in use and {} cached ({})",
                requested, in_use, cached, msg
            ),
            Error::Budget { needed, available, msg } => write!(
                f,
                "the GPU memory budget is too small: {} bytes ({}) needed, {} bytes ({}) available: {}",
                needed,
                crate::model::placement::human(*needed),
                available,
                crate::model::placement::human(*available),
                msg
            ),
            Error::Unavailable(why) => write!(f, "CUDA backend unavailable: {}", why),
            Error::Io { path, source } => write!(f, "{}: {}", path, source),
            Error::Config { file, msg } => write!(f, "{}: {}", file, msg),
            Error::Checkpoint { file, tensor, msg } if tensor.is_empty() => write!(f, "{}: {}", file, msg),
            Error::Checkpoint { file, tensor, msg } => write!(f, "{}: tensor '{}': {}", file, tensor, msg),
            Error::Tokenizer { msg } => write!(f, "tokenizer: {}", msg),
            Error::Image { file, msg } => write!(f, "{}: {}", file, msg),
            Error::Video { file, msg } => write!(f, "{}: {}", file, msg),
            Error::Context { tokens, limit, msg } => write!(f, "{} tokens exceed the context limit of {} ({})", tokens, limit, msg),
            Error::Template { origin, msg } => write!(f, "chat template ({}): {}", origin, msg),
            Error::Grammar { msg } => write!(f, "grammar: {}", msg),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
