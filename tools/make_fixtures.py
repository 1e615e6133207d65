#!/usr/bin/env python3
"""Build tiny random-weight Qwen3-VL checkpoints and record reference outputs.

Run on a machine with torch and transformers (>= 5) installed:

    PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py --out tests/fixtures/text

For every case it writes OUT/<case>/ with the checkpoint (config.json, safetensors,
index json where sharded), reference.json and raw little-endian float32 logits files.
See tests/fixtures/text/README.md for what the cases cover.

The references are computed on the CPU in float32 with eager attention, from the
checkpoint as reloaded from disk (after any config rewrite), so they describe exactly
what is committed. Weights are re-drawn larger than transformers' default init and
rounded to bfloat16-representable values, so a bf16 checkpoint holds the exact weights.
"""

import argparse
import copy
import hashlib
import json
import os
import random
import re
import sys
import time

import numpy as np
import torch

import transformers
from transformers import GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration

# Special ids of the real Qwen3-VL vocabulary.
QWEN_SPECIAL = {
    "bos_token_id": 151643,  # <|endoftext|>
    "eos_token_id": 151645,  # <|im_end|>
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "image_token_id": 151655,
    "video_token_id": 151656,
}
# The tiny 1024-token vocabularies keep Qwen's layout shifted down by 150643, so every
# special id is inside the vocabulary; ids >= 1000 are "special" and never in prompts.
TINY_SPECIAL = {k: v - 150643 for k, v in QWEN_SPECIAL.items()}
TINY_PROMPT_ID_LIMIT = 1000

VISION = dict(
    depth=2,
    hidden_size=32,
    hidden_act="gelu_pytorch_tanh",
    intermediate_size=64,
    num_heads=2,
    in_channels=3,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    num_position_embeddings=64,
    deepstack_visual_indexes=[0, 1],
)

CASES = {
    "tied_gqa": dict(
        text=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=128, vocab_size=1024),
        mrope_section=[4, 2, 2],
        tie=True,
        save_dtype=torch.float32,
        max_shard_size=None,
        hub_form=False,
        special=TINY_SPECIAL,
        prompt_lengths=[1, 5, 17, 40],
        all_logits_prompt=2,
        emb_std=0.45,
        head_gain=None,
        branch_gains=[3.0, 4.0, 6.0, 8.0],
        seed=1001,
    ),
    "untied_mha": dict(
        text=dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                  head_dim=32, intermediate_size=160, vocab_size=1024),
        mrope_section=[6, 5, 5],
        tie=False,
        save_dtype=torch.bfloat16,
        max_shard_size="400KB",
        hub_form=True,
        special=TINY_SPECIAL,
        prompt_lengths=[1, 5, 17, 40],
        all_logits_prompt=2,
        emb_std=1.0,
        head_gain=3.0,
        branch_gains=[1.0, 2.0, 4.0],
        seed=2002,
    ),
    "fullvocab": dict(
        text=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=16, intermediate_size=64, vocab_size=151936),
        mrope_section=[4, 2, 2],
        tie=True,
        save_dtype=torch.bfloat16,
        max_shard_size=None,
        hub_form=False,
        special=QWEN_SPECIAL,
        prompt_texts=["Hello!", "Describe a cat in one sentence.", "你好，世界 🌍"],
        all_logits_prompt=None,
        emb_std=0.5,
        head_gain=None,
        branch_gains=[3.0, 4.0, 6.0, 8.0],
        seed=3003,
    ),
}

CHAT_TEMPLATE = "<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
MAX_NEW_TOKENS = 8
MIN_DISTINCT_GREEDY = 3  # a case's seed is bumped until every continuation has this many distinct ids
SEEDS_PER_GAIN = 10

# Keys of the published Qwen/Qwen3-VL-2B-Instruct config.json (transformers 4.57 form).
HUB_TOP_KEYS = ["architectures", "image_token_id", "model_type", "text_config", "tie_word_embeddings",
                "transformers_version", "video_token_id", "vision_config", "vision_end_token_id",
                "vision_start_token_id"]
