"""Images in requests: where each one sits in the prompt text, where its bytes come
from, and the prompt's tokens with each image's placeholders.

Parsing puts a marker in the text where an image part was (OpenAI `image_url`,
Anthropic `image`, Responses `input_image`; llama-server's `multimodal_data` names its
places with `<__media__>` itself), and notes the part. The template renders the text
around the markers; then each marker becomes `<|vision_start|>`, one placeholder per
merged patch block, `<|vision_end|>` (as llama.cpp's mtmd tokenizes Qwen-VL images) and
the text between is tokenized on its own, as special tokens split it anyway.

An image is a data URL (base64), raw base64 (`multimodal_data`), or a `file://` path
inside `--media-path`; the daemon fetches nothing, so an http(s) URL is a 400 saying
so. A part that can't be read or decoded is a 400 naming the part.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from ckptd.daemon.http.errors import bad_request
from ckptd.model.vision.image import ImageError, Limits, Prepared, decode, prepare

MEDIA_MARKER = "<__media__>"     # llama-server's default marker in multimodal prompts


@dataclass
class Media:
    """A request's images in the order they appear, and the text standing for each."""
    marker: str = field(default_factory=lambda: f"<__media_{secrets.token_hex(8)}__>")
    parts: list[tuple[str, str]] = field(default_factory=list)     # (field, source)
    raw: bool = False                # sources are bare base64 (multimodal_data)

    def add(self, where: str, source: object) -> str:
        if not isinstance(source, str) or not source:
            raise bad_request(f"{where} must be an image URL (data:image/...;base64,...)",
                              where, "invalid_type")
        self.parts.append((where, source))
        return self.marker

    def __bool__(self) -> bool:
        return bool(self.parts)


class Prompt(list):
    """A prompt's token ids that also carries its images' spans (ImageSpan)."""
    images: tuple = ()


def image_bytes(source: str, where: str, raw: bool, media_path: Path | None,
                max_bytes: int) -> bytes:
    """The encoded image a part names; ApiError 400 naming the part."""
    if raw:
        return _base64(source, where, max_bytes)
    if source.startswith("data:"):
        head, sep, data = source.partition(",")
        mime = head[5:].split(";")[0].strip().lower()
        if not sep or ";base64" not in head.lower():
            raise bad_request(f"{where}: a data URL must carry base64 data "
                              "(data:image/png;base64,...)", where)
        if mime and not mime.startswith("image/") and mime != "application/octet-stream":
            raise bad_request(f"{where}: {mime!r} is not an image type", where)
        return _base64(data, where, max_bytes)
    scheme = urlparse(source).scheme.lower()
    if scheme in ("http", "https"):
        raise bad_request(f"{where}: remote image URLs are not fetched (the daemon fetches "
                          "nothing): send the image as a data URL, or put it in the folder "
                          "--media-path names and send file://<path>", where, "not_supported")
    if scheme == "file":
        return _file(unquote(source[len("file://"):]), where, media_path, max_bytes)
    raise bad_request(f"{where} is not an image URL: send data:image/...;base64,... (or "
                      "file://<path> under --media-path)", where)


def _base64(data: str, where: str, max_bytes: int) -> bytes:
    if len(data) > max_bytes * 4 // 3 + 4:
        raise bad_request(f"{where}: the image is more than {max_bytes} bytes "
                          "(--image-max-bytes)", where, "image_too_large")
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}: the image data is not valid base64", where) from None


def _file(path: str, where: str, media_path: Path | None, max_bytes: int) -> bytes:
    """file://PATH: PATH within --media-path, as llama-server reads it (relative to the
    folder, leading slashes dropped, no '..'), or an absolute path that lies inside it."""
    if media_path is None:
        raise bad_request(f"{where}: file:// images are served only from the folder "
                          "--media-path names, and none is set", where, "not_supported")
    root = Path(media_path).resolve()
    if ".." in Path(path).parts:
        raise bad_request(f"{where}: {path} is outside --media-path ('..')", where)
    target = (root / path.lstrip("/")).resolve()
    if not target.is_file() and Path(path).is_absolute():
        target = Path(path).resolve()
    if not target.is_relative_to(root):
        raise bad_request(f"{where}: {path} is outside --media-path", where)
    if not target.is_file():
        raise bad_request(f"{where}: no such file under --media-path: {path}", where)
    if target.stat().st_size > max_bytes:
        raise bad_request(f"{where}: the image is more than {max_bytes} bytes "
                          "(--image-max-bytes)", where, "image_too_large")
    return target.read_bytes()


def prepare_all(media: Media, embedder, media_path: Path | None, limits: Limits,
                most_tokens: int) -> list[Prepared]:
    """Every image read, decoded and resized for the model (blocking: call on a thread).
    ApiError 400 naming the part that fails; the model must see images."""
    if embedder is None:
        where = media.parts[0][0]
        raise bad_request(f"{where}: image input is not supported: this model has no "
                          "vision tower (serve a multimodal checkpoint, or a GGUF with "
                          "--mmproj)", where, "not_supported")
    out = []
    for where, source in media.parts:
        data = image_bytes(source, where, media.raw, media_path, limits.max_bytes)
        try:
            img = prepare(decode(data, limits), embedder.config.processing, limits)
        except ImageError as e:
            raise bad_request(f"{where}: {e}", where, "invalid_image") from None
        n = embedder.tokens(img)
        if n > most_tokens:
            raise bad_request(f"{where}: the image resizes to {n} tokens, more than the "
                              f"{most_tokens} one step can take", where, "image_too_large")
        out.append(img)
    return out


def tokenize(text: str, marker: str, images: list[Prepared], encode, embedder,
             where: str) -> Prompt:
    """The ids of `text` with each marker replaced by its image's placeholder tokens."""
    pieces = text.split(marker)
    if len(pieces) - 1 != len(images):
        raise bad_request(f"{where}: the prompt has {len(pieces) - 1} image markers for "
                          f"{len(images)} images", where)
    cfg = embedder.config
    out, spans = Prompt(), []
    for i, piece in enumerate(pieces):
        if piece:
            out += encode(piece)
        if i < len(images):
            out.append(cfg.vision_start_token_id)
            spans.append(embedder.span(images[i], len(out)))
            out += [cfg.image_token_id] * spans[-1].length
            out.append(cfg.vision_end_token_id)
    if out.count(cfg.image_token_id) != sum(s.length for s in spans):
        raise bad_request(f"{where}: the text holds image placeholder tokens of its own "
                          "(<|image_pad|>); images go in image parts", where)
    out.images = tuple(spans)
    return out
