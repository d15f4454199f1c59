"""Prometheus text exposition (format 0.0.4) for /metrics.

HTTP figures are counted here by a middleware; generation figures come from the
engine's counters and its timing observations (drained into histograms, so
they do not pile up between scrapes); cache figures from CacheStore.stats().
"""

from __future__ import annotations

import math
import threading

SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
           120.0, 300.0, 600.0)
HISTOGRAMS = {
    "restore": "Time restoring a cached prefix into a sequence",
    "prefill": "Time computing a prompt's uncached tokens",
    "decode": "Time from the first to the last generated token of a request",
    "http_request": "Time answering an HTTP request (streams: until the stream ends)",
}
_SCHEDULER = {
    "requests": ("ckptd_requests_total", "Generation requests accepted"),
    "rejected": ("ckptd_requests_rejected_total", "Generation requests refused: queue full"),
    "cancelled": ("ckptd_requests_cancelled_total", "Generations cancelled (client gone, "
                                                    "shutdown)"),
    "errors": ("ckptd_requests_failed_total", "Generations that ended in an error"),
    "prompt_tokens": ("ckptd_prompt_tokens_total", "Prompt tokens of admitted requests"),
    "cached_tokens": ("ckptd_cached_prompt_tokens_total", "Prompt tokens restored from the "
                                                          "cache, all tiers"),
    "generated_tokens": ("ckptd_generated_tokens_total", "Tokens generated"),
}


SHED_REASONS = ("interval", "end", "branch", "block")   # what a shed write was


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = SECONDS) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)     # per bucket, not cumulative
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
                break
        self.sum += v
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, acc = [], 0
        sep = "," if labels else ""
        for b, c in zip(self.buckets, self.counts):
            acc += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{_num(b)}"}} {acc}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        lab = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{lab} {_num(self.sum)}", f"{name}_count{lab} {self.count}"]
        return out


