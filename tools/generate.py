"""`ckptd generate`: one prompt in, the generated text out.

Only the generated text goes to stdout, streamed as it is decoded; everything
else goes to stderr, so the output can be piped.
"""

from __future__ import annotations

import sys

LONG_PROMPT = 4096          # tokens from which the prefill shows a progress bar


def add_arguments(p) -> None:
    p.add_argument("--model", help="HF folder or .gguf file (default: the embedded SmolLM2)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file", help="read the prompt from this file ('-': stdin)")
    p.add_argument("--system", help="system message (chat mode; default: the template's)")
    p.add_argument("--raw", action="store_true", help="no chat template: complete the prompt")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--device", default="auto",
                   help="auto (default: CUDA when there is one), cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (default: bfloat16 on CUDA, float32 "
                   "on the CPU), bfloat16, float16 or float32")
    p.add_argument("--weights", choices=("keep", "expand"), default="keep",
                   help="keep a GGUF's quantized tensors in their formats (default) or "
                        "expand them to the dtype at load")
    p.add_argument("--gemv-activations", choices=("fp32", "q8"), default="fp32",
                   help="the matmuls over kept Q4_0 / Q4_1 / Q8_0 weights on the CPU: fp32 "
                        "(default) multiplies the weights' exact values; q8 rounds their "
                        "input to int8 per block of 32 and multiplies in integers, as "
                        "llama.cpp does")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs for decode steps (default: graphs on CUDA)")


def run(args) -> int:
    # imported here: `ckptd generate --help` answers without importing torch
    from ckptd.daemon.engine import local_engine
    from ckptd.model.default import default_model_path
    from ckptd.model.loader import load
    from ckptd.model.placement import resolve
    from ckptd.model.sampling.sampler import SamplingParams

    # Check everything the user typed before the model is loaded.
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                            seed=args.seed, stop=tuple(args.stop))
    if args.block_size <= 0:
        raise ValueError(f"--block-size must be positive, got {args.block_size}")
    where = resolve(args.device, args.dtype)
    text_in = args.prompt if args.prompt is not None else _read(args.prompt_file)
    model, tok = load(args.model or default_model_path(), where.dtype, where.device,
                      weights=args.weights, gemv_activations=args.gemv_activations)
    if args.raw:
        prompt = tok.encode(text_in, add_special_tokens=True)
    else:
        msgs = [{"role": "system", "content": args.system}] if args.system else []
        msgs.append({"role": "user", "content": text_in})
        prompt = tok.encode(tok.apply_chat_template(msgs))
    if not prompt:
        raise ValueError("the prompt encodes to no tokens")
    total = len(prompt) + params.max_tokens
    limit = model.config.max_position_embeddings
    if total > limit:
        raise ValueError(f"prompt ({len(prompt)} tokens) + --max-tokens ({params.max_tokens}) "
                         f"exceeds the model's context of {limit} tokens")
    engine = local_engine(model, tok, -(-total // args.block_size) + 1, args.block_size,
                          graphs=False if args.enforce_eager else None)
    text = ""
    with _PrefillBar(len(prompt)) as bar:
        for ev in engine.stream(prompt, params, on_prefill=bar.update):
            bar.close()
            text += ev.text
            sys.stdout.write(ev.text)
            sys.stdout.flush()
    if sys.stdout.isatty() and not text.endswith("\n"):
        sys.stdout.write("\n")
    return 0


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--prompt-file {path}: {e}") from None


class _PrefillBar:
    """A progress bar on stderr while a long prompt is computed (stdout stays the
    generated text alone)."""

    def __init__(self, total: int) -> None:
        self.total, self.progress, self.task = total, None, None
        if total >= LONG_PROMPT:
            # only a long prompt shows a bar
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )
            self.progress = Progress(TextColumn("prefill"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), console=Console(stderr=True),
                                     transient=True)
            self.task = self.progress.add_task("", total=total)
            self.progress.start()

    def update(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=done)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def __enter__(self) -> _PrefillBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
