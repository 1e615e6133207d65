"""Images and videos in messages made into what the server takes: PIL images and numpy arrays
become PNG data URLs, paths become absolute paths (read by the in-process server under its
allowed directory), data URLs pass as they are.

Pillow is needed only when a PIL image is passed, numpy only when an array is: arrays are
written as PNG here with zlib."""

import base64
import os
import struct
import zlib

from ._errors import RequestError


def _bad(param, message):
    return RequestError(message, 400, "invalid_value", param)


def _is_pil(x):
    return type(x).__module__.startswith("PIL.") and hasattr(x, "save") and hasattr(x, "mode")


def _is_array(x):
    return type(x).__module__.split(".")[0] == "numpy" and hasattr(x, "__array_interface__")


def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_of_array(a, param="image"):
    """PNG bytes of an HxWx3 (RGB) or HxW (gray) uint8 array."""
    import numpy as np

    if a.dtype != np.uint8:
        raise _bad(param, f"an image array must be uint8 (0-255), not {a.dtype}: convert it, e.g. (a * 255).clip(0, 255).astype('uint8')")
    if a.ndim == 2:
        color = 0
    elif a.ndim == 3 and a.shape[2] == 3:
        color = 2
    else:
        raise _bad(param, f"an image array must be HxWx3 (RGB) or HxW (gray), not of shape {a.shape}")
    h, w = a.shape[0], a.shape[1]
    if h == 0 or w == 0:
        raise _bad(param, f"the image array is empty (shape {a.shape})")
    rows = np.ascontiguousarray(a).reshape(h, -1)
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rows], axis=1).tobytes()  # filter 0 per row
    header = struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 6)) + _chunk(b"IEND", b"")


def _png_of_pil(img):
    import io

    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _data_url(png):
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _path(x, param, what):
    """An absolute path of a file path (str or os.PathLike)."""
    p = os.fspath(x)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not os.path.isfile(p):
        raise RequestError(f"the {what} file {p} does not exist", 400, f"invalid_{what}_url", param)
    return os.path.abspath(p)


def image_url(x, param):
    """The URL the server takes for an image given as a PIL image, a numpy array, a path or a
    URL (data:, file://; any other URL is left to the server, which refuses it)."""
    if _is_pil(x):
        return _data_url(_png_of_pil(x))
    if _is_array(x):
        return _data_url(png_of_array(x, param))
    if isinstance(x, str):
        if x.startswith(("data:", "file://", "http://", "https://")):
            return x
        return _path(x, param, "image")
    if isinstance(x, (os.PathLike, bytes)):
        return _path(x, param, "image")
    raise _bad(param, f"an image must be a PIL image, a numpy array, a path or a data: URL, not {type(x).__name__}")


def video_url(x, param):
    """The URL the server takes for a video given as a path or a URL."""
    if isinstance(x, str) and x.startswith(("data:", "file://", "http://", "https://")):
        return x
    if isinstance(x, (str, os.PathLike, bytes)):
        return _path(x, param, "video")
    raise _bad(param, f"a video must be a path or a data: URL, not {type(x).__name__}")


def _url_of(v):
    """The url of an image_url/video_url field (a string, or an object with url)."""
    return v.get("url") if isinstance(v, dict) else v


def part(p, param):
    """One content part as the server takes it. Besides OpenAI's parts: a string (text), a PIL
    image, a numpy array or a pathlib.Path (an image), {"type": "image", "image": X} and
    {"type": "video", "video": PATH}; image_url/video_url parts may hold any of these too."""
    if isinstance(p, str):
        return {"type": "text", "text": p}
    if _is_pil(p) or _is_array(p) or isinstance(p, os.PathLike):
        return {"type": "image_url", "image_url": {"url": image_url(p, param)}}
    if not isinstance(p, dict):
        return p  # the server says what is wrong with it
    kind = p.get("type")
    if kind == "image" and "image" in p:
        return {"type": "image_url", "image_url": {"url": image_url(p["image"], param + ".image")}}
    if kind == "video" and "video" in p:
        return {"type": "video_url", "video_url": {"url": video_url(p["video"], param + ".video")}}
    for key, convert in (("image_url", image_url), ("video_url", video_url)):
        if kind == key and key in p:
            v = p[key]
            url = _url_of(v)
            if url is None or (isinstance(url, str) and url.startswith("data:")):
                return p
            new = dict(v) if isinstance(v, dict) else {}
            new["url"] = convert(url, f"{param}.{key}.url" if isinstance(v, dict) else f"{param}.{key}")
            return {**p, key: new}
    return p


def messages(msgs):
    """The messages with their images and videos made into URLs the server takes."""
    if not isinstance(msgs, (list, tuple)):
        raise _bad("messages", f"messages must be a list of messages, not {type(msgs).__name__}")
    out = []
    for i, m in enumerate(msgs):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, (list, tuple)):
            m = {**m, "content": [part(p, f"messages[{i}].content[{j}]") for j, p in enumerate(content)]}
        out.append(m)
    return out
