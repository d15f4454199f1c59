"""Sampling fields of a generation request: defaults (the API's, or the server's flags),
penalties, logit bias and output constraints; every error names its field."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from ckptd.daemon.http.errors import bad_request
from ckptd.daemon.http.fields import Fields, type_error
from ckptd.model.sampling.dry import DEFAULT_BREAKERS, DryParams
from ckptd.model.sampling.filters import CHARS, sampler_name
from ckptd.model.sampling.grammar import GBNF, Constraint, schema_constraint
from ckptd.model.sampling.sampler import SamplingParams
from ckptd.model.speculative.params import DraftLimits

MAX_LOGIT_BIAS = 1024
MAX_GRAMMAR = 256 * 1024            # characters of GBNF or schema JSON


@dataclass(frozen=True)
class ApiDefaults:
    """One API's sampling defaults; the server's flags (ServeConfig) override them."""
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float = 1.0
    penalty_last_n: int | None = None
    seed: int | None = None
    backend_sampling: bool = False  # sample on the model's device (--backend-sampling)

    def with_server(self, cfg) -> ApiDefaults:
        def pick(v, default):
            return default if v is None else v
        return ApiDefaults(pick(cfg.temp, self.temperature), pick(cfg.top_k, self.top_k),
                           pick(cfg.top_p, self.top_p), pick(cfg.min_p, self.min_p),
                           pick(cfg.repeat_penalty, self.repetition_penalty),
                           pick(cfg.repeat_last_n, self.penalty_last_n), cfg.seed,
                           cfg.backend_sampling)


OPENAI = ApiDefaults(1.0, 0, 1.0, 0.0)
LLAMA = ApiDefaults(0.8, 40, 0.95, 0.05, 1.0, 64)


MAX_BREAKERS = 64


@dataclass(frozen=True)
class ParseContext:
    """What parsing a generation request needs to know of the server."""
    vocab_size: int
    defaults: ApiDefaults
    encode: object = None           # text -> token ids (logit bias given as text)
    verbose: bool = False           # answers carry __verbose unless a request says no
    breakers: object = None         # DRY's breaker strings -> tokens (dry.BreakerTable)
    n_lora: int = 0                 # LoRA adapters loaded: a request's "lora" ids below it


# llama-server sampling fields ckptd does not implement: accepted at the value that
# turns them off (clients such as llama.cpp's web UI send every field with its default),
# a 400 naming the field otherwise, never silently dropped. name -> (read, active, what)
_REFUSED = {
    "adaptive_target": ("float", lambda v: v >= 0, "adaptive-p sampling"),
    "n_indent": ("int", lambda v: v > 0, "n_indent (stopping on indentation)"),
    "t_max_predict_ms": ("int", lambda v: v > 0, "a time limit on generation"),
    "t_max_prompt_ms": ("int", lambda v: v > 0, "a time limit on the prompt"),
    "grammar_lazy": ("bool", lambda v: v, "lazy grammars (grammar_triggers)"),
}


def _refuse_active(f: Fields) -> None:
    for name, (kind, active, what) in _REFUSED.items():
        v = getattr(f, kind)(name)
        if v is not None and active(v):
            raise bad_request(f"{name}: {what} is not supported by this server (ckptd); "
                              "leave it out or at its default", name, "not_supported")


def dry(f: Fields, ctx: ParseContext) -> DryParams | None:
    """llama.cpp's DRY fields (model/sampling/dry.py); None when it is off."""
    mult = f.float("dry_multiplier", 0.0, 0.0, 1e6)
    base = f.float("dry_base", 1.75, 0.0, 1e6)
    allowed = f.int("dry_allowed_length", 2, 0, 1 << 20)
    last_n = f.int("dry_penalty_last_n", -1, -1, 1 << 30)
    raw = f.get("dry_sequence_breakers")
    if raw is None:
        strings = DEFAULT_BREAKERS
    elif isinstance(raw, list) and raw and all(isinstance(s, str) for s in raw):
        if len(raw) > MAX_BREAKERS:
            raise bad_request(f"dry_sequence_breakers holds at most {MAX_BREAKERS} strings",
                              "dry_sequence_breakers")
        strings = tuple(raw)
    else:
        raise type_error("dry_sequence_breakers", "a non-empty list of strings", raw)
    p = DryParams(mult, base, allowed, last_n, ())
    if not p.active:
        return None
    if ctx.breakers is None:
        raise bad_request("dry_multiplier: DRY needs the model's vocabulary, which this "
                          "parser was not given", "dry_multiplier", "not_supported")
    return DryParams(mult, base, allowed, last_n, ctx.breakers(strings))


