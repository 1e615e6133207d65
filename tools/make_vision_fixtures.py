#!/usr/bin/env python3
"""Build a tiny random-weight Qwen3-VL checkpoint and record transformers' vision references.

Run on a machine with torch, transformers (>= 5), Pillow and numpy installed:

    PYTHONUNBUFFERED=1 python3 tools/make_vision_fixtures.py --out tests/fixtures/vision

It writes into OUT:

- tiny/: the checkpoint (config.json, model.safetensors in bfloat16, preprocessor_config.json);
- a_64x96.png, b_50x70.png, c_96x64.png: deterministic test images (gradient + seeded noise);
- <case>.json and <case>_*.f32 for every case in CASES: the processor's pixel values, the vision
  tower's outputs (merged image embeddings, DeepStack features, and for the first case the
  patch-level states before and after every vision block), the multimodal position ids, the
  last-position logits and a greedy continuation with its per-step logits (top-k);
- manifest.json: what is common to the cases (versions, processor, weights, checks).

See tests/fixtures/vision/README.md for the file format. Helpers (weight re-draw, f32 writer,
tokenizer loading) come from tools/make_fixtures.py. References are computed on the CPU in
float32 with eager attention, from the checkpoint as reloaded from disk.
"""

import argparse
import copy
import inspect
import json
import math
import os
import re
import sys
import time

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

import transformers  # noqa: E402
from transformers import GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration  # noqa: E402

SPECIAL = dict(mf.QWEN_SPECIAL)
IMAGE_PAD = "<|image_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
CHAT_TEMPLATE = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"

# Text hidden 16 keeps the bf16 embedding of the full 151936-token vocabulary at 4.9 MB
# (hidden 32 would be 9.7 MB on its own). q/o projections are 16 <-> 32 (2 heads x 16).
TEXT = dict(hidden_size=16, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, intermediate_size=64, vocab_size=151936)
# head_dim/2 = 8 frequencies; interleaved: T at j = 0,3,6, H at j = 1,4,7, W at j = 2,5.
# transformers assigns H to slice(1, 3*sec_h, 3) and W to slice(2, 3*sec_w, 3) and T the rest,
# so the section is "consistent" (the counts equal the section) exactly for [3, 3, 2].
MROPE_SECTION = [3, 3, 2]
VISION = dict(
    depth=3,
    hidden_size=32,
    hidden_act="gelu_pytorch_tanh",
    intermediate_size=64,
    num_heads=2,
    in_channels=3,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    num_position_embeddings=64,
    deepstack_visual_indexes=[0, 2],
)
EMB_STD = 0.75
BRANCH_GAINS = [3.0, 4.0, 6.0, 2.0]
SEEDS_PER_GAIN = 12
BASE_SEED = 4004
MAX_NEW_TOKENS = 6
MIN_DISTINCT_GREEDY = 3
MARGIN_TARGET = 0.05  # a seed is taken at once when every greedy step's top-2 gap is at least this
TOPK = 64

# Published Qwen3-VL-2B-Instruct preprocessor values (= transformers' Qwen2VLImageProcessor
# settings for Qwen3-VL), except shortest_edge (min_pixels), lowered from 65536 to 4096 so that
# the small test images are not upscaled (see README).
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorPil",
    "processor_class": "Qwen3VLProcessor",
    "do_resize": True,
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 1.0 / 255.0,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": True,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": 4096, "longest_edge": 16777216},
}
PUBLISHED_SIZE = {"shortest_edge": 65536, "longest_edge": 16777216}

IMAGES = {
    # name: (height, width, noise seed)
    "a_64x96.png": (64, 96, 11),
    "b_50x70.png": (50, 70, 22),
    "c_96x64.png": (96, 64, 33),
}

CASES = {
    "one_image_exact": dict(images=["a_64x96.png"], text="Describe this image.", debug_vision=True),
    "one_image_resized": dict(images=["b_50x70.png"], text="What is it?", debug_vision=False),
    "two_images": dict(images=["a_64x96.png", "c_96x64.png"], text="Compare them.", debug_vision=False),
}

log = mf.log


# ---------------------------------------------------------------------------------------------
# Images


