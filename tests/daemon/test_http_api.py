"""The HTTP API of a real daemon process: OpenAI client, llama.cpp fields, cache admin,
named contexts, OpenAPI document, Prometheus metrics."""

from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest

from ckptd.daemon.config import ServeConfig
from ckptd.daemon.http.app import build_app
from ckptd.daemon.service import Service
from ckptd.model.sampling.sampler import SamplingParams

PROMPT = list(range(40, 40 + 37))           # token ids: 2 full blocks + a tail


def _client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0,
                         timeout=90)


def _model(daemon) -> str:
    return daemon.get("/v1/models").json["data"][0]["id"]


def test_openai_client_completions_and_chat(daemon):
    client, model = _client(daemon), _model(daemon)
    greedy = {"temperature": 0, "max_tokens": 6}
    nocache = {"cache": False, "ignore_eos": True}
    c = client.completions.create(model=model, prompt=PROMPT, extra_body=nocache, **greedy)
    assert c.object == "text_completion" and c.model == model
    assert c.usage.prompt_tokens == len(PROMPT) and c.usage.completion_tokens == 6
    assert c.usage.prompt_tokens_details.cached_tokens == 0
    assert c.choices[0].finish_reason == "length"
    timings = c.model_extra["timings"]
    assert timings["prompt_n"] == len(PROMPT) and timings["predicted_n"] == 6
    assert timings["prompt_ms"] > 0 and timings["predicted_per_second"] > 0

    chunks = list(client.completions.create(model=model, prompt=PROMPT, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body=nocache, **greedy))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.choices[0].text
    assert chunks[-1].usage.completion_tokens == 6

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    chat = client.chat.completions.create(model=model, messages=msgs, logprobs=True,
                                          top_logprobs=2, extra_body=nocache, **greedy)
    msg = chat.choices[0].message
    assert msg.role == "assistant" and chat.usage.completion_tokens == 6
    lps = chat.choices[0].logprobs.content
    assert len(lps) == 6 and all(len(t.top_logprobs) == 2 for t in lps)
    assert all(t.logprob <= t.top_logprobs[0].logprob + 1e-6 for t in lps)
    stream = client.chat.completions.create(model=model, messages=msgs, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body=nocache, **greedy)
    parts = list(stream)
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == msg.content
    assert [p.choices[0].finish_reason for p in parts if p.choices][-1] == "length"
    assert parts[-1].usage.prompt_tokens == chat.usage.prompt_tokens


def test_repeat_restores_from_cache_with_same_output(daemon):
    client, model = _client(daemon), _model(daemon)
    prompt = list(range(100, 100 + 50))
    kw = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": 5,
          "extra_body": {"ignore_eos": True, "cache_salt": "repeat"}}
    first = client.completions.create(**kw)
    second = client.completions.create(**kw)
    longer = client.completions.create(**{**kw, "prompt": prompt + [7, 8, 9]})
    plain = client.completions.create(**{**kw, "prompt": prompt + [7, 8, 9], "extra_body": {
        "ignore_eos": True, "cache": False}})
    other_tenant = client.completions.create(**{**kw, "extra_body": {
        "ignore_eos": True, "cache_salt": "someone-else"}})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.choices[0].text == first.choices[0].text
    assert longer.usage.prompt_tokens_details.cached_tokens >= 48
    assert longer.model_extra["timings"]["cache_tier"] in ("host", "disk")
    assert longer.choices[0].text == plain.choices[0].text
    assert plain.usage.prompt_tokens_details.cached_tokens == 0
    assert other_tenant.usage.prompt_tokens_details.cached_tokens == 0