HUB_TEXT_KEYS = ["attention_bias", "attention_dropout", "bos_token_id", "dtype", "eos_token_id", "head_dim",
                 "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
                 "max_position_embeddings", "model_type", "num_attention_heads", "num_hidden_layers",
                 "num_key_value_heads", "rms_norm_eps", "rope_scaling", "rope_theta", "tie_word_embeddings",
                 "use_cache", "vocab_size"]
HUB_VISION_KEYS = ["deepstack_visual_indexes", "depth", "hidden_act", "hidden_size", "in_channels",
                   "initializer_range", "intermediate_size", "model_type", "num_heads",
                   "num_position_embeddings", "out_hidden_size", "patch_size", "spatial_merge_size",
                   "temporal_patch_size"]


def log(*a):
    print(*a, flush=True)


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_config(spec):
    t = dict(spec["text"])
    sp = spec["special"]
    text_config = dict(
        t,
        hidden_act="silu",
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
        attention_bias=False,
        attention_dropout=0.0,
        use_cache=True,
        tie_word_embeddings=spec["tie"],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": list(spec["mrope_section"]),
            "mrope_interleaved": True,
        },
        bos_token_id=sp["bos_token_id"],
        eos_token_id=sp["eos_token_id"],
    )
    assert sum(spec["mrope_section"]) * 2 == t["head_dim"]
    vision_config = dict(VISION, out_hidden_size=t["hidden_size"])
    cfg = Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=sp["image_token_id"],
        video_token_id=sp["video_token_id"],
        vision_start_token_id=sp["vision_start_token_id"],
        vision_end_token_id=sp["vision_end_token_id"],
        tie_word_embeddings=spec["tie"],
    )
    cfg.architectures = ["Qwen3VLForConditionalGeneration"]
    return cfg


def new_model(cfg):
    try:
        model = Qwen3VLForConditionalGeneration._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        cfg._attn_implementation = "eager"
        model = Qwen3VLForConditionalGeneration(cfg)
    return model.to(torch.float32).eval()


@torch.no_grad()
def redraw_weights(model, seed, emb_std, head_gain, branch_gain):
    """Re-draw every parameter (tied ones once) and round it to bf16-representable values.

    1-D '*.weight' (RMSNorm / LayerNorm gains): 1 + N(0, 0.1)
    1-D '*.bias':                               N(0, 0.05)
    embed_tokens.weight:                        N(0, emb_std)   (also the LM head when tied)
    lm_head.weight (untied):                    N(0, 1) * head_gain / sqrt(fan_in)
    vision pos_embed.weight:                    N(0, 0.5)
    text o_proj / down_proj (residual branches): N(0, 1) * branch_gain / sqrt(fan_in)
    every other weight (Linear, Conv3d):        N(0, 1) / sqrt(fan_in), fan_in = prod(shape[1:])
    """
    g = torch.Generator().manual_seed(seed)
    kinds = {}
    for name, p in model.named_parameters():
        z = torch.randn(tuple(p.shape), generator=g, dtype=torch.float32)
        if p.ndim == 1 and name.endswith("weight"):
            v, kind = 1.0 + 0.1 * z, "norm 1+N(0,0.1)"
        elif p.ndim == 1:
            v, kind = 0.05 * z, "bias N(0,0.05)"
        elif name.endswith("embed_tokens.weight"):
            v, kind = emb_std * z, f"embed N(0,{emb_std})"
        elif name == "lm_head.weight":
            v, kind = z * (head_gain / np.sqrt(p.shape[1])), f"lm_head N(0,1)*{head_gain}/sqrt(in)"
        elif name.endswith("pos_embed.weight"):
            v, kind = 0.5 * z, "pos_embed N(0,0.5)"
        elif "language_model" in name and name.endswith(("o_proj.weight", "down_proj.weight")):
            v, kind = z * (branch_gain / np.sqrt(p.shape[1])), f"branch N(0,1)*{branch_gain}/sqrt(in)"
        else:
            fan_in = int(np.prod(p.shape[1:]))
            v, kind = z / np.sqrt(fan_in), "N(0,1/sqrt(fan_in))"
        p.copy_(v.to(torch.bfloat16).to(torch.float32))
        kinds[name] = kind
    return kinds


