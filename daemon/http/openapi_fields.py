"""Request fields for /openapi.json beyond the common ones (openapi.py): llama.cpp's
other sampling fields, which every generation route reads, and the bodies of
Anthropic's Messages API and OpenAI's Responses API in their own shapes, so that a
client (or a fuzzer) sees every field an error may name."""

from __future__ import annotations

_NUM, _INT, _BOOL, _STR = ({"type": "number"}, {"type": "integer"}, {"type": "boolean"},
                           {"type": "string"})
_OBJ = {"type": "object"}

# llama.cpp's sampling fields beyond the usual ones (daemon/http/sampling.py)
LLAMA_SAMPLING = {
    "typical_p": _NUM, "top_n_sigma": _NUM, "min_keep": _INT, "xtc_probability": _NUM,
    "xtc_threshold": _NUM, "dynatemp_range": _NUM, "dynatemp_exponent": _NUM,
    "samplers": {"oneOf": [_STR, {"type": "array", "items": _STR}]},
    "mirostat": {"type": "integer", "minimum": 0, "maximum": 2}, "mirostat_tau": _NUM,
    "mirostat_eta": _NUM, "dry_multiplier": _NUM, "dry_base": _NUM,
    "dry_allowed_length": _INT, "dry_penalty_last_n": _INT,
    "dry_sequence_breakers": {"type": "array", "items": _STR},
    "backend_sampling": _BOOL, "speculative.n_max": _INT, "speculative.n_min": _INT,
    "speculative.p_min": _NUM, "timings_per_token": _BOOL, "verbose": _BOOL,
    # accepted at their off values only (a 400 otherwise)
    "adaptive_target": _NUM, "n_indent": _INT, "t_max_predict_ms": _INT,
    "t_max_prompt_ms": _INT, "grammar_lazy": _BOOL,
}

_TOOL_CALL = {"type": "object", "properties": {
    "id": _STR, "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": _STR, "arguments": {"oneOf": [_STR, _OBJ]}}}}}
_TOOL = {"type": "object", "required": ["function"], "properties": {
    "type": {"type": "string", "enum": ["function"]}, "function": {
        "type": "object", "required": ["name"], "properties": {
            "name": _STR, "description": _STR, "parameters": _OBJ}}}}
# OpenAI's chat fields beside messages (daemon/http/chat.py)
CHAT = {
    "tools": {"type": "array", "items": _TOOL},
    "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]},
                              {"type": "object", "properties": {
                                  "type": _STR, "function": {"type": "object", "properties": {
                                      "name": _STR}}}}]},
    "parallel_tool_calls": _BOOL, "chat_template_kwargs": _OBJ,
    "reasoning_format": {"type": "string", "enum": ["auto", "none", "deepseek",
                                                    "deepseek-legacy"]},
    "reasoning_effort": _STR, "best_of": _INT, "echo": _BOOL,
}
# an image: a data URL (data:image/png;base64,...) or file://NAME under --media-path
# (daemon/http/media.py); remote URLs are refused
_IMAGE_URL = {"type": "string", "description": "data:image/...;base64,... or file://NAME "
              "under --media-path"}
_CHAT_PART = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["text", "image_url"]}, "text": _STR,
    "image_url": {"oneOf": [_IMAGE_URL, {"type": "object", "required": ["url"], "properties": {
        "url": _IMAGE_URL, "detail": _STR}}]}}}
MESSAGES = {"type": "array", "items": {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"oneOf": [_STR, {"type": "array", "items": _CHAT_PART}]},
    "tool_calls": {"type": "array", "items": _TOOL_CALL}, "tool_call_id": _STR,
    "name": _STR, "reasoning_content": _STR}}}

_TEXT_BLOCK = {"type": "object", "required": ["type", "text"], "properties": {
    "type": {"type": "string", "enum": ["text"]}, "text": _STR}}
_SOURCE = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["base64", "url"]}, "media_type": _STR,
    "data": {"type": "string", "description": "base64 image data"}, "url": _IMAGE_URL}}