def test_llama_completion(daemon):
    body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0, "ignore_eos": True,
            "n_probs": 3, "cache_prompt": False, "return_tokens": True}
    r = daemon.post("/completion", body)
    assert r.status == 200, r.text
    out = r.json
    assert len(out["tokens"]) == 4 and isinstance(out["content"], str)
    assert out["stop"] is True and out["stop_type"] == "limit"
    assert out["tokens_evaluated"] == len(PROMPT) and out["tokens_predicted"] == 4
    assert out["timings"]["predicted_n"] == 4 and out["timings"]["cache_n"] == 0
    assert len(out["completion_probabilities"]) == 4
    assert len(out["completion_probabilities"][0]["top_logprobs"]) == 3
    events = daemon.post("/completion", {**body, "stream": True}).sse()
    assert "[DONE]" not in events                  # llama.cpp streams end without it
    assert [e["stop"] for e in events] == [False] * 4 + [True]
    assert [t for e in events[:-1] for t in e["tokens"]] == out["tokens"]
    assert "".join(e["content"] for e in events) == out["content"]

    text = daemon.post("/completion", {"prompt": "The quick brown", "n_predict": 2,
                                       "seed": 5, "temperature": 1.0}).json
    again = daemon.post("/completion", {"prompt": "The quick brown", "n_predict": 2,
                                        "seed": 5, "temperature": 1.0}).json
    assert text["tokens"] == again["tokens"]      # a seed fixes sampled tokens
    assert text["prompt"] == "The quick brown"
    ids = daemon.post("/tokenize", {"content": "The quick brown"}).json["tokens"]
    by_ids = daemon.post("/completion", {"prompt": ids, "n_predict": 1}).json
    assert by_ids["prompt"] == "The quick brown"   # decoded only for the answer
    tail = daemon.post("/tokenize", {"content": " lazy dog"}).json["tokens"]
    mixed = daemon.post("/completion", {"prompt": ids + [" lazy dog"] + ids, "n_predict": 1})
    assert mixed.json["tokens_evaluated"] == 2 * len(ids) + len(tail)


def _local_text(model_dir, params: SamplingParams) -> str:
    """The same greedy run in process, for what the daemon must give."""
    from ckptd.daemon.engine import local_engine
    from ckptd.model.loader import load_model
    from ckptd.model.text.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    engine = local_engine(load_model(model_dir), tok, num_pages=16)
    return tok.decode([ev.token for ev in engine.stream(PROMPT, params)])