def make_image(h, w, seed):
    """Smooth colour gradients, a sine pattern and two flat boxes, plus seeded Gaussian noise."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, h)[:, None] * np.ones((1, w))
    x = np.linspace(0.0, 1.0, w)[None, :] * np.ones((h, 1))
    r = 230.0 * x + 10.0
    g = 220.0 * y + 20.0
    b = 127.5 + 110.0 * np.sin(2.0 * np.pi * (1.5 * x + 2.0 * y + seed / 7.0))
    img = np.stack([r, g, b], axis=-1)
    y0, x0 = h // 5, w // 6
    img[y0:y0 + h // 4, x0:x0 + w // 3] = [240.0, 30.0, 60.0]
    img[h - h // 3:h - h // 8, w - w // 3:w - w // 10] = [20.0, 200.0, 90.0]
    img = img + rng.normal(0.0, 28.0, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def write_images(out):
    info = {}
    for name, (h, w, seed) in IMAGES.items():
        path = os.path.join(out, name)
        Image.fromarray(make_image(h, w, seed)).save(path, format="PNG", optimize=True)
        back = np.asarray(Image.open(path).convert("RGB"))
        assert back.shape == (h, w, 3) and np.array_equal(back, make_image(h, w, seed))
        info[name] = {"height": h, "width": w, "noise_seed": seed, "sha256": mf.sha256_file(path)}
    return info


# ---------------------------------------------------------------------------------------------
# Image processor


def pil_image_processor(ckpt_dir):
    """The PIL/numpy Qwen2-VL image processor, loaded from the committed preprocessor_config.json."""
    # transformers 5.17: Qwen2VLImageProcessor is the torchvision backend (the former "Fast" class);
    # the PIL/numpy one is Qwen2VLImageProcessorPil (AutoImageProcessor with use_fast=False).
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as mp
    from transformers.models.qwen2_vl import image_processing_qwen2_vl as mt
    cls = mp.Qwen2VLImageProcessorPil
    log(f"PIL image processor class {cls.__module__}.{cls.__name__} from {inspect.getsourcefile(cls)}")
    ip = cls.from_pretrained(ckpt_dir)
    auto = {}
    from transformers import AutoImageProcessor
    for label, kw in (("default", {}), ("use_fast_false", {"use_fast": False}), ("backend_pil", {"backend": "pil"})):
        try:
            a = AutoImageProcessor.from_pretrained(ckpt_dir, **kw)
            auto[label] = type(a).__module__ + "." + type(a).__name__
        except Exception as e:  # noqa: BLE001
            auto[label] = "error: " + repr(e)
    try:
        tv = mt.Qwen2VLImageProcessor.from_pretrained(ckpt_dir)
    except Exception as e:  # noqa: BLE001
        log("no torchvision image processor:", repr(e))
        tv = None
    return ip, auto, tv


def smart_resize_ref(h, w, factor, min_pixels, max_pixels):
    """Our own statement of the resize rule (checked against the processor's grids)."""
    hb = round(h / factor) * factor
    wb = round(w / factor) * factor
    if hb * wb > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb = math.ceil(h * beta / factor) * factor
        wb = math.ceil(w * beta / factor) * factor
    return hb, wb


def pixel_values_reimpl(img_u8, rh, rw):
    """Independent numpy re-implementation: PIL bicubic resize of the uint8 image, /255,
    (x-0.5)/0.5, frame repeated to temporal_patch_size 2, rows in merge-block order, each row
    laid out [channel][frame][py][px]."""
    p, m, tp = 16, 2, 2
    im = Image.fromarray(np.ascontiguousarray(img_u8))
    if (im.height, im.width) != (rh, rw):
        im = im.resize((rw, rh), resample=Image.Resampling.BICUBIC)
    x = np.asarray(im).astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(0.5)) / np.float32(0.5)  # [H, W, C]
    gh, gw = rh // p, rw // p
    x = x.transpose(2, 0, 1)  # [C, H, W]
    x = np.stack([x] * tp, axis=1)  # [C, T, H, W]
    x = x.reshape(3, tp, gh // m, m, p, gw // m, m, p)
    x = x.transpose(2, 5, 3, 6, 0, 1, 4, 7)  # [bh, bw, ih, iw, C, T, py, px]
    return x.reshape(gh * gw, 3 * tp * p * p), (1, gh, gw)


# ---------------------------------------------------------------------------------------------
# Model


def build_config():
    text_config = dict(
        TEXT,
        hidden_act="silu",
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        attention_bias=False,
        attention_dropout=0.0,
        use_cache=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                         "mrope_section": list(MROPE_SECTION), "mrope_interleaved": True},
        bos_token_id=SPECIAL["bos_token_id"],
        eos_token_id=SPECIAL["eos_token_id"],
    )
    assert sum(MROPE_SECTION) * 2 == TEXT["head_dim"]
    cfg = Qwen3VLConfig(
        text_config=text_config,
        vision_config=dict(VISION, out_hidden_size=TEXT["hidden_size"]),
        image_token_id=SPECIAL["image_token_id"],
        video_token_id=SPECIAL["video_token_id"],
        vision_start_token_id=SPECIAL["vision_start_token_id"],
        vision_end_token_id=SPECIAL["vision_end_token_id"],
        tie_word_embeddings=True,
    )
    cfg.architectures = ["Qwen3VLForConditionalGeneration"]
    return cfg


