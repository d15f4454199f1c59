"""The daemon's settings: one frozen dataclass, from flags, then CKPTD_* variables, then defaults.

Every flag is read as a string and converted here, so a bad value from a flag or
from the environment fails the same way: one `ValueError` naming the setting.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from ckptd.model.placement import DTYPE_NAMES, check_names
from ckptd.model.speculative.params import (
    DEFAULT_LIMITS,
    DraftLimits,
    parse_rates,
    parse_types,
    synth_rates,
)

LOG_FORMATS = ("text", "json")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
REASONING = ("auto", "on", "off")
MAX_STEP_TOKENS = 65536        # one step's activations grow with its token count

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, name: str = "size") -> int:
    """'20GB' -> 20_000_000_000, '512MiB' -> 536_870_912, '4096' -> 4096."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"{name}: not a size: {text!r} (examples: 4096, 512MiB, 20GB)")
    return int(float(m.group(1)) * _UNITS[unit])


def default_cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ckptd"


@dataclass(frozen=True)
class ServeConfig:
    model: str | None = None               # None: the embedded SmolLM2
    host: str = "127.0.0.1"
    port: int = 8080
    cache_dir: Path = Path("ckptd-cache")
    disk_budget: int = 20 * 10**9          # bytes
    host_budget: int | None = None         # bytes; None: a fifth of the memory available
    kv_budget: int | None = None           # bytes of KV pages; None: daemon/memory.py
    write_queue: int = 256 * 2**20         # bytes waiting to be written to disk
    block_size: int = 16
    snapshot_interval: int = 1024          # tokens; a multiple of block_size
    max_snapshots: int = 16                # kept per prefix; older ones are thinned
    snapshot_budget: float = 1.0           # interval snapshot bytes / the context's KV bytes
    max_context: int | None = None         # tokens per sequence; None: the model's limit
    parallel: int = 4                      # sequences computed together
    queue_size: int = 64                   # requests waiting beyond `parallel`
    step_tokens: int = 256                 # tokens per model step (decodes + prefill chunk)
    max_body: int = 32 * 2**20             # bytes of one request body
    max_tokens: int | None = None          # tokens one request may generate; None: the context
    request_timeout: float | None = None   # seconds a request may take, queue included
    drain_timeout: float = 10.0            # seconds SIGTERM waits for running requests
    api_key: str | None = None
    admin_key: str | None = None           # set: /cache/* needs this key (the API key won't do)
    no_admin: bool = False                 # /cache/* answers 403
    log_format: str = "text"
    device: str = "auto"                   # auto: CUDA when there is one, else the CPU
    dtype: str = "auto"                    # auto: bfloat16 on CUDA, float32 on the CPU
    enforce_eager: bool = False            # no CUDA graphs for decode steps
    weights: str = "keep"                  # a GGUF's formats kept in memory, or "expand"
    threads: int | None = None             # torch threads; None: torch's choice (one a core)
    alias: str | None = None               # the model's names, comma-separated; None: the file's
    tags: str | None = None                # labels /v1/models lists, comma-separated
    strict_model_name: bool = False        # a request naming another model gets 404
    # Server-wide sampling defaults (llama-server's flags); None: each API's own default.
    seed: int | None = None
    temp: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    chat_template: str | None = None       # a built-in name or jinja source
    chat_template_file: Path | None = None
    reasoning: str = "auto"                # on, off, auto: the template's enable_thinking
    metrics: bool = True                   # False: /metrics answers 501
    slots: bool = True                     # False: /slots answers 501
    slot_save_path: Path | None = None     # where /slots/{id}?action=save|restore keep files
    cors_origins: str | None = None        # "*", "localhost" or a comma-separated list
    cors_credentials: bool = False         # preflights allow credentials (cookies)
    remote: str | None = None              # s3://bucket/prefix: the shared remote tier
    verbose: bool = False                  # answers carry llama-server's __verbose
    # Speculative decoding (llama-server's flags; model/speculative/params.py)
    model_draft: str | None = None         # the draft model: the model's vocabulary
    spec_type: str | None = None           # none or draft-simple (with model_draft: that)
    spec_draft_n_max: int = DEFAULT_LIMITS.n_max
    spec_draft_n_min: int = DEFAULT_LIMITS.n_min
    spec_draft_p_min: float = DEFAULT_LIMITS.p_min
    spec_synth_len: float | None = None    # synthetic acceptance (benchmarking only)
    spec_synth_rates: str | None = None

    @property
    def drafting(self) -> bool:
        """Whether a draft model proposes tokens."""
        on = True if self.spec_type is None else parse_types(self.spec_type)
        return self.model_draft is not None and on

    def draft_limits(self) -> DraftLimits:
        return DraftLimits(self.spec_draft_n_max, self.spec_draft_n_min, self.spec_draft_p_min)

    def synth(self) -> tuple[float, ...]:
        """The synthetic acceptance rates asked for (checked), or ()."""
        rates = parse_rates(self.spec_synth_rates) if self.spec_synth_rates else None
        return synth_rates(self.spec_synth_len, rates, self.spec_draft_n_max)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.model is not None and not Path(self.model).exists():
            raise ValueError(f"model: no such file or folder: {self.model}")
        positive = ("block_size", "snapshot_interval", "parallel", "queue_size", "step_tokens",
                    "max_body")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("disk_budget", "host_budget", "kv_budget"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.write_queue <= 0:
            raise ValueError(f"write_queue must be positive, got {self.write_queue}")
        if self.snapshot_interval % self.block_size:
            raise ValueError(f"snapshot_interval ({self.snapshot_interval}) must be a multiple "
                             f"of block_size ({self.block_size})")
        if self.snapshot_budget <= 0:
            raise ValueError(f"snapshot_budget must be positive, got {self.snapshot_budget}")
        if self.max_snapshots < 2:
            raise ValueError(f"max_snapshots must be >= 2, got {self.max_snapshots}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {self.max_context}")
        if self.step_tokens > MAX_STEP_TOKENS:
            raise ValueError(f"step_tokens must be <= {MAX_STEP_TOKENS}, got {self.step_tokens}")
        if self.step_tokens < self.parallel:
            raise ValueError(f"step_tokens ({self.step_tokens}) must be >= parallel "
                             f"({self.parallel}): every decoding sequence needs a token a step")
        if (self.request_timeout is not None and self.request_timeout <= 0) \
                or self.drain_timeout < 0:
            raise ValueError("request_timeout must be positive and drain_timeout >= 0")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}, "
                             f"got {self.log_format!r}")
        check_names(self.device, self.dtype)
        if self.weights not in ("keep", "expand"):
            raise ValueError(f"weights must be keep or expand, got {self.weights!r}")
        for name in ("api_key", "admin_key"):
            key = getattr(self, name)
            if key is not None and (not key.strip() or key != key.strip()):
                raise ValueError(f"{name} must not be empty or start or end with a space")
        if self.no_admin and self.admin_key is not None:
            raise ValueError("give admin_key or no_admin, not both")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {self.max_tokens}")
        self._check_sampling()
        self._check_remote()
        if self.alias is not None and not self.aliases:
            raise ValueError("alias must name the model")
        if self.reasoning not in REASONING:
            raise ValueError(f"reasoning must be one of {', '.join(REASONING)}, "
                             f"got {self.reasoning!r}")
        if not self.hosts:
            raise ValueError("host must name an address")
        if self.chat_template is not None and self.chat_template_file is not None:
            raise ValueError("give chat_template or chat_template_file, not both")
        if self.chat_template_file is not None and not Path(self.chat_template_file).is_file():
            raise ValueError(f"chat_template_file: no such file: {self.chat_template_file}")
        if self.slot_save_path is not None and not Path(self.slot_save_path).is_dir():
            raise ValueError(f"slot_save_path: no such folder: {self.slot_save_path}")
        if self.cors_origins is not None and not self.cors_origins.strip():
            raise ValueError("cors_origins must not be empty")
        self._check_speculative()

    def _check_speculative(self) -> None:
        if self.model_draft is not None and not Path(self.model_draft).exists():
            raise ValueError(f"model_draft: no such file or folder: {self.model_draft}")
        if self.spec_type is not None and parse_types(self.spec_type) \
                and self.model_draft is None:
            raise ValueError("--spec-type draft-simple needs --model-draft")
        self.draft_limits()
        if self.synth() and not self.drafting:
            raise ValueError("synthetic acceptance (--spec-synth-len/-rates) needs a draft "
                             "model (--model-draft)")

    def _check_sampling(self) -> None:
        checks = {"temp": (0.0, 100.0), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
                  "repeat_penalty": (0.0, 100.0), "top_k": (0, None),
                  "repeat_last_n": (-1, None)}
        for name, (lo, hi) in checks.items():
            v = getattr(self, name)
            if v is not None and (v < lo or (hi is not None and v > hi)):
                raise ValueError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}]"
                                 f", got {v}")
        if self.top_p == 0.0 or self.repeat_penalty == 0.0:
            raise ValueError("top_p and repeat_penalty must be > 0")

    def _check_remote(self) -> None:
        if self.remote is not None:
            from ckptd.cache.remote.layout import RemoteURL

            RemoteURL.parse(self.remote)
            if importlib.util.find_spec("boto3") is None:
                raise ValueError("--remote needs boto3: pip install 'ckptd[s3]'")

    @property
    def hosts(self) -> list[str]:
        """The addresses to listen on: --host takes a comma-separated list."""
        return [h.strip() for h in self.host.split(",") if h.strip()]

    @property
    def aliases(self) -> list[str]:
        return sorted({a.strip() for a in (self.alias or "").split(",") if a.strip()})

    @property
    def tag_list(self) -> list[str]:
        return sorted({t.strip() for t in (self.tags or "").split(",") if t.strip()})

    @property
    def loopback(self) -> bool:
        """Every address listened on is a loopback one."""
        return all(_loopback(h) for h in self.hosts)


