"""A three-turn chat with an image in turn 1 and another in turn 2, through a real daemon
serving llama.cpp's text GGUF with its mmproj (`--mmproj`): cached answers equal the
cache-off ones, each turn restores the longest prefix, and so again after SIGKILL and a
restart (only what LMDB committed survives); the OpenAI SDK sends an image and gets
the answer."""

from __future__ import annotations

from tests.daemon.daemon_proc import start
from tests.images import data_url, encoded
from tests.reliability.conftest import kill9, wait_written

IMAGES = (encoded(300, 200, seed=11), encoded(90, 150, seed=12))
TURNS = (
    [{"type": "text", "text": "Look at this picture."},
     {"type": "image_url", "image_url": {"url": data_url(IMAGES[0])}},
     {"type": "text", "text": "What is in it?"}],
    [{"type": "text", "text": "And this one, smaller?"},
     {"type": "image_url", "image_url": {"url": data_url(IMAGES[1])}}],
    "Which of the two is brighter?",
)


def _conversation(d, cache: bool = True) -> list[tuple[str, dict]]:
    """Each turn's answer and usage; a turn's messages are the ones before, the answers,
    and its own."""
    messages, out = [], []
    for content in TURNS:
        messages.append({"role": "user", "content": content})
        r = d.post("/v1/chat/completions", {"messages": messages, "max_tokens": 5,
                                            "temperature": 0, "cache": cache})
        assert r.status == 200, r.text
        answer = r.json["choices"][0]["message"]["content"]
        out.append((answer, r.json["usage"]))
        messages.append({"role": "assistant", "content": answer})
    return out


def _check_restores(turns, whole: bool) -> None:
    """Each turn restored at least what the one before computed (its prompt); `whole`:
    every prompt was cached before, all of it but its last token comes back."""
    for i, (_, usage) in enumerate(turns):
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        if whole:
            assert cached >= usage["prompt_tokens"] - 1, (i, usage)
        elif i:
            assert cached >= turns[i - 1][1]["prompt_tokens"], (i, usage)


def test_conversation_cached_equals_uncached_across_sigkill(tiny_vision, tmp_path):
    folder, gguf, mmproj = tiny_vision()
    args = ("--mmproj", str(mmproj), "--block-size", "8", "--snapshot-interval", "32",
            "--step-tokens", "48", "--parallel", "2")
    cache = tmp_path / "cache"
    d = start(gguf, cache, *args)
    try:
        assert d.get("/props").json["modalities"]["vision"] is True
        want = _conversation(d, cache=False)
        first = _conversation(d)
        assert [a for a, _ in first] == [a for a, _ in want]
        assert first[0][1]["prompt_tokens"] == want[0][1]["prompt_tokens"] > 70
        _check_restores(first, whole=False)
        second = _conversation(d)                    # every prompt seen: RAM and disk
        assert [a for a, _ in second] == [a for a, _ in want]
        _check_restores(second, whole=True)
        wait_written(d)
    finally:
        kill9(d)
    d = start(gguf, cache, *args)                    # a fresh process: disk only
    try:
        again = _conversation(d)
        assert [a for a, _ in again] == [a for a, _ in want]
        _check_restores(again, whole=True)
    finally:
        assert d.stop() == 0, d.output()


def test_openai_sdk_sends_an_image(tiny_vision, tmp_path):
    from openai import OpenAI

    folder = tiny_vision()[0]
    d = start(folder, tmp_path / "cache", "--parallel", "1")
    try:
        client = OpenAI(base_url=f"{d.url}/v1", api_key="none")
        r = client.chat.completions.create(model="tiny", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": [
                                               {"type": "text", "text": "What is this?"},
                                               {"type": "image_url",
                                                "image_url": {"url": data_url(IMAGES[0])}}]}])
        assert r.choices[0].message.content and r.usage.prompt_tokens > 70
        assert r.usage.completion_tokens == 4
    finally:
        assert d.stop() == 0, d.output()


def test_slot_with_images_saves_and_restores(tiny_vision, tmp_path):
    """A slot whose prompt holds an image: saved, the cache cleared, restored; the same
    picture then restores all of the prompt, another of its size only the text before
    it; a daemon without the vision tower refuses the file."""
    folder = tiny_vision()[0]
    slots = tmp_path / "slots"
    slots.mkdir()
    b64 = data_url(IMAGES[0]).split(",", 1)[1]

    def ask(d, image):
        # one token: the slot's state is the prompt's, which the same prompt restores
        # (a recurrent state can't be cut back to a shorter prefix)
        r = d.post("/completion", {"n_predict": 1, "temperature": 0, "id_slot": 0,
                                   "prompt": {"prompt_string": "What is this: <__media__>\n",
                                              "multimodal_data": [image]}})
        assert r.status == 200, r.text
        return r.json
    d = start(folder, tmp_path / "cache", "--parallel", "1", "--slot-save-path", str(slots))
    try:
        first = ask(d, b64)
        n = first["tokens_evaluated"]
        r = d.post("/slots/0?action=save", {"filename": "img.bin"})
        assert r.status == 200 and r.json["n_saved"] >= n, r.text
        assert d.post("/cache/clear", {}).status == 200
        r = d.post("/slots/0?action=restore", {"filename": "img.bin"})
        assert r.status == 200 and r.json["n_restored"] >= n, r.text
        again = ask(d, b64)
        assert again["timings"]["cache_n"] >= n - 1 and again["content"] == first["content"]
        other = ask(d, data_url(encoded(300, 200, seed=99)).split(",", 1)[1])
        assert other["timings"]["cache_n"] < 20
    finally:
        assert d.stop() == 0, d.output()
    d = start(folder, tmp_path / "cache2", "--no-mmproj", "--slot-save-path", str(slots))
    try:
        r = d.post("/slots/0?action=restore", {"filename": "img.bin"})
        assert r.status == 400 and "without an mmproj" in r.json["error"]["message"], r.text
    finally:
        assert d.stop() == 0, d.output()


def test_images_after_sleeping(tiny_vision, tmp_path):
    """The vision tower goes with the model when the daemon sleeps and comes back with
    it: the same request answers the same after a wake-up (its image restored or
    encoded again by the reloaded tower)."""
    import time

    folder, gguf, mmproj = tiny_vision()
    d = start(gguf, tmp_path / "cache", "--mmproj", str(mmproj), "--sleep-idle-seconds", "1")
    try:
        body = {"messages": [{"role": "user", "content": TURNS[0]}], "max_tokens": 4,
                "temperature": 0}
        first = d.post("/v1/chat/completions", body).json
        deadline = time.monotonic() + 60
        while not d.get("/props").json["is_sleeping"]:
            assert time.monotonic() < deadline, "the daemon did not fall asleep"
            time.sleep(0.2)
        other = {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "Something else first."}, *TURNS[0]]}],
            "max_tokens": 4, "temperature": 0, "cache": False}
        assert d.post("/v1/chat/completions", other).status == 200      # encoded anew
        again = d.post("/v1/chat/completions", body).json
        assert again["choices"][0]["message"] == first["choices"][0]["message"]
    finally:
        assert d.stop() == 0, d.output()
