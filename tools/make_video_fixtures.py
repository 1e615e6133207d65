#!/usr/bin/env python3
"""Video test fixtures: the clips, and transformers' references for them.

Two steps, on two machines:

    python3 tools/make_video_fixtures.py files --out tests/fixtures/video
        Writes the clips (needs numpy, Pillow and an ffmpeg executable with FFV1 and libx264):
        exact-palette animated GIFs, a lossless animated WebP, a lossless FFV1/RGB Matroska file
        and a lossy H.264 MP4,
        plus video_preprocessor_config.json (small pixel bounds, so that the exact clips are
        not resized).

    python3 tools/make_video_fixtures.py refs --out tests/fixtures/video
        On a machine with torch, transformers (>= 5), Pillow, numpy and OpenCV: decodes each
        clip as transformers' loaders would (Pillow for GIF, OpenCV for the rest), runs
        Qwen3VLProcessor (tokenizer + Qwen3VLVideoProcessor from the committed config) and the
        tiny checkpoint of tests/fixtures/vision (float32, eager attention, CPU), and writes
        <case>.json with the sampled frame indices, video_grid_thw, the rendered prompt, its
        input ids, the position ids, and <case>_pixel_values.f32 / <case>_last_logits.f32.

The frame rate given to the processor: a GIF's or WebP's frame count over its summed frame
delays (a delay under 2 hundredths counts as 10, as ffmpeg's demuxer does); OpenCV's CAP_PROP_FPS for the
rest. The total frame count: the frames decoded.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

CONFIG = {
    "processor_class": "Qwen3VLProcessor",
    "video_processor_type": "Qwen3VLVideoProcessor",
    "size": {"shortest_edge": 4096, "longest_edge": 1048576},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
    "do_sample_frames": True,
}

# name: (file, frames, height, width, frame delay in hundredths (GIF) or fps (ffmpeg), text)
CLIPS = {
    "gif_exact": ("gif_exact_12x64x96.gif", 12, 64, 96, 10, "What happens in this video?"),
    "gif_resized": ("gif_resized_9x50x70.gif", 9, 50, 70, 20, "Describe it."),
    "gif_three": ("gif_three_3x32x64.gif", 3, 32, 64, 10, "And this one?"),
    "mkv_lossless": ("ffv1_20x64x64.mkv", 20, 64, 64, 25, "What moves?"),
    "webp_lossless": ("webp_lossless_8x64x96.webp", 8, 64, 96, 150, "What changes?"),
    "mp4_h264": ("h264_30x64x96.mp4", 30, 64, 96, 15, "Summarize the clip."),
}

CHAT = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def frame(h, w, k, n, seed):
    """A moving gradient with a box that travels across the frame."""
    y = np.linspace(0.0, 1.0, h)[:, None] * np.ones((1, w))
    x = np.linspace(0.0, 1.0, w)[None, :] * np.ones((h, 1))
    ph = k / max(n, 1)
    r = 200.0 * ((x + ph) % 1.0) + 30.0
    g = 180.0 * y + 40.0
    b = 127.5 + 100.0 * np.sin(2.0 * np.pi * (x + 2.0 * y + ph + seed / 5.0))
    img = np.stack([r, g, b], axis=-1)
    bx = int((w - w // 4) * ph)
    img[h // 3:h // 3 + h // 4, bx:bx + w // 4] = [250.0, 20.0, 40.0]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def palette_216():
    levels = [0, 51, 102, 153, 204, 255]
    return np.array([[r, g, b] for r in levels for g in levels for b in levels], dtype=np.uint8)


def quantize(img, pal):
    """Nearest colour of the 6x6x6 palette: every GIF pixel is exactly a palette entry."""
    q = np.rint(img.astype(np.float64) / 51.0).astype(np.int64)
    idx = q[..., 0] * 36 + q[..., 1] * 6 + q[..., 2]
    return idx.astype(np.uint8), pal[idx]


def make_files(out):
    from PIL import Image
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "video_preprocessor_config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    pal = palette_216()
    flat_pal = list(pal.reshape(-1)) + [0] * (768 - pal.size)
    for name, (file, n, h, w, rate, _) in CLIPS.items():
        path = os.path.join(out, file)
        frames = [frame(h, w, k, n, len(name)) for k in range(n)]
        if file.endswith(".webp"):
            # lossless; Pillow's encoder stores changed rectangles, blended or not: the decoder's
            # compositing is exercised
            ims = [Image.fromarray(fr) for fr in frames]
            ims[0].save(path, save_all=True, append_images=ims[1:], duration=rate, loop=0, lossless=True, quality=100, method=4)
            back = Image.open(path)
            assert back.n_frames == n, (path, back.n_frames)
        elif file.endswith(".gif"):
            ims = []
            for fr in frames:
                idx, _ = quantize(fr, pal)
                im = Image.fromarray(idx, mode="P")
                im.putpalette(flat_pal)
                ims.append(im)
            ims[0].save(path, save_all=True, append_images=ims[1:], duration=rate * 10, loop=0, optimize=False, disposal=1)
            back = Image.open(path)
            assert back.n_frames == n, (path, back.n_frames)
        else:
            raw = b"".join(fr.tobytes() for fr in frames)
            if file.endswith(".mkv"):
                codec = ["-c:v", "ffv1", "-pix_fmt", "bgr0"]
            else:
                codec = ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", "18", "-preset", "medium", "-movflags", "+faststart"]
            cmd = ["ffmpeg", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", str(rate), "-i", "-"] + codec + ["-frames:v", str(n), path]
            subprocess.run(cmd, input=raw, check=True)
        log(f"{file}: {n} frames {w}x{h}, {os.path.getsize(path)} bytes")


# ---------------------------------------------------------------------------------------------
# References


def decode(path):
    """Frames (RGB uint8, [T, H, W, 3]) and fps, as transformers' loaders would get them."""
    if path.endswith((".gif", ".webp")):
        from PIL import Image, ImageSequence
        im = Image.open(path)
        frames, cs = [], 0.0
        for fr in ImageSequence.Iterator(im):
            frames.append(np.asarray(fr.convert("RGB")))  # (a WebP frame's duration is set once loaded)
            d = (fr.info.get("duration") or 0) / 10.0
            cs += 10.0 if d < 2.0 else d
        return np.stack(frames), len(frames) / (cs / 100.0)
    import cv2
    cap = cv2.VideoCapture(path)
    fps = cap.get(cv2.CAP_PROP_FPS)
    frames = []
    while True:
        ok, fr = cap.read()
        if not ok:
            break
        frames.append(cv2.cvtColor(fr, cv2.COLOR_BGR2RGB))
    return np.stack(frames), fps


