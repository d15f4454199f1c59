"""API errors: one exception type, rendered as OpenAI-style JSON by the error middleware."""

from __future__ import annotations

from ckptd.cache.device import OutOfPages
from ckptd.daemon.request import EngineError, QueueFull, RequestTimeout

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          403: "permission_error", 405: "invalid_request_error", 408: "timeout_error",
          409: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 501: "not_supported_error", 503: "unavailable_error",
          504: "timeout_error"}


class ApiError(Exception):
    """A request the daemon answers with a 4xx/5xx JSON body instead of a result."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None,
                 kind: str | None = None, extra: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code or _default_code(status)
        self.headers = headers or {}
        self.kind = kind or _TYPES.get(status, "server_error")
        self.extra = extra or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code, **self.extra}}


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def not_supported(what: str, param: str | None = None) -> ApiError:
    """A feature ckptd leaves out (embeddings, multimodal input, ...): 501, as llama-server
    answers what its build does not support."""
    return ApiError(501, f"{what} is not supported by this server (ckptd)", param,
                    "not_supported")


def context_exceeded(n_prompt: int, n_ctx: int, param: str = "prompt",
                     what: str = "the context") -> ApiError:
    """A prompt that does not fit: llama-server's error type and figures, OpenAI's code."""
    return ApiError(400, f"the request exceeds the available context size: the prompt is "
                         f"{n_prompt} tokens and {what} holds {n_ctx} (prompt plus at least "
                         "one generated token)", param, "context_length_exceeded",
                    kind="exceed_context_size_error",
                    extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx})


def _default_code(status: int) -> str:
    return {400: "invalid_value", 401: "invalid_api_key", 404: "not_found",
            405: "method_not_allowed", 413: "body_too_large", 501: "not_supported",
            503: "unavailable", 504: "timeout"}.get(status, "internal_error")


# What went wrong with a generation -> what its client gets: (status, code, retry).
# Checked in order; an error of no listed type is the engine's fault (503, retry).
_FAILURES: tuple[tuple[type[Exception], int, str, bool], ...] = (
    (RequestTimeout, 504, "timeout", False),
    (QueueFull, 503, "queue_full", True),
    (OutOfPages, 503, "out_of_memory", True),
    (EngineError, 503, "generation_failed", True),
)


def error_for(err: Exception) -> ApiError:
    """The HTTP error a failed generation is answered with."""
    status, code, retry = next(((s, c, r) for kind, s, c, r in _FAILURES
                                if isinstance(err, kind)), (503, "generation_failed", True))
    return ApiError(status, str(err), None, code, {"Retry-After": "1"} if retry else None)
