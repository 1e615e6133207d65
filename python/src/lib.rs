//! `qwen3_vl._native`: the model behind the Python package (`qwen3_vl/__init__.py` is the
//! API users call). An [`engine::Engine`] is the in-process server of the library
//! (`qwen3_vl::server::local::Local`) running the model on a thread of its own; requests are
//! the JSON bodies `serve` takes, answers the JSON objects it gives, passed as text. Every
//! blocking wait releases the GIL.

mod engine;
mod logger;
mod options;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logger::init();
    m.add_class::<engine::Engine>()?;
    m.add_class::<engine::Stream>()?;
    m.add("CUDA_BUILD", cfg!(feature = "cuda"))?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
