"""The daemon's settings: one frozen dataclass, from flags, then CKPTD_* variables, then defaults.

Every flag is read as a string and converted here, so a bad value from a flag or
from the environment fails the same way: one `ValueError` naming the setting.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ckptd.model.placement import check_names
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
KV_DTYPES = ("auto", "float16", "float32")   # model/loader.py: use_kv_dtype
GEMV_ACTIVATIONS = ("fp32", "q8")            # model/kept_swap.py: use_gemv_activations
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
    n_predict: int | None = None           # tokens when a request names none; None: max_tokens
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
    kv_dtype: str = "auto"                 # the attention KV's dtype; auto: the compute dtype
    gemv_activations: str = "fp32"         # kept Q4_0/Q4_1/Q8_0 matmuls' input: fp32 or int8
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
    remote_segment_bytes: int = 8 * 2**20   # a remote segment object's size (blocks in bytes)
    verbose: bool = False                  # answers carry llama-server's __verbose
    lora: tuple = ()                       # daemon/lora.py: LoraFile per --lora(-scaled)
    lora_init_without_apply: bool = False  # the adapters' scales start at 0
    backend_sampling: bool = False         # requests sample on the model's device by default
    sleep_idle_seconds: float | None = None   # idle this long: free the model; None: never
    # Speculative decoding (llama-server's flags; model/speculative/params.py)
    model_draft: str | None = None         # the draft model: the model's vocabulary
    spec_type: str | None = None           # none or draft-simple (with model_draft: that)
    spec_draft_n_max: int = DEFAULT_LIMITS.n_max
    spec_draft_n_min: int = DEFAULT_LIMITS.n_min
    spec_draft_p_min: float = DEFAULT_LIMITS.p_min
    spec_synth_len: float | None = None    # synthetic acceptance (benchmarking only)
    spec_synth_rates: str | None = None
    # Images (model/vision): the vision tower of a GGUF model; an HF folder has its own
    mmproj: str | None = None              # llama.cpp's mmproj GGUF
    no_mmproj: bool = False                # serve the text model only: images refused
    media_path: Path | None = None         # image parts may name files under it (file://)
    image_max_bytes: int = 20 * 2**20      # an image as sent (decoded from base64)
    image_max_side: int = 8192             # pixels, before the model's resize
    image_max_pixels: int = 8192 * 4096
    image_min_tokens: int | None = None    # the model's resize bounds, in placeholder
    image_max_tokens: int | None = None    # tokens; None: the processor's

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
        idle = self.sleep_idle_seconds
        if idle is not None:           # llama-server's -1: never sleep
            if not (idle == -1 or 0 < idle < float("inf")):
                raise ValueError(f"sleep_idle_seconds must be positive (or -1: never), got {idle}")
            object.__setattr__(self, "sleep_idle_seconds", None if idle == -1 else idle)
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}, "
                             f"got {self.log_format!r}")
        check_names(self.device, self.dtype)
        if self.weights not in ("keep", "expand"):
            raise ValueError(f"weights must be keep or expand, got {self.weights!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, "
                             f"got {self.kv_dtype!r}")
        if self.gemv_activations not in GEMV_ACTIVATIONS:
            raise ValueError(f"gemv_activations must be one of {', '.join(GEMV_ACTIVATIONS)}, "
                             f"got {self.gemv_activations!r}")
        for name in ("api_key", "admin_key"):
            key = getattr(self, name)
            if key is not None and (not key.strip() or key != key.strip()):
                raise ValueError(f"{name} must not be empty or start or end with a space")
        if self.no_admin and self.admin_key is not None:
            raise ValueError("give admin_key or no_admin, not both")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {self.max_tokens}")
        if self.n_predict is not None and self.n_predict < 1:
            raise ValueError(f"n_predict must be positive, got {self.n_predict}")
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
        self._check_vision()

    def _check_vision(self) -> None:
        if self.mmproj is not None and not Path(self.mmproj).is_file():
            raise ValueError(f"mmproj: no such file: {self.mmproj}")
        if self.mmproj is not None and self.no_mmproj:
            raise ValueError("give mmproj or no_mmproj, not both")
        if self.media_path is not None and not Path(self.media_path).is_dir():
            raise ValueError(f"media_path: no such folder: {self.media_path}")
        for name in ("image_max_bytes", "image_max_side", "image_max_pixels"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        lo, hi = self.image_min_tokens, self.image_max_tokens
        if (lo is not None and lo < 1) or (hi is not None and hi < 1) \
                or (lo is not None and hi is not None and lo > hi):
            raise ValueError("image_min_tokens and image_max_tokens must be >= 1, min <= max")

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
            # imported here: the layout imports torch (codec), and flags are checked without
            from ckptd.cache.remote.layout import RemoteURL

            RemoteURL.parse(self.remote)
            if self.remote_segment_bytes <= 0:
                raise ValueError("--remote-segment-bytes must be positive")
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