def write_f32(out, name, t):
    a = np.ascontiguousarray(np.asarray(t, dtype="<f4"))
    a.tofile(os.path.join(out, name))
    return {"file": name, "shape": list(a.shape)}


def make_refs(out):
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    log(f"transformers {transformers.__version__}, torch {torch.__version__}")
    from transformers import Qwen3VLVideoProcessor
    vp = Qwen3VLVideoProcessor.from_pretrained(out)
    log("video processor:", vp.to_dict())
    import inspect
    log("resize:", inspect.getsource(type(vp).resize)[:1500])
    try:
        from transformers import video_processing_utils as vpu
        log("base resize:", inspect.getsource(vpu.BaseVideoProcessor.resize)[:1500])
    except Exception as e:  # noqa: BLE001
        log("no base resize source:", repr(e))
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(repo, "tests/fixtures/tokenizer/tokenizer.json"))
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    ip = Qwen2VLImageProcessorPil.from_pretrained(os.path.join(repo, "tests/fixtures/vision/tiny"))
    proc = Qwen3VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp)
    model = Qwen3VLForConditionalGeneration.from_pretrained(os.path.join(repo, "tests/fixtures/vision/tiny"), dtype=torch.float32, attn_implementation="eager")
    model.eval()
    video_id = tok.convert_tokens_to_ids("<|video_pad|>")
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__, "processor": vp.to_dict(), "cases": []}
    for name, (file, n, h, w, rate, text) in CLIPS.items():
        path = os.path.join(out, file)
        frames, fps = decode(path)
        md = VideoMetadata(total_num_frames=len(frames), fps=fps, width=frames.shape[2], height=frames.shape[1], duration=len(frames) / fps)
        rendered_template = CHAT.format(content=VIDEO + text)
        kw = dict(text=[rendered_template], videos=[frames], video_metadata=[md], do_sample_frames=True, return_tensors="pt", return_metadata=True)
        r = proc(**kw)
        ids = r["input_ids"][0].tolist()
        pv = r["pixel_values_videos"].float()
        grid = r["video_grid_thw"].long()
        used = r.get("video_metadata")
        indices = None
        if used is not None:
            m0 = used[0]
            indices = [int(i) for i in (m0.frames_indices if hasattr(m0, "frames_indices") else m0["frames_indices"])]
        rendered = tok.decode(ids, skip_special_tokens=False)
        mm = (torch.tensor([ids]) == video_id).long() * 2
        log(f"{name}: processor outputs {sorted(r.keys())}")
        if "mm_token_type_ids" in r:
            mm = r["mm_token_type_ids"].long()
        ones = torch.ones(1, len(ids), dtype=torch.long)
        with torch.no_grad():
            o = model(input_ids=torch.tensor([ids]), attention_mask=ones, pixel_values_videos=pv, video_grid_thw=grid, mm_token_type_ids=mm)
            last = o.logits[0, -1].float()
            try:
                rope = model.model.get_rope_index(input_ids=torch.tensor([ids]), mm_token_type_ids=mm, image_grid_thw=None, video_grid_thw=grid, attention_mask=ones)
            except TypeError as e:
                log("get_rope_index without mm_token_type_ids:", repr(e))
                rope = model.model.get_rope_index(input_ids=torch.tensor([ids]), image_grid_thw=None, video_grid_thw=grid, attention_mask=ones)
        pos = rope[0][:, 0, :].long()
        rec = {
            "case": name, "file": file, "frames": len(frames), "fps": fps, "height": int(frames.shape[1]), "width": int(frames.shape[2]),
            "frames_indices": indices, "video_grid_thw": grid.tolist(), "rendered": rendered, "input_ids": ids,
            "position_ids": pos.tolist(), "next_position": int(pos.max()) + 1,
            "pixel_values": write_f32(out, f"{name}_pixel_values.f32", pv.numpy()),
            "last_logits": write_f32(out, f"{name}_last_logits.f32", last.numpy()),
            "logits_std": float(last.std()), "last_argmax": int(last.argmax()),
        }
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
        manifest["cases"].append(name)
        log(f"{name}: {len(frames)} frames at {fps:.3f} fps, indices {indices}, grid {grid.tolist()}, {len(ids)} ids, logits std {rec['logits_std']:.4f}")
    # an image, then a video, in one user turn: placeholders, positions and DeepStack rows of both
    from PIL import Image
    img = Image.open(os.path.join(repo, "tests/fixtures/vision/a_64x96.png")).convert("RGB")
    frames, fps = decode(os.path.join(out, CLIPS["gif_exact"][0]))
    md = VideoMetadata(total_num_frames=len(frames), fps=fps, width=frames.shape[2], height=frames.shape[1], duration=len(frames) / fps)
    text = CHAT.format(content="<|vision_start|><|image_pad|><|vision_end|>" + VIDEO + "Which comes first?")
    r = proc(text=[text], images=[img], videos=[frames], video_metadata=[md], do_sample_frames=True, return_tensors="pt", return_metadata=True)
    ids = r["input_ids"][0].tolist()
    ones = torch.ones(1, len(ids), dtype=torch.long)
    with torch.no_grad():
        o = model(input_ids=torch.tensor([ids]), attention_mask=ones, pixel_values=r["pixel_values"], image_grid_thw=r["image_grid_thw"],
                  pixel_values_videos=r["pixel_values_videos"], video_grid_thw=r["video_grid_thw"], mm_token_type_ids=r["mm_token_type_ids"])
        last = o.logits[0, -1].float()
    rec = {"case": "image_and_video", "image": "tests/fixtures/vision/a_64x96.png", "file": CLIPS["gif_exact"][0], "input_ids": ids,
           "rendered": tok.decode(ids, skip_special_tokens=False), "image_grid_thw": r["image_grid_thw"].tolist(), "video_grid_thw": r["video_grid_thw"].tolist(),
           "last_logits": write_f32(out, "image_and_video_last_logits.f32", last.numpy()), "logits_std": float(last.std())}
    with open(os.path.join(out, "image_and_video.json"), "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
    manifest["cases"].append("image_and_video")
    log(f"image_and_video: {len(ids)} ids, grids {rec['image_grid_thw']} {rec['video_grid_thw']}, logits std {rec['logits_std']:.4f}")
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["files", "refs"])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.step == "files":
        make_files(a.out)
    else:
        make_refs(a.out)


if __name__ == "__main__":
    sys.exit(main())
