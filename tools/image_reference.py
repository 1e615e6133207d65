#!/usr/bin/env python3
"""Reference data for the Rust image input (host/src/image), made with Pillow and transformers.

    pip install pillow numpy transformers    # torch is not needed
    python3 tools/image_reference.py

It writes small deterministic test images into tests/fixtures/images/ and, for each, what
transformers does with it:

* `<name>.rgb`: the decoded image as the processor resizes it: what
  `transformers.image_utils.load_image` returns (Pillow decode, `ImageOps.exif_transpose`,
  `convert("RGB")`) after the processor's own `convert_to_rgb` (which paints the pixels of a
  PNG tRNS color key white), raw 8-bit RGB, row-major;
* for some images `<name>.<config>.f32`: the `pixel_values` (raw little-endian float32) that
  transformers' slow, PIL-based `Qwen2VLImageProcessorPil` makes of that RGB image;
* resize_sweep.u8: Pillow's bicubic resize of gradient_64x96.png to the sizes in RESIZE_SWEEP;
* reference.json: sizes, `image_grid_thw` for every image under the configs below, and, where
  the full patches are not stored, their sum and every `stride`-th value (about SAMPLES).

Configs: "qwen3" is Qwen3-VL-2B-Instruct's preprocessor_config.json (min 65536 px, max 16777216
px, patch 16, merge 2, temporal 2, mean = std = 0.5); "small" lowers min_pixels to 4096 so that
small images can stay unresized; "capped" (big_200x300.png only) lowers max_pixels to 32*32*20
to force a downscale.

One deliberate deviation: Pillow opens 16-bit grayscale PNGs as mode "I;16" and its
`convert("RGB")` clips values above 255 (nearly every pixel turns white). The Rust decoder keeps
the high byte instead, as Pillow itself does for 16-bit RGB, RGBA and gray+alpha PNGs; the
reference for gray16.png is that high byte (see DEVIATIONS in reference.json).
"""

import json
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
from PIL import Image
from transformers.image_transforms import convert_to_rgb
from transformers.image_utils import load_image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "images"
SAMPLES = 97  # about this many values of each output not stored in full

QWEN3 = dict(
    size={"shortest_edge": 65536, "longest_edge": 16777216},
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)
CONFIGS = {
    "qwen3": QWEN3,
    "small": dict(QWEN3, size={"shortest_edge": 4096, "longest_edge": 16777216}),
    "capped": dict(QWEN3, size={"shortest_edge": 65536, "longest_edge": 32 * 32 * 20}),
}


