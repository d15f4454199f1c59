"""The benchmark's outputs: results.json (every request), report.md (tables) and PNG plots.

Rows carry a `server` label; when a peer ran too, each table shows both servers
side by side. Figures of repeated requests are medians.
"""

from __future__ import annotations

import json
from pathlib import Path

from ckptd.tools.bench.scenarios import median

PHASES = ("cold", "warm", "restart")
PHASE_LABEL = {"cold": "cold", "warm": "warm", "restart": "after restart"}
TIER_LABEL = {"warm": " (RAM)", "restart": " (disk)"}    # where ckptd serves them from


def _ms(v: float | None) -> str:
    return "–" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def _n(v) -> str:
    return "?" if v is None else str(v)


def _share(cache_n, prompt_n) -> str:
    if cache_n is None or not prompt_n:
        return "?"
    return f"{100 * cache_n / prompt_n:.0f}%"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def servers(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["server"] for r in rows))


def context_summary(rows: list[dict]) -> list[dict]:
    """One entry per (server, length): median TTFT per phase, and the token counts."""
    out = []
    ctx = [r for r in rows if r["scenario"] == "context"]
    for server in servers(ctx):
        for length in dict.fromkeys(r["length"] for r in ctx if r["server"] == server):
            mine = [r for r in ctx if r["server"] == server and r["length"] == length]
            entry = {"server": server, "length": length}
            for phase in PHASES:
                ph = [r for r in mine if r["phase"] == phase]
                if not ph:
                    continue
                last = ph[-1]
                entry[phase] = {"ttft_ms": median([r["ttft_ms"] for r in ph]),
                                "server_ttft_ms": median([r["server_ttft_ms"] for r in ph]),
                                "prompt_n": last["prompt_n"], "cache_n": last["cache_n"],
                                "computed_n": last["computed_n"], "tier": last["cache_tier"]}
            out.append(entry)
    return out


def _cached(p: dict | None) -> str:
    if p is None:
        return "–"
    tier = f" {p['tier']}" if p.get("tier") else ""
    return f"{_n(p['cache_n'])}/{_n(p['prompt_n'])}{tier}"