def test_logit_bias_and_penalties(daemon, tiny_hybrid_dir):
    """OpenAI's fields give what the sampler gives in process; llama.cpp's count the
    prompt's tokens too, and `false` bans a token. Two tokens held far above the rest by
    their biases (7: +100, 9: +90) alternate under a frequency penalty of 20: 7 (100),
    9 (90 > 80), 7 (80 > 70), ... The prompt restored from cache with no penalties
    gives the plain answer again (sampling never touches the cache)."""
    base = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    plain = daemon.post("/v1/completions", base).json["choices"][0]["text"]
    forced = daemon.post("/v1/completions", {**base, "logit_bias": {"77": 100}, "logprobs": 1})
    assert forced.status == 200, forced.text
    lp = forced.json["choices"][0]["logprobs"]["tokens"]
    assert lp == [lp[0]] * 8
    openai_fields = {"presence_penalty": 1.5, "frequency_penalty": -0.5,
                     "repetition_penalty": 1.3, "logit_bias": {"9": 2.5, "12": -3}}
    got = daemon.post("/v1/completions", {**base, **openai_fields}).json["choices"][0]["text"]
    want = _local_text(tiny_hybrid_dir, SamplingParams(
        max_tokens=8, ignore_eos=True, presence_penalty=1.5, frequency_penalty=-0.5,
        repetition_penalty=1.3, logit_bias=((9, 2.5), (12, -3.0))))
    assert got == want and got != plain

    llama = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "ignore_eos": True,
             "return_tokens": True}
    alternating = daemon.post("/completion", {
        **llama, "logit_bias": [[7, 100], [9, 90]], "frequency_penalty": 20,
        "repeat_last_n": -1}).json["tokens"]
    assert alternating == [7, 9, 7, 9, 7, 9]
    first = daemon.post("/completion", llama).json["tokens"]
    banned = daemon.post("/completion", {**llama, "logit_bias": {str(first[0]): False}}).json
    assert first[0] not in banned["tokens"]
    in_prompt = daemon.post("/completion", {**llama, "logit_bias": [[PROMPT[0], 100]],
                                            "presence_penalty": 100, "repeat_last_n": -1})
    assert PROMPT[0] not in in_prompt.json["tokens"]   # the window holds the prompt
    again = daemon.post("/v1/completions", base).json
    assert again["choices"][0]["text"] == plain
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_tokenize_detokenize_and_models(daemon):
    ids = daemon.post("/tokenize", {"content": "Paris is the capital"}).json["tokens"]
    assert ids and all(isinstance(i, int) for i in ids)
    pieces = daemon.post("/tokenize", {"content": "Paris", "with_pieces": True}).json["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Paris"
    assert daemon.post("/detokenize", {"tokens": ids}).json["content"] == "Paris is the capital"
    models = daemon.get("/v1/models").json
    assert models["object"] == "list" and len(models["data"]) == 1
    assert models["data"][0]["meta"]["n_ctx"] == 512


def test_openapi_lists_exactly_the_routes(daemon, tmp_path):
    app = build_app(Service(ServeConfig(cache_dir=tmp_path)))
    routes = {(r.method.lower(), r.resource.canonical) for r in app.router.routes()}
    doc = daemon.get("/openapi.json").json
    assert doc["openapi"].startswith("3.")
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert routes == documented
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert op["responses"] and op["summary"]
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert names == set(re.findall(r"{(\w+)}", path))


_LABEL = r'[a-zA-Z_]\w*="(?:[^"\\]|\\.)*"'
_SAMPLE = re.compile(rf'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
                     rf'(?:{{(?P<labels>{_LABEL}(?:,{_LABEL})*)}})?'
                     r' (?P<value>-?[0-9.e+-]+|[+-]Inf|NaN)$')


def parse_prometheus(text: str) -> dict[str, list[tuple[str, float]]]:
    """A strict reader of the text format: every sample belongs to a declared family."""
    types: dict[str, str] = {}
    samples: dict[str, list[tuple[str, float]]] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped")
            assert name not in types, f"family {name} declared twice"
            types[name] = kind
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name = m.group("name")
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in types or types.get(family) == "histogram", f"undeclared {name}"
        samples.setdefault(name, []).append((m.group("labels") or "", float(m.group("value"))))
    for name, kind in types.items():
        if kind == "histogram":
            counts = [v for _, v in samples[name + "_bucket"]]
            assert counts == sorted(counts) and counts[-1] == samples[name + "_count"][0][1]
    return samples


def test_metrics_are_prometheus_text(daemon):
    daemon.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    r = daemon.get("/metrics")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
    s = parse_prometheus(r.text)
    assert s["ckptd_up"] == [("", 1.0)]
    assert s["ckptd_requests_total"][0][1] >= 1
    assert s["ckptd_generated_tokens_total"][0][1] >= 2
    assert s["ckptd_prefill_seconds_count"][0][1] >= 1
    tiers = dict(s["ckptd_cache_bytes"])
    assert set(tiers) == {'tier="host"', 'tier="disk"'} and tiers['tier="host"'] > 0
    assert "ckptd_cache_write_queue_depth" in s and "ckptd_cache_dropped_writes_total" in s
    http = dict(s["ckptd_http_requests_total"])
    assert http['route="/v1/completions",method="POST",status="200"'] >= 1


def test_cache_admin(daemon):
    client, model = _client(daemon), _model(daemon)
    client.completions.create(model=model, prompt=list(range(200, 240)), max_tokens=1,
                              extra_body={"cache_salt": "admin"})
    stats = daemon.get("/cache/stats").json
    assert stats["entries"] > 0 and stats["scheduler"]["requests"] >= 1
    page = daemon.get("/cache/entries?limit=1&sort=position").json
    assert len(page["data"]) == 1 and page["next_offset"] == 1
    deepest = page["data"][0]
    assert deepest["kind"] in ("block", "snapshot")
    assert daemon.post("/cache/pin", {"key": deepest["key"]}).json["pinned"] is True
    pinned = {e["key"] for e in daemon.get("/cache/entries?limit=1000").json["data"]
              if e["pinned"]}
    assert deepest["key"] in pinned and deepest["parent"] in pinned    # ancestors too
    cleared = daemon.post("/cache/clear", {}).json["deleted"]
    keys = {e["key"] for e in daemon.get("/cache/entries?limit=1000").json["data"]}
    assert cleared > 0 and pinned <= keys                               # pins survive clear
    assert daemon.post("/cache/unpin", {"key": deepest["key"]}).status == 200
    r = daemon.request("DELETE", f"/cache/entries/{deepest['parent']}")
    assert r.status == 200 and r.json["deleted"] >= 2                   # the entry and below
    assert daemon.request("DELETE", f"/cache/entries/{deepest['key']}").status == 404


@pytest.mark.parametrize("source", ["text", "messages"])
def test_named_context(daemon, source):
    name = f"manual-{source}"
    doc = "Paris is the capital of France. " * 12
    body = {"name": name, "text": doc} if source == "text" else \
        {"name": name, "messages": [{"role": "system", "content": doc}]}
    r = daemon.post("/v1/contexts", body)
    assert r.status == 201, r.text
    ctx = r.json
    assert ctx["tokens"] > 48 and ctx["pinned"] is True and ctx["key"]
    assert daemon.get(f"/v1/contexts/{name}").json["tokens"] == ctx["tokens"]
    assert name in {c["name"] for c in daemon.get("/v1/contexts").json["data"]}
    if source == "text":
        req = {"prompt": " Berlin is", "context": name, "max_tokens": 4, "temperature": 0}
        path, ref_prompt = "/v1/completions", doc + " Berlin is"
    else:
        req = {"messages": [{"role": "user", "content": "Where is Paris?"}],
               "context": name, "max_tokens": 4, "temperature": 0}
        path, ref_prompt = "/v1/chat/completions", None
    out = daemon.post(path, req).json
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] >= ctx["tokens"]
    assert out["usage"]["prompt_tokens"] > ctx["tokens"]
    if ref_prompt is not None:                     # context + suffix == the same text, uncached
        ids = daemon.post("/tokenize", {"content": doc}).json["tokens"] + \
            daemon.post("/tokenize", {"content": " Berlin is"}).json["tokens"]
        ref = daemon.post(path, {"prompt": ids, "max_tokens": 4, "temperature": 0,
                                 "cache": False}).json
        assert out["choices"][0]["text"] == ref["choices"][0]["text"]
    assert daemon.request("DELETE", f"/v1/contexts/{name}").status == 200
    assert daemon.get(f"/v1/contexts/{name}").status == 404
    assert daemon.post(path, req).status == 404


def _cpu_ticks(pid: int) -> dict[int, int]:
    """utime + stime of each thread of a process, in clock ticks."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:                         # the thread ended meanwhile
            continue
        out[int(task.name)] = int(fields[11]) + int(fields[12])
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads Linux's /proc")
def test_model_steps_run_on_the_main_thread(daemon):
    # On a machine with no core to spare, libgomp lets only the main thread's team spin
    # between torch's parallel regions; the daemon runs its scheduler there.
    pid = daemon.proc.pid
    before = _cpu_ticks(pid)
    prompt = [(7 * i) % 500 + 3 for i in range(450)]
    for _ in range(12):
        r = daemon.post("/completion", {"prompt": prompt, "n_predict": 1, "cache_prompt": False})
        assert r.status == 200, r.text
    after = _cpu_ticks(pid)
    used = {t: n - before.get(t, 0) for t, n in after.items()}
    main = used.pop(pid)
    assert main >= 0.4 * (main + sum(used.values())), (main, used)
