#!/usr/bin/env python3
"""Writes a random-weight Qwen3-VL checkpoint of a published shape (for benchmarks).

    python3 tools/make_random_checkpoint.py --shape 2b --out /tmp/qwen3-vl-2b-random [--dtype bf16]

Produces config.json (hub form, as Qwen/Qwen3-VL-2B-Instruct publishes it) and model.safetensors
holding every text and vision tensor with the real names and shapes.
Pure Python (no numpy): values come from a block of Gaussian numbers (std 0.02, norms 1.0) that
is tiled over each tensor, which is fine for timing and keeps activations bounded.
"""
import argparse
import json
import os
import random
import struct

SHAPES = {
    "2b": {
        "text": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                     max_position_embeddings=262144),
        "vision": dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, in_channels=3,
                       patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2048,
                       num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17]),
        "tie": True,
    },
}


def tensors(spec):
    t, v = spec["text"], spec["vision"]
    h, d, i = t["hidden_size"], t["head_dim"], t["intermediate_size"]
    q, kv = t["num_attention_heads"] * d, t["num_key_value_heads"] * d
    out = [("model.language_model.embed_tokens.weight", [t["vocab_size"], h])]
    for l in range(t["num_hidden_layers"]):
        p = f"model.language_model.layers.{l}."
        out += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h]),
                (p + "self_attn.q_proj.weight", [q, h]), (p + "self_attn.k_proj.weight", [kv, h]),
                (p + "self_attn.v_proj.weight", [kv, h]), (p + "self_attn.o_proj.weight", [h, q]),
                (p + "self_attn.q_norm.weight", [d]), (p + "self_attn.k_norm.weight", [d]),
                (p + "mlp.gate_proj.weight", [i, h]), (p + "mlp.up_proj.weight", [i, h]),
                (p + "mlp.down_proj.weight", [h, i])]
    out.append(("model.language_model.norm.weight", [h]))
    if not spec["tie"]:
        out.append(("lm_head.weight", [t["vocab_size"], h]))
    vh, vi, ps, tp = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["temporal_patch_size"]
    m = vh * v["spatial_merge_size"] ** 2
    out += [("model.visual.patch_embed.proj.weight", [vh, v["in_channels"], tp, ps, ps]),
            ("model.visual.patch_embed.proj.bias", [vh]),
            ("model.visual.pos_embed.weight", [v["num_position_embeddings"], vh])]
    for b in range(v["depth"]):
        p = f"model.visual.blocks.{b}."
        out += [(p + "norm1.weight", [vh]), (p + "norm1.bias", [vh]), (p + "norm2.weight", [vh]), (p + "norm2.bias", [vh]),
                (p + "attn.qkv.weight", [3 * vh, vh]), (p + "attn.qkv.bias", [3 * vh]),
                (p + "attn.proj.weight", [vh, vh]), (p + "attn.proj.bias", [vh]),
                (p + "mlp.linear_fc1.weight", [vi, vh]), (p + "mlp.linear_fc1.bias", [vi]),
                (p + "mlp.linear_fc2.weight", [vh, vi]), (p + "mlp.linear_fc2.bias", [vh])]
    mergers = [("model.visual.merger.", vh)] + [(f"model.visual.deepstack_merger_list.{k}.", m) for k in range(len(v["deepstack_visual_indexes"]))]
    for p, norm in mergers:
        out += [(p + "norm.weight", [norm]), (p + "norm.bias", [norm]),
                (p + "linear_fc1.weight", [m, m]), (p + "linear_fc1.bias", [m]),
                (p + "linear_fc2.weight", [t["hidden_size"], m]), (p + "linear_fc2.bias", [t["hidden_size"]])]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="2b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    spec = SHAPES[a.shape]
    rng = random.Random(a.seed)
    size = 2 if a.dtype == "bf16" else 4

    def pack(values):
        if a.dtype == "f32":
            return struct.pack(f"<{len(values)}f", *values)
        raw = struct.pack(f"<{len(values)}f", *values)
        return b"".join(raw[k + 2:k + 4] for k in range(0, len(raw), 4))  # top halves: bf16

    block_n = 1 << 16
    gauss = pack([rng.gauss(0.0, 0.02) for _ in range(block_n)])
    ones = pack([1.0 + rng.gauss(0.0, 0.02) for _ in range(block_n)])
    entries, header, offset = tensors(spec), {}, 0
    for name, shape in entries:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16" if a.dtype == "bf16" else "F32", "shape": shape, "data_offsets": [offset, offset + n * size]}
        offset += n * size
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name, shape in entries:
            nbytes = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            src = ones if (name.endswith("norm.weight") or name.endswith("norm1.weight") or name.endswith("norm2.weight")) else gauss
            while nbytes > 0:
                chunk = src[: min(nbytes, len(src))]
                f.write(chunk)
                nbytes -= len(chunk)
    t, v = spec["text"], spec["vision"]
    cfg = {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
        "tie_word_embeddings": spec["tie"],
        "text_config": dict(t, model_type="qwen3_vl_text", hidden_act="silu", attention_bias=False, attention_dropout=0.0,
                            bos_token_id=151643, eos_token_id=151645, rope_theta=5000000, tie_word_embeddings=spec["tie"],
                            rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True},
                            dtype="bfloat16" if a.dtype == "bf16" else "float32", use_cache=True),
        "vision_config": dict(v, model_type="qwen3_vl", hidden_act="gelu_pytorch_tanh", initializer_range=0.02),
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"wrote {a.out}: {len(entries)} tensors, {offset / 1e9:.2f} GB of {a.dtype}")


if __name__ == "__main__":
    main()
