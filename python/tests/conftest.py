"""Fixtures: the tiny full-vocabulary checkpoint of the repository's tests, loaded once, and
the `qwen3-vl` binary to compare answers with (QWEN3_VL_BIN, else the release build, else the
debug build of the repository's target directory or $CARGO_TARGET_DIR)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests/fixtures/vision/tiny"
TOKENIZER = ROOT / "tests/fixtures/tokenizer/tokenizer.json"
IMAGE = ROOT / "tests/fixtures/vision/a_64x96.png"


def _binary():
    if os.environ.get("QWEN3_VL_BIN"):
        return Path(os.environ["QWEN3_VL_BIN"])
    targets = [Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    targets.append(ROOT / "target")
    for t in targets:
        for profile in ("release", "debug"):
            if (t / profile / "qwen3-vl").is_file():
                return t / profile / "qwen3-vl"
    pytest.fail("no qwen3-vl binary: build it (cargo build) or set QWEN3_VL_BIN")


@pytest.fixture(scope="session")
def generate_greedy():
    """The reply `qwen3-vl generate -q --greedy` prints for a prompt and images."""
    binary = _binary()

    def run(prompt, images=(), max_tokens=12):
        args = [str(binary), "generate", "-m", str(TINY), "--tokenizer", str(TOKENIZER), "-q", "--greedy", "--max-tokens", str(max_tokens), "-p", prompt]
        for i in images:
            args += ["-i", str(i)]
        out = subprocess.run(args, capture_output=True, check=False)
        assert out.returncode == 0, out.stderr.decode()
        text = out.stdout.decode()
        assert text.endswith("\n")
        return text[:-1]

    return run


@pytest.fixture(scope="session")
def model():
    """The model on the device it picks (CUDA where there is one), as the CLI's."""
    import qwen3_vl

    with qwen3_vl.Model(TINY, tokenizer=TOKENIZER, max_batch=4) as m:
        yield m


@pytest.fixture(scope="session")
def cpu_model():
    """The model on the CPU, whose greedy tokens in a batch are those of each request alone
    (a GPU's batched kernels may round a close call the other way: tests/engine.rs)."""
    import qwen3_vl

    with qwen3_vl.Model(TINY, tokenizer=TOKENIZER, max_batch=4, device="cpu") as m:
        yield m
