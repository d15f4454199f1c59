"""LoRA through the daemon: llama-server's flags and routes, per-request scales, and the
cache. A prefix computed with one adapter set is never restored for another: the same
prompt at scale 0 and 1 gives two answers, each equal to its own uncached run, when
restored from the cache, when requests with different scales share steps, and after a
restart from the disk tier."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from ckptd.daemon import flags, lora
from ckptd.daemon.lora import Adapters, LoraFile, parse_scaled
from ckptd.model.loader import load_model
from ckptd.model.lora.adapter import Adapter
from ckptd.tools.make_lora import make_lora
from tests.daemon.daemon_proc import Daemon, start

PROMPT = "The quick brown fox jumps over the lazy dog and then " * 3
ARGS = ("--max-context", "512", "--parallel", "4", "--step-tokens", "64",
        "--snapshot-interval", "64")


@pytest.fixture(scope="module")
def adapter(tiny_hybrid_dir, tmp_path_factory):
    model = load_model(tiny_hybrid_dir)
    return make_lora(model, tmp_path_factory.mktemp("lora") / "a", std=0.5, seed=3,
                     targets=("q_proj", "v_proj", "o_proj", "in_proj_qkv", "out_proj",
                              "gate_proj", "up_proj", "down_proj"))


def _complete(d: Daemon, scale: float | None, cache: bool = True) -> tuple[list[int], dict]:
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "return_tokens": True,
            "cache_prompt": cache}
    if scale is not None:
        body["lora"] = [{"id": 0, "scale": scale}]
    r = d.post("/completion", body)
    assert r.status == 200, r.text
    return r.json["tokens"], r.json["timings"]


def test_lora_scales_never_share_cache_entries(tiny_hybrid_dir, adapter, tmp_path):
    cache = tmp_path / "cache"
    d = start(tiny_hybrid_dir, cache, *ARGS, "--lora", str(adapter))
    try:
        r = d.get("/lora-adapters")
        assert r.status == 200
        assert r.json == [{"id": 0, "path": str(adapter), "scale": 1.0, "task_name": "",
                           "prompt_prefix": ""}]
        # uncached references: nothing restored, nothing left behind
        ref = {s: _complete(d, s, cache=False)[0] for s in (0.0, 1.0, 0.5)}
        assert ref[0.0] != ref[1.0] and ref[0.5] not in (ref[0.0], ref[1.0])
        first = _complete(d, 1.0)
        assert first[0] == ref[1.0] and first[1]["cache_n"] == 0
        # the base model's and scale 0.5's prefixes are not scale 1's, and each says so
        for s in (0.0, 0.5):
            toks, timings = _complete(d, s)
            assert toks == ref[s] and timings["cache_n"] == 0, s
            assert timings["cache"]["miss"]["reason"] == "other_adapters", timings["cache"]
        # and now each restores its own
        for s in (1.0, 0.0, 0.5):
            toks, timings = _complete(d, s)
            assert toks == ref[s] and timings["cache_n"] > 0, s
        # no "lora": the global scale (1), the same entries as an explicit 1
        toks, timings = _complete(d, None)
        assert toks == ref[1.0] and timings["cache_n"] > 0
        # requests with different scales, all at once: steps shared, answers their own
        scales = [1.0, 0.0, 0.5, 1.0, 0.0, 0.5]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda s: _complete(d, s, cache=False)[0], scales))
        assert got == [ref[s] for s in scales]
        # POST sets the global scales: unnamed adapters go to 0
        r = d.post("/lora-adapters", [])
        assert r.status == 200 and r.json == {"success": True}
        assert d.get("/lora-adapters").json[0]["scale"] == 0.0
        assert _complete(d, None)[0] == ref[0.0]
        assert d.post("/lora-adapters", [{"id": 0, "scale": 0.5}]).status == 200
        assert _complete(d, None)[0] == ref[0.5]
    finally:
        assert d.stop() == 0, d.output()
    # after a restart, from the disk tier: each scale its own answer
    d = start(tiny_hybrid_dir, cache, *ARGS, "--lora-init-without-apply", "--lora",
              str(adapter))
    try:
        assert d.get("/lora-adapters").json[0]["scale"] == 0.0
        for s in (1.0, 0.0, 0.5):
            toks, timings = _complete(d, s)
            assert toks == ref[s] and timings["cache_n"] > 0, s
            assert timings["cache_tier"] == "disk", s
    finally:
        assert d.stop() == 0, d.output()


def test_bad_lora_input_is_a_400_naming_the_field(tiny_hybrid_dir, adapter, tmp_path):
    d = start(tiny_hybrid_dir, tmp_path / "cache", *ARGS, "--lora-scaled", f"{adapter}:0.25")
    try:
        assert d.get("/lora-adapters").json[0]["scale"] == 0.25
        cases = [({"id": 0, "scale": 1}, "body"), ([{"id": 1, "scale": 1}], "body[0].id"),
                 ([{"id": "0", "scale": 1}], "body[0].id"),
                 ([{"id": 0, "scale": "big"}], "body[0].scale"), ([3], "body[0]")]
        for body, param in cases:
            r = d.post("/lora-adapters", body)
            assert r.status == 400 and r.json["error"]["param"] == param, (body, r.text)
        for lora, param in [([{"id": 7, "scale": 1}], "lora[0].id"),
                            ([{"id": 0, "scale": True}], "lora[0].scale"), ({"id": 0}, "lora")]:
            for path, extra in (("/completion", {"prompt": "hi"}),
                                ("/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "hi"}]})):
                r = d.post(path, {**extra, "max_tokens": 2, "lora": lora})
                assert r.status == 400 and r.json["error"]["param"] == param, (path, r.text)
        assert d.get("/lora-adapters").json[0]["scale"] == 0.25      # unchanged
        r = d.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 2, "lora": [{"id": 0, "scale": 1}]})
        assert r.status == 200, r.text
    finally:
        assert d.stop() == 0, d.output()


@pytest.mark.parametrize("flags, message", [
    (("--lora", "/nonexistent/adapter.gguf"), "no such file"),
    (("--lora-scaled", "x.gguf:big"), "not a number"),
])
def test_bad_adapters_stop_the_start_with_one_line(tiny_hybrid_dir, tmp_path, flags, message):
    d = Daemon(tiny_hybrid_dir, tmp_path / "cache", *ARGS, *flags)
    code = d.proc.wait(timeout=120)
    d.stop()
    out = d.output()
    assert code != 0 and message in out and "Traceback" not in out, out


def test_an_adapter_for_another_model_is_refused(tiny_llama_dir, adapter, tmp_path):
    d = Daemon(tiny_llama_dir, tmp_path / "cache", *ARGS, "--lora", str(adapter))
    code = d.proc.wait(timeout=120)
    d.stop()
    out = d.output()
    assert code != 0 and "LoRA adapter" in out and "Traceback" not in out, out


def test_a_slot_saved_with_an_adapter_restores_under_it(tiny_hybrid_dir, adapter, tmp_path):
    """A slot file keeps its adapter set's salt: restored into another daemon, the state
    serves requests with that adapter and scale, and not the base model."""
    slots = tmp_path / "slots"
    slots.mkdir()
    args = ("--max-context", "256", "--parallel", "2", "--slot-save-path", str(slots),
            "--lora", str(adapter))
    prompt = list(range(50, 50 + 70))
    greedy = {"n_predict": 8, "temperature": 0, "ignore_eos": True, "return_tokens": True,
              "lora": [{"id": 0, "scale": 1.0}]}
    a = start(tiny_hybrid_dir, tmp_path / "cache-a", *args)
    try:
        first = a.post("/completion", {"prompt": prompt, "id_slot": 1, **greedy}).json
        assert a.post("/slots/1?action=save", {"filename": "s1.bin"}).status == 200
        state = prompt + first["tokens"][:-1]
        uncached = a.post("/completion", {"prompt": state + [7, 8, 9], "cache_prompt": False,
                                          **greedy}).json
    finally:
        assert a.stop() == 0, a.output()
    b = start(tiny_hybrid_dir, tmp_path / "cache-b", *args)
    try:
        assert b.post("/slots/0?action=restore", {"filename": "s1.bin"}).status == 200
        base = b.post("/completion", {"prompt": state + [7, 8, 9], **greedy,
                                      "lora": [{"id": 0, "scale": 0.0}]}).json
        assert base["timings"]["cache_n"] == 0
        got = b.post("/completion", {"prompt": state + [7, 8, 9], **greedy}).json
        assert got["timings"]["cache_n"] == len(state)
        assert got["tokens"] == uncached["tokens"] != base["tokens"]
    finally:
        assert b.stop() == 0, b.output()


def test_flags_read_as_llama_server_reads_them(tmp_path):
    import argparse
    p = argparse.ArgumentParser()
    flags.add_arguments(p)
    lora.add_arguments(p)
    args = p.parse_args(["--lora", "a.gguf,b.gguf", "--lora-scaled", "c.gguf", "0.5",
                         "--lora-scaled", "d.gguf:2,e:f.gguf:-1", "--lora-init-without-apply"])
    cfg = flags.from_args(args, env={"XDG_DATA_HOME": str(tmp_path)})
    assert cfg.lora == (LoraFile("a.gguf"), LoraFile("b.gguf"), LoraFile("c.gguf", 0.5),
                        LoraFile("d.gguf", 2.0), LoraFile("e:f.gguf", -1.0))
    assert cfg.lora_init_without_apply
    for bad in (["x.gguf"], ["x.gguf:nan"], ["x.gguf", "1", "2"]):
        with pytest.raises(ValueError, match="--lora-scaled"):
            parse_scaled(bad)


def test_the_cache_salt_of_an_adapter_set():
    ads = Adapters([Adapter("a", {}, "11" * 16), Adapter("b", {}, "22" * 16)], [1.0, 0.0])
    assert ads.effective(None) == (1.0, 0.0) and ads.effective({1: 0.5}) == (0.0, 0.5)
    assert ads.effective({0: 0.0}) == ()                   # no adapter in use: the base
    assert ads.salt("t", ()) == "t" and ads.salt(None, (0.0, 0.0)) is None
    one, half = ads.salt(None, (1.0, 0.0)), ads.salt(None, (0.5, 0.0))
    tenant = ads.salt("t", (1.0, 0.0))
    assert len({one, half, tenant, ads.salt(None, (0.0, 1.0))}) == 4
    for salt in (one, half, tenant):                       # never a user's (text) salt
        assert isinstance(salt, bytes) and salt[0] == 0xFF
        with pytest.raises(UnicodeDecodeError):
            salt.decode()
    # the set decides, not the ids: the same files loaded in another order share entries
    swapped = Adapters([Adapter("b", {}, "22" * 16), Adapter("a", {}, "11" * 16)], [0, 1])
    assert swapped.salt(None, (0.0, 1.0)) == one


def test_adapters_are_attached_again_after_a_sleep(tiny_hybrid_dir, adapter, tmp_path):
    """A wake-up loads the weights again: the adapters must come back with them, or a
    request at scale 1 would silently run the base model."""
    from tests.daemon.test_sleep import _wait_asleep
    d = start(tiny_hybrid_dir, tmp_path / "cache", *ARGS, "--lora", str(adapter),
              "--sleep-idle-seconds", "1")
    try:
        ref = {s: _complete(d, s, cache=False)[0] for s in (0.0, 1.0)}
        assert ref[0.0] != ref[1.0]
        _wait_asleep(d)
        assert {s: _complete(d, s, cache=False)[0] for s in (1.0, 0.0)} == ref
    finally:
        assert d.stop() == 0, d.output()


def test_an_adapted_lm_head_in_prefill_and_decode(tiny_hybrid_dir, tmp_path):
    """lm_head runs on the logits' rows only (a prefill's last token, every drafted
    position): its adapter's scales are those rows', not the step's tokens'."""
    model = load_model(tiny_hybrid_dir)
    head = make_lora(model, tmp_path / "head", std=0.5, seed=5, targets=("lm_head", "q_proj"))
    d = start(tiny_hybrid_dir, tmp_path / "cache", *ARGS, "--lora", str(head))
    try:
        ref = {s: _complete(d, s, cache=False)[0] for s in (0.0, 1.0)}
        assert ref[0.0] != ref[1.0]
        assert _complete(d, 1.0)[0] == ref[1.0] and _complete(d, 1.0)[0] == ref[1.0]
    finally:
        assert d.stop() == 0, d.output()
