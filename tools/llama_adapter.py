"""Start ckptd where llama.cpp's server tests start `llama-server`: its flags mapped to
ckptd's (`LLAMA_SERVER_BIN_PATH` names a wrapper that runs this module).

`--ctx-size N --parallel S` gives each request N/S tokens of context, as llama-server's
slots have; with `--kv-unified` each may use all N (ckptd's pages are one pool anyway).
The model is ckptd's (CKPTD_SUITE_MODEL, default the embedded SmolLM2); the suite's
model flags (--hf-repo, --model, --model-draft) are not followed: it downloads nothing
(a draft model is ckptd's model too: it drafts for itself). Its LoRA adapters are
for its own model too: `--lora` serves CKPTD_SUITE_LORA instead (an adapter for
ckptd's model, `ckptd make-lora`), and is refused without it; its vision tower likewise
(CKPTD_SUITE_MMPROJ, for a GGUF model; an HF model folder brings its own). llama-server's
defaults are mapped too: metrics off unless --metrics, CORS open to any origin with
credentials. A flag for a feature ckptd leaves out exits 2 with one line saying so.
"""

from __future__ import annotations

import os
import sys
import tempfile

from ckptd.daemon.flags import SETTINGS
from ckptd.model.default import default_model_path

# llama-server flag -> (ckptd flag or None to drop it, takes a value)
_MAP = {
    "--port": ("--port", True), "--host": ("--host", True), "--temp": ("--temp", True),
    "--seed": ("--seed", True), "--alias": ("--alias", True), "--api-key": ("--api-key", True),
    "--slot-save-path": ("--slot-save-path", True), "--threads": ("--threads", True),
    "--chat-template": ("--chat-template", True),
    "--chat-template-file": ("--chat-template-file", True),
    "--cors-origins": ("--cors-origins", True), "--batch-size": ("--step-tokens", True),
    "--n-predict": ("--n-predict", True), "--slots": ("--slots", False),
    "--no-slots": ("--no-slots", False),
    "--model": (None, True), "--hf-repo": (None, True), "--hf-file": (None, True),
    "--ubatch-size": (None, True), "--n-gpu-layers": (None, True), "-ctk": (None, True),
    "-ctv": (None, True), "-fa": (None, True), "--cache-ram": (None, True),
    "--tags": ("--tags", True), "--reasoning": ("--reasoning", True),
    "--reasoning-format": (None, True),
    "--offline": (None, False), "--cont-batching": (None, False),
    "--swa-full": (None, False), "--jinja": (None, False), "--no-jinja": (None, False),
    "--no-ui": (None, False), "--verbose": ("--verbose", False),
    "--no-cache-idle-slots": (None, False),
    "--lora-init-without-apply": ("--lora-init-without-apply", False),
    "--sleep-idle-seconds": ("--sleep-idle-seconds", True),
    "--backend_sampling": ("--backend-sampling", False),
    "--backend-sampling": ("--backend-sampling", False),
    "--spec-type": ("--spec-type", True), "--spec-draft-n-max": ("--spec-draft-n-max", True),
    "--spec-draft-n-min": ("--spec-draft-n-min", True),
    "--spec-draft-p-min": ("--spec-draft-p-min", True),
    "--spec-synth-len": ("--spec-synth-len", True),
    "--spec-synth-rates": ("--spec-synth-rates", True),
    "--media-path": ("--media-path", True), "--no-mmproj": ("--no-mmproj", False),
    # the suite's vision tower is for its own model: CKPTD_SUITE_MMPROJ takes its place
    "--mmproj-url": (None, True), "--mmproj": (None, True),
}
UNSUPPORTED = {
    "--embedding": "embeddings", "--reranking": "reranking", "--pooling": "embeddings",
    "--context-shift": "context shift",
    "--models-dir": "router mode", "--models-max": "router mode",
    "--no-models-autoload": "router mode",
    "--models-preset": "router mode", "--tools": "tool/MCP proxying",
    "--mcp-servers-config": "tool/MCP proxying", "--mcp-servers-json": "tool/MCP proxying",
    "--ui-mcp-proxy": "tool/MCP proxying",
    "--grp-attn-n": "context shift", "--grp-attn-w": "context shift",
}