def is_tied(model):
    return model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()


@torch.no_grad()
def forward_logits(model, ids):
    x = torch.tensor([ids], dtype=torch.long, device=model.device)
    out = model(input_ids=x, attention_mask=torch.ones_like(x))
    return out.logits[0].float().cpu()


def gen_config():
    return GenerationConfig(
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
        num_beams=1,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        temperature=None,
        top_p=None,
        top_k=None,
        repetition_penalty=None,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
    )


@torch.no_grad()
def greedy(model, ids):
    # eos stopping is disabled: the model's generation_config has eos_token_id=None and so does
    # the one passed here; the length check below proves no early stop happened.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    x = torch.tensor([ids], dtype=torch.long, device=model.device)
    out = model.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        generation_config=gen_config(),
    )
    seq = out.sequences[0].tolist()
    assert seq[: len(ids)] == list(ids)
    new = seq[len(ids):]
    assert len(new) == MAX_NEW_TOKENS, f"generate stopped early: {new}"
    steps = torch.stack([l[0].float().cpu() for l in out.logits])  # [8, V]
    return new, steps


@torch.no_grad()
def greedy_nocache(model, ids):
    cur = list(ids)
    steps = []
    for _ in range(MAX_NEW_TOKENS):
        last = forward_logits(model, cur)[-1]
        steps.append(last)
        cur.append(int(torch.argmax(last)))
    return cur[len(ids):], torch.stack(steps)


@torch.no_grad()
def explicit_positions_diff(model, ids, ref_logits):
    """Max |diff| between the default forward and one given position_ids 0..L-1 on all three mrope axes."""
    try:
        x = torch.tensor([ids], dtype=torch.long, device=model.device)
        pos = torch.arange(len(ids), device=model.device)[None, None, :].expand(3, 1, len(ids))
        out = model(input_ids=x, attention_mask=torch.ones_like(x), position_ids=pos)
        return float((out.logits[0].float().cpu() - ref_logits).abs().max())
    except Exception as e:  # noqa: BLE001
        return repr(e)


def top2_margin(row):
    v, _ = torch.topk(row, 2)
    return float(v[0] - v[1])


def write_f32(path, t):
    a = np.ascontiguousarray(t.detach().cpu().numpy().astype("<f4"))
    a.tofile(path)
    return list(a.shape)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def to_hub_form(cfg_dict, special):
    """Rewrite a transformers-5 config.json dict into the form of the published Qwen3-VL configs."""
    c = copy.deepcopy(cfg_dict)
    changes = []
    tc = c["text_config"]
    for k in ("bos_token_id", "eos_token_id"):
        if tc.get(k) is None:
            tc[k] = special[k]
            changes.append(f"text_config.{k} set to {special[k]} (save_pretrained did not write it)")
    rp = dict(tc.pop("rope_parameters"))
    theta = rp.pop("rope_theta")
    tc["rope_theta"] = int(theta) if float(theta).is_integer() else theta  # published: 5000000
    rope_scaling = {"mrope_interleaved": rp.pop("mrope_interleaved"), "mrope_section": rp.pop("mrope_section"),
                    "rope_type": rp.pop("rope_type", "default")}
    assert not rp, f"unexpected rope_parameters keys: {rp}"
    tc["rope_scaling"] = rope_scaling
    changes.append("text_config.rope_parameters {rope_type, rope_theta, mrope_section, mrope_interleaved} -> "
                   "text_config.rope_scaling {rope_type, mrope_section, mrope_interleaved} + text_config.rope_theta")
    if "dtype" in c and tc.get("dtype") != c["dtype"]:
        changes.append(f"text_config.dtype {tc.get('dtype')!r} -> {c['dtype']!r} (the checkpoint's dtype, "
                       "as in the published config)")
        tc["dtype"] = c["dtype"]
    vc = c["vision_config"]
    if vc.get("model_type") != "qwen3_vl":
        changes.append(f"vision_config.model_type {vc.get('model_type')!r} -> 'qwen3_vl' (as published)")
        vc["model_type"] = "qwen3_vl"
    if "rope_parameters" in c:
        c.pop("rope_parameters")
        changes.append("top-level rope_parameters dropped")
    dropped = []
    for where, d, keep in (("", c, HUB_TOP_KEYS), ("text_config.", tc, HUB_TEXT_KEYS),
                           ("vision_config.", c["vision_config"], HUB_VISION_KEYS)):
        for k in sorted(list(d.keys())):
            if k not in keep:
                dropped.append(f"{where}{k}={json.dumps(d[k])}")
                d.pop(k)
    if dropped:
        changes.append("dropped keys the published config does not have: " + ", ".join(dropped))
    missing = [k for k in HUB_TEXT_KEYS if k not in tc] + [k for k in HUB_TOP_KEYS if k not in c]
    if missing:
        changes.append("keys of the published config that this one still lacks: " + ", ".join(missing))
    c["transformers_version"] = "4.57.0.dev0"
    changes.append(f"transformers_version {cfg_dict.get('transformers_version')!r} -> '4.57.0.dev0'")
    return c, changes