def mrope_assignment(model):
    """Which rotary frequency index uses which axis, read off transformers' own function."""
    rot = model.model.language_model.rotary_emb
    half = TEXT["head_dim"] // 2
    freqs = torch.stack([torch.full((1, 1, half), float(a)) for a in range(3)])  # [3, 1, 1, half]
    if hasattr(rot, "recomposition_frequencies"):  # 5.17: also concatenates the two halves
        out = rot.recomposition_frequencies(freqs.clone())[..., :half]
    else:
        out = rot.apply_interleaved_mrope(freqs.clone(), rot.mrope_section)
    return ["THW"[int(v)] for v in out.reshape(-1).tolist()]


def gen_config():
    return GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, do_sample=False, num_beams=1, eos_token_id=None,
                            bos_token_id=None, pad_token_id=None, temperature=None, top_p=None, top_k=None,
                            repetition_penalty=None, use_cache=True, output_logits=True,
                            return_dict_in_generate=True)


def model_inputs(case, device):
    ids = torch.tensor([case["ids"]], dtype=torch.long, device=device)
    mm = (ids == SPECIAL["image_token_id"]).long()
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                pixel_values=case["pixel_values"].to(device),
                image_grid_thw=case["grid"].to(device), mm_token_type_ids=mm)


@torch.no_grad()
def forward_last(model, case, **over):
    kw = model_inputs(case, model.device)
    kw.update(over)
    out = model(**kw)
    return out.logits[0, -1].float().cpu(), out


@torch.no_grad()
def greedy(model, case):
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    kw = model_inputs(case, model.device)
    out = model.generate(**kw, generation_config=gen_config())
    seq = out.sequences[0].tolist()
    L = len(case["ids"])
    assert seq[:L] == case["ids"]
    new = seq[L:]
    assert len(new) == MAX_NEW_TOKENS, f"generate stopped early: {new}"
    steps = torch.stack([s[0].float().cpu() for s in out.logits])
    return new, steps


@torch.no_grad()
def greedy_nocache(model, case):
    cur = list(case["ids"])
    steps = []
    for _ in range(MAX_NEW_TOKENS):
        c = dict(case, ids=cur)
        last, _ = forward_last(model, c, use_cache=False)
        steps.append(last)
        cur = cur + [int(torch.argmax(last))]
    return cur[len(case["ids"]):], torch.stack(steps)


def top2(row):
    v, _ = torch.topk(row, 2)
    return float(v[0] - v[1])


def unpack_visual(out):
    """(merged [N, out_hidden], [deepstack ...]) from whatever the vision model returns."""
    if isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], (list, tuple)):
        return out[0], list(out[1])
    merged = getattr(out, "pooler_output", None)
    if merged is None:
        merged = out.last_hidden_state
    ds = getattr(out, "deepstack_features", None)
    if ds is None:
        ds = getattr(out, "deepstack_feature_lists", None)
    return merged, list(ds)


def call_filtered(fn, **kw):
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(**kw)
    return fn(**{k: v for k, v in kw.items() if k in params})


class Capture:
    """Forward hooks recording what the model really computes inside a forward."""

    def __init__(self, model, vision_debug=False):
        self.model = model
        self.rotary = []
        self.lm_inputs = []
        self.block_in = None
        self.block_out = []
        self.patch = None
        self.handles = []
        lm = model.model.language_model
        self.handles.append(lm.rotary_emb.register_forward_hook(self._rot, with_kwargs=True))
        self.handles.append(lm.register_forward_pre_hook(self._lm, with_kwargs=True))
        if vision_debug:
            vis = model.model.visual
            self.handles.append(vis.patch_embed.register_forward_hook(self._patch))
            self.handles.append(vis.blocks[0].register_forward_pre_hook(self._bin, with_kwargs=True))
            for b in vis.blocks:
                self.handles.append(b.register_forward_hook(self._bout))

    def _rot(self, mod, args, kwargs, out):
        pos = args[1] if len(args) > 1 else kwargs.get("position_ids")
        self.rotary.append(pos.detach().cpu().clone())

    def _lm(self, mod, args, kwargs):
        self.lm_inputs.append({k: (v.detach().cpu().clone() if torch.is_tensor(v) else
                                   [t.detach().cpu().clone() for t in v] if isinstance(v, (list, tuple)) and v
                                   and torch.is_tensor(v[0]) else v)
                               for k, v in kwargs.items() if k in ("inputs_embeds", "visual_pos_masks",
                                                                   "deepstack_visual_embeds", "position_ids")})

    def _patch(self, mod, args, out):
        self.patch = out.detach().cpu().clone()

    def _bin(self, mod, args, kwargs):
        hs = args[0] if args else kwargs["hidden_states"]
        self.block_in = hs.detach().cpu().clone()

    def _bout(self, mod, args, out):
        o = out[0] if isinstance(out, (tuple, list)) else out
        self.block_out.append(o.detach().cpu().clone())

    def close(self):
        for h in self.handles:
            h.remove()


