"""The package's PEP 517 build backend: maturin's, with the `cuda` feature of the native module
turned on where the CUDA toolchain of the repository's kernels is (LLVM 7 at $LLVM_CONFIG and
CUDA's libNVVM under $CUDA_PATH, as /opt/rust-cuda-env.sh sets them; README, "Building").

The CUDA build opens the driver at run time and falls back to the CPU with a logged reason, so
one wheel serves machines with and without a GPU. QWEN3_VL_CUDA=1 requires the CUDA build,
QWEN3_VL_CUDA=0 builds for the CPU only; feature flags given to maturin (MATURIN_PEP517_ARGS or
`-C maturin.build-args=...`) are kept as they are.
"""

import os
import sys

import maturin
from maturin import (  # noqa: F401  (the hooks used as they are)
    build_sdist,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)


def _toolchain():
    """Why the CUDA toolchain is usable, or None with the reason it is not."""
    llvm = os.environ.get("LLVM_CONFIG")
    cuda = os.environ.get("CUDA_PATH")
    if not llvm or not os.path.isfile(llvm):
        return None, "LLVM_CONFIG does not name llvm-config (LLVM 7)"
    if not cuda or not os.path.isdir(os.path.join(cuda, "nvvm")):
        return None, "CUDA_PATH has no nvvm/ (CUDA 11.x libNVVM)"
    return "LLVM_CONFIG and CUDA_PATH name the kernels' toolchain", None


def _settings(config_settings):
    """config_settings with the build's feature flags added."""
    args = maturin.get_maturin_pep517_args(config_settings)
    if any(a.startswith(("--features", "-F", "--no-default-features", "--all-features")) for a in args):
        return config_settings
    want = os.environ.get("QWEN3_VL_CUDA", "auto").strip().lower()
    ok, why_not = _toolchain()
    if want in ("0", "no", "off", "false"):
        cuda, why = False, "QWEN3_VL_CUDA=0"
    elif want in ("1", "yes", "on", "true"):
        if not ok:
            raise RuntimeError(f"QWEN3_VL_CUDA=1 but the CUDA toolchain is missing: {why_not} (source /opt/rust-cuda-env.sh, README 'Building')")
        cuda, why = True, "QWEN3_VL_CUDA=1"
    else:
        cuda, why = (True, ok) if ok else (False, why_not)
    print(f"qwen3-vl: building {'with CUDA' if cuda else 'for the CPU only'}: {why}", file=sys.stderr)
    settings = dict(config_settings or {})
    settings["maturin.build-args"] = args + (["--features", "cuda"] if cuda else [])
    return settings


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return maturin.build_wheel(wheel_directory, _settings(config_settings), metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return maturin.build_editable(wheel_directory, _settings(config_settings), metadata_directory)