def samplers(f: Fields) -> tuple[str, ...] | None:
    """llama.cpp's `samplers`: the filters to run, in order, as names or one letter each
    ("kypmxt"); None when not given."""
    v = f.get("samplers")
    if v is None:
        return None
    if isinstance(v, str):
        names = [CHARS.get(c) or c for c in v]
    elif isinstance(v, list) and all(isinstance(x, str) for x in v):
        names = list(v)
    else:
        raise type_error("samplers", "a list of sampler names or a string of letters", v)
    out = []
    for n in names:
        name = sampler_name(n)
        if name is None:
            raise bad_request(f"samplers: unknown sampler {n!r}", "samplers")
        if name == "infill":
            raise bad_request("samplers: the infill sampler is not supported by this server "
                              "(ckptd)", "samplers", "not_supported")
        out.append(name)
    return tuple(out)


def sampling(f: Fields, ctx: ParseContext, logprobs: int | None, llama: bool) -> SamplingParams:
    d = ctx.defaults
    seed = f.int("seed")
    if seed is None or seed < 0:
        # an effective seed is always known, so a client can replay what it got
        seed = d.seed if d.seed is not None else random.randrange(2**32)
    if llama:
        penalties = {
            "presence_penalty": f.float("presence_penalty", 0.0, -100.0, 100.0),
            "frequency_penalty": f.float("frequency_penalty", 0.0, -100.0, 100.0),
            "repetition_penalty": _positive(f, "repeat_penalty", d.repetition_penalty),
            "penalty_last_n": f.int("repeat_last_n", d.penalty_last_n, -1)}
    else:
        penalties = {
            "presence_penalty": f.float("presence_penalty", 0.0, -2.0, 2.0),
            "frequency_penalty": f.float("frequency_penalty", 0.0, -2.0, 2.0),
            "repetition_penalty": _positive(f, "repetition_penalty", d.repetition_penalty),
            "penalty_last_n": d.penalty_last_n}
    _refuse_active(f)
    order = samplers(f)
    if order is not None and "penalties" not in order:      # llama.cpp: listed steps only
        penalties = {"presence_penalty": 0.0, "frequency_penalty": 0.0,
                     "repetition_penalty": 1.0, "penalty_last_n": penalties["penalty_last_n"]}
    return SamplingParams(
        max_tokens=0, temperature=f.float("temperature", d.temperature, 0.0, 100.0),
        top_k=f.int("top_k", d.top_k, 0), top_p=_top_p(f.float("top_p", d.top_p, 0.0, 1.0)),
        min_p=f.float("min_p", d.min_p, 0.0, 1.0), seed=seed, stop=f.stop(),
        ignore_eos=f.bool("ignore_eos"), logprobs=logprobs,
        logit_bias=logit_bias(f, ctx, allow_false=llama),
        post_sampling_probs=f.bool("post_sampling_probs"),
        backend_sampling=f.bool("backend_sampling", d.backend_sampling),
        typical_p=f.float("typical_p", 1.0, 0.0, 1.0),
        top_n_sigma=f.float("top_n_sigma", -1.0, -1e9, 1e9),
        min_keep=f.int("min_keep", 0, 0, 1 << 20),
        xtc_probability=f.float("xtc_probability", 0.0, 0.0, 1.0),
        xtc_threshold=f.float("xtc_threshold", 0.1, 0.0, 1.0),
        dynatemp_range=f.float("dynatemp_range", 0.0, 0.0, 100.0),
        dynatemp_exponent=f.float("dynatemp_exponent", 1.0, 0.0, 100.0),
        samplers=order, dry=dry(f, ctx), mirostat=f.int("mirostat", 0, 0, 2),
        mirostat_tau=f.float("mirostat_tau", 5.0, 0.0, 1e6),
        mirostat_eta=f.float("mirostat_eta", 0.1, 0.0, 1e6), draft=draft_limits(f),
        **penalties)


def draft_limits(f: Fields) -> DraftLimits | None:
    """llama-server's speculative.n_max / n_min / p_min: this request's draft limits
    (ignored without a draft model); None when it gives none."""
    n_max = f.int("speculative.n_max", None, 0, 1 << 10)
    n_min = f.int("speculative.n_min", None, 0, 1 << 10)
    p_min = f.float("speculative.p_min", None, 0.0, 1.0)
    if n_max is None and n_min is None and p_min is None:
        return None
    return DraftLimits(n_max, n_min, p_min)


def _positive(f: Fields, name: str, default: float) -> float:
    v = f.float(name, default, 0.0, 100.0)
    if v == 0.0:
        raise bad_request(f"{name} must be > 0", name)
    return v


