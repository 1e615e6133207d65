#!/usr/bin/env python3
"""GGUF test files, written independently of the engine with the `gguf` package from PyPI.

    make_gguf.py fixtures OUT      GGUF text + mmproj files of the small fixture checkpoints
                                   (tests/fixtures/text/*) in F32 / F16 / BF16 / Q8_0, each with
                                   ref/: the same checkpoint with the GGUF's weights dequantized
                                   by `gguf.quants.dequantize` to f32 (safetensors, HF names);
                                   plus k256/: a small random checkpoint whose rows are whole
                                   256-value super-blocks (for Q4_K / Q6_K), with a tokenizer.json
    make_gguf.py dequant TEXT MMPROJ CONFIG REF
                                   the f32 reference of GGUF files the engine wrote (every type
                                   dequantized by the package), into REF (safetensors + config)

Names and metadata keys are llama.cpp's for Qwen3-VL (see host/src/gguf/names.rs, meta.rs); this
script spells them out itself.
"""
import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------- safetensors, by hand

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        raw = data[s:e]
        if info["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif info["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            raise ValueError(info["dtype"])
        out[name] = a.reshape(info["shape"]).astype(np.float32)
    return out


def read_checkpoint(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(d, f)))
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- llama.cpp's names

TEXT_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
VISION_BLOCK = {"norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out",
                "mlp.linear_fc1": "ffn_up", "mlp.linear_fc2": "ffn_down"}


def gguf_name(hf, deepstack):
    """(file, name): file 'text' or 'mmproj'; None for the patch embedding."""
    if hf == "lm_head.weight":
        return "text", "output.weight"
    if hf.startswith("model.language_model."):
        r = hf[len("model.language_model."):]
        if r == "embed_tokens.weight":
            return "text", "token_embd.weight"
        if r == "norm.weight":
            return "text", "output_norm.weight"
        _, layer, rest = r.split(".", 2)
        module, kind = rest.rsplit(".", 1)
        return "text", f"blk.{layer}.{TEXT_LAYER[module]}.{kind}"
    r = hf[len("model.visual."):]
    module, kind = r.rsplit(".", 1)
    fixed = {"patch_embed.proj": "v.patch_embd", "pos_embed": "v.position_embd", "merger.norm": "v.post_ln",
             "merger.linear_fc1": "mm.0", "merger.linear_fc2": "mm.2"}
    if module == "patch_embed.proj" and kind == "weight":
        return "mmproj", None
    if module in fixed:
        return "mmproj", f"{fixed[module]}.{kind}"
    if module.startswith("blocks."):
        _, i, sub = module.split(".", 2)
        return "mmproj", f"v.blk.{i}.{VISION_BLOCK[sub]}.{kind}"
    _, k, sub = module.split(".", 2)
    return "mmproj", f"v.deepstack.{deepstack[int(k)]}.{ {'norm': 'norm', 'linear_fc1': 'fc1', 'linear_fc2': 'fc2'}[sub] }.{kind}"


# ---------------------------------------------------------------- tokenizers

def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def real_tokenizer():
    return json.load(open(os.path.join(ROOT, "tests/fixtures/tokenizer/tokenizer.json")))


def small_tokenizer(vocab_size):
    """Qwen's tokenizer cut to the 256 byte tokens (ids 0..255) and its added tokens shifted down
    by 150643 (as the fixtures' 1024-token vocabularies lay them out), no merges."""
    t = real_tokenizer()
    alpha = byte_alphabet()
    t["model"]["vocab"] = {alpha[b]: b for b in range(256)}
    t["model"]["merges"] = []
    t["added_tokens"] = [dict(a, id=a["id"] - 150643) for a in t["added_tokens"] if a["id"] - 150643 < vocab_size]
    return t