def _totals(c: dict) -> tuple[float, float, float, float]:
    """What llama-server's throughput gauges divide: prompt tokens computed and their
    ms, tokens generated and their ms."""
    return (c["prompt_tokens"] - c["cached_tokens"], c["prompt_ms"], c["generated_tokens"],
            c["predicted_ms"])


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.http: dict[tuple[str, str, int], int] = {}
        self.hist = {name: Histogram() for name in HISTOGRAMS}
        # llama-server's throughput gauges average the window between two scrapes: the
        # totals at the last scrape (a scrape resets the window)
        self.base = (0.0, 0.0, 0.0, 0.0)
        self.last: tuple[tuple, str] | None = None   # (engine figures, text) of the last
        self.asleep: list | None = None              # [texts to serve, totals at sleep]

    def rates(self, c: dict, reset: bool) -> tuple[float, float]:
        """(prompt, generation) tokens per second over the window since the last scrape."""
        now = _totals(c)
        dn, dms, gn, gms = (a - b for a, b in zip(now, self.base))
        if reset:
            self.base = now
        return (dn / dms * 1000 if dms > 0 else 0.0, gn / gms * 1000 if gms > 0 else 0.0)

    def enter_sleep(self, engine, cache_stats: dict | None, state: str) -> None:
        """The texts /metrics serves while the daemon sleeps: first the window the last
        scrape left (its throughput), then the same with an empty window. When the engine
        did nothing since the last scrape and reported an empty window itself, that
        scrape's text stays what a scraper reads."""
        c = dict(engine.counters)
        rates = self.rates(c, reset=False)
        first = None
        if self.last is not None and self.last[0] == _figures(engine, rates):
            first = self.last[1]
        first = first or self.render(engine, cache_stats, state, rates=rates)
        rest = self.render(engine, cache_stats, state, rates=(0.0, 0.0))
        self.asleep = [[first, rest], _totals(c)]

    def asleep_text(self) -> str | None:
        """The snapshot's next text while asleep (None when awake); once the first is
        served, the window it reported is over (as a scrape ends one)."""
        snap = self.asleep
        if snap is None:
            return None
        texts, totals = snap
        if len(texts) > 1:
            self.base = totals
            return texts.pop(0)
        return texts[0]

    def leave_sleep(self) -> None:
        self.asleep = None

    def observe_http(self, route: str, method: str, status: int, seconds: float) -> None:
        with self.lock:
            k = (route, method, status)
            self.http[k] = self.http.get(k, 0) + 1
            self.hist["http_request"].observe(seconds)

    def drain(self, engine) -> None:
        """Move the engine's timing observations into the histograms."""
        obs = engine.observations
        n = len(obs)
        items = obs[:n]
        del obs[:n]          # slice deletion is atomic: appends made meanwhile stay
        with self.lock:
            for name, seconds in items:
                if name in self.hist:
                    self.hist[name].observe(seconds)

    def render(self, engine=None, cache_stats: dict | None = None, state: str = "",
               inflight: int = 0, rates: tuple[float, float] | None = None) -> str:
        """The exposition. rates: the throughput gauges to report; None: this scrape's
        window, which it then ends."""
        out: list[str] = []
        put = _Writer(out)
        put.gauge("ckptd_up", "1 once the model is loaded and the daemon serves",
                  [("", 1 if state == "ready" else 0)])
        put.gauge("ckptd_http_inflight_generations", "Generation requests being answered",
                  [("", inflight)])
        with self.lock:
            put.counter("ckptd_http_requests_total", "HTTP requests answered",
                        [(f'route="{_esc(r)}",method="{m}",status="{s}"', v)
                         for (r, m, s), v in sorted(self.http.items())])
        if engine is not None:
            self.drain(engine)
            counters = dict(engine.counters)
            for key, (name, help_text) in _SCHEDULER.items():
                put.counter(name, help_text, [("", counters.get(key, 0))])
            put.counter("ckptd_cache_hit_tokens_total", "Prompt tokens restored, by the "
                        "tier that held them (device: shared pages, mapped without a copy)",
                        [(f'tier="{t}"', n) for t, n in sorted(dict(
                            engine.cached_by_tier).items())])
            load = engine.load
            put.gauge("ckptd_sequences_running", "Sequences being computed",
                      [("", load["running"])])
            put.gauge("ckptd_requests_waiting", "Requests waiting for a sequence",
                      [("", load["waiting"])])
            scrape = rates is None
            if scrape:
                rates = self.rates(counters, reset=True)
            _llamacpp_lines(put, counters, load, rates)
            _image_lines(put, engine.runner.embedder)
        with self.lock:
            for name, help_text in HISTOGRAMS.items():
                out.append(f"# HELP ckptd_{name}_seconds {help_text}")
                out.append(f"# TYPE ckptd_{name}_seconds histogram")
                out += self.hist[name].lines(f"ckptd_{name}_seconds")
        if cache_stats is not None:
            _cache_lines(put, cache_stats)
            if cache_stats.get("remote"):
                _remote_lines(put, out, cache_stats["remote"])
        text = "\n".join(out) + "\n"
        if engine is not None and scrape:
            self.last = (_figures(engine, rates), text)
        return text


def _figures(engine, rates: tuple[float, float]) -> tuple:
    """What the engine reports in a scrape (to tell whether it changed)."""
    return (tuple(sorted(engine.counters.items())), tuple(sorted(engine.cached_by_tier.items())),
            tuple(sorted(engine.load.items())), rates)


