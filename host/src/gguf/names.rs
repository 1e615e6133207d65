//! The tensor names llama.cpp's converter gives Qwen3-VL (`convert_hf_to_gguf.py`,
//! `Qwen3VLTextModel` / `Qwen3VLVisionModel`), mapped from the Hugging Face checkpoint names the
//! model code asks for.
//!
//! Text model (arch `qwen3vl`): `token_embd`, `output_norm`, `output` (absent when tied), and
//! per layer `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm,
//! ffn_norm, ffn_gate, ffn_up, ffn_down}`.
//!
//! Vision tower (an mmproj file, arch `clip`): `v.patch_embd.weight` and `.weight.1` (the
//! Conv3d kernel's two temporal slices), `v.patch_embd.bias`, `v.position_embd.weight`,
//! per block `v.blk.N.{ln1, attn_qkv, attn_out, ln2, ffn_up, ffn_down}`, the merger as
//! `v.post_ln` (its norm), `mm.0` and `mm.2` (its two linears), and DeepStack merger `k` as
//! `v.deepstack.I.{norm, fc1, fc2}` where `I` is the vision block it follows
//! (`deepstack_visual_indexes[k]`).

/// The text model's tensor name for a checkpoint name, if it belongs to the text model.
pub fn text_name(hf: &str) -> Option<String> {
    if hf == "lm_head.weight" {
        return Some("output.weight".into());
    }
    let rest = hf.strip_prefix("model.language_model.")?;
    match rest {
        "embed_tokens.weight" => return Some("token_embd.weight".into()),
        "norm.weight" => return Some("output_norm.weight".into()),
        _ => {}
    }
    let rest = rest.strip_prefix("layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    let g = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{}.{}.{}", layer, g, kind))
}

/// The checkpoint name of the patch embedding (stored in an mmproj as two temporal slices).
pub const PATCH_EMBED: &str = "model.visual.patch_embed.proj.weight";
/// The mmproj names of its temporal slices 0 and 1.
pub const PATCH_SLICES: [&str; 2] = ["v.patch_embd.weight", "v.patch_embd.weight.1"];

/// The mmproj tensor name for a vision checkpoint name (`deepstack` maps DeepStack merger
/// numbers to the vision blocks they follow). [`PATCH_EMBED`] has no single name.
pub fn vision_name(hf: &str, deepstack: &[usize]) -> Option<String> {
    let rest = hf.strip_prefix("model.visual.")?;
    let (module, kind) = rest.rsplit_once('.')?;
    let fixed = match module {
        "patch_embed.proj" if kind == "bias" => Some("v.patch_embd".to_string()),
        "pos_embed" => Some("v.position_embd".to_string()),
        "merger.norm" => Some("v.post_ln".to_string()),
        "merger.linear_fc1" => Some("mm.0".to_string()),
        "merger.linear_fc2" => Some("mm.2".to_string()),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(format!("{}.{}", f, kind));
    }
    if let Some(r) = module.strip_prefix("blocks.") {
        let (i, sub) = r.split_once('.')?;
        let i: usize = i.parse().ok()?;
        let g = match sub {
            "norm1" => "ln1",
            "norm2" => "ln2",
            "attn.qkv" => "attn_qkv",
            "attn.proj" => "attn_out",
            "mlp.linear_fc1" => "ffn_up",
            "mlp.linear_fc2" => "ffn_down",
            _ => return None,
        };
        return Some(format!("v.blk.{}.{}.{}", i, g, kind));
    }
    if let Some(r) = module.strip_prefix("deepstack_merger_list.") {
        let (k, sub) = r.split_once('.')?;
        let layer = *deepstack.get(k.parse::<usize>().ok()?)?;
        let g = match sub {
            "norm" => "norm",
            "linear_fc1" => "fc1",
            "linear_fc2" => "fc2",
            _ => return None,
        };
        return Some(format!("v.deepstack.{}.{}.{}", layer, g, kind));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_cpp() {
        assert_eq!(text_name("model.language_model.embed_tokens.weight").unwrap(), "token_embd.weight");
        assert_eq!(text_name("model.language_model.layers.27.self_attn.o_proj.weight").unwrap(), "blk.27.attn_output.weight");
        assert_eq!(text_name("model.language_model.layers.3.self_attn.k_norm.weight").unwrap(), "blk.3.attn_k_norm.weight");
        assert_eq!(text_name("model.language_model.layers.0.mlp.down_proj.weight").unwrap(), "blk.0.ffn_down.weight");
        assert_eq!(text_name("lm_head.weight").unwrap(), "output.weight");
        assert!(text_name("model.visual.pos_embed.weight").is_none());
        let ds = [5, 11, 17];
        assert_eq!(vision_name("model.visual.blocks.4.attn.qkv.bias", &ds).unwrap(), "v.blk.4.attn_qkv.bias");
        assert_eq!(vision_name("model.visual.merger.linear_fc2.weight", &ds).unwrap(), "mm.2.weight");
        assert_eq!(vision_name("model.visual.deepstack_merger_list.1.linear_fc1.weight", &ds).unwrap(), "v.deepstack.11.fc1.weight");
        assert_eq!(vision_name("model.visual.patch_embed.proj.bias", &ds).unwrap(), "v.patch_embd.bias");
        assert!(vision_name("model.visual.deepstack_merger_list.3.norm.weight", &ds).is_none());
    }
}