def load_tokenizer(repo_root):
    cands = [os.path.join(repo_root, "tests/fixtures/tokenizer/tokenizer.json"),
             os.path.join(repo_root, ".fixture-work/tokenizer.json")]
    for p in cands:
        if os.path.exists(p):
            from tokenizers import Tokenizer
            return p, Tokenizer.from_file(p)
    raise SystemExit(f"no tokenizer.json at any of {cands}")


def check_with_transformers_tokenizer(path, rendered, ids):
    """Encode with transformers' fast tokenizer built from the same tokenizer.json."""
    try:
        from transformers import PreTrainedTokenizerFast
        tok = PreTrainedTokenizerFast(tokenizer_file=path)
        got = tok(rendered, add_special_tokens=False)["input_ids"]
        return got == ids, None
    except Exception as e:  # noqa: BLE001
        return None, repr(e)


def build_case(name, spec, out_root, repo_root, gpu_check):
    t0 = time.time()
    case_dir = os.path.join(out_root, name)
    os.makedirs(case_dir, exist_ok=True)
    for f in os.listdir(case_dir):
        os.remove(os.path.join(case_dir, f))
    V = spec["text"]["vocab_size"]

    # Prompts.
    tokenizer_info = None
    prompts = []
    if "prompt_texts" in spec:
        tpath, tok = load_tokenizer(repo_root)
        tokenizer_info = {"path_used": os.path.relpath(tpath, repo_root), "sha256": sha256_file(tpath),
                          "chat_template": CHAT_TEMPLATE}
        for text in spec["prompt_texts"]:
            rendered = CHAT_TEMPLATE.format(text=text)
            ids = tok.encode(rendered, add_special_tokens=False).ids
            same, err = check_with_transformers_tokenizer(tpath, rendered, ids)
            log(f"[{name}] prompt {text!r}: {len(ids)} ids {ids}; transformers tokenizer agrees: {same} {err or ''}")
            prompts.append({"text": text, "rendered": rendered, "ids": ids,
                            "transformers_tokenizer_agrees": same})
    else:
        rng = np.random.default_rng(spec["seed"])
        for L in spec["prompt_lengths"]:
            ids = [int(i) for i in rng.integers(0, TINY_PROMPT_ID_LIMIT, size=L)]
            prompts.append({"ids": ids})

    # Model: search (residual-branch gain, weight seed) until every greedy continuation is varied.
    # Tied embeddings make a random model echo its last token (h stays aligned with that token's
    # embedding); a larger gain on o_proj/down_proj lets the layers, not the input embedding,
    # dominate the final hidden state.
    cfg = build_config(spec)
    chosen = None
    best = None
    for gain in spec["branch_gains"]:
        for attempt in range(SEEDS_PER_GAIN):
            wseed = spec["seed"] * 100 + attempt
            seed_everything(wseed)
            model = new_model(cfg)
            assert is_tied(model) == spec["tie"], f"tying is {is_tied(model)}, wanted {spec['tie']}"
            redraw_weights(model, wseed, spec["emb_std"], spec["head_gain"], gain)
            distinct = []
            for p in prompts:
                new, _ = greedy(model, p["ids"])
                distinct.append(len(set(new)))
            log(f"[{name}] branch gain {gain}, weight seed {wseed}: distinct greedy ids per prompt {distinct}")
            if best is None or min(distinct) > best[0]:
                best = (min(distinct), gain, wseed)
            if min(distinct) >= MIN_DISTINCT_GREEDY:
                chosen = (gain, wseed)
                break
        if chosen:
            break
    if chosen is None:
        _, gain, wseed = best
        log(f"[{name}] WARNING: nothing gave >= {MIN_DISTINCT_GREEDY} distinct ids everywhere; best: gain {gain} seed {wseed}")
        chosen = (gain, wseed)
        seed_everything(wseed)
        model = new_model(cfg)
        redraw_weights(model, wseed, spec["emb_std"], spec["head_gain"], gain)
    branch_gain, chosen = chosen
    log(f"[{name}] chosen: branch gain {branch_gain}, weight seed {chosen}")

    mem_logits = [forward_logits(model, p["ids"]) for p in prompts]

    # Save.
    save_model = copy.deepcopy(model).to(spec["save_dtype"])
    save_kwargs = {}
    if spec["max_shard_size"]:
        save_kwargs["max_shard_size"] = spec["max_shard_size"]
    save_model.save_pretrained(case_dir, **save_kwargs)
    del save_model
    files = sorted(os.listdir(case_dir))
    log(f"[{name}] saved files: {files}")
    for extra in ("generation_config.json",):
        if extra in files:
            os.remove(os.path.join(case_dir, extra))
            files.remove(extra)
    st_files = [f for f in files if f.endswith(".safetensors")]
    if spec["max_shard_size"]:
        assert len(st_files) >= 2 and "model.safetensors.index.json" in files, files
    else:
        assert st_files == ["model.safetensors"], files

    cfg_path = os.path.join(case_dir, "config.json")
    with open(cfg_path) as f:
        saved_cfg = json.load(f)
    log(f"[{name}] config.json as save_pretrained wrote it:\n{json.dumps(saved_cfg, indent=2)}")
    config_changes = []
    if spec["hub_form"]:
        hub_cfg, config_changes = to_hub_form(saved_cfg, spec["special"])
        with open(cfg_path, "w") as f:
            json.dump(hub_cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        log(f"[{name}] rewritten hub-form config.json:\n{json.dumps(hub_cfg, indent=2, sort_keys=True)}")
        for c in config_changes:
            log(f"[{name}]   change: {c}")

    from safetensors import safe_open
    tensor_names = {}
    for sf in st_files:
        with safe_open(os.path.join(case_dir, sf), "pt") as h:
            for k in h.keys():
                tensor_names[k] = {"file": sf, "dtype": str(h.get_slice(k).get_dtype()),
                                   "shape": list(h.get_slice(k).get_shape())}
    log(f"[{name}] safetensors tensors ({len(tensor_names)}):")
    for k, v in tensor_names.items():
        log(f"    {k} {v['dtype']} {v['shape']} {v['file']}")

    # Reload exactly what is on disk, and compute the references from it.
    model2, info = Qwen3VLForConditionalGeneration.from_pretrained(
        case_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model2.eval()
    log(f"[{name}] loading info: { {k: sorted(v) if hasattr(v, '__iter__') else v for k, v in info.items()} }")
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info.get(k), f"{k}: {info.get(k)}"
    assert is_tied(model2) == spec["tie"]
    rd = model2.config.text_config.rope_parameters
    log(f"[{name}] reloaded text_config.rope_parameters: {rd}")
    sd1, sd2 = model.state_dict(), model2.state_dict()
    assert sorted(sd1) == sorted(sd2)
    wdiff = max(float((sd1[k] - sd2[k]).abs().max()) for k in sd1)
    log(f"[{name}] max |weight diff| in-memory vs reloaded: {wdiff}")
    assert wdiff == 0.0

    refs = []
    all_last = []
    max_abs = 0.0
    reload_diff = 0.0
    nocache_diff = 0.0
    nocache_ids_agree = True
    step0_diff = 0.0
    pos_diffs = []
    for i, p in enumerate(prompts):
        logits = forward_logits(model2, p["ids"])
        reload_diff = max(reload_diff, float((logits - mem_logits[i]).abs().max()))
        pd = explicit_positions_diff(model2, p["ids"], logits)
        pos_diffs.append(pd)
        last = logits[-1]
        new, steps = greedy(model2, p["ids"])
        nc_new, nc_steps = greedy_nocache(model2, p["ids"])
        nocache_ids_agree &= nc_new == new
        if nc_new == new:
            nocache_diff = max(nocache_diff, float((nc_steps - steps).abs().max()))
        step0_diff = max(step0_diff, float((steps[0] - last).abs().max()))
        assert [int(torch.argmax(s)) for s in steps] == new
        rec = {}
        if "text" in p:
            rec["text"] = p["text"]
            rec["rendered"] = p["rendered"]
            rec["transformers_tokenizer_agrees"] = p["transformers_tokenizer_agrees"]
        rec["ids"] = p["ids"]
        rec["last_logits_file"] = f"p{i}_last.f32"
        write_f32(os.path.join(case_dir, rec["last_logits_file"]), last)
        rec["last_argmax"] = int(torch.argmax(last))
        rec["last_top2_margin"] = top2_margin(last)
        if spec["all_logits_prompt"] == i:
            rec["all_logits_file"] = f"p{i}_all.f32"
            rec["all_logits_shape"] = write_f32(os.path.join(case_dir, rec["all_logits_file"]), logits)
            max_abs = max(max_abs, float(logits.abs().max()))
        rec["greedy_ids"] = new
        rec["greedy_min_top2_margin"] = min(top2_margin(s) for s in steps)
        if i == 0 and "prompt_texts" not in spec:
            rec["step_logits_file"] = f"p{i}_steps.f32"
            rec["step_logits_shape"] = write_f32(os.path.join(case_dir, rec["step_logits_file"]), steps)
            max_abs = max(max_abs, float(steps.abs().max()))
        all_last.append(last)
        max_abs = max(max_abs, float(last.abs().max()))
        refs.append(rec)
        log(f"[{name}] p{i} len {len(p['ids'])}: greedy {new} (distinct {len(set(new))}), "
            f"last std {float(last.std()):.3f}, argmax {rec['last_argmax']}, "
            f"min top2 margin {rec['greedy_min_top2_margin']:.4f}")
    cat = torch.cat(all_last)
    logits_std = float(cat.std())
    log(f"[{name}] logits std {logits_std:.4f}, max |logit| {max_abs:.4f}, in-mem vs reloaded logit diff "
        f"{reload_diff}, cache vs no-cache: ids agree {nocache_ids_agree}, max step-logit diff {nocache_diff:.3g}; "
        f"generate step 0 vs forward last diff {step0_diff:.3g}; default vs explicit 0..L-1 positions {pos_diffs}")

    gpu = None
    if gpu_check and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        mg = copy.deepcopy(model2).to("cuda")
        gd, gids = 0.0, True
        for i, p in enumerate(prompts):
            lg = forward_logits(mg, p["ids"])[-1]
            gd = max(gd, float((lg - all_last[i]).abs().max()))
            new, _ = greedy(mg, p["ids"])
            gids &= new == refs[i]["greedy_ids"]
        gpu = {"device": torch.cuda.get_device_name(0), "max_abs_last_logit_diff_vs_cpu": gd,
               "greedy_ids_agree": gids}
        log(f"[{name}] GPU fp32 (tf32 off) cross-check: {gpu}")
        del mg

    tc = spec["text"]
    notes = (
        f"Tiny random-weight Qwen3VLForConditionalGeneration ({'tied' if spec['tie'] else 'untied'} embeddings, "
        f"text hidden {tc['hidden_size']}, {tc['num_hidden_layers']} layers, {tc['num_attention_heads']} heads / "
        f"{tc['num_key_value_heads']} kv heads, head_dim {tc['head_dim']}, intermediate {tc['intermediate_size']}, "
        f"vocab {V}), checkpoint saved as {str(spec['save_dtype']).replace('torch.', '')}"
        f"{', sharded' if spec['max_shard_size'] else ''}"
        f"{', config.json rewritten to the published hub form' if spec['hub_form'] else ''}. "
        "References: CPU float32, eager attention, computed from the checkpoint reloaded from disk. "
        "last/all logits: one forward with input_ids + attention_mask only (default text-only positions 0..L-1 "
        "on all three mrope axes). greedy_ids: model.generate(max_new_tokens=8, do_sample=False, KV cache) with "
        "eos stopping disabled (eos_token_id=None in the generation config and in model.generation_config), so "
        "exactly 8 ids are produced even if an eos id comes up; step logits are generate's raw output_logits "
        "(no logits processors act in this greedy setting). Logits files are raw little-endian float32, "
        "row-major."
    )
    ref = {
        "case": name,
        "notes": notes,
        "prompts": refs,
        "vocab_size": V,
        "logits_std": logits_std,
        "max_abs_logit": max_abs,
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_stopping": "disabled (eos_token_id=None)",
        "special_token_ids": spec["special"],
        "prompt_id_range": None if "prompt_texts" in spec else [0, TINY_PROMPT_ID_LIMIT],
        "tokenizer": tokenizer_info,
        "weight_seed": chosen,
        "weight_init": {"scheme": redraw_weights.__doc__.strip(), "emb_std": spec["emb_std"],
                        "head_gain": spec["head_gain"], "branch_gain": branch_gain,
                        "rounded_to_bf16": True},
        "config_changes_after_save_pretrained": config_changes,
        "safetensors_tensors": tensor_names,
        "checks": {
            "weights_reloaded_bit_exact": True,
            "max_abs_logit_diff_in_memory_vs_reloaded": reload_diff,
            "greedy_kv_cache_vs_no_cache_ids_agree": nocache_ids_agree,
            "max_abs_step_logit_diff_kv_cache_vs_no_cache": nocache_diff,
            "max_abs_diff_generate_step0_vs_forward_last": step0_diff,
            "max_abs_diff_default_vs_explicit_positions_0_to_L-1": pos_diffs,
            "gpu": gpu,
        },
        "generated_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                           "python": sys.version.split()[0], "device": "cpu",
                           "command": "python3 tools/make_fixtures.py --out tests/fixtures/text"},
    }
    text = json.dumps(ref, indent=1, ensure_ascii=False)
    # Put lists of plain numbers (ids, shapes) on one line.
    text = re.sub(r"\[\s*(-?[\d.e+-]+(?:,\s*-?[\d.e+-]+)*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    assert json.loads(text) == json.loads(json.dumps(ref))
    with open(os.path.join(case_dir, "reference.json"), "w") as f:
        f.write(text + "\n")
    log(f"[{name}] done in {time.time() - t0:.1f}s: {sorted(os.listdir(case_dir))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder (e.g. tests/fixtures/text)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    ap.add_argument("--no-gpu-check", action="store_true", help="skip the fp32 GPU cross-check")
    args = ap.parse_args()
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    torch.use_deterministic_algorithms(True, warn_only=True)
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}")
    failed = []
    for name in args.cases.split(","):
        try:
            build_case(name, CASES[name], args.out, repo_root, not args.no_gpu_check)
        except Exception:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            failed.append(name)
    if failed:
        raise SystemExit(f"failed cases: {failed}")


if __name__ == "__main__":
    main()