def _loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:                                   # 127.0.0.0/8 and ::1, however they are written
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
}


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_flag(text: str, name: str) -> bool:
    v = str(text).strip().lower()
    if v not in _TRUE + _FALSE:
        raise ValueError(f"{name}: not a yes/no value: {text!r} (examples: 1, true, 0, false)")
    return v in _TRUE


def add_arguments(parser) -> None:
    for name, (conv, help_text) in SETTINGS.items():
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
    known = {f.name for f in fields(ServeConfig)}
    assert set(values) <= known
    return ServeConfig(**values)


@dataclass(frozen=True)
class Vertex:
    """Vertex AI's custom-container settings (AIP_* variables; daemon/http/vertex.py)."""

    enabled: bool = False
    predict_route: str = "/predict"
    health_route: str | None = None
    port: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Vertex:
        if env.get("AIP_MODE") != "PREDICTION":
            return cls()
        port = env.get("AIP_HTTP_PORT")
        if port is not None and not port.isdigit():
            raise ValueError(f"AIP_HTTP_PORT must be a port number, got {port!r}")
        return cls(True, env.get("AIP_PREDICT_ROUTE") or "/predict",
                   env.get("AIP_HEALTH_ROUTE") or None, int(port) if port else None)


def prepare_cache_dir(path: Path):
    """Create the cache folder, prove it writable and lock it for this process, so a bad
    --cache-dir (or one another daemon serves) is one clear error at start-up, not a
    model load that fails after the port opened. Returns the lock: keep it open."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"--cache-dir {path}: exists and is not a folder") from None
    except OSError as e:
        raise ValueError(f"--cache-dir {path}: cannot create it: {e.strerror}") from None
    probe = path / f".write-test-{os.getpid()}"
    try:
        with open(probe, "wb") as fh:
            fh.write(b"x")
            fh.flush()
            os.fsync(fh.fileno())
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--cache-dir {path}: not writable: {e.strerror}") from None
    # Two daemons on one folder would each keep their own index and budget of the
    # same store, and overwrite each other's contexts. The kernel drops the lock
    # when the process dies, however it dies.
    lock = open(path / "daemon.lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise ValueError(f"--cache-dir {path}: another ckptd serves it (pid {holder})") \
            from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock
