"""llama-server's sampling fields (issue 23) against the shared tiny daemon: the filters
ckptd implements, the ones it refuses by name, `samplers`; n > 1 computing its prompt
once; /slots read while requests come and go."""

from __future__ import annotations

import threading

import pytest

PROMPT = "The quick brown fox jumps over the lazy dog"


def _metric(d, name: str) -> float:
    for line in d.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_implemented_filters_run_and_are_reported(daemon):
    body = {"prompt": PROMPT, "n_predict": 3, "seed": 1, "typical_p": 0.7, "top_n_sigma": 2.0,
            "min_keep": 2, "xtc_probability": 0.5, "xtc_threshold": 0.2, "dynatemp_range": 0.3,
            "dynatemp_exponent": 2.0, "samplers": "kyptx", "ignore_eos": True}
    r = daemon.post("/completion", body)
    assert r.status == 200, r.text
    gs = r.json["generation_settings"]
    assert gs["typical_p"] == 0.7 and gs["top_n_sigma"] == 2.0 and gs["min_keep"] == 2
    assert gs["samplers"] == ["top_k", "typ_p", "top_p", "temperature", "xtc"]
    assert gs["mirostat"] == 0 and gs["dry_multiplier"] == 0.0        # off, as reported
    miro = {"prompt": PROMPT, "n_predict": 4, "seed": 3, "temperature": 0.9, "mirostat": 2,
            "mirostat_tau": 3.0, "mirostat_eta": 0.2, "ignore_eos": True}
    m = daemon.post("/completion", miro)
    assert m.status == 200, m.text
    gs = m.json["generation_settings"]
    assert (gs["mirostat"], gs["mirostat_tau"], gs["mirostat_eta"]) == (2, 3.0, 0.2)
    assert daemon.post("/completion", miro).json["content"] == m.json["content"]


def test_dry_penalises_the_token_that_extends_a_repeat(daemon):
    """A prompt that cycles 300 301 302, and a bias that makes 300 (the cycle's next
    token) the greedy choice: DRY takes it away, and reports its settings; a request's
    `samplers` without "dry" runs none."""
    greedy = {"prompt": [300, 301, 302] * 10, "n_predict": 1, "temperature": 0,
              "return_tokens": True, "logit_bias": [[300, 30.0]]}
    assert daemon.post("/completion", greedy).json["tokens"] == [300]
    dry = {**greedy, "dry_multiplier": 0.8, "dry_sequence_breakers": ["\u2603"]}
    got = daemon.post("/completion", dry)
    assert got.status == 200, got.text
    gs = got.json["generation_settings"]
    assert (gs["dry_multiplier"], gs["dry_base"], gs["dry_allowed_length"]) == (0.8, 1.75, 2)
    assert got.json["tokens"] != [300]
    off = daemon.post("/completion", {**dry, "samplers": ["top_k", "temperature"]}).json
    assert off["tokens"] == [300]


@pytest.mark.parametrize("field,value", [("mirostat", 3), ("dry_sequence_breakers", []),
                                         ("adaptive_target", 0.5), ("n_indent", 4),
                                         ("t_max_predict_ms", 100), ("grammar_lazy", True),
                                         ("samplers", ["top_k", "infill"]),
                                         ("samplers", ["top_k", "warp"]), ("typical_p", 2.0)])
def test_what_is_not_implemented_is_refused_by_name(daemon, field, value):
    r = daemon.post("/completion", {"prompt": PROMPT, "n_predict": 1, field: value})
    assert r.status == 400 and r.json["error"]["param"] == field, r.text


def test_lora_without_adapters_names_the_id(daemon):
    r = daemon.post("/completion", {"prompt": PROMPT, "n_predict": 1,
                                    "lora": [{"id": 0, "scale": 1.0}]})
    assert r.status == 400 and r.json["error"]["param"] == "lora[0].id", r.text
    assert daemon.get("/lora-adapters").json == []


def test_off_values_of_refused_fields_pass(daemon):
    # what llama.cpp's web UI sends with every request
    off = {"mirostat": 0, "mirostat_tau": 5, "mirostat_eta": 0.1, "dry_multiplier": 0,
           "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
           "adaptive_target": -1, "n_indent": 0, "t_max_predict_ms": 0, "xtc_probability": 0,
           "typical_p": 1, "top_n_sigma": -1, "samplers": "edkypmxt", "lora": []}
    r = daemon.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 2, **off})
    assert r.status == 200, r.text


def test_n_choices_compute_their_prompt_once(daemon):
    prompt = [int(t) for t in range(300, 300 + 150)]         # never sent before
    before = _metric(daemon, "llamacpp:prompt_tokens_total")
    r = daemon.post("/v1/completions", {"prompt": prompt, "n": 3, "max_tokens": 2,
                                        "temperature": 1, "seed": 2, "ignore_eos": True})
    assert r.status == 200, r.text
    computed = _metric(daemon, "llamacpp:prompt_tokens_total") - before
    # the first computes all 150; the copies adopt its state at the prompt's end, which
    # carries the last logits: they compute nothing of the prompt
    assert computed == len(prompt), computed
    assert r.json["usage"]["prompt_tokens"] == len(prompt)
    timings = daemon.post("/completion", {"prompt": prompt, "n_predict": 1}).json["timings"]
    assert timings["prompt_n"] == 0 and timings["cache_n"] == len(prompt)


def test_slots_read_while_requests_come_and_go(daemon):
    seen, errors, stop = [], [], threading.Event()

    def poll() -> None:
        while not stop.is_set():
            r = daemon.get("/slots")
            if r.status != 200:
                errors.append(r.text)
                continue
            ids = [s["id"] for s in r.json]
            if ids != sorted(set(ids)):
                errors.append(r.text)
            seen.append(sum(s["is_processing"] for s in r.json))

    pollers = [threading.Thread(target=poll) for _ in range(2)]
    for t in pollers:
        t.start()
    try:
        clients = [threading.Thread(target=daemon.post, args=("/completion", {
            "prompt": f"{PROMPT} {i}", "n_predict": 8, "ignore_eos": True}))
            for i in range(8)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
    finally:
        stop.set()
        for t in pollers:
            t.join()
    assert not errors, errors[:2]
    assert seen and max(seen) >= 1 and all(n <= 4 for n in seen)