def markdown(results: dict) -> str:
    rows, meta = results["rows"], results["meta"]
    lines = ["# ckptd bench", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    summary = context_summary(rows)
    if summary:
        lines += ["", "## Time to first token by context length",
                  "", "TTFT is measured by the client (request sent -> first streamed token), "
                  "median of the repeats. *cached* is tokens served from cache / prompt "
                  "tokens, as the server reports them (? = the server does not say).", ""]
        body = []
        for e in summary:
            cold, warm, rs = e.get("cold"), e.get("warm"), e.get("restart")
            speed = "–"
            if cold and warm and warm["ttft_ms"]:
                speed = f"{cold['ttft_ms'] / warm['ttft_ms']:.1f}×"
            body.append([e["server"], str(e["length"]),
                         _n(cold and cold["prompt_n"]), _ms(cold and cold["ttft_ms"]),
                         _ms(warm and warm["ttft_ms"]), speed, _ms(rs and rs["ttft_ms"]),
                         _n(cold and cold["computed_n"]), _cached(warm), _cached(rs)])
        lines += _table(["server", "target tokens", "prompt tokens", "cold TTFT ms",
                         "warm TTFT ms", "cold/warm", "after restart TTFT ms",
                         "cold: computed", "warm: cached", "restart: cached"], body)
    chat = [r for r in rows if r["scenario"] == "chat"]
    if chat:
        lines += ["", "## Multi-turn chat", "", "Each turn resends the whole history.", ""]
        lines += _table(["server", "turn", "prompt tokens", "cached", "cached share",
                         "TTFT ms"],
                        [[r["server"], str(r["turn"]), _n(r["prompt_n"]), _n(r["cache_n"]),
                          _share(r["cache_n"], r["prompt_n"]), _ms(r["ttft_ms"])]
                         for r in chat])
    mem = [r for r in rows if r["scenario"] == "memory"]
    if mem:
        lines += ["", "## Memory store: one document, many questions", ""]
        lines += _table(["server", "request", "prompt tokens", "cached", "computed",
                         "TTFT ms"],
                        [[r["server"], r["request"], _n(r["prompt_n"]), _n(r["cache_n"]),
                          _n(r["computed_n"]), _ms(r["ttft_ms"])] for r in mem])
        lines += [""] + memory_summary(mem)
    lines += ["", "## Client vs server", ""] + consistency_lines(rows)
    return "\n".join(lines) + "\n"


def memory_summary(mem: list[dict]) -> list[str]:
    """Mean TTFT per question by server, and ckptd's rows against the peer's, when a
    peer ran (ckptd's two ways of asking are not compared with each other)."""
    means = {}
    for server in servers(mem):
        ttfts = [r["ttft_ms"] for r in mem if r["server"] == server and r["index"] > 0]
        if ttfts:
            means[server] = sum(ttfts) / len(ttfts)
    peers = [s for s in means if not s.startswith("ckptd")]
    peer = peers[-1] if peers else None
    out = []
    for server, mean in means.items():
        line = f"- {server}: mean TTFT per question {_ms(mean)} ms"
        if peer is not None and server != peer and mean and means[peer]:
            ratio = means[peer] / mean
            line += (f", {ratio:.1f}x faster than {peer}" if ratio >= 1
                     else f", {1 / ratio:.1f}x slower than {peer}")
        out.append(line)
    return out


def consistency_lines(rows: list[dict]) -> list[str]:
    """The client's TTFT against the server's own queue + restore + prefill time: the
    difference is HTTP, the first token's sampling and streaming."""
    timed = [r for r in rows if r["server_ttft_ms"] is not None]
    if not timed:
        return ["No server reported timings."]
    out = []
    for server in servers(timed):
        mine = [r for r in timed if r["server"] == server]
        gaps = [r["ttft_ms"] - r["server_ttft_ms"] for r in mine]
        out.append(f"- {server}: {len(mine)} requests with timings; client TTFT - server "
                   f"(queue+restore+prefill) median {_ms(median(gaps))} ms, "
                   f"min {_ms(min(gaps))} ms, max {_ms(max(gaps))} ms")
    return out


def plots(results: dict, out: Path) -> list[Path]:
    import matplotlib  # optional (extra bench)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the backend

    rows, written = results["rows"], []
    summary = context_summary(rows)
    if summary:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for server in servers(summary):
            mine = [e for e in summary if e["server"] == server]
            for phase, style in zip(PHASES, ("o-", "s--", "^:")):
                pts = [(e["length"], e[phase]["ttft_ms"]) for e in mine if phase in e]
                if pts:
                    tier = TIER_LABEL.get(phase, "") if server.startswith("ckptd") else ""
                    ax.plot(*zip(*pts), style, label=f"{server}: {PHASE_LABEL[phase]}{tier}")
        ax.set(xlabel="context length (tokens)", ylabel="time to first token (ms)",
               yscale="log", title="TTFT by context length")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        written.append(_save(fig, out / "ttft_by_context.png"))
    chat = [r for r in rows if r["scenario"] == "chat"]
    if chat:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for server in servers(chat):
            mine = [r for r in chat if r["server"] == server]
            turns = [r["turn"] for r in mine]
            if all(r["cache_n"] is not None and r["prompt_n"] for r in mine):
                a1.plot(turns, [100 * r["cache_n"] / r["prompt_n"] for r in mine], "o-",
                        label=server)
            a2.plot(turns, [r["ttft_ms"] for r in mine], "o-", label=server)
        a1.set(xlabel="turn", ylabel="prompt served from cache (%)", ylim=(0, 105),
               title="Chat: cached share per turn")
        a2.set(xlabel="turn", ylabel="TTFT (ms)", title="Chat: TTFT per turn")
        for a in (a1, a2):
            a.grid(True, alpha=0.3)
            a.legend(fontsize=8)
        written.append(_save(fig, out / "chat_turns.png"))
    mem = [r for r in rows if r["scenario"] == "memory"]
    if mem:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = servers(mem)
        width = 0.8 / len(names)
        for k, server in enumerate(names):
            mine = [r for r in mem if r["server"] == server]
            ax.bar([r["index"] + k * width for r in mine], [r["ttft_ms"] for r in mine],
                   width, label=server)
        first = [r for r in mem if r["server"] == names[0]]
        ax.set_xticks([r["index"] + 0.4 - width / 2 for r in first],
                      [r["request"] for r in first], rotation=30, fontsize=8)
        ax.set(ylabel="TTFT (ms)", yscale="log", title="Memory store: document, then questions")
        ax.legend(fontsize=8)
        written.append(_save(fig, out / "memory_questions.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt  # optional (extra bench): plots() chose the backend

    plt.close(fig)
    return path


def write(results: dict, out: Path, with_plots: bool = True) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "report.md"]
    paths[0].write_text(json.dumps(results, indent=1))
    paths[1].write_text(markdown(results))
    if with_plots:
        paths += plots(results, out)
    return paths