# ---------------------------------------------------------------------------------------------
# Output helpers


def write_f32(out, name, t):
    shape = mf.write_f32(os.path.join(out, name), t.float())
    return {"file": name, "shape": shape}


def dump_json(path, obj):
    text = json.dumps(obj, indent=1, ensure_ascii=False)
    text = re.sub(r"\[\s*(-?[\d.e+-]+(?:,\s*-?[\d.e+-]+)*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    assert json.loads(text) == json.loads(json.dumps(obj))
    with open(path, "w") as f:
        f.write(text + "\n")


def maxdiff(a, b):
    return float((a.float() - b.float()).abs().max())


# ---------------------------------------------------------------------------------------------
# Main


def prepare_cases(out, ckpt_dir, repo_root):
    tpath, tok = mf.load_tokenizer(repo_root)
    ip, auto_cls, tv = pil_image_processor(ckpt_dir)
    log(f"image processor: {type(ip).__module__}.{type(ip).__name__}; AutoImageProcessor.from_pretrained "
        f"-> {auto_cls}; settings: {ip.to_dict()}")
    min_px = ip.size["shortest_edge"]
    max_px = ip.size["longest_edge"]
    cases = {}
    for name, spec in CASES.items():
        imgs = [Image.open(os.path.join(out, f)).convert("RGB") for f in spec["images"]]
        bf = ip(images=imgs, return_tensors="pt")
        pv = bf["pixel_values"].float()
        grid = bf["image_grid_thw"].long()
        # Our re-implementation of the preprocessing, row for row.
        parts, rgrids, img_info = [], [], []
        for f, im in zip(spec["images"], imgs):
            h, w = im.height, im.width
            rh, rw = smart_resize_ref(h, w, 32, min_px, max_px)
            a, g = pixel_values_reimpl(np.asarray(im), rh, rw)
            parts.append(torch.from_numpy(a))
            rgrids.append(list(g))
            n_tok = g[0] * g[1] * g[2] // 4
            img_info.append({"file": f, "height": h, "width": w, "resized_height": rh, "resized_width": rw,
                             "grid_thw": list(g), "n_patches": g[0] * g[1] * g[2], "n_image_tokens": n_tok,
                             "resampled": (rh, rw) != (h, w)})
        reimpl = torch.cat(parts)
        assert grid.tolist() == rgrids, (grid.tolist(), rgrids)
        reimpl_diff = maxdiff(reimpl, pv)
        tv_pv, tv_diff = None, None
        if tv is not None:
            try:
                fb = tv(images=imgs, return_tensors="pt")
                tv_pv = fb["pixel_values"].float()
                tv_diff = maxdiff(tv_pv, pv) if tv_pv.shape == pv.shape else f"shape {list(tv_pv.shape)}"
            except Exception as e:  # noqa: BLE001
                tv_diff = "error: " + repr(e)
        content = "".join(VISION_START + IMAGE_PAD * i["n_image_tokens"] + VISION_END for i in img_info)
        rendered = CHAT_TEMPLATE.format(content=content + spec["text"])
        ids = tok.encode(rendered, add_special_tokens=False).ids
        n_img = sum(i["n_image_tokens"] for i in img_info)
        assert ids.count(SPECIAL["image_token_id"]) == n_img
        same, err = mf.check_with_transformers_tokenizer(tpath, rendered, ids)
        log(f"[{name}] grids {grid.tolist()}, pixel_values {list(pv.shape)}, reimpl max diff {reimpl_diff:.3g}, "
            f"torchvision-processor max diff {tv_diff}; {len(ids)} ids, {n_img} image tokens; transformers tokenizer "
            f"agrees: {same} {err or ''}")
        cases[name] = dict(spec=spec, ids=ids, rendered=rendered, pixel_values=pv, grid=grid, images=img_info,
                           reimpl_diff=reimpl_diff, tv_pv=tv_pv, tv_diff=tv_diff, tok_same=same)
    # The full Qwen3VLProcessor (tokenizer + image processor) as a cross-check of ids and pixels.
    proc_check = {}
    try:
        from transformers import PreTrainedTokenizerFast, Qwen3VLProcessor
        t = PreTrainedTokenizerFast(tokenizer_file=tpath)
        kw = dict(image_processor=ip, tokenizer=t)
        if "video_processor" in inspect.signature(Qwen3VLProcessor.__init__).parameters:
            try:
                from transformers import Qwen3VLVideoProcessor
                kw["video_processor"] = Qwen3VLVideoProcessor()
            except Exception as e:  # noqa: BLE001
                log("no video processor:", repr(e))
        proc = Qwen3VLProcessor(**kw)
        for name, c in cases.items():
            content = "".join(VISION_START + IMAGE_PAD + VISION_END for _ in c["images"])
            text = CHAT_TEMPLATE.format(content=content + c["spec"]["text"])
            imgs = [Image.open(os.path.join(out, f)).convert("RGB") for f in c["spec"]["images"]]
            r = proc(text=[text], images=imgs, return_tensors="pt")
            got_ids = r["input_ids"][0].tolist()
            mm = r.get("mm_token_type_ids")
            mm_ok = None
            if mm is not None:
                mm_ok = mm[0].tolist() == [1 if i == SPECIAL["image_token_id"] else 0 for i in c["ids"]]
            proc_check[name] = {"ids_agree": got_ids == c["ids"],
                                "pixel_values_max_diff": maxdiff(r["pixel_values"], c["pixel_values"]),
                                "grid_agree": r["image_grid_thw"].tolist() == c["grid"].tolist(),
                                "mm_token_type_ids_agree": mm_ok,
                                "keys": sorted(r.keys())}
        log(f"Qwen3VLProcessor cross-check: {proc_check}")
    except Exception as e:  # noqa: BLE001
        proc_check = {"error": repr(e)}
        log("Qwen3VLProcessor cross-check failed:", repr(e))
    proc_info = {
        "class": f"{type(ip).__module__}.{type(ip).__name__}",
        "auto_image_processor_from_pretrained": auto_cls,
        "settings": {k: v for k, v in ip.to_dict().items() if not k.startswith("_")},
        "torchvision_class": None if tv is None else f"{type(tv).__module__}.{type(tv).__name__}",
        "qwen3vl_processor_cross_check": proc_check,
    }
    return cases, proc_info, tpath


def search_weights(cfg, cases):
    best, chosen = None, None
    for gain in BRANCH_GAINS:
        for attempt in range(SEEDS_PER_GAIN):
            wseed = BASE_SEED * 100 + attempt
            mf.seed_everything(wseed)
            model = mf.new_model(cfg)
            assert mf.is_tied(model)
            mf.redraw_weights(model, wseed, EMB_STD, None, gain)
            distinct, margins = [], []
            for c in cases.values():
                new, steps = greedy(model, c)
                distinct.append(len(set(new)))
                margins.append(min(top2(s) for s in steps))
            score = (min(min(distinct), MIN_DISTINCT_GREEDY), min(margins))
            log(f"gain {gain} seed {wseed}: distinct {distinct}, min top2 margins {[round(m, 4) for m in margins]}")
            if best is None or score > best[0]:
                best = (score, gain, wseed)
            if min(distinct) >= MIN_DISTINCT_GREEDY and min(margins) >= MARGIN_TARGET:
                chosen = (gain, wseed)
                break
        if chosen:
            break
    if chosen is None:
        _, gain, wseed = best
        log(f"WARNING: no seed met both targets; best {best}")
        chosen = (gain, wseed)
    gain, wseed = chosen
    mf.seed_everything(wseed)
    model = mf.new_model(cfg)
    mf.redraw_weights(model, wseed, EMB_STD, None, gain)
    return model, gain, wseed


@torch.no_grad()
def record_case(model, name, c, out):
    L = len(c["ids"])
    vis = model.model.visual
    ids_t = torch.tensor([c["ids"]])
    img_mask = ids_t[0] == SPECIAL["image_token_id"]
    rec = {"case": name, "checkpoint": "tiny", "text": c["spec"]["text"], "images": c["images"],
           "rendered": c["rendered"], "input_ids": c["ids"], "seq_len": L,
           "image_token_positions": torch.nonzero(img_mask).flatten().tolist(),
           "n_image_tokens": int(img_mask.sum()), "image_grid_thw": c["grid"].tolist()}
    rec["pixel_values"] = write_f32(out, f"{name}_pixel_values.f32", c["pixel_values"])
    checks = {"pixel_values_reimpl_max_diff": c["reimpl_diff"],
              "pixel_values_torchvision_processor_max_diff": c["tv_diff"],
              "transformers_tokenizer_agrees": c["tok_same"]}

    # Vision tower, called directly.
    cap = Capture(model, vision_debug=c["spec"]["debug_vision"])
    vout = vis(c["pixel_values"], grid_thw=c["grid"])
    merged, ds = unpack_visual(vout)
    log(f"[{name}] visual() returned {type(vout).__name__}; merged {list(merged.shape)}, deepstack "
        f"{[list(d.shape) for d in ds]}")
    assert merged.shape == (rec["n_image_tokens"], TEXT["hidden_size"]), merged.shape
    assert len(ds) == len(VISION["deepstack_visual_indexes"])
    rec["image_embeds"] = write_f32(out, f"{name}_image_embeds.f32", merged)
    rec["deepstack_embeds"] = []
    for i, (layer, d) in enumerate(zip(VISION["deepstack_visual_indexes"], ds)):
        e = write_f32(out, f"{name}_deepstack{i}.f32", d)
        e.update({"vision_layer": layer, "added_after_text_layer": i})
        rec["deepstack_embeds"].append(e)
    if c["spec"]["debug_vision"]:
        pe = cap.patch
        bi = cap.block_in
        # transformers 5.17 interpolates inside forward (no separate function): the position
        # embedding is then recorded as block input - patch embedding (exact to f32 rounding).
        pos = None
        if hasattr(vis, "fast_pos_embed_interpolate"):
            pos = vis.fast_pos_embed_interpolate(c["grid"]).float().cpu()
            checks["block_input_eq_patch_plus_pos_max_diff"] = maxdiff(pe + pos, bi)
        else:
            pos = bi - pe
        rec["vision_patch_embed"] = write_f32(out, f"{name}_vision_patch_embed.f32", pe)
        rec["vision_pos_embed"] = write_f32(out, f"{name}_vision_pos_embed.f32", pos)
        rec["vision_block_input"] = write_f32(out, f"{name}_vision_block_input.f32", bi)
        rec["vision_block_outputs"] = [write_f32(out, f"{name}_vision_block{i}_output.f32", b)
                                       for i, b in enumerate(cap.block_out)]
        assert len(cap.block_out) == VISION["depth"]
    cap.close()
    # get_image_features must agree with the direct call.
    try:
        gif = model.model.get_image_features(c["pixel_values"], c["grid"])
        if isinstance(gif, (tuple, list)) and len(gif) == 2:
            g_m, g_ds = gif
        else:
            g_m, g_ds = getattr(gif, "pooler_output", None), getattr(gif, "deepstack_features", None)
        g_m = torch.cat(list(g_m)) if isinstance(g_m, (tuple, list)) else g_m
        checks["get_image_features_vs_visual_max_diff"] = max([maxdiff(g_m, merged)] +
                                                              [maxdiff(a, b) for a, b in zip(g_ds, ds)])
    except Exception as e:  # noqa: BLE001
        checks["get_image_features_vs_visual_max_diff"] = "error: " + repr(e)

    # Position ids.
    kw = model_inputs(c, model.device)
    rope = call_filtered(model.model.get_rope_index, input_ids=kw["input_ids"],
                         mm_token_type_ids=kw["mm_token_type_ids"], image_grid_thw=kw["image_grid_thw"],
                         video_grid_thw=None, attention_mask=kw["attention_mask"])
    pos_ids, delta = rope[0], rope[1]
    assert tuple(pos_ids.shape) == (3, 1, L), pos_ids.shape
    pos = pos_ids[:, 0, :].long()
    delta = int(torch.as_tensor(delta).reshape(-1)[0])
    assert delta == int(pos.max()) + 1 - L
    rec["position_ids"] = pos.tolist()
    rec["rope_delta"] = delta
    rec["next_position"] = L + delta

    # Forward: last-position logits; hooks see what the language model was fed.
    cap = Capture(model)
    last, fout = forward_last(model, c)
    cap.close()
    used_pos = cap.rotary[0]
    checks["forward_positions_eq_get_rope_index"] = bool(torch.equal(used_pos[:, 0, :].long(), pos))
    tok_emb = model.model.get_input_embeddings()(ids_t)[0]
    try:
        lmi = cap.lm_inputs[0]
        emb = lmi["inputs_embeds"][0]
        checks["forward_image_rows_eq_image_embeds_max_diff"] = maxdiff(emb[img_mask], merged)
        checks["forward_text_rows_eq_token_embeddings_max_diff"] = maxdiff(emb[~img_mask], tok_emb[~img_mask])
        checks["forward_deepstack_eq_recorded_max_diff"] = max(
            maxdiff(a, b) for a, b in zip(lmi["deepstack_visual_embeds"], ds))
        checks["forward_visual_pos_mask_eq_image_tokens"] = bool(
            torch.equal(lmi["visual_pos_masks"][0].bool(), img_mask))
    except Exception as e:  # noqa: BLE001
        checks["forward_language_model_inputs_error"] = repr(e)
    if fout.rope_deltas is not None:
        checks["forward_rope_deltas"] = int(torch.as_tensor(fout.rope_deltas).reshape(-1)[0])
    rec["last_logits"] = write_f32(out, f"{name}_last_logits.f32", last)
    rec["last_argmax"] = int(torch.argmax(last))
    rec["last_top2_margin"] = top2(last)
    rec["logits_std"] = float(last.std())

    # Rebuild the logits from the recorded pieces alone, and measure what each piece matters.
    sens = {}
    try:
        lm = model.model.language_model

        def rebuild(embeds, ds_list, p):
            e = tok_emb.clone()
            e[img_mask] = embeds
            o = lm(inputs_embeds=e[None], attention_mask=torch.ones(1, L, dtype=torch.long),
                   position_ids=p[:, None, :], visual_pos_masks=img_mask[None] if ds_list else None,
                   deepstack_visual_embeds=ds_list)
            return model.lm_head(o.last_hidden_state)[0, -1].float()

        checks["rebuilt_from_recorded_pieces_max_diff"] = maxdiff(rebuild(merged, ds, pos), last)
        sens["no_deepstack"] = maxdiff(rebuild(merged, None, pos), last)
        sens["deepstack_layers_swapped"] = maxdiff(rebuild(merged, ds[::-1], pos), last)
        sens["text_positions_0_to_L-1"] = maxdiff(rebuild(merged, ds, torch.arange(L)[None].expand(3, L)), last)
        hw_swapped = pos[[0, 2, 1]]
        sens["h_w_position_rows_swapped"] = maxdiff(rebuild(merged, ds, hw_swapped), last)
    except Exception as e:  # noqa: BLE001
        sens["error"] = repr(e)
    try:
        if c["tv_pv"] is not None and c["tv_pv"].shape == c["pixel_values"].shape:
            fl, _ = forward_last(model, c, pixel_values=c["tv_pv"])
            sens["torchvision_processor_pixels"] = maxdiff(fl, last)
        flipped = c["pixel_values"].clone()
        flipped[0] = c["pixel_values"][1]
        flipped[1] = c["pixel_values"][0]
        fl, _ = forward_last(model, c, pixel_values=flipped)
        sens["first_two_patches_swapped"] = maxdiff(fl, last)
    except Exception as e:  # noqa: BLE001
        sens["pixels_error"] = repr(e)
    rec["sensitivity_max_abs_last_logit_change"] = sens

    # Greedy continuation.
    cap = Capture(model)
    new, steps = greedy(model, c)
    cap.close()
    dec_pos = []
    for p in cap.rotary[1:]:
        assert p.shape[-1] == 1
        v = p[:, 0, 0].tolist()
        dec_pos.append(int(v[0]))
        assert v[0] == v[1] == v[2], v
    expected = [L + delta + k for k in range(MAX_NEW_TOKENS - 1)]
    checks["decode_positions_eq_next_position_plus_k"] = dec_pos == expected
    nc_new, nc_steps = greedy_nocache(model, c)
    checks["greedy_kv_cache_vs_no_cache_ids_agree"] = nc_new == new
    checks["max_abs_step_logit_diff_kv_cache_vs_no_cache"] = maxdiff(nc_steps, steps) if nc_new == new else None
    checks["max_abs_diff_generate_step0_vs_forward_last"] = maxdiff(steps[0], last)
    assert [int(torch.argmax(s)) for s in steps] == new
    top_v, top_i = torch.topk(steps, TOPK, dim=-1)
    rec["greedy"] = {
        "max_new_tokens": MAX_NEW_TOKENS,
        "ids": new,
        "decode_positions": dec_pos,
        "step_top2_margin": [top2(s) for s in steps],
        "min_top2_margin": min(top2(s) for s in steps),
        "step_topk": TOPK,
        "step_top_ids": top_i.tolist(),
        "step_top_logits": top_v.tolist(),
        "step_stats": [{"mean": float(s.mean()), "std": float(s.std()), "max": float(s.max()),
                        "logsumexp": float(torch.logsumexp(s.double(), 0))} for s in steps],
    }
    rec["checks"] = checks
    log(f"[{name}] L {L}, image tokens {rec['n_image_tokens']}, grid {rec['image_grid_thw']}, rope delta {delta}, "
        f"last std {rec['logits_std']:.3f}, argmax {rec['last_argmax']}, last top2 {rec['last_top2_margin']:.4f}; "
        f"greedy {new} (distinct {len(set(new))}), step margins "
        f"{[round(m, 4) for m in rec['greedy']['step_top2_margin']]}, decode positions {dec_pos}")
    log(f"[{name}] checks {checks}")
    log(f"[{name}] sensitivity {sens}")
    return rec, last, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder (e.g. tests/fixtures/vision)")
    ap.add_argument("--no-gpu-check", action="store_true", help="skip the fp32 GPU cross-check")
    args = ap.parse_args()
    t0 = time.time()
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    torch.use_deterministic_algorithms(True, warn_only=True)
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}")
    out = args.out
    ckpt = os.path.join(out, "tiny")
    os.makedirs(ckpt, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith((".f32", ".json", ".png")):
            os.remove(os.path.join(out, f))
    for f in os.listdir(ckpt):
        os.remove(os.path.join(ckpt, f))

    image_info = write_images(out)
    with open(os.path.join(ckpt, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f, indent=2)
        f.write("\n")
    cases, proc_info, tpath = prepare_cases(out, ckpt, repo_root)

    cfg = build_config()
    model, gain, wseed = search_weights(cfg, cases)
    log(f"chosen: branch gain {gain}, weight seed {wseed}; vision attn impl "
        f"{getattr(model.config.vision_config, '_attn_implementation', None)}, text attn impl "
        f"{getattr(model.config.text_config, '_attn_implementation', None)}")

    save_model = copy.deepcopy(model).to(torch.bfloat16)
    save_model.save_pretrained(ckpt)
    del save_model
    if os.path.exists(os.path.join(ckpt, "generation_config.json")):
        os.remove(os.path.join(ckpt, "generation_config.json"))
    files = sorted(os.listdir(ckpt))
    assert files == ["config.json", "model.safetensors", "preprocessor_config.json"], files
    with open(os.path.join(ckpt, "config.json")) as f:
        log("config.json:\n" + f.read())
    from safetensors import safe_open
    tensors = {}
    with safe_open(os.path.join(ckpt, "model.safetensors"), "pt") as h:
        for k in h.keys():
            tensors[k] = {"dtype": str(h.get_slice(k).get_dtype()), "shape": list(h.get_slice(k).get_shape())}

    model2, info = Qwen3VLForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model2.eval()
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info.get(k), f"{k}: {info.get(k)}"
    assert mf.is_tied(model2)
    sd1, sd2 = model.state_dict(), model2.state_dict()
    assert sorted(sd1) == sorted(sd2)
    wdiff = max(float((sd1[k] - sd2[k]).abs().max()) for k in sd1)
    assert wdiff == 0.0, wdiff
    try:
        assignment = mrope_assignment(model2)
    except Exception as e:  # noqa: BLE001
        assignment = "error: " + repr(e)
    log(f"mrope frequency axes (j = 0..7): {assignment}")

    recs, lasts = {}, {}
    for name, c in cases.items():
        rec, last, steps = record_case(model2, name, c, out)
        recs[name] = rec
        lasts[name] = (last, rec["greedy"]["ids"])

    gpu = None
    if not args.no_gpu_check and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        mg = copy.deepcopy(model2).to("cuda")
        gd, gids = 0.0, True
        for name, c in cases.items():
            lg, _ = forward_last(mg, c)
            gd = max(gd, maxdiff(lg, lasts[name][0]))
            new, _ = greedy(mg, c)
            gids &= new == lasts[name][1]
        gpu = {"device": torch.cuda.get_device_name(0), "max_abs_last_logit_diff_vs_cpu": gd,
               "greedy_ids_agree": gids}
        log(f"GPU fp32 (tf32 off) cross-check: {gpu}")

    for name, rec in recs.items():
        dump_json(os.path.join(out, f"{name}.json"), rec)
    manifest = {
        "cases": list(recs),
        "checkpoint": "tiny",
        "text_config": dict(TEXT, tie_word_embeddings=True, mrope_section=MROPE_SECTION, rope_theta=5000000.0,
                            mrope_interleaved=True),
        "mrope_frequency_axes": assignment,
        "vision_config": dict(VISION, out_hidden_size=TEXT["hidden_size"]),
        "special_token_ids": SPECIAL,
        "chat_template": CHAT_TEMPLATE,
        "image_placeholder": VISION_START + IMAGE_PAD + "×n_image_tokens" + VISION_END,
        "images": image_info,
        "image_processor": proc_info,
        "preprocessor_config_changes": [
            f"size.shortest_edge (min_pixels) {PUBLISHED_SIZE['shortest_edge']} -> "
            f"{PREPROCESSOR['size']['shortest_edge']} so the small test images are not upscaled",
            "image_processor_type Qwen2VLImageProcessorFast (published) -> Qwen2VLImageProcessorPil, the PIL class used here"],
        "tokenizer": {"path_used": os.path.relpath(tpath, repo_root), "sha256": mf.sha256_file(tpath)},
        "weight_seed": wseed,
        "weight_init": {"scheme": mf.redraw_weights.__doc__.strip(), "emb_std": EMB_STD, "head_gain": None,
                        "branch_gain": gain, "rounded_to_bf16": True},
        "safetensors_tensors": tensors,
        "gpu_check": gpu,
        "generated_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                           "python": sys.version.split()[0], "pillow": Image.__version__,
                           "numpy": np.__version__, "device": "cpu",
                           "command": "python3 tools/make_vision_fixtures.py --out tests/fixtures/vision"},
    }
    dump_json(os.path.join(out, "manifest.json"), manifest)
    total = 0
    for root, _, fs in os.walk(out):
        for f in fs:
            total += os.path.getsize(os.path.join(root, f))
    log(f"done in {time.time() - t0:.1f}s; {out} holds {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
