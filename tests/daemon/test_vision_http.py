"""Images through a real daemon on loopback (the tiny multimodal Qwen3.5): OpenAI
image_url parts (data URLs; file:// under --media-path; remote URLs refused), Anthropic
image blocks, Responses input_image, llama-server's multimodal_data; /props and
/v1/models; bad images answered 400 naming the part."""

from __future__ import annotations

import pytest

from tests.daemon.daemon_proc import start
from tests.images import data_url, encoded

PNG = encoded(300, 200, seed=1)
OTHER = encoded(300, 200, seed=7)          # the same size: the same placeholder tokens


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    (folder / "cat.png").write_bytes(PNG)
    (folder / "junk.png").write_bytes(b"\x89PNG but not really")
    return folder


@pytest.fixture(scope="module")
def vision_daemon(tiny_vision, media, tmp_path_factory):
    d = start(tiny_vision()[0], tmp_path_factory.mktemp("vision") / "cache",
              "--parallel", "2", "--step-tokens", "48", "--snapshot-interval", "32",
              "--block-size", "8", "--media-path", str(media), "--image-max-side", "2000")
    yield d
    assert d.stop() == 0, d.output()


def _chat(d, parts, **kw):
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 4,
            "temperature": 0, **kw}
    return d.post("/v1/chat/completions", body)


def _image(url):
    return {"type": "image_url", "image_url": {"url": url}}


def test_props_and_models_report_vision(vision_daemon):
    assert vision_daemon.get("/props").json["modalities"] == {"vision": True, "audio": False}
    models = vision_daemon.get("/v1/models").json
    assert "multimodal" in models["models"][0]["capabilities"]
    assert "multimodal" in models["data"][0]["capabilities"]


def test_data_url_and_file_give_one_image(vision_daemon, media):
    """The same picture as a data URL and as a file under --media-path: one answer, and
    the second restores past the image; another picture of that size restores only the
    text before it."""
    text = {"type": "text", "text": "What is in this picture?"}
    first = _chat(vision_daemon, [text, _image(data_url(PNG))])
    assert first.status == 200, first.text
    u = first.json["usage"]
    assert u["prompt_tokens"] > 70                        # the image's 70 placeholders count
    again = _chat(vision_daemon, [text, _image(f"file://{media / 'cat.png'}")])
    assert again.status == 200, again.text
    assert again.json["choices"][0]["message"] == first.json["choices"][0]["message"]
    assert again.json["usage"]["prompt_tokens_details"]["cached_tokens"] >= \
        u["prompt_tokens"] - 1
    for url in ("file://cat.png", "file:////cat.png"):      # llama-server's reading
        assert _chat(vision_daemon, [text, _image(url)]).status == 200
    other = _chat(vision_daemon, [text, _image(data_url(OTHER))])
    assert other.status == 200
    assert other.json["usage"]["prompt_tokens"] == u["prompt_tokens"]
    assert other.json["usage"]["prompt_tokens_details"]["cached_tokens"] < \
        u["prompt_tokens"] - 70


@pytest.mark.parametrize("url,code,words", [
    ("https://example.com/cat.png", "not_supported", "--media-path"),
    ("data:image/png;base64,@@@not-base64@@@", "invalid_value", "base64"),
    ("data:text/html;base64,aGVsbG8=", "invalid_value", "not an image"),
    (data_url(b"not an image at all"), "invalid_image", "cannot decode"),
    ("file:///etc/passwd", "invalid_value", "outside --media-path"),
    ("file://../media0/cat.png", "invalid_value", "outside --media-path"),
    ("file://junk.png", "invalid_image", "cannot decode"),
    ("file://nothere.png", "invalid_value", "no such file"),
    ("malformed", "invalid_value", "not an image URL"),
    (data_url(encoded(2100, 40)), "invalid_image", "--image-max-side"),
])
def test_bad_images_are_400_naming_the_part(vision_daemon, url, code, words):
    r = _chat(vision_daemon, [{"type": "text", "text": "hi"}, _image(url)])
    assert r.status == 400, r.text
    err = r.json["error"]
    assert err["param"] == "messages[0].content[1].image_url" and err["code"] == code
    assert words in err["message"]
    assert vision_daemon.get("/health").status == 200


def test_anthropic_responses_and_completion(vision_daemon):
    """Each API's own image shape; they reach the same prompt as the chat route."""
    b64 = data_url(PNG).split(",", 1)[1]
    r = vision_daemon.post("/v1/messages", {
        "model": "m", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": b64}}]}]})
    assert r.status == 200, r.text
    assert r.json["usage"]["input_tokens"] > 70
    parts = [{"type": "input_text", "text": "Describe"},
             {"type": "input_image", "image_url": data_url(PNG)}]
    r = vision_daemon.post("/v1/responses", {"model": "m", "max_output_tokens": 3,
                                             "temperature": 0,
                                             "input": [{"role": "user", "content": parts}]})
    assert r.status == 200, r.text
    r = vision_daemon.post("/completion", {"n_predict": 3, "temperature": 0, "prompt": {
        "prompt_string": "What is this: <__media__>\n", "multimodal_data": [b64]}})
    assert r.status == 200, r.text
    t = r.json["timings"]
    assert t["prompt_n"] + t["cache_n"] > 70 and r.json["tokens_evaluated"] > 70
    for bad, field in ((["@@"], "prompt.multimodal_data[0]"),
                       ([b64, b64], "prompt.multimodal_data")):
        r = vision_daemon.post("/completion", {"n_predict": 1, "prompt": {
            "prompt_string": "What is this: <__media__>\n", "multimodal_data": bad}})
        assert r.status == 400 and r.json["error"]["param"] == field, r.text


def test_text_model_refuses_images(daemon):
    r = _chat(daemon, [{"type": "text", "text": "hi"}, _image(data_url(encoded(32, 32)))])
    assert r.status == 400, r.text
    assert r.json["error"]["param"] == "messages[0].content[1].image_url"
    assert "vision" in r.json["error"]["message"]
    assert daemon.get("/props").json["modalities"]["vision"] is False


def test_metrics_count_the_encoder(vision_daemon):
    def value(name):
        text = vision_daemon.get("/metrics").text
        return float(next(line.split()[1] for line in text.splitlines()
                          if line.startswith(name + " ")))
    pic = _image(data_url(encoded(64, 64, seed=21)))
    before = value("ckptd_images_encoded_total")
    assert _chat(vision_daemon, [{"type": "text", "text": "a"}, pic]).status == 200
    assert value("ckptd_images_encoded_total") == before + 1
    assert value("ckptd_image_encode_seconds_total") > 0
    hits = value("ckptd_image_embedding_hits_total")
    # other text before it: the text is computed, the picture's encoding reused
    assert _chat(vision_daemon, [{"type": "text", "text": "bb"}, pic]).status == 200
    assert value("ckptd_images_encoded_total") == before + 1
    assert value("ckptd_image_embedding_hits_total") == hits + 1