def _llamacpp_lines(put: _Writer, c: dict, load: dict, rates: tuple[float, float]) -> None:
    """llama-server's series, same names and meanings, for dashboards built for it."""
    computed = c["prompt_tokens"] - c["cached_tokens"]
    prompt_s, predicted_s = c["prompt_ms"] / 1000, c["predicted_ms"] / 1000
    calls = c["model_calls"]
    for name, help_text, v in (
            ("prompt_tokens_total", "Number of prompt tokens processed.", computed),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache.",
             c["cached_tokens"]),
            ("prompt_seconds_total", "Prompt process time", prompt_s),
            ("tokens_predicted_total", "Number of generation tokens processed.",
             c["generated_tokens"]),
            ("tokens_predicted_seconds_total", "Predict process time", predicted_s),
            ("n_decode_total", "Total number of llama_decode() calls", calls),
            ("n_tokens_max", "Largest observed n_tokens.", c["max_sequence_tokens"]),
            # ckptd does not decode speculatively: these stay 0
            ("spec_decode_num_draft_tokens_total", "Number of draft tokens generated.", 0),
            ("spec_decode_num_accepted_tokens_total", "Number of draft tokens accepted.", 0),
            ("spec_decode_num_drafts_total", "Number of speculative drafts.", 0)):
        put.counter(f"llamacpp:{name}", help_text, [("", v)])
    for name, help_text, v in (
            # over the window since the last scrape, as llama-server's
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s.", rates[0]),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s.",
             rates[1]),
            ("requests_processing", "Number of requests processing.", load["running"]),
            ("requests_deferred", "Number of requests deferred.", load["waiting"]),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() "
                                        "call", c["busy_in_calls"] / calls if calls else 0.0)):
        put.gauge(f"llamacpp:{name}", help_text, [("", v)])


def _image_lines(put: _Writer, embedder) -> None:
    """The vision encoder's work (model/vision/embedder.py), when the model sees images."""
    if embedder is None:
        return
    put.counter("ckptd_images_encoded_total", "Images run through the vision encoder",
                [("", embedder.images_encoded)])
    put.counter("ckptd_image_encode_seconds_total", "Seconds spent in the vision encoder",
                [("", embedder.encode_seconds)])
    put.counter("ckptd_image_embedding_hits_total", "Images whose encoder output was "
                "reused from memory", [("", embedder.hits)])


def _cache_lines(put: _Writer, s: dict) -> None:
    disk, host, wq = s.get("disk", {}), s.get("host", {}), s.get("write_queue", {})
    lookups = s.get("lookups", {})
    put.gauge("ckptd_cache_bytes", "Bytes held by each cache tier (disk: compressed)",
              [('tier="host"', host.get("bytes", 0)), ('tier="disk"', disk.get("stored_bytes", 0))])
    put.gauge("ckptd_cache_budget_bytes", "Budget of each cache tier",
              [('tier="host"', host.get("budget_bytes", 0)),
               ('tier="disk"', disk.get("budget_bytes", 0))])
    put.gauge("ckptd_cache_entries", "Entries held by each cache tier",
              [('tier="host"', host.get("entries", 0)), ('tier="disk"', disk.get("entries", 0))])
    put.counter("ckptd_cache_lookups_total", "Cache lookups, by result",
                [('result="hit"', lookups.get("hits", 0)),
                 ('result="miss"', lookups.get("misses", 0))])
    put.counter("ckptd_cache_evictions_total", "Entries evicted, by tier",
                [('tier="host"', host.get("evictions", 0)),
                 ('tier="disk"', s.get("evictions", 0))])
    put.counter("ckptd_cache_corrupt_dropped_total", "Stored values that failed verification",
                [("", s.get("corrupt_dropped", 0))])
    put.gauge("ckptd_cache_write_queue_depth", "Entries waiting for the disk writer",
              [("", wq.get("depth", 0))])
    put.gauge("ckptd_cache_write_queue_bytes", "Bytes waiting for the disk writer",
              [("", wq.get("bytes", 0))])
    put.counter("ckptd_cache_dropped_writes_total", "Writes shed because the disk writer fell "
                "behind (kept in RAM only), by what they were: interval, end or branch "
                "snapshots, blocks", [(f'reason="{r}"', wq.get("shed", {}).get(r, 0))
                                      for r in SHED_REASONS])
    put.counter("ckptd_cache_committed_writes_total", "Entries committed to disk",
                [("", wq.get("committed", 0))])
    misses = s.get("misses") or {}
    put.counter("ckptd_cache_misses_total", "Restores that stopped short of the prompt, by "
                "why the first token not restored was not (timings.cache.miss.reason)",
                [(f'reason="{r}"', n) for r, n in misses.get("by_reason", {}).items()])
    put.counter("ckptd_cache_missed_tokens_total", "Prompt tokens computed after a miss, by "
                "its reason", [(f'reason="{r}"', n)
                               for r, n in misses.get("tokens_by_reason", {}).items()])
    put.counter("ckptd_cache_restores_total", "Restores explained, by whether the whole "
                "prompt (but its last token) was restored",
                [('result="complete"', misses.get("complete", 0)),
                 ('result="missed"', misses.get("restores", 0) - misses.get("complete", 0))])


