"""`Model`: Qwen3-VL in this process, answering as `qwen3-vl serve` does."""

import json
import os
import weakref

from . import _media
from ._errors import RequestError
from ._native import Engine

#: allowed_image_dir's default: any file this process may read (see Model).
ANY_FILE = "/"


def _schema_format(rf):
    """response_format as the server takes it; a Pydantic model class becomes its JSON schema."""
    if isinstance(rf, type) and hasattr(rf, "model_json_schema"):
        return {"type": "json_schema", "json_schema": {"name": rf.__name__, "schema": rf.model_json_schema(), "strict": True}}
    return rf


def _body(fields, extra):
    """The request body: the fields given (None: left out, so the server's default applies)
    and the extra ones as they are."""
    body = {k: v for k, v in fields.items() if v is not None}
    body.update(extra)
    if "response_format" in body:
        body["response_format"] = _schema_format(body["response_format"])
    return body


def _encode(body):
    try:
        return json.dumps(body).encode()
    except (TypeError, ValueError) as e:
        raise RequestError(f"the request is not JSON-serializable: {e}", 400, "invalid_json") from None


def _chunks(stream):
    """The chunk dicts of a native stream; closing or dropping the iterator cancels the request."""
    try:
        for text in stream:
            yield json.loads(text)
    finally:
        stream.close()


