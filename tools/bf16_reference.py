#!/usr/bin/env python3
"""How far transformers in bfloat16 lands from the committed float32 references.

For every text fixture prompt (tests/fixtures/text/*/reference.json) and every image case
(tests/fixtures/vision/*.json), runs the fixture checkpoint in transformers with
dtype=torch.bfloat16 (eager attention, on CUDA when there is a GPU, else the CPU) and compares
its last-position logits with the float32 reference file: the largest |difference| over the
reference logits' standard deviation, and whether the top-1 token is kept. Writes
tests/fixtures/bf16_reference.json, which tests/precision.rs reads as the bound of our
`--precision bf16` mode (it must do no worse than transformers bf16 on the same input).

    python3 tools/bf16_reference.py --out tests/fixtures/bf16_reference.json
"""

import argparse
import json
import pathlib
import platform

import numpy as np
import torch
import transformers
from transformers import Qwen3VLForConditionalGeneration

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEXT_CASES = ["tied_gqa", "untied_mha", "fullvocab"]
VISION_CASES = ["one_image_exact", "one_image_resized", "two_images"]


def read_f32(path):
    return np.fromfile(path, dtype="<f4")


def load(dir_, device):
    model = Qwen3VLForConditionalGeneration.from_pretrained(dir_, dtype=torch.bfloat16, attn_implementation="eager")
    return model.to(device).eval()


def compare(got, want):
    std = float(want.std())
    return {
        "max_abs_over_std": float(np.abs(got - want).max() / std),
        "top1_kept": bool(int(got.argmax()) == int(want.argmax())),
        "reference_top2_margin_over_std": float(np.diff(np.sort(want)[-2:])[0] / std),
    }


@torch.no_grad()
def text_cases(device, out):
    for case in TEXT_CASES:
        d = ROOT / "tests/fixtures/text" / case
        ref = json.loads((d / "reference.json").read_text())
        model = load(d, device)
        for i, p in enumerate(ref["prompts"]):
            ids = torch.tensor([p["ids"]], dtype=torch.long, device=device)
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float().cpu().numpy()
            want = read_f32(d / p["last_logits_file"])
            out[f"text/{case}/p{i}"] = dict(compare(logits, want), tokens=len(p["ids"]))
            print(f"text/{case}/p{i}", out[f"text/{case}/p{i}"], flush=True)


@torch.no_grad()
def vision_cases(device, out):
    d = ROOT / "tests/fixtures/vision"
    model = load(d / "tiny", device)
    image_token = model.config.image_token_id
    for case in VISION_CASES:
        c = json.loads((d / f"{case}.json").read_text())
        ids = torch.tensor([c["input_ids"]], dtype=torch.long, device=device)
        pv = torch.from_numpy(read_f32(d / c["pixel_values"]["file"]).reshape(c["pixel_values"]["shape"])).to(device, torch.bfloat16)
        grid = torch.tensor(c["image_grid_thw"], dtype=torch.long, device=device)
        mm = (ids == image_token).long()
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pv, image_grid_thw=grid, mm_token_type_ids=mm).logits[0, -1].float().cpu().numpy()
        want = read_f32(d / c["last_logits"]["file"])
        out[f"vision/{case}"] = dict(compare(logits, want), tokens=len(c["input_ids"]))
        print(f"vision/{case}", out[f"vision/{case}"], flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = {}
    text_cases(device, cases)
    vision_cases(device, cases)
    doc = {
        "what": "transformers bfloat16 (eager attention) last-position logits against the committed float32 references: max |diff| / reference std, top-1 kept",
        "generated_with": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "command": "python3 tools/bf16_reference.py --out tests/fixtures/bf16_reference.json",
        },
        "cases": cases,
    }
    pathlib.Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