def add_tokenizer(w, tok, vocab_size):
    """tokenizer.ggml.* as llama.cpp's converter writes a gpt2 / qwen2 vocabulary."""
    n = max(vocab_size, max(list(tok["model"]["vocab"].values()) + [a["id"] for a in tok["added_tokens"]]) + 1)
    tokens, types = [f"[PAD{i}]" for i in range(n)], [gguf.TokenType.UNUSED] * n
    for s, i in tok["model"]["vocab"].items():
        tokens[i], types[i] = s, gguf.TokenType.NORMAL
    for a in tok["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_add_bos_token(False)


# ---------------------------------------------------------------- writing a model pair

def tensor_for(arr, qtype):
    """(data for add_tensor, raw_dtype, dequantized f32) of an f32 array stored as qtype."""
    if qtype == T.F32:
        return arr.astype(np.float32), None, arr.astype(np.float32)
    q = quants.quantize(arr.astype(np.float32), qtype)
    return q, qtype, quants.dequantize(q, qtype).reshape(arr.shape).astype(np.float32)


def write_pair(cfg, weights, tok, vocab_size, qtype, out):
    """model.gguf + mmproj.gguf of `weights` (HF names) in `qtype` (2-D weights whose rows fit
    its blocks; norms, biases and the vision position / patch embeddings in f32), and
    ref/{config.json, model.safetensors} with the dequantized values."""
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    tc, vc = cfg["text_config"], cfg["vision_config"]
    ds = vc["deepstack_visual_indexes"]
    rope = tc.get("rope_parameters") or tc.get("rope_scaling")
    theta = tc.get("rope_theta") or rope.get("rope_theta")
    tw = gguf.GGUFWriter(os.path.join(out, "model.gguf"), "qwen3vl")
    tw.add_context_length(tc["max_position_embeddings"])
    tw.add_embedding_length(tc["hidden_size"])
    tw.add_block_count(tc["num_hidden_layers"])
    tw.add_feed_forward_length(tc["intermediate_size"])
    tw.add_head_count(tc["num_attention_heads"])
    tw.add_head_count_kv(tc["num_key_value_heads"])
    tw.add_key_length(tc["head_dim"])
    tw.add_value_length(tc["head_dim"])
    tw.add_layer_norm_rms_eps(tc["rms_norm_eps"])
    tw.add_rope_freq_base(float(theta))
    tw.add_rope_dimension_sections(list(rope["mrope_section"]) + [0])
    tw.add_num_deepstack_layers(len(ds))
    tw.add_file_type(int(qtype))
    add_tokenizer(tw, tok, vocab_size)
    vw = gguf.GGUFWriter(os.path.join(out, "mmproj.gguf"), "clip")
    vw.add_type("mmproj")
    vw.add_clip_projector_type("qwen3vl_merger")
    vw.add_clip_has_vision_encoder(True)
    vw.add_vision_projection_dim(vc["out_hidden_size"])
    vw.add_vision_image_size(int(vc["num_position_embeddings"] ** 0.5) * vc["patch_size"])
    vw.add_vision_patch_size(vc["patch_size"])
    vw.add_vision_embedding_length(vc["hidden_size"])
    vw.add_vision_feed_forward_length(vc["intermediate_size"])
    vw.add_vision_block_count(vc["depth"])
    vw.add_vision_head_count(vc["num_heads"])
    vw.add_vision_image_mean([0.5, 0.5, 0.5])
    vw.add_vision_image_std([0.5, 0.5, 0.5])
    vw.add_vision_use_gelu(True)
    vw.add_vision_spatial_merge_size(vc["spatial_merge_size"])
    vw.add_vision_attention_layernorm_eps(tc["rms_norm_eps"])
    vw.add_vision_is_deepstack_layers([i in ds for i in range(vc["depth"])])
    ref = {}
    block = {T.Q8_0: 32}.get(qtype, 1)
    for hf in sorted(weights):
        a = weights[hf]
        f, name = gguf_name(hf, ds)
        if name is None:  # Conv3d [h, C, T, P, P] as T slices [h, C, P, P]
            for t in range(a.shape[2]):
                vw.add_tensor("v.patch_embd.weight" + ("" if t == 0 else f".{t}"), a[:, :, t].astype(np.float32))
            ref[hf] = a
            continue
        quantize = a.ndim == 2 and hf.endswith(".weight") and "pos_embed" not in hf and a.shape[1] % block == 0
        data, raw, deq = tensor_for(a, qtype if quantize else T.F32)
        (tw if f == "text" else vw).add_tensor(name, data, raw_dtype=raw)
        ref[hf] = deq
    for w in (tw, vw):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    json.dump(cfg, open(os.path.join(out, "ref", "config.json"), "w"), indent=1)
    write_safetensors(os.path.join(out, "ref", "model.safetensors"), ref)


def k256_checkpoint(out):
    """A random Qwen3-VL checkpoint whose text rows are whole 256-value blocks: hidden 256, 2
    layers, 4 heads / 2 KV heads of 64, intermediate 512, vocab 1024, untied; a tiny vision tower
    (hidden 64, merger rows of 256)."""
    rng = np.random.default_rng(256)
    h, inter, layers, heads, kvh, hd, vocab = 256, 512, 2, 4, 2, 64, 1024
    vh, vi, depth = 64, 128, 2
    cfg = json.load(open(os.path.join(ROOT, "tests/fixtures/text/tied_gqa/config.json")))
    tc, vc = cfg["text_config"], cfg["vision_config"]
    tc.update(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
              num_key_value_heads=kvh, head_dim=hd, vocab_size=vocab, tie_word_embeddings=False)
    tc["rope_parameters"]["mrope_section"] = [16, 8, 8]
    cfg["tie_word_embeddings"] = False
    vc.update(hidden_size=vh, intermediate_size=vi, depth=depth, num_heads=2, out_hidden_size=h, deepstack_visual_indexes=[0, 1])
    w = {}
    g = lambda *s, std=1.0: (rng.standard_normal(s) * std).astype(np.float32)
    p = "model.language_model."
    w[p + "embed_tokens.weight"] = g(vocab, h)
    w["lm_head.weight"] = g(vocab, h, std=3 / h ** 0.5)
    w[p + "norm.weight"] = 1 + g(h, std=0.1)
    for l in range(layers):
        q = f"{p}layers.{l}."
        for n, (o, i) in {"self_attn.q_proj": (heads * hd, h), "self_attn.k_proj": (kvh * hd, h), "self_attn.v_proj": (kvh * hd, h),
                          "self_attn.o_proj": (h, heads * hd), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter)}.items():
            w[f"{q}{n}.weight"] = g(o, i, std=(2 if "o_proj" in n or "down" in n else 1) / i ** 0.5)
        for n, s in {"input_layernorm": h, "post_attention_layernorm": h, "self_attn.q_norm": hd, "self_attn.k_norm": hd}.items():
            w[f"{q}{n}.weight"] = 1 + g(s, std=0.1)
    v = "model.visual."
    m = vh * 4
    w[v + "patch_embed.proj.weight"] = g(vh, 3, 2, 16, 16, std=1 / 1536 ** 0.5)
    w[v + "patch_embed.proj.bias"] = g(vh, std=0.05)
    w[v + "pos_embed.weight"] = g(vc["num_position_embeddings"], vh, std=0.5)
    for b in range(depth):
        q = f"{v}blocks.{b}."
        for n, (o, i) in {"attn.qkv": (3 * vh, vh), "attn.proj": (vh, vh), "mlp.linear_fc1": (vi, vh), "mlp.linear_fc2": (vh, vi)}.items():
            w[f"{q}{n}.weight"], w[f"{q}{n}.bias"] = g(o, i, std=1 / i ** 0.5), g(o, std=0.05)
        for n in ("norm1", "norm2"):
            w[f"{q}{n}.weight"], w[f"{q}{n}.bias"] = 1 + g(vh, std=0.1), g(vh, std=0.05)
    for name, norm in [("merger", vh)] + [(f"deepstack_merger_list.{k}", m) for k in range(2)]:
        q = f"{v}{name}."
        w[q + "norm.weight"], w[q + "norm.bias"] = 1 + g(norm, std=0.1), g(norm, std=0.05)
        w[q + "linear_fc1.weight"], w[q + "linear_fc1.bias"] = g(m, m, std=1 / m ** 0.5), g(m, std=0.05)
        w[q + "linear_fc2.weight"], w[q + "linear_fc2.bias"] = g(h, m, std=1 / m ** 0.5), g(h, std=0.05)
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump(small_tokenizer(vocab), open(os.path.join(out, "tokenizer.json"), "w"))
    write_safetensors(os.path.join(out, "model.safetensors"), w)