_IMAGE_BLOCK = {"type": "object", "required": ["type", "source"], "properties": {
    "type": {"type": "string", "enum": ["image"]}, "source": _SOURCE}}
_BLOCK = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["text", "image", "tool_use", "tool_result",
                                        "thinking", "redacted_thinking"]},
    "text": _STR, "source": _SOURCE, "thinking": _STR, "id": _STR, "name": _STR,
    "input": _OBJ, "tool_use_id": _STR, "content": {"oneOf": [_STR, {"type": "array",
        "items": {"oneOf": [_TEXT_BLOCK, _IMAGE_BLOCK]}}]},
    "is_error": _BOOL}}
# Anthropic's Messages API (daemon/http/anthropic_request.py: NAMES and its own fields)
ANTHROPIC = {
    "model": _STR, "max_tokens": {"type": "integer", "minimum": 0},
    "messages": {"type": "array", "items": {"type": "object", "required": ["role", "content"],
                                            "properties": {
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "content": {"oneOf": [_STR, {"type": "array", "items": _BLOCK}]}}}},
    "system": {"oneOf": [_STR, {"type": "array", "items": _TEXT_BLOCK}]},
    "stop_sequences": {"type": "array", "items": _STR, "maxItems": 16},
    "temperature": {"type": "number", "minimum": 0}, "top_p": _NUM, "top_k": _INT,
    "stream": _BOOL, "seed": _INT, "metadata": _OBJ,
    "tools": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
        "name": _STR, "description": _STR, "input_schema": _OBJ, "type": _STR}}},
    "tool_choice": {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]}, "name": _STR,
        "disable_parallel_tool_use": _BOOL}},
    "thinking": {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["enabled", "disabled", "adaptive"]},
        "budget_tokens": _INT}},
    "chat_template_kwargs": _OBJ, "cache_prompt": _BOOL, "cache_salt": _STR, "context": _STR,
    "id_slot": _INT, "return_progress": _BOOL, "timings_per_token": _BOOL, "verbose": _BOOL,
}

_PART = {"type": "object", "required": ["type"], "properties": {
    "type": {"type": "string", "enum": ["input_text", "output_text", "input_image"]},
    "text": _STR, "image_url": _IMAGE_URL, "detail": _STR}}
_ITEM = {"type": "object", "properties": {
    "type": {"type": "string", "enum": ["message", "function_call", "function_call_output",
                                        "reasoning"]},
    "role": {"type": "string", "enum": ["user", "system", "developer", "assistant"]},
    "content": {"oneOf": [_STR, {"type": "array", "items": _PART}]},
    "call_id": _STR, "name": _STR, "arguments": _STR, "output": {"oneOf": [
        _STR, {"type": "array", "items": _PART}]}}}
# OpenAI's Responses API (daemon/http/responses_request.py), beside the chat fields it
# passes on as llama-server does
RESPONSES = {
    "model": _STR, "input": {"oneOf": [_STR, {"type": "array", "items": _ITEM}]},
    "instructions": _STR, "max_output_tokens": {"type": "integer", "minimum": 0},
    "tools": {"type": "array", "items": {"type": "object", "required": ["type", "name"],
                                         "properties": {
        "type": {"type": "string", "enum": ["function"]}, "name": _STR,
        "description": _STR, "parameters": _OBJ, "strict": _BOOL}}},
    "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]},
                              {"type": "object", "properties": {"type": _STR,
                                                                "name": _STR}}]},
    "parallel_tool_calls": _BOOL, "include": {"type": "array", "items": _STR},
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    "text": {"type": "object", "properties": {"format": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
        "name": _STR, "schema": _OBJ, "strict": _BOOL}}}},
    "reasoning": {"type": "object", "properties": {"effort": _STR, "summary": _STR}},
    "previous_response_id": _STR, "store": _BOOL, "metadata": _OBJ,
    "truncation": {"type": "string", "enum": ["disabled", "auto"]},
    "chat_template_kwargs": _OBJ, "reasoning_effort": _STR,
}
