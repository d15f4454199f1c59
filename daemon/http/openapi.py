"""The OpenAPI 3.1 description of the daemon's HTTP API, served at /openapi.json.

Written out by hand (not generated from the router) so that a test comparing it
with the routes app.py registers catches an endpoint added to one and not the other.
"""

from __future__ import annotations

from ckptd.daemon.http.openapi_fields import ANTHROPIC, CHAT, LLAMA_SAMPLING, MESSAGES, RESPONSES
from ckptd.daemon.http.unsupported import UNSUPPORTED

_ERROR = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"},
    "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}

_STOP = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                        "maxItems": 16}]}
# llama-server's multimodal prompt: `<__media__>` in the text where each image goes
_MEDIA_PROMPT = {"type": "object", "required": ["prompt_string"], "properties": {
    "prompt_string": {"type": "string"}, "multimodal_data": {
        "type": "array", "minItems": 1, "items": {"type": "string",
                                                  "description": "base64 image data"}}}}
_PROMPT = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}},
                     _MEDIA_PROMPT]}
_SAMPLING = {
    "temperature": {"type": "number", "minimum": 0}, "top_p": {"type": "number"},
    "top_k": {"type": "integer", "minimum": 0}, "min_p": {"type": "number"},
    "seed": {"type": "integer"}, "stop": _STOP, "ignore_eos": {"type": "boolean"},
    "stream": {"type": "boolean"},
    "presence_penalty": {"type": "number"}, "frequency_penalty": {"type": "number"},
    "cache_salt": {"type": "string", "description": "entries are shared only within a salt"},
    "context": {"type": "string", "description": "a named context to put before the prompt"},
}
_OPENAI_PENALTIES = {"logit_bias": {"type": "object", "additionalProperties": {"type": "number"},
                               "description": "token id (as a string): bias in [-100, 100]"},
                "repetition_penalty": {"type": "number", "exclusiveMinimum": 0}}
_LLAMA_PENALTIES = {
    "repeat_penalty": {"type": "number", "exclusiveMinimum": 0},
    "repeat_last_n": {"type": "integer", "minimum": -1},
    "logit_bias": {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "array"}}],
                   "description": "[[token id, bias or false], ...] or {token id: bias}"}}
_CONSTRAINTS = {
    "grammar": {"type": "string", "description": "GBNF grammar the output must match"},
    "json_schema": {"type": "object", "description": "JSON schema the output must match"},
    "response_format": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
        "schema": {"type": "object"}, "json_schema": {"type": "object"}}},
    "n": {"type": "integer", "minimum": 1, "maximum": 16},
    "return_progress": {"type": "boolean"}, "id_slot": {"type": "integer"},
    "post_sampling_probs": {"type": "boolean"},
    "lora": {"type": "array", "description": "LoRA scales for this request (unnamed: 0)",
             "items": {"type": "object", "required": ["id"], "properties": {
                 "id": {"type": "integer", "minimum": 0}, "scale": {"type": "number"}}}}}
_CACHE_FLAG = {"cache": {"type": "boolean", "default": True,
                         "description": "false: no restore and no checkpoints"}}
_STREAM_OPTIONS = {"stream_options": {"type": "object", "properties": {
    "include_usage": {"type": "boolean"}}}}
_MESSAGES = {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["role"],
             "properties": {"role": {"type": "string"}, "content": {
                 "oneOf": [{"type": "string"}, {"type": "array"}]}}}}
_TIMINGS = {"type": "object", "description": "prompt_n, cache_n, cache_tier, restore_ms, "
            "prompt_ms, prompt_per_second, predicted_n, predicted_ms, predicted_per_second; "
            "cache: restored tokens by tier, the runs of blocks in prompt order, and miss: why "
            "the first token not restored was not (reason, tier, when, detail)"}


def _body(props: dict, required: tuple[str, ...] = ()) -> dict:
    schema = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _op(summary: str, body: dict | None = None, ok: str = "200", stream: bool = False,
        params: list | None = None, errors: tuple[str, ...] = ("400",)) -> dict:
    content = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    responses = {ok: {"description": "OK", "content": content}}
    for code in (*errors, "401", "503"):
        responses[code] = {"description": "error",
                           "content": {"application/json": {"schema": _ERROR}}}
    op = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = body
    if params:
        op["parameters"] = params
    return op


_ADMIN_NOTE = ("Cache admin endpoint: with --admin-key it needs that key (the API key is "
               "not enough); with --no-admin it answers 403.")


def _admin(op: dict) -> dict:
    op["description"] = _ADMIN_NOTE
    op["security"] = [{"admin": []}]
    op["responses"]["403"] = {"description": "the admin API is turned off (--no-admin)",
                              "content": {"application/json": {"schema": _ERROR}}}
    return op


def _static(summary: str, content_type: str) -> dict:
    """A file of the cache page: open to all (it holds no data)."""
    return {"summary": summary, "security": [], "responses": {"200": {
        "description": "OK", "content": {content_type: {"schema": {"type": "string"}}}}}}