def _top_p(v: float) -> float:
    if v <= 0.0:
        raise bad_request("top_p must be in (0, 1]", "top_p")
    return v


def logit_bias(f: Fields, ctx: ParseContext, allow_false: bool,
               name: str = "logit_bias") -> tuple[tuple[int, float], ...]:
    """(token, bias) pairs from {"id": bias} or, for llama.cpp, [[id, bias], ...]; a key
    that is text (not a token id) biases every token of that text, as llama-server does,
    and a bias of false (llama.cpp) bans the token (-inf)."""
    v = f.get(name)
    if v is None:
        return ()
    if isinstance(v, dict):
        pairs = list(v.items())
    elif allow_false and isinstance(v, list) and all(
            isinstance(p, list) and len(p) == 2 for p in v):
        pairs = [tuple(p) for p in v]
    else:
        want = "an object of token id: bias" + (" or a list of [id, bias] pairs"
                                                  if allow_false else "")
        raise type_error(name, want, v)
    if len(pairs) > MAX_LOGIT_BIAS:
        raise bad_request(f"{name} holds at most {MAX_LOGIT_BIAS} tokens", name)
    out: dict[int, float] = {}
    for key, bias in pairs:
        if allow_false and bias is False:
            bias = float("-inf")
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not -100.0 <= bias <= 100.0:
            raise bad_request(f"{name}: the bias of {key!r} must be a number in [-100, 100]"
                              f"{' or false' if allow_false else ''}, got {bias!r}", name)
        for token in _bias_tokens(key, name, ctx):
            if not 0 <= token < ctx.vocab_size:
                raise bad_request(f"{name}: token id {token} is outside the vocabulary "
                                  f"(0..{ctx.vocab_size - 1})", name)
            out[token] = float(bias)
    return tuple(out.items())


def _bias_tokens(key: object, name: str, ctx: ParseContext) -> list[int]:
    if isinstance(key, int) and not isinstance(key, bool):
        return [key]
    if isinstance(key, str) and re.fullmatch(r"-?[0-9]{1,12}", key):
        return [int(key)]
    if isinstance(key, str) and key and ctx.encode is not None:
        return ctx.encode(key)
    raise bad_request(f"{name}: {key!r} is not a token id or a text", name)


def constraint(f: Fields, extra: tuple[str, Constraint] | None = None
               ) -> tuple[str, Constraint] | None:
    """(field, Constraint) from `grammar` (GBNF), `json_schema`, OpenAI's
    `response_format` or `extra` (an API's own field); at most one of them. Compiled
    later (a bad grammar is a 400 naming its field)."""
    found = [extra] if extra is not None else []
    g = f.str("grammar", max_len=MAX_GRAMMAR)
    if g:
        found.append(("grammar", Constraint(GBNF, g)))
    schema = f.get("json_schema")
    if schema is not None:
        found.append(("json_schema", schema_field(schema, "json_schema")))
    rf = f.get("response_format")
    if rf is not None:
        c = _response_format(rf)
        if c is not None:
            found.append(c)
    if len(found) > 1:
        raise bad_request(f"give one of {', '.join(n for n, _ in found)}, not several",
                          found[1][0])
    return found[0] if found else None


def schema_field(v: object, where: str) -> Constraint:
    if not isinstance(v, (dict, bool)) or v is False:
        raise type_error(where, "a JSON schema (an object)", v)
    if len(repr(v)) > MAX_GRAMMAR:
        raise bad_request(f"{where} is larger than {MAX_GRAMMAR} characters", where)
    return schema_constraint(v)


def _response_format(v: object) -> tuple[str, Constraint] | None:
    rf = Fields(v, "response_format")
    kind = rf.str("type", required=True) if isinstance(v, dict) and "type" in v else None
    if kind is None:
        raise bad_request("response_format.type is required", "response_format.type",
                          "missing_field")
    if kind == "text":
        return None
    if kind == "json_object":
        # JSON mode gives an object (OpenAI's documentation; llama-server's reading too)
        schema = rf.data.get("schema")
        return ("response_format", schema_field({"type": "object"} if schema in (None, {})
                                           else schema, "response_format.schema"))
    if kind == "json_schema":
        js = Fields(rf.data.get("json_schema"), "response_format.json_schema")
        schema = js.data.get("schema")
        if schema is None:
            raise bad_request("response_format.json_schema.schema is required",
                              "response_format.json_schema.schema", "missing_field")
        return ("response_format", schema_field(schema, "response_format.json_schema.schema"))
    raise bad_request(f"response_format.type must be text, json_object or json_schema, "
                      f"got {kind!r}", "response_format.type")
