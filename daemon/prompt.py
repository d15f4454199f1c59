"""A prompt as the engine takes it, with where its structure says the next one parts.

A memory-store client sends a long document (or system message) and asks; the next
request sends the same start and another question. A hybrid model's state can be
restored only where a snapshot was taken, so the first request's prefill stops where
the next one is likely to part and leaves a snapshot there (cache/checkpoints.py),
which makes the second question compute only itself:

    chat           the start of the last user message (after the turns before it: a
                   new question after the same system message and history) and the
                   end of the messages before the generation prompt (the next turn of
                   the conversation, whose history renders the answer the template's
                   way, which need not be the tokens that were generated)
    named context  its end, always: every request naming it parts there
    raw prompt     tail snapshots a few offsets before its end, planned by the cache

The anchors are token positions of character offsets of the rendered text: where a
token straddles the offset, the tokens before it (their state is what the next
prompt shares).

Every endpoint builds its prompt here (PromptBuilder), so text, chat messages, named
contexts and images become tokens the same way whichever API asked.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from jinja2.exceptions import TemplateError

from ckptd.daemon.config import ServeConfig
from ckptd.daemon.contexts import Context
from ckptd.daemon.http import media as media_parts
from ckptd.daemon.http.chat import ChatPrompt
from ckptd.daemon.http.errors import ApiError, bad_request
from ckptd.daemon.http.media import Media
from ckptd.daemon.http.schemas import CacheOptions
from ckptd.daemon.vision import limits as vision_limits
from ckptd.model.runner import Runner
from ckptd.model.text.tokenizer import Tokenizer
from ckptd.model.text.tool_calls import generic
from ckptd.model.text.tool_calls.detect import ToolSyntax, detect
from ckptd.model.text.tool_calls.reasoning import THINK, marks_of

# between the other files of an /infill request when the vocabulary has no file separator
_SNIPPET = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    salt: str | None = None
    anchors: tuple[int, ...] = ()    # token positions where the next prompt will part
    tails: bool = True               # a raw prompt: tail snapshots near its end


def anchors_at(ends: list[int], chars: Iterable[int], n: int) -> tuple[int, ...]:
    """The token positions of character offsets in a text of n tokens (ends: where each
    token ends): how many tokens end at or before each offset, where that lies inside."""
    return tuple(sorted({p for p in (bisect_right(ends, c) for c in chars) if 0 < p < n}))


def chat_heads(chat: ChatPrompt) -> list[ChatPrompt]:
    """The renderings whose ends are a chat prompt's anchors: the messages before its last
    user message, and all of them without the generation prompt (or the answer's start
    that is continued)."""
    msgs = chat.messages
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=0)
    heads = [chat.with_messages(msgs[:last_user], False)] if last_user else []
    if chat.add_generation_prompt or chat.prefill is not None:
        heads.append(chat.with_messages(msgs, False))
    return heads


class PromptBuilder:
    """A loaded model's prompts: its tokenizer and chat template, its vision tower (the
    runner's), the named contexts (`context`: a lookup by name and tenant salt, 404
    when unknown). Made when the model has loaded (Service.load)."""

    def __init__(self, cfg: ServeConfig, tokenizer: Tokenizer, runner: Runner,
                 context: Callable[[str, str | None], Context]) -> None:
        self.cfg, self.tokenizer, self.runner, self.context = cfg, tokenizer, runner, context
        self._ctx_tokens: dict[str, tuple[str, list[int]]] = {}   # name -> (source, tokens)
        self._syntax: ToolSyntax | None = None

    def render_chat(self, chat: ChatPrompt, generating: bool = True) -> str:
        """The prompt text. The template sees what llama-server gives it: bos_token,
        eos_token, enable_thinking (--reasoning, or the request's), today's date as
        `datetime` and `date_string`, the tools, and chat_template_kwargs. A last
        assistant message is an answer to continue: the rest rendered, then its text.
        generating: the answer will be read, so tools need a call syntax ckptd reads
        (/apply-template only renders, as llama-server's does)."""
        messages, add, tail = chat.messages, chat.add_generation_prompt, ""
        if chat.prefill is not None:
            add, tail = True, chat.prefill
        variables = self._variables(chat.tools, chat.enable_thinking)
        if any(m.get("tool_calls") for m in messages) and not self.tool_syntax().shows_tools:
            messages = _calls_written(messages)
        if chat.tools:
            syntax = self.tool_syntax()
            if generating and chat.tool_choice != "none" and syntax.fmt is None:
                raise bad_request("tools: this model's chat template writes tool calls in a "
                                  "syntax this server (ckptd) does not read (it writes "
                                  f"{syntax.sample!r}); send tool_choice none, or serve the "
                                  "model with a chat template whose calls ckptd reads "
                                  "(docs/COMPATIBILITY.md)", "tools", "not_supported")
            if not syntax.shows_tools and chat.tool_choice != "none":
                messages = _with_system(messages, generic.instructions(chat.tools))
            if syntax.string_arguments:
                messages = _string_arguments(messages)
        if any(m.get("tool_calls") or m.get("tool_call_id") is not None for m in messages) \
                and self.tool_syntax().short_ids:
            messages = _short_ids(messages)
        variables.update(chat.kwargs)
        try:
            return self.tokenizer.apply_chat_template(messages, add, **variables) + tail
        except TemplateError as e:
            raise bad_request(f"the chat template rejected the messages: {e}",
                              "messages") from None

    def _variables(self, tools: list[dict], thinking: bool | None) -> dict:
        now = datetime.now()
        out = {"enable_thinking": self.cfg.reasoning != "off" if thinking is None else thinking,
               "datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"),
               # what llama.cpp gives templates that list tools as text (FireFunction's)
               "functions": json.dumps(tools, indent=2) if tools else ""}
        if tools:
            out["tools"] = tools
        return out

    def tool_syntax(self) -> ToolSyntax:
        """Read from the template once (it is fixed at start-up)."""
        if self._syntax is None:
            src = self.tokenizer.chat_template
            render = lambda msgs, tools: self.tokenizer.apply_chat_template(   # noqa: E731
                msgs, True, **self._variables(tools, None))
            marks = marks_of(src)
            self._syntax = replace(detect(render), thinking=marks is not None,
                                   marks=marks or THINK)
        return self._syntax

    def context_tokens(self, ctx: Context) -> list[int]:
        """A context's tokens; the same ids every time, so the same cache keys."""
        source = ctx.text if ctx.text is not None else repr(ctx.messages)
        hit = self._ctx_tokens.get(ctx.name)
        if hit is not None and hit[0] == source:
            return hit[1]
        if ctx.text is not None:
            ids = self.tokenizer.encode(ctx.text)
        else:
            ids = self.tokenizer.encode(self.render_chat(ChatPrompt(ctx.messages,
                                                                    add_generation_prompt=False)))
        self._ctx_tokens[ctx.name] = (source, ids)
        return ids

    def prompt_tokens(self, prompt: str | list) -> list[int]:
        """A prompt's ids: text encoded, a list of ids with text pieces encoded in place."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if str not in set(map(type, prompt)):       # ids only: a copy, in C
            return list(prompt)
        out: list[int] = []
        for x in prompt:
            out += self.tokenizer.encode(x) if isinstance(x, str) else [x]
        return out

    def infill_tokens(self, fill, gap: str | list) -> list[int]:
        """Fill-in-the-middle in llama-server's repo-level layout (arXiv 2409.12186):
        [repo]myproject, each other file as [file_sep]name + its text (a plain snippet
        separator without that token), [file_sep]filename, then
        [prefix]code before the gap + the prompt (the gap's start)[suffix]code after[middle].
        Unlike llama-server, the prefix and suffix are not cut to a batch's size: a prefill
        of any length runs in chunks."""
        tok = self.tokenizer
        pre, suf, mid = tok.fim
        sep, repo, enc = tok.file_sep, tok.fim_repo, tok.encode
        out: list[int] = []
        if repo is not None:
            out += [repo] + enc("myproject\n")
        for name, text in fill.extra:
            out += [sep] + enc((name or "tmp") + "\n") if sep is not None else enc(_SNIPPET)
            out += enc(text)
        if sep is not None:
            out += [sep] + enc("filename\n")
        gap_ids = self.prompt_tokens(gap) if gap else []
        return out + [pre] + enc(fill.prefix) + gap_ids + [suf] + enc(fill.suffix) + [mid]

    def completion_prompt(self, prompt: str | list, cache: CacheOptions) -> Prompt:
        """A named context's tokens (its end an anchor: above), then the
        prompt's own (with its images' placeholders, when it has any)."""
        media = getattr(prompt, "media", None)
        if cache.context is None:
            if media:
                return Prompt(self.media_tokens([], prompt, media, "prompt"), cache.salt)
            return Prompt(self.prompt_tokens(prompt), cache.salt)
        ctx = self.context(cache.context, cache.salt)
        head = self.context_tokens(ctx)
        ids = (self.media_tokens(head, prompt, media, "prompt") if media
               else head + self.prompt_tokens(prompt))
        return Prompt(ids, cache.salt or ctx.salt, (len(head),))

    def media_tokens(self, head: list[int], text: str, media: Media,
                     where: str) -> media_parts.Prompt:
        """`head`, then the ids of `text` with each image's placeholders where its marker
        is (blocking: images are read and decoded here)."""
        embedder = self.runner.embedder
        room = self.runner.max_batch_tokens - self.cfg.step_tokens
        images = media_parts.prepare_all(media, embedder, self.cfg.media_path,
                                          vision_limits(self.cfg), room)
        body = media_parts.tokenize(text, media.marker, images, self.tokenizer.encode,
                                    embedder, where)
        out = media_parts.Prompt(head + body)
        out.images = tuple(im.moved(im.start + len(head)) for im in body.images)
        return out

    def chat_prompt(self, chat: ChatPrompt, cache: CacheOptions, anchors: bool = True,
                    param: str = "messages") -> Prompt:
        """The chat's tokens, and (anchors) where the next chat request over the same
        start will part from it (above). A chat with images has the named
        context's end as its one anchor (its text's offsets are not its tokens'); the
        cache moves any anchor that falls inside an image to the image's start. `param`:
        the field that holds the messages (images' errors)."""
        if chat.media:
            if cache.context is not None:
                ctx = self.context(cache.context, cache.salt)
                head = self.context_tokens(ctx)
                return Prompt(self.media_tokens(head, self.render_chat(chat), chat.media,
                                                param),
                              cache.salt or ctx.salt, (len(head),), tails=False)
            return Prompt(self.media_tokens([], self.render_chat(chat), chat.media, param),
                          cache.salt, tails=False)
        if cache.context is None:
            text = self.render_chat(chat)
            if not anchors:
                return Prompt(self.tokenizer.encode(text), cache.salt, tails=False)
            ids, ends = self.tokenizer.encode_ends(text)
            heads = (self._render_or_none(h) for h in chat_heads(chat))
            chars = [len(h) for h in heads if h is not None and text.startswith(h)]
            return Prompt(ids, cache.salt, anchors_at(ends, chars, len(ids)), tails=False)
        ctx = self.context(cache.context, cache.salt)
        if ctx.messages is not None:
            # Render the whole conversation and keep what follows the context's own
            # rendering, so the suffix reads as the template would have it.
            head = self.render_chat(chat.with_messages(ctx.messages, False))
            full = self.render_chat(chat.with_messages(ctx.messages + chat.messages,
                                                       chat.add_generation_prompt, chat.prefill))
            suffix = full[len(head):] if full.startswith(head) else self.render_chat(chat)
        else:
            suffix = self.render_chat(chat)
        head = self.context_tokens(ctx)
        return Prompt(head + self.tokenizer.encode(suffix), cache.salt or ctx.salt,
                      (len(head),), tails=False)

    def _render_or_none(self, chat: ChatPrompt) -> str | None:
        """A rendering for an anchor: None where the template refuses these messages
        (one that wants a user message last), which only costs the anchor."""
        try:
            return self.render_chat(chat)
        except ApiError:
            return None


def _with_system(messages: list[dict], text: str) -> list[dict]:
    """`text` at the end of the system message (one put first when there is none)."""
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{text}"}] + messages[1:]
    return [{"role": "system", "content": text}] + messages


def _string_arguments(messages: list[dict]) -> list[dict]:
    """The calls' arguments as JSON text, for templates that write them as they are."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [
                {**c, "function": {**c["function"], "arguments": json.dumps(
                    c["function"]["arguments"], ensure_ascii=False)}}
                for c in m["tool_calls"]]}
        out.append(m)
    return out


def short_id(call_id: str) -> str:
    """A call id as a template that takes only ids of 9 letters or digits (Mistral's)
    takes it: the same id each time, so a call and its result still match (vLLM cuts
    ids for these templates too)."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _short_ids(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "id": short_id(str(c.get("id", "")))}
                                     for c in m["tool_calls"]]}
        if m.get("tool_call_id") is not None:
            m = {**m, "tool_call_id": short_id(str(m["tool_call_id"]))}
        out.append(m)
    return out


def _calls_written(messages: list[dict]) -> list[dict]:
    """An assistant's past calls as the generic format's text, in its content, for a
    template that renders no calls (the model sees what it wrote)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            text = generic.written(m["tool_calls"])
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = f"{m['content']}\n{text}" if m.get("content") else text
        out.append(m)
    return out
