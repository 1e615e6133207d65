"""The package on the tiny checkpoint: answers equal the CLI's (greedy), with images given
every way; streams, structured output, batches, errors, the GIL."""

import json
import threading
import time

import pytest

import qwen3_vl
from conftest import IMAGE, TINY, TOKENIZER

PROMPT = "Describe a cat in one sentence, then a dog in another."


def user(*content):
    return [{"role": "user", "content": list(content) if len(content) > 1 or not isinstance(content[0], str) else content[0]}]


def text_of(r):
    return r["choices"][0]["message"]["content"]


def test_greedy_text_answers_as_the_cli(model, generate_greedy):
    r = model.chat(user(PROMPT), max_tokens=12, temperature=0)
    assert text_of(r) == generate_greedy(PROMPT, max_tokens=12)
    assert r["object"] == "chat.completion" and r["model"] == "tiny"
    assert r["usage"]["completion_tokens"] <= 12 and r["usage"]["prompt_tokens"] > 5


def test_an_image_as_pil_array_path_and_data_url_answers_as_the_cli(model, generate_greedy):
    from PIL import Image
    import numpy as np

    want = generate_greedy("What is in this picture?", [IMAGE], max_tokens=10)
    pil = Image.open(IMAGE)
    pil.load()
    array = np.asarray(pil.convert("RGB"))
    assert array.shape == (64, 96, 3)
    data_url = qwen3_vl._media.image_url(array, "x")
    assert data_url.startswith("data:image/png;base64,")
    forms = {
        "pil": pil,
        "numpy": array,
        "path": {"type": "image", "image": str(IMAGE)},
        "pathlib": IMAGE,
        "image_url": {"type": "image_url", "image_url": {"url": str(IMAGE)}},
        "data_url": {"type": "image_url", "image_url": {"url": data_url}},
    }
    for name, img in forms.items():
        r = model.chat(user(img, "What is in this picture?"), max_tokens=10, temperature=0)
        assert text_of(r) == want, name
        assert r["usage"]["prompt_tokens"] > 20, name


def test_the_pure_python_png_of_an_array_decodes_to_its_pixels():
    from PIL import Image
    import base64
    import io
    import numpy as np

    a = (np.arange(5 * 7 * 3) * 7 % 256).astype(np.uint8).reshape(5, 7, 3)
    for arr in (a, a[:, :, 0]):
        png = qwen3_vl._media.png_of_array(arr)
        back = np.asarray(Image.open(io.BytesIO(png)))
        assert (back == arr).all()
    url = qwen3_vl._media.image_url(a[:, ::2], "x")  # a strided view
    back = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))
    assert (back == a[:, ::2]).all()


