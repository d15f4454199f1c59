"""Chat templates: Hugging Face-style jinja2, rendered in a sandbox.

The environment mirrors what transformers gives a template: trim_blocks and
lstrip_blocks, the loop-controls extension, `{% generation %}` blocks (transformers
marks the assistant's tokens with them; rendered here as their body, as llama.cpp's
minja does), a `tojson` that keeps non-ASCII
text as is, and the globals `raise_exception` and `strftime_now`. Templates
come from model files, so they are untrusted code: jinja2's sandbox refuses every
attribute of Python's internals (`__class__`, `__globals__`, a function's code...),
and messages and variables are copied into plain JSON types before a template sees
them. A template may change its own lists and dicts (`ids.append(x)`, `d.update(...)`,
as jinja2's sandbox and llama.cpp's minja allow, and Kimi K2's templates do): all it
can reach are those copies and what it built itself, fresh on every render.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import SandboxedEnvironment

# Used when a model ships none: plain ChatML.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(TemplateError, ValueError):
    """The template rejected the messages (raise_exception, a bad variable, a bad message).

    A TemplateError for callers that catch jinja2's errors, a ValueError for the rest."""


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: its body, as written."""
    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(value, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    # jinja2's own tojson escapes HTML characters; templates expect plain json.dumps
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=8)
def compile_template(source: str | None) -> jinja2.Template:
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                               extensions=[jinja2.ext.loopcontrols, _Generation])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source or CHATML)
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e}") from None


def render_chat(source: str | None, messages: list[dict], add_generation_prompt: bool = True,
                **variables) -> str:
    """Render `messages` ([{"role": ..., "content": ...}, ...]) with the template `source`
    (ChatML when None). `variables` reach the template as globals: bos_token, eos_token,
    tools, enable_thinking, ..."""
    if not isinstance(messages, list):
        raise ChatTemplateError(f"messages must be a list, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be an object with a string 'role'")
    template = compile_template(source)
    try:
        return template.render(messages=_plain(messages),
                               add_generation_prompt=add_generation_prompt, **_plain(variables))
    except ChatTemplateError:
        raise
    except TemplateError as e:
        raise ChatTemplateError(str(e)) from None
    except (TypeError, KeyError, AttributeError, IndexError) as e:
        # e.g. `message['content'] + ...` on a message whose content is a list or missing
        raise ChatTemplateError(f"the chat template failed on these messages: "
                                f"{type(e).__name__}: {e}") from None


def _plain(value):
    """A copy built only of JSON types, so a template can reach no caller object's methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    # subclasses (enums, numpy scalars) are cut back to the base type, without their methods
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return f"<{type(value).__name__}>"