class Model:
    """Qwen3-VL loaded in this process, running on its own thread.

    `path`: a model directory as published on Hugging Face (config.json, *.safetensors,
    tokenizer.json), a GGUF text model file, or a directory of a GGUF model and its mmproj.
    `device`: "auto" (CUDA device 0 if it works, else the CPU, saying why on stderr), "cpu",
    "cuda" or "cuda:N". `gpu_memory`: the most the model and its KV cache take on the GPU, in bytes or as
    "8GiB" (default: the free memory less 5%; what does not fit runs on the CPU). `max_batch`:
    requests generated at once (continuous batching; `batch` keeps twice as many in flight).
    `allowed_image_dir`: image and video paths in messages are read from inside this directory
    (default "/": any file this process may read, as a local library should; None refuses
    paths, leaving PIL images, arrays and data URLs).

    The other options are `qwen3-vl serve`'s flags with underscores: threads, kernels,
    precision, kv_cache, gpu_layers, mmproj, quant, tokenizer, chat_template, model_name,
    max_pixels, max_image_pixels, max_images, max_videos, max_video_seconds, max_video_frames,
    video_fps, video_max_frames, video_max_pixels, ffmpeg, max_prompt_tokens,
    max_output_tokens, kv_cache_tokens, max_prefill_tokens, image_cache, temperature, top_k, top_p,
    repetition_penalty, seed (the sampling defaults of requests that give none), and
    max_file_mib (the largest image or video file read, 32 by default).

    The constructor returns once the model takes requests, or raises `LoadError` with the
    reason. Requests may come from several threads at once; they are batched together. The
    GIL is released while the model runs. Close the model with `close()` or a `with` block to
    free its memory (it is closed at exit otherwise).
    """

    def __init__(self, path, device="auto", gpu_memory=None, max_batch=16, allowed_image_dir=ANY_FILE, **options):
        opts = {"model": os.fspath(path), "device": device, "gpu_memory": gpu_memory, "max_batch": max_batch, **options}
        if allowed_image_dir is not None:
            opts["allowed_image_dir"] = os.fspath(allowed_image_dir)
        opts = {k: (os.fspath(v) if isinstance(v, os.PathLike) else v) for k, v in opts.items() if v is not None}
        self._engine = Engine(json.dumps(opts))
        self._close = weakref.finalize(self, self._engine.close)
        self.path = opts["model"]

    @property
    def device(self):
        """Which backend runs and why, e.g. "using CPU (16 threads): ..."."""
        return self._engine.device

    @property
    def model_id(self):
        """The model name that answers report."""
        return self._engine.model_id

    def chat(self, messages, *, max_tokens=None, temperature=None, top_p=None, seed=None, stop=None, response_format=None, tools=None, tool_choice=None, n=None, logprobs=None, top_logprobs=None, stream=False, **extra):
        """A chat completion of `messages`, as `POST /v1/chat/completions` answers it: the
        `chat.completion` dict, or with stream=True an iterator of `chat.completion.chunk`
        dicts (closing or dropping it cancels the request).

        Messages are OpenAI's; in a content list, images may also be PIL images, numpy arrays
        (HxWx3 uint8), paths (str or pathlib.Path) or data URLs, as a part of their own or as
        {"type": "image", "image": X} or an image_url's url; videos are paths, as
        {"type": "video", "video": PATH} or a video_url's url. `response_format` may be a
        Pydantic model class (its JSON schema, strict). Every other field `serve` takes goes in
        `extra` (top_k, min_tokens, frequency_penalty, stream_options, ...); a field it does
        not know is refused. Raises `RequestError` (status, code, param, message) when the
        request is refused or fails.
        """
        fields = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop, response_format=response_format, tools=tools, tool_choice=tool_choice, n=n, logprobs=logprobs, top_logprobs=top_logprobs)
        body = _body({"messages": _media.messages(messages), **fields}, extra)
        return self._run("chat", body, stream)

    def complete(self, prompt, *, max_tokens=None, temperature=None, top_p=None, seed=None, stop=None, response_format=None, n=None, logprobs=None, stream=False, **extra):
        """A completion of the raw `prompt` text (no chat template), as `POST /v1/completions`
        answers it: the `text_completion` dict, or an iterator of chunks with stream=True.
        Other fields as in `chat`."""
        fields = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop, response_format=response_format, n=n, logprobs=logprobs)
        body = _body({"prompt": prompt, **fields}, extra)
        return self._run("completions", body, stream)

    def _run(self, endpoint, body, stream):
        if stream:
            body["stream"] = True
            return _chunks(self._engine.stream(endpoint, _encode(body)))
        return json.loads(self._engine.complete(endpoint, _encode(body)))

    def batch(self, requests, concurrency=None):
        """Answers every request of `requests`, many at once through the engine (up to
        `concurrency` in flight, default twice max_batch), and returns the answers in the
        order of the requests.

        Each request is a dict of `chat`'s arguments ({"messages": [...], "max_tokens": 64,
        ...}), or of `complete`'s when it has "prompt" instead of "messages"; images as in
        `chat`. Streaming is not available here.

        A request that is refused or fails does not raise: its entry is the error object
        `serve` would send, {"error": {"message", "type", "param", "code"}}, so check each
        entry for "error". The others are answered all the same.
        """
        jobs, results = [], [None] * len(requests)
        for i, r in enumerate(requests):
            try:
                if not isinstance(r, dict):
                    raise RequestError(f"a batch request must be a dict of chat's or complete's arguments, not {type(r).__name__}", 400, "invalid_type", None)
                r = dict(r)
                if r.get("stream"):
                    raise RequestError("stream is not available in a batch (use chat(..., stream=True))", 400, "invalid_value", "stream")
                r.pop("stream", None)
                if "messages" in r:
                    endpoint = "chat"
                    r["messages"] = _media.messages(r["messages"])
                elif "prompt" in r:
                    endpoint = "completions"
                else:
                    raise RequestError("a batch request needs 'messages' (chat) or 'prompt' (completions)", 400, "missing_field", "messages")
                jobs.append((i, endpoint, _encode(_body(r, {}))))
            except RequestError as e:
                results[i] = e.to_dict()
        answers = self._engine.batch([(e, b) for _, e, b in jobs], concurrency)
        for (i, _, _), (ok, text) in zip(jobs, answers):
            results[i] = json.loads(text)
        return results

    def close(self):
        """Lets the requests under way finish, then frees the model (the GPU's memory
        included). Requests after this raise `RequestError` (status 503)."""
        self._close()

    @property
    def closed(self):
        return self._engine.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"qwen3_vl.Model({self.path!r}, {self.device!r})"