def test_stream_chunks_make_the_whole_answer(model):
    whole = text_of(model.chat(user(PROMPT), max_tokens=16, temperature=0))
    chunks = list(model.chat(user(PROMPT), max_tokens=16, temperature=0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    done = list(model.complete("The cat", max_tokens=6, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in done) == model.complete("The cat", max_tokens=6, temperature=0)["choices"][0]["text"]


def test_closing_a_stream_cancels_it(model):
    s = model.chat(user(PROMPT), max_tokens=400, temperature=0, ignore_eos=True, stream=True)
    next(s)
    next(s)
    t0 = time.time()
    s.close()
    with pytest.raises(StopIteration):
        next(s)
    # the engine is free again at once (a request of 400 tokens left running would hold it)
    assert text_of(model.chat(user("Hi"), max_tokens=2, temperature=0)) is not None
    assert time.time() - t0 < 30


def test_a_json_schema_answer_parses(model):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}}, "required": ["name", "n"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}
    r = model.chat(user("A person as JSON."), max_tokens=40, temperature=0, response_format=rf)
    v = json.loads(text_of(r))
    assert set(v) == {"name", "n"} and isinstance(v["n"], int) and len(v["name"]) <= 6


def test_a_batch_answers_in_order_and_keeps_errors_as_entries(cpu_model):
    model = cpu_model
    prompts = ["A cat.", "A dog.", "A bird.", "A fish.", "A horse."]
    singles = [text_of(model.chat(user(p), max_tokens=8, temperature=0)) for p in prompts]
    reqs = [{"messages": user(p), "max_tokens": 8, "temperature": 0} for p in prompts]
    reqs.insert(2, {"messages": user("x"), "max_tokens": -1})
    reqs.insert(4, {"messages": user("y"), "max_tokens": 4, "bogus": 1})
    reqs.append({"prompt": "The cat", "max_tokens": 6, "temperature": 0})
    out = model.batch(reqs)
    assert len(out) == len(reqs)
    assert out[2]["error"]["param"] == "max_tokens" and out[2]["error"]["code"] == "invalid_value"
    assert out[4]["error"]["param"] == "bogus"
    got = [text_of(r) for i, r in enumerate(out[:-1]) if i not in (2, 4)]
    assert got == singles
    assert out[-1]["object"] == "text_completion"
    assert out[-1]["choices"][0]["text"] == model.complete("The cat", max_tokens=6, temperature=0)["choices"][0]["text"]


def test_bad_requests_raise_with_the_field_named(model):
    with pytest.raises(qwen3_vl.RequestError) as e:
        model.chat(user("x"), max_tokens=-1)
    assert (e.value.status, e.value.code, e.value.param) == (400, "invalid_value", "max_tokens")
    assert "max_tokens" in e.value.message and isinstance(e.value, qwen3_vl.Error)
    with pytest.raises(qwen3_vl.RequestError) as e:
        model.chat(user("x"), frobnicate=True)
    assert e.value.param == "frobnicate" and "frobnicate" in str(e.value)
    import numpy as np

    with pytest.raises(qwen3_vl.RequestError) as e:
        model.chat(user(np.zeros((4, 4, 2), np.uint8), "x"))
    assert e.value.param == "messages[0].content[0]" and "HxWx3" in e.value.message
    with pytest.raises(qwen3_vl.RequestError) as e:
        model.chat(user({"type": "image", "image": "/no/such/image.png"}, "x"))
    assert e.value.param == "messages[0].content[0].image" and "/no/such/image.png" in e.value.message


def test_paths_need_the_allowed_directory():
    with qwen3_vl.Model(TINY, tokenizer=TOKENIZER, allowed_image_dir=None) as m:
        with pytest.raises(qwen3_vl.RequestError) as e:
            m.chat(user(IMAGE, "x"), max_tokens=2)
        assert e.value.param == "messages[0].content[0].image_url" and "not enabled" in e.value.message
    with qwen3_vl.Model(TINY, tokenizer=TOKENIZER, allowed_image_dir=TINY) as m:
        with pytest.raises(qwen3_vl.RequestError) as e:
            m.chat(user(IMAGE, "x"), max_tokens=2)
        assert e.value.code == "image_not_allowed"
    assert m.closed
    with pytest.raises(qwen3_vl.RequestError) as e:
        m.chat(user("x"))
    assert e.value.status == 503


def test_load_errors_name_the_file_or_the_option(tmp_path):
    with pytest.raises(qwen3_vl.LoadError) as e:
        qwen3_vl.Model(tmp_path / "missing")
    assert "missing" in str(e.value)
    with pytest.raises(qwen3_vl.LoadError) as e:
        qwen3_vl.Model(TINY, tokenizer=TOKENIZER, max_batch=0)
    assert "max_batch=0" in str(e.value) and "1 to 4096" in str(e.value)
    with pytest.raises(qwen3_vl.LoadError) as e:
        qwen3_vl.Model(TINY, tokenizer=TOKENIZER, batch_size=4)
    assert "unknown option 'batch_size'" in str(e.value)
    with pytest.raises(qwen3_vl.LoadError) as e:
        qwen3_vl.Model(TINY, device="tpu")
    assert "tpu" in str(e.value)


def test_the_gil_is_released_while_the_model_runs(cpu_model):
    model = cpu_model  # (the CPU: slow enough for the other thread to be seen counting)
    counts = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counts[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        before, t0 = counts[0], time.time()
        r = model.chat(user(PROMPT), max_tokens=200, temperature=0, ignore_eos=True)
        elapsed, during = time.time() - t0, counts[0] - before
    finally:
        stop.set()
        t.join()
    assert r["usage"]["completion_tokens"] == 200
    # a thread that held the GIL for the whole call would leave the counter where it was; the
    # loop runs millions of times a second when it has the interpreter
    assert elapsed > 0.05 and during > 100_000 * elapsed, (during, elapsed)


def test_requests_from_several_threads_are_answered_alike(cpu_model):
    model = cpu_model
    want = text_of(model.chat(user(PROMPT), max_tokens=8, temperature=0))
    got = [None] * 6

    def ask(i):
        got[i] = text_of(model.chat(user(PROMPT), max_tokens=8, temperature=0))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 6
