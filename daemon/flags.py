"""The daemon's flags: every setting of ServeConfig as a --flag and a CKPTD_* variable.
Flags win over variables, which win over the defaults; every value is read as a string
and converted here, so a bad one from either fails the same way (a ValueError naming
the setting)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

from ckptd.daemon import lora
from ckptd.daemon.config import ServeConfig, default_cache_dir, parse_size
from ckptd.model.placement import DTYPE_NAMES
from ckptd.model.speculative.params import DEFAULT_LIMITS

# setting -> (converter, help); the flag is --name-with-dashes, the variable CKPTD_NAME
_INT = int
SETTINGS: dict[str, tuple] = {
    "model": (str, "HF folder or .gguf file (default: the embedded SmolLM2-135M)"),
    "host": (str, "address to bind, or a comma-separated list (default 127.0.0.1)"),
    "port": (_INT, "port to bind (default 8080; 0 picks a free one)"),
    "cache_dir": (Path, "cache folder (default $XDG_DATA_HOME/ckptd)"),
    "disk_budget": ("size", "disk tier budget, e.g. 20GB"),
    "host_budget": ("size", "host RAM tier budget, e.g. 2GB (default: a fifth of the memory "
                            "available at start)"),
    "kv_budget": ("size", "memory for KV pages, e.g. 8GB (default: 40% of the memory "
                          "available at start, 80% of a GPU's free memory, at most room for "
                          "--parallel + 1 full contexts)"),
    "write_queue": ("size", "checkpoints waiting for the disk writer, e.g. 256MiB (default); "
                            "beyond it the least useful are shed"),
    "block_size": (_INT, "tokens per KV page and stored block (default 16)"),
    "snapshot_interval": (_INT, "tokens between prefill snapshots (default 1024)"),
    "max_snapshots": (_INT, "snapshots kept per prefix, older ones thinned out (default 16, "
                            "at least 2)"),
    "snapshot_budget": (float, "a long prefill's interval snapshots take at most this many "
                               "times its context's KV bytes (default 1)"),
    "max_context": (_INT, "most tokens per sequence (default: the model's limit)"),
    "parallel": (_INT, "sequences computed together (default 4)"),
    "queue_size": (_INT, "requests that may wait for a sequence slot (default 64)"),
    "step_tokens": (_INT, "tokens per model step: decodes plus a prefill chunk (default 256)"),
    "max_body": ("size", "largest request body (default 32MiB)"),
    "max_tokens": (_INT, "most tokens one request may generate (default: what the context "
                         "leaves)"),
    "n_predict": (_INT, "tokens a request generates when it names no limit, as llama-server's "
                        "--n-predict: a request's own max_tokens / n_predict wins, up to "
                        "--max-tokens (default: --max-tokens, else what the context leaves)"),
    "request_timeout": (float, "seconds one request may take, queue included (default: no "
                               "limit: a cold 250K-token prompt takes many minutes on a CPU)"),
    "drain_timeout": (float, "seconds SIGTERM lets running requests finish (default 10)"),
    "api_key": (str, "require 'Authorization: Bearer KEY' on every endpoint but /health"),
    "admin_key": (str, "require 'Authorization: Bearer KEY' with this key on /cache/*; it "
                       "also opens every other endpoint"),
    "no_admin": ("flag", "turn the /cache/* admin endpoints off (they answer 403)"),
    "log_format": (str, "text or json (default text)"),
    "device": (str, "auto, cpu, cuda or cuda:N (default auto: CUDA when there is one)"),
    "dtype": (str, f"{', '.join(DTYPE_NAMES)} (default auto: bfloat16 on CUDA, float32 "
                   "on the CPU)"),
    "enforce_eager": ("flag", "no CUDA graphs: decode steps launch their kernels one by one "
                              "(default: graphs on CUDA)"),
    "weights": (str, "keep: a GGUF's quantized / F16 / BF16 tensors stay in their formats and "
                     "are dequantized inside the matmul (default); expand: all converted to "
                     "the dtype at load"),
    "kv_dtype": (str, "auto, float16 or float32: the attention layers' KV pages (default auto: the "
                      "dtype the model computes in, float32 on the CPU); float16 halves the "
                      "bytes a long context's decode step reads and the cache stores, as "
                      "llama.cpp keeps them, at fp16's rounding of every key and value"),
    "gemv_activations": (str, "fp32 or q8: how the matmuls over kept Q4_0 / Q4_1 / Q8_0 "
                              "weights take their input on the CPU; fp32 (default) multiplies "
                              "the weights' exact values; q8 rounds the input to int8 per "
                              "block of 32 and multiplies in integers, as llama.cpp does "
                              "(decode ~1.4x less CPU, prefill ~1.5x more; the logits move "
                              "by ~6% of their norm, near-ties can flip)"),
    "threads": (_INT, "torch threads for the model (default: one per core); fewer than "
                      "cores leaves room for the cache writer on small machines"),
    "alias": (str, "the model's name, or comma-separated names (/v1/models reports the "
                   "first in sorted order as its id; default: the model file's name)"),
    "tags": (str, "comma-separated labels /v1/models reports for the model"),
    "strict_model_name": ("flag", "answer 404 to a request naming another model (default: "
                                  "any name is served by the one model)"),
    "seed": (_INT, "default seed of a request that gives none (default: random; -1: random)"),
    "temp": (float, "default temperature (default: 0.8 on /completion, 1.0 on /v1/*)"),
    "top_k": (_INT, "default top-k (default: 40 on /completion, off on /v1/*)"),
    "top_p": (float, "default top-p (default: 0.95 on /completion, 1.0 on /v1/*)"),
    "min_p": (float, "default min-p (default: 0.05 on /completion, 0 on /v1/*)"),
    "repeat_penalty": (float, "default repetition penalty (default 1.0: off)"),
    "repeat_last_n": (_INT, "default window of the repetition penalties (default 64)"),
    "chat_template": (str, "chat template: a built-in name (chatml, llama3, llama2, "
                           "mistral, gemma, phi3, zephyr, command-r, vicuna, deepseek) or "
                           "jinja source (default: the model's)"),
    "chat_template_file": (Path, "read the chat template (jinja) from this file"),
    "reasoning": (str, "thinking in chat templates that have it: on, off (the template's "
                       "enable_thinking false, or an empty thought block), auto (default: "
                       "the template's own default)"),
    "metrics": ("bool", "serve /metrics (default on; --no-metrics: 501)"),
    "slots": ("bool", "serve /slots (default on; --no-slots: 501)"),
    "slot_save_path": (Path, "folder for /slots/{id}?action=save|restore files (default: "
                             "none, the actions answer 501)"),
    "cors_origins": (str, "origins browsers may call from: '*', 'localhost' or a "
                          "comma-separated list (default: none, no CORS headers)"),
    "cors_credentials": ("flag", "let CORS requests carry credentials (cookies)"),
    "remote": (str, "s3://BUCKET[/PREFIX]: share cached state with other daemons through "
                    "an S3-compatible store (endpoint and keys from AWS_ENDPOINT_URL, "
                    "AWS_ACCESS_KEY_ID, ... or ~/.aws; needs ckptd[s3])"),
    "remote_segment_bytes": ("size", "blocks go to the remote in segment objects of this size "
                                     "(default 8MiB); daemons sharing a bucket share segments "
                                     "only when they use the same"),
    "model_draft": (str, "draft model (HF folder or .gguf with the model's vocabulary) for "
                         "speculative decoding (default: none)"),
    "spec_type": (str, "none or draft-simple (default: draft-simple with --model-draft)"),
    "spec_draft_n_max": (_INT, f"tokens drafted at most per step (default "
                               f"{DEFAULT_LIMITS.n_max})"),
    "spec_draft_n_min": (_INT, "a shorter draft is not used (default 0)"),
    "spec_draft_p_min": (float, "drafting stops at a token the draft gives less "
                                "probability (default 0)"),
    "spec_synth_len": (float, "benchmarking only: drafted tokens are kept at random for "
                              "this mean accepted length (the output is not the model's)"),
    "spec_synth_rates": (str, "benchmarking only: P0,P1,... the rates of keeping drafted "
                              "token i (the output is not the model's)"),
    "verbose": ("flag", "answers carry llama-server's __verbose object (the prompt text, "
                        "settings, timings); a request's \"verbose\" field asks for it too"),
    "backend_sampling": ("flag", "sample on the model's device (temperature, top-k, top-p, "
                                 "min-p, logit bias); other chains sample on the host; a "
                                 "request's \"backend_sampling\" field overrides it"),
    "sleep_idle_seconds": (float, "after this many seconds without a task, free the model "
                                  "(weights, KV pages) until the next request reloads it; "
                                  "the host and disk cache tiers stay (default: never; -1: never)"),
    "mmproj": (str, "vision tower of a GGUF model (llama.cpp's mmproj GGUF): images in "
                    "prompts (an HF folder with model.visual.* weights needs none)"),
    "no_mmproj": ("flag", "serve a multimodal model's text part only: images are refused"),
    "media_path": (Path, "folder whose files image parts may name as file:// URLs (default: "
                         "none; the daemon fetches no remote URL)"),
    "image_max_bytes": ("size", "largest image as sent (default 20MiB)"),
    "image_max_side": (_INT, "longest side of an image as sent, in pixels (default 8192)"),
    "image_max_pixels": (_INT, "most pixels of an image as sent (default 33554432)"),
    "image_min_tokens": (_INT, "fewest placeholder tokens an image is resized to (default: "
                               "the model's processor)"),
    "image_max_tokens": (_INT, "most placeholder tokens an image is resized to (default: "
                               "the model's processor)"),
}


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_flag(text: str, name: str) -> bool:
    v = str(text).strip().lower()
    if v not in _TRUE + _FALSE:
        raise ValueError(f"{name}: not a yes/no value: {text!r} (examples: 1, true, 0, false)")
    return v in _TRUE


def add_arguments(parser) -> None:
    for name, (conv, text) in SETTINGS.items():
        help_text = text.replace("%", "%%")      # argparse formats help with %
        env = "CKPTD_" + name.upper()
        flag = "--" + name.replace("_", "-")
        if conv == "flag":                 # takes no value; the variable takes 1/0
            parser.add_argument(flag, dest=name, default=None, action="store_const",
                                const="1", help=f"{help_text} [env {env}=1]")
            continue
        if conv == "bool":                 # --name / --no-name; the variable takes 1/0
            parser.add_argument(flag, dest=name, default=None, action="store_const",
                                const="1", help=f"{help_text} [env {env}=1/0]")
            parser.add_argument("--no-" + flag[2:], dest=name, action="store_const",
                                const="0", help=argparse.SUPPRESS)
            continue
        parser.add_argument(flag, dest=name, default=None, metavar="VALUE",
                            help=f"{help_text} [env {env}]")


def from_args(args, env: Mapping[str, str] = os.environ) -> ServeConfig:
    """Flags win over CKPTD_* variables, which win over the defaults."""
    values: dict = {}
    for name, (conv, _) in SETTINGS.items():
        raw = getattr(args, name, None)
        if raw is None:
            raw = env.get("CKPTD_" + name.upper())
        if raw is None or raw == "":
            continue
        flag = "--" + name.replace("_", "-")
        if conv == "size":
            values[name] = parse_size(raw, flag)
            continue
        if conv in ("flag", "bool"):
            values[name] = parse_flag(raw, flag)
            continue
        try:
            values[name] = conv(raw)
        except ValueError:
            raise ValueError(f"{flag}: invalid value {raw!r}") from None
    if values.get("seed", 0) < 0:             # llama-server's -1: a random seed per request
        values.pop("seed")
    values.setdefault("cache_dir", default_cache_dir(env))
    values.update(lora.from_args(args))
    known = {f.name for f in fields(ServeConfig)}
    assert set(values) <= known
    return ServeConfig(**values)
