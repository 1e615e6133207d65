"""qwen3_vl: Qwen3-VL-2B inference in Rust (CUDA kernels and a CPU path) from Python.

    import qwen3_vl
    with qwen3_vl.Model("Qwen3-VL-2B-Instruct") as m:
        r = m.chat([{"role": "user", "content": [image, "Describe this picture."]}], max_tokens=64)
        print(r["choices"][0]["message"]["content"])

Answers are the dicts `qwen3-vl serve` sends (OpenAI's shapes); see `Model`.
"""

from ._errors import Error, LoadError, RequestError
from ._model import Model
from ._native import CUDA_BUILD, __version__

__all__ = ["Model", "Error", "LoadError", "RequestError", "CUDA_BUILD", "__version__"]