def pattern(h, w, seed):
    """Gradients, noise and saturated blocks (to exercise bicubic overshoot and clipping)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255.0 / max(w - 1, 1), y * 255.0 / max(h - 1, 1), (x + y) % 64 * 4.0], -1)
    img += rng.normal(0, 18, img.shape)
    img[h // 4 : h // 2, w // 5 : w // 3] = [255, 255, 255]
    img[h // 2 : h // 2 + max(h // 6, 1), w // 2 : w // 2 + max(w // 7, 1)] = [0, 0, 0]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def write_png(path, arr, color_type, bit_depth):
    """A minimal PNG writer, for the 16-bit color types Pillow cannot save."""
    h = arr.shape[0]
    dtype = ">u2" if bit_depth == 16 else np.uint8
    rows = np.ascontiguousarray(arr.astype(dtype)).view(np.uint8).reshape(h, -1)
    raw = b"".join(b"\x00" + rows[i].tobytes() for i in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", arr.shape[1], h, bit_depth, color_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def exif_bytes(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def make_images():
    """Writes the test images; returns {file name: note}."""
    made = {}

    def save(name, im, note, **kw):
        im.save(OUT / name, **kw)
        made[name] = note

    save("gradient_64x96.png", Image.fromarray(pattern(64, 96, 1)), "RGB, multiple of 32")
    save("photo_50x70.jpg", Image.fromarray(pattern(50, 70, 2)), "baseline JPEG 4:2:0", quality=90)
    save("progressive_40x56.jpg", Image.fromarray(pattern(40, 56, 3)), "progressive JPEG",
         quality=85, progressive=True)
    save("wide_40x300.png", Image.fromarray(pattern(40, 300, 4)), "aspect 7.5")
    rgba = np.dstack([pattern(48, 80, 5), np.linspace(0, 255, 48 * 80).reshape(48, 80).astype(np.uint8)])
    save("rgba_48x80.png", Image.fromarray(rgba, "RGBA"), "RGBA (alpha dropped)")
    save("gray_30x45.png", Image.fromarray(pattern(30, 45, 6)[..., 0], "L"), "grayscale")
    la = np.dstack([pattern(20, 26, 7)[..., 1], pattern(20, 26, 8)[..., 2]])
    save("gray_alpha_20x26.png", Image.fromarray(la, "LA"), "gray + alpha")
    save("bilevel_17x23.png", Image.fromarray(pattern(17, 23, 9)[..., 0] > 127), "1-bit")
    pal = Image.fromarray(pattern(27, 33, 10)).quantize(colors=37)
    save("palette_27x33.png", pal, "palette, tRNS key (index 5 turns white)", transparency=5)
    pal_alpha = Image.fromarray(np.dstack([pattern(19, 21, 17), pattern(19, 21, 18)[..., 0]]), "RGBA")
    save("palette_alpha_19x21.png", pal_alpha.quantize(colors=20), "palette with per-entry alpha (dropped)")
    save("gray_key_22x25.png", Image.fromarray(pattern(22, 25, 19)[..., 1] // 32 * 32, "L"),
         "gray, tRNS key 96", transparency=96)
    save("rgb_key_18x23.png", Image.fromarray(pattern(18, 23, 20) // 128 * 128), "RGB, tRNS key",
         transparency=(128, 128, 0))
    save("cmyk_24x32.jpg", Image.fromarray(pattern(24, 32, 11)).convert("CMYK"), "CMYK JPEG", quality=95)
    webp = Image.fromarray(pattern(36, 40, 12))
    save("lossless_36x40.webp", webp, "lossless WebP (VP8L)", lossless=True)
    save("lossy_36x40.webp", webp, "lossy WebP (VP8)", quality=80)
    alpha = np.dstack([pattern(36, 40, 13), np.full((36, 40), 200, np.uint8)])
    save("lossy_alpha_36x40.webp", Image.fromarray(alpha, "RGBA"), "lossy WebP + ALPH (VP8X)", quality=80)
    save("big_200x300.png", Image.fromarray(pattern(200, 300, 14) // 4 * 4), "downscaled by 'capped'")
    write_png(OUT / "rgb16_22x18.png", np.random.default_rng(15).integers(0, 65536, (22, 18, 3)), 2, 16)
    made["rgb16_22x18.png"] = "16-bit RGB"
    write_png(OUT / "gray16_21x19.png", np.random.default_rng(16).integers(0, 65536, (21, 19)), 0, 16)
    made["gray16_21x19.png"] = "16-bit gray (see DEVIATIONS)"
    for o in range(1, 9):
        save(f"exif_o{o}_6x10.png", Image.fromarray(pattern(6, 10, 20 + o)), f"PNG eXIf orientation {o}",
             exif=exif_bytes(o))
    save("exif_o6_32x48.jpg", Image.fromarray(pattern(32, 48, 30)), "JPEG EXIF orientation 6",
         quality=92, exif=exif_bytes(6))
    save("exif_o3_32x48.jpg", Image.fromarray(pattern(32, 48, 31)), "JPEG EXIF orientation 3",
         quality=92, exif=exif_bytes(3))
    save("exif_o8_20x30.webp", Image.fromarray(pattern(20, 30, 32)), "lossless WebP EXIF orientation 8",
         lossless=True, exif=exif_bytes(8))
    return made


# (width, height) targets for resize_sweep.u8, from gradient_64x96.png (96 wide, 64 high).
# Pillow 13 runs the vertical pass first for (250, 8), (130, 30) and (90, 20) (the height shrinks
# by more than twice as many pixels as the width), the horizontal pass first for the others.
RESIZE_SWEEP = [(1, 1), (3, 200), (7, 5), (16, 16), (31, 45), (97, 65), (31, 128), (13, 200), (47, 47),
                (96, 17), (250, 8), (33, 64), (130, 30), (90, 20), (19, 61), (112, 70)]
BIG = "big_200x300.png"
# (image, config) pairs whose full patches are stored; the rest get sum + samples.
FULL = {
    ("gradient_64x96.png", "small"),
    ("photo_50x70.jpg", "small"),
    ("wide_40x300.png", "small"),
    ("rgba_48x80.png", "small"),
    (BIG, "capped"),
}


def reference_rgb(name):
    """The image handed to the processor, and the RGB array that the processor resizes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Palette images with Transparency expressed in bytes"
        if name.startswith("gray16"):
            raw = np.array(Image.open(OUT / name), dtype=np.uint16)
            img = Image.fromarray(np.repeat((raw >> 8).astype(np.uint8)[..., None], 3, -1))
        else:
            img = load_image(str(OUT / name))
        return img, np.asarray(convert_to_rgb(img, return_numpy=True), dtype=np.uint8)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    notes = make_images()
    processors = {k: Qwen2VLImageProcessorPil(**v) for k, v in CONFIGS.items()}
    entries = []
    for name in sorted(notes):
        rgb, arr = reference_rgb(name)
        stem = name.rsplit(".", 1)[0]
        entry = {"file": name, "note": notes[name], "height": arr.shape[0], "width": arr.shape[1], "configs": {}}
        if name != BIG:  # the big PNG's decode is lossless like the others; its RGB is not kept
            entry["rgb"] = f"{stem}.rgb"
            (OUT / entry["rgb"]).write_bytes(arr.tobytes())
        for cfg, proc in processors.items():
            if (cfg == "capped") != (name == BIG):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = proc(images=[rgb])
            pv = np.asarray(out["pixel_values"], dtype=np.float32)
            res = {"grid_thw": [int(v) for v in out["image_grid_thw"][0]], "rows": pv.shape[0], "row_len": pv.shape[1]}
            if (name, cfg) in FULL:
                res["patches"] = f"{stem}.{cfg}.f32"
                (OUT / res["patches"]).write_bytes(pv.astype("<f4").tobytes())
            else:
                flat = pv.ravel()
                stride = max(1, flat.size // SAMPLES) | 1
                res["sum"] = float(flat.astype(np.float64).sum())
                res["stride"] = stride
                res["samples"] = [float(v) for v in flat[::stride]]  # exact: float32 -> float64
            entry["configs"][cfg] = res
        entries.append(entry)
    # Pillow's bicubic resize of one decoded image to many sizes (up, down, mixed, extreme).
    src = load_image(str(OUT / "gradient_64x96.png"))
    sweep = []
    with open(OUT / "resize_sweep.u8", "wb") as f:
        for w, h in RESIZE_SWEEP:
            f.write(np.asarray(src.resize((w, h), Image.BICUBIC), dtype=np.uint8).tobytes())
            sweep.append([w, h])
    configs = {k: {"min_pixels": v["size"]["shortest_edge"], "max_pixels": v["size"]["longest_edge"]}
               for k, v in CONFIGS.items()}
    manifest = {
        "generator": "tools/image_reference.py",
        "reference": "transformers Qwen2VLImageProcessorPil (slow, PIL) on transformers.image_utils.load_image",
        "versions": {"pillow": Image.__version__, "numpy": np.__version__,
                     "transformers": __import__("transformers").__version__},
        "configs": configs,
        "DEVIATIONS": {"gray16_21x19.png": "Pillow clips I;16 to 255 in convert('RGB'); reference is value >> 8"},
        "images": entries,
        "resize_sweep": {"source": "gradient_64x96.png", "data": "resize_sweep.u8", "sizes_wh": sweep},
    }
    (OUT / "reference.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {len(entries)} images, {total / 1024:.0f} KiB in {OUT}")


if __name__ == "__main__":
    main()