def translate(argv: list[str], env: dict[str, str]) -> list[str]:
    """ckptd serve's arguments for llama-server's `argv`; ValueError for what ckptd
    leaves out. Without a model flag llama-server starts its router; the suite uses
    that preset for tests of other things (CORS), so ckptd serves its model then too."""
    out: list[str] = []
    ctx = slots = None
    metrics = cors = unified = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in UNSUPPORTED:
            raise ValueError(f"{a}: {UNSUPPORTED[a]} is not supported by ckptd")
        if a in ("--ctx-size", "--parallel"):
            v = argv[i + 1]
            ctx, slots = (int(v), slots) if a == "--ctx-size" else (ctx, int(v))
            i += 2
            continue
        if a == "--metrics":
            metrics, i = True, i + 1
            continue
        if a == "--kv-unified":
            unified, i = True, i + 1
            continue
        if a == "--lora":
            if not env.get("CKPTD_SUITE_LORA"):
                raise ValueError("--lora: the suite's adapter is for its own test model; set "
                                 "CKPTD_SUITE_LORA to one for ckptd's (ckptd make-lora)")
            out, i = out + ["--lora", env["CKPTD_SUITE_LORA"]], i + 2
            continue
        if a == "--n-predict" and int(argv[i + 1]) < 0:    # llama-server's -1: no limit
            i += 2                                          # (ckptd's default: the context)
            continue
        if a == "--model-draft":          # the suite's draft is replaced too: the model
            out += ["--model-draft", _model(env)]    # drafts for itself
            i += 2
            continue
        if a not in _MAP:
            raise ValueError(f"{a}: not a llama-server flag this adapter knows")
        flag, takes = _MAP[a]
        if flag == "--cors-origins":
            cors = True
        if flag is not None:
            out += [flag, argv[i + 1]] if takes else [flag]
        i += 2 if takes else 1
    slots = slots or 1
    out += ["--parallel", str(slots), "--step-tokens", str(max(_value(out, "--step-tokens", 256),
                                                             slots))]
    if ctx:
        # llama-server splits its context among the slots, or with --kv-unified lets
        # each use all of it; ckptd's KV pages are one pool either way
        out += ["--max-context", str(ctx if unified else ctx // slots)]
    if not metrics:
        out.append("--no-metrics")
    # llama-server cancels what runs on SIGTERM; the suite's stop() waits 5 s and then
    # kills, which ckptd's default 10-s drain outlasts whenever a test ends mid-request
    out += ["--drain-timeout", "0"]
    if not cors:                      # llama-server's default: any origin, credentials on
        out += ["--cors-origins", "*", "--cors-credentials"]
    if env.get("CKPTD_SUITE_MODEL"):
        out += ["--model", env["CKPTD_SUITE_MODEL"]]
    if env.get("CKPTD_SUITE_MMPROJ") and "--no-mmproj" not in out:
        out += ["--mmproj", env["CKPTD_SUITE_MMPROJ"]]
    return out


def environment(env: dict[str, str]) -> dict[str, str]:
    """The daemon's environment: without CKPTD_* settings (a caller's CKPTD_API_KEY or
    CKPTD_PORT would serve another daemon than the flags describe); other variables,
    CKPTD_CHECK_INVARIANTS among them, pass."""
    settings = {"CKPTD_" + name.upper() for name in SETTINGS}
    return {k: v for k, v in env.items() if k not in settings}


def _model(env: dict[str, str]) -> str:
    """The model ckptd serves in the suite: CKPTD_SUITE_MODEL, else the embedded one."""
    return env.get("CKPTD_SUITE_MODEL") or str(default_model_path())


def _value(args: list[str], flag: str, default: int) -> int:
    return int(args[args.index(flag) + 1]) if flag in args else default


def main() -> int:
    try:
        args = translate(sys.argv[1:], dict(os.environ))
    except ValueError as e:
        print(f"llama-adapter: {e}", file=sys.stderr)
        return 2
    cache = tempfile.mkdtemp(prefix="ckptd-suite-")     # each start begins uncached
    os.execve(sys.executable, [sys.executable, "-m", "ckptd.tools.cli", "serve",
                               "--cache-dir", cache, *args], environment(dict(os.environ)))
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