def _path_param(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query(name: str, kind: str = "integer") -> dict:
    return {"name": name, "in": "query", "required": False, "schema": {"type": kind}}


def document(model_id: str) -> dict:
    model = {"model": {"type": "string", "enum": [model_id]}}
    completion = _body({**model, "prompt": _PROMPT,
                        "max_tokens": {"type": "integer", "minimum": 0},
                        "n_predict": {"type": "integer", "minimum": -1},
                        "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
                        **_SAMPLING, **_OPENAI_PENALTIES, **_CACHE_FLAG, **_STREAM_OPTIONS,
                        **_CONSTRAINTS, **LLAMA_SAMPLING, "best_of": {"type": "integer"},
                        "echo": {"type": "boolean"}}, ("prompt",))
    chat = _body({**model, "messages": {**MESSAGES, "minItems": 1},
                  "max_tokens": {"type": "integer", "minimum": 0},
                  "max_completion_tokens": {"type": "integer", "minimum": 0},
                  "logprobs": {"type": "boolean"},
                  "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
                  **_SAMPLING, **_OPENAI_PENALTIES, **_CACHE_FLAG, **_STREAM_OPTIONS,
                  **_CONSTRAINTS, **LLAMA_SAMPLING, **CHAT,
                  "add_generation_prompt": {"type": "boolean"},
                  "continue_final_message": {"type": "boolean"}}, ("messages",))
    llama_fields = {**model, "n_predict": {"type": "integer", "minimum": -1},
                    "max_tokens": {"type": "integer", "minimum": -1},
                    "n_probs": {"type": "integer"}, "cache_prompt": {"type": "boolean"},
                    "return_tokens": {"type": "boolean"},
                    "response_fields": {"type": "array", "items": {"type": "string"}},
                    **_SAMPLING, **_LLAMA_PENALTIES, **_CONSTRAINTS, **LLAMA_SAMPLING}
    llama = _body({**llama_fields, "prompt": _PROMPT}, ("prompt",))
    infill = _body({**llama_fields, "input_prefix": {"type": "string"},
                    "input_suffix": {"type": "string"},
                    "input_extra": {"type": "array", "items": {"type": "object"}},
                    "prompt": {"type": "string"}}, ("input_prefix", "input_suffix"))
    responses = _body({**_SAMPLING, **_OPENAI_PENALTIES, **_CACHE_FLAG, **LLAMA_SAMPLING,
                       **{k: v for k, v in _CONSTRAINTS.items()
                          if k not in ("response_format", "n")}, **RESPONSES}, ("input",))
    messages = _body(ANTHROPIC, ("messages",))
    slot_file = {"required": False, "content": {"application/json": {"schema": {
        "type": "object", "properties": {"filename": {"type": "string"}}}}}}
    context = _body({"name": {"type": "string"}, "text": {"type": "string"},
                     "messages": _MESSAGES, "pin": {"type": "boolean", "default": True},
                     "cache_salt": {"type": "string"}}, ("name",))
    key = _body({"key": {"type": "string", "pattern": "^[0-9a-fA-F]{32}$"}}, ("key",))
    paths = {
        "/v1/completions": {"post": _op("Text completion (OpenAI)", completion, stream=True,
                                        errors=("400", "404", "413", "504"))},
        "/v1/chat/completions": {"post": _op("Chat completion (OpenAI)", chat, stream=True,
                                             errors=("400", "404", "413", "504"))},
        "/v1/models": {"get": _op("The served model", errors=())},
        "/models": {"get": _op("The served model (llama-server's path)", errors=())},
        "/chat/completions": {"post": _op("Chat completion (llama-server's path)", chat,
                                          stream=True, errors=("400", "404", "413", "501",
                                                               "504"))},
        "/v1/chat/completions/input_tokens": {"post": _op("Tokens of a chat prompt", chat)},
        "/chat/completions/input_tokens": {"post": _op("Tokens of a chat prompt", chat)},
        "/completions": {"post": _op("Completion (llama.cpp server fields)", llama,
                                     stream=True, errors=("400", "404", "413", "501", "504"))},
        "/infill": {"post": _op("Fill in the middle (models with FIM tokens)", infill,
                                stream=True, errors=("400", "413", "504"))},
        "/v1/responses": {"post": _op("OpenAI's Responses API (not stored)", responses,
                                      stream=True, errors=("400", "413", "504"))},
        "/responses": {"post": _op("As /v1/responses", responses, stream=True,
                                   errors=("400", "413", "504"))},
        "/v1/responses/input_tokens": {"post": _op("Tokens of a Responses prompt", responses)},
        "/responses/input_tokens": {"post": _op("Tokens of a Responses prompt", responses)},
        "/v1/messages": {"post": _op("Anthropic's Messages API", messages, stream=True,
                                     errors=("400", "413", "504"))},
        "/v1/messages/count_tokens": {"post": _op("Tokens of a Messages prompt", messages)},
        "/apply-template": {"post": _op("The prompt a chat request renders to", chat)},
        "/props": {"get": _op("Server settings (llama-server's /props)", errors=())},
        "/lora-adapters": {
            "get": _op("The LoRA adapters (--lora) and their global scales", errors=()),
            "post": _op("Set the global LoRA scales (adapters not named: 0)", {
                "required": True, "content": {"application/json": {
                    "schema": _CONSTRAINTS["lora"]}}})},
        "/slots": {"get": _op("The slots and what they run", errors=("501",))},
        "/slots/{id_slot}": {"post": _op(
            "Save, restore or erase a slot's state (?action=save|restore|erase)", slot_file,
            params=[_path_param("id_slot"), {"name": "action", "in": "query",
                                             "required": True, "schema": {
                                                 "type": "string",
                                                 "enum": ["save", "restore", "erase"]}}],
            errors=("400", "404", "409", "501"))},
        "/v1/health": {"get": {**_op("As /health", errors=()), "security": []}},
        "/completion": {"post": _op("Completion (llama.cpp server fields)", llama,
                                    stream=True, errors=("400", "404", "413", "504"))},
        "/tokenize": {"post": _op("Text to token ids", _body(
            {"content": {"type": "string"}, "add_special": {"type": "boolean"},
             "with_pieces": {"type": "boolean"}}, ("content",)))},
        "/detokenize": {"post": _op("Token ids to text", _body(
            {"tokens": {"type": "array", "items": {"type": "integer"}}}, ("tokens",)))},
        "/health": {"get": {**_op("200 when serving, 503 while loading or shutting down",
                                  errors=()), "security": []}},
        "/metrics": {"get": {"summary": "Prometheus metrics (text format 0.0.4); 501 with "
                                        "--no-metrics",
                             "responses": {"200": {"description": "OK", "content": {
                                 "text/plain": {"schema": {"type": "string"}}}},
                                 "501": {"description": "turned off", "content": {
                                     "application/json": {"schema": _ERROR}}}}}},
        "/openapi.json": {"get": _op("This document", errors=())},
        "/v1/contexts": {
            "post": _op("Register (and prefill) a named context; a salted one is used only "
                        "by requests with the same cache_salt", context, "201",
                        errors=("400", "409", "413")),
            "get": _op("List the named contexts this cache_salt may use (unsalted ones and "
                       "its own)", params=[_query("cache_salt", "string")])},
        "/v1/contexts/{name}": {
            "get": _op("One named context (a salted one only with its cache_salt)",
                       params=[_path_param("name"), _query("cache_salt", "string")],
                       errors=("400", "404")),
            "delete": _op("Forget a named context (its cache entries are unpinned); a "
                          "salted one only with its cache_salt",
                          params=[_path_param("name"), _query("cache_salt", "string")],
                          errors=("400", "404"))},
        "/cache/stats": {"get": _admin(_op("Cache tiers, lookups, write queue", errors=()))},
        "/cache/entries": {"get": _admin(_op("Cache entries, a page at a time", params=[
            _query("offset"), _query("limit"), _query("sort", "string"),
            _query("kind", "string")]))},
        "/cache/entries/{key}": {"delete": _admin(_op(
            "Delete an entry and everything below it", params=[_path_param("key")],
            errors=("400", "404")))},
        "/cache/pin": {"post": _admin(_op("Pin an entry and its ancestors", key,
                                          errors=("400", "404")))},
        "/cache/unpin": {"post": _admin(_op("Unpin an entry", key, errors=("400", "404")))},
        "/": {"get": _static("The cache page (HTML; its data comes from /cache/*)",
                             "text/html")},
        "/page.js": {"get": _static("The cache page's script", "text/javascript")},
        "/cache/tiers": {"get": _admin(_op("What each tier holds now, and samples of the "
                                           "last hour", errors=()))},
        "/cache/tree": {"get": _admin(_op("The prefix tree's largest branches, with the "
                                          "tiers holding them", params=[_query("limit")]))},
        "/cache/requests": {"get": _admin(_op("Running requests: prefill progress, rate, "
                                              "ETA", errors=()))},
        "/cache/misses": {"get": _admin(_op("Misses counted by reason, and the latest",
                                            errors=()))},
        "/cache/pinned": {"get": _admin(_op("Named contexts and pinned prefixes",
                                            errors=()))},
        "/cache/clear": {"post": _admin(_op("Delete every unpinned entry (or all)", {
            "required": False, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"include_pinned": {"type": "boolean"}}}}}}))},
    }
    for (method, path), what in UNSUPPORTED.items():
        paths.setdefault(path, {})[method.lower()] = _op(
            f"Not supported: {what} (501)", errors=("501",))
    return {
        "openapi": "3.1.0",
        "info": {"title": "ckptd", "version": "0.1.0",
                 "description": "A persistent prompt-cache daemon for hybrid LLMs. Completions "
                                "report usage.prompt_tokens_details (cached_tokens, "
                                "cached_tokens_by_tier, cache_miss) and timings (cache)."},
        "components": {"schemas": {"Error": _ERROR, "Timings": _TIMINGS},
                       "securitySchemes": {
                           "bearer": {"type": "http", "scheme": "bearer",
                                      "description": "--api-key (every endpoint but /health)"},
                           "admin": {"type": "http", "scheme": "bearer",
                                     "description": "--admin-key (/cache/*)"}}},
        "security": [{"bearer": []}],
        "paths": paths,
    }