def fixtures(out):
    cases = {"tied_gqa": [T.F32, T.F16, T.Q8_0], "untied_mha": [T.BF16, T.Q8_0], "fullvocab": [T.F16, T.Q8_0]}
    for case, types in cases.items():
        d = os.path.join(ROOT, "tests/fixtures/text", case)
        cfg = json.load(open(os.path.join(d, "config.json")))
        weights = read_checkpoint(d)
        vocab = cfg["text_config"]["vocab_size"]
        tok = real_tokenizer() if case == "fullvocab" else small_tokenizer(vocab)
        for t in types:
            write_pair(cfg, weights, tok, vocab, t, os.path.join(out, f"{case}-{t.name}"))
    k256_checkpoint(os.path.join(out, "k256"))


def dequant(text, mmproj, config, ref):
    """Every tensor of two GGUF files dequantized by the package, under the HF names."""
    cfg = json.load(open(config))
    ds = cfg["vision_config"]["deepstack_visual_indexes"]
    inverse = {}
    names = [k for k in read_checkpoint(os.path.dirname(config))]
    for hf in names:
        f, n = gguf_name(hf, ds)
        if n is not None:
            inverse[n] = hf
    out, slices = {}, {}
    for path in (text, mmproj):
        r = gguf.GGUFReader(path)
        for t in r.tensors:
            shape = [int(x) for x in reversed(t.shape.tolist())]
            a = quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)
            if t.name.startswith("v.patch_embd.weight"):
                slices[0 if t.name.endswith("weight") else int(t.name.rsplit(".", 1)[1])] = a
            else:
                out[inverse[t.name]] = a
    out["model.visual.patch_embed.proj.weight"] = np.stack([slices[i] for i in sorted(slices)], axis=2)
    if cfg.get("tie_word_embeddings") and "lm_head.weight" in out:
        del out["lm_head.weight"]
    os.makedirs(ref, exist_ok=True)
    json.dump(cfg, open(os.path.join(ref, "config.json"), "w"), indent=1)
    write_safetensors(os.path.join(ref, "model.safetensors"), out)


if __name__ == "__main__":
    if sys.argv[1] == "fixtures":
        fixtures(sys.argv[2])
    elif sys.argv[1] == "dequant":
        dequant(*sys.argv[2:6])
    else:
        sys.exit(__doc__)