def _remote_lines(put: _Writer, out: list[str], r: dict) -> None:
    up, fetch, look = r.get("uploads") or {}, r["fetch"], r["lookups"]
    put.gauge("ckptd_remote_available", "1 unless the remote tier is cooling off after "
              "failures (lookups skip it meanwhile)", [("", int(r["available"]))])
    put.counter("ckptd_remote_requests_total", "Requests made to the remote tier",
                [(f'op="{op}"', n) for op, n in r["requests"].items()])
    put.counter("ckptd_remote_errors_total", "Remote requests that failed, by kind "
                "(a missing object is not one)", [(f'kind="{k}"', n)
                                                   for k, n in r["errors"].items()])
    put.counter("ckptd_remote_bytes_total", "Bytes moved to and from the remote tier",
                [('direction="down"', r["bytes_down"]), ('direction="up"', r["bytes_up"])])
    lat = r["latency"]
    out.append("# HELP ckptd_remote_request_seconds Time of one remote request")
    out.append("# TYPE ckptd_remote_request_seconds histogram")
    acc = 0
    for b, c in zip(lat["buckets"], lat["counts"]):
        acc += c
        out.append(f'ckptd_remote_request_seconds_bucket{{le="{_num(b)}"}} {acc}')
    out.append(f'ckptd_remote_request_seconds_bucket{{le="+Inf"}} {sum(lat["counts"])}')
    out += [f"ckptd_remote_request_seconds_sum {_num(lat['sum'])}",
            f"ckptd_remote_request_seconds_count {sum(lat['counts'])}"]
    put.counter("ckptd_remote_lookups_total", "Restores that asked the remote, or skipped "
                "it while it was cooling off", [('result="asked"', look["asked"]),
                                                 ('result="skipped"', look["skipped"])])
    put.counter("ckptd_remote_fetched_objects_total", "Objects read from the remote for "
                "restores, checked", [("", fetch["objects"])])
    put.counter("ckptd_remote_fetch_failures_total", "Remote objects a restore planned but "
                "could not use", [(f'reason="{k}"', fetch[k]) for k in
                                  ("missing", "corrupt", "late")])
    put.gauge("ckptd_remote_upload_queue_depth", "Entries waiting to go up",
              [("", up.get("depth", 0))])
    put.gauge("ckptd_remote_upload_queue_bytes", "Bytes waiting to go up",
              [("", up.get("bytes", 0))])
    put.counter("ckptd_remote_uploads_total", "Entries offered for upload, by outcome "
                "(exists: another daemon had put it; dropped: the queue was full)",
                [(f'result="{k}"', up.get(k, 0)) for k in
                 ("uploaded", "exists", "failed", "dropped")])
    put.counter("ckptd_remote_upload_retries_total", "Upload attempts repeated after a "
                "failure", [("", up.get("retries", 0))])


class _Writer:
    def __init__(self, out: list[str]) -> None:
        self.out = out

    def _family(self, kind: str, name: str, help_text: str, samples) -> None:
        self.out.append(f"# HELP {name} {help_text}")
        self.out.append(f"# TYPE {name} {kind}")
        for labels, v in samples:
            self.out.append(f"{name}{{{labels}}} {_num(v)}" if labels else f"{name} {_num(v)}")

    def counter(self, name: str, help_text: str, samples) -> None:
        self._family("counter", name, help_text, samples)

    def gauge(self, name: str, help_text: str, samples) -> None:
        self._family("gauge", name, help_text, samples)


def _num(v: float) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
