"""`ckptd generate`: one prompt in, the generated text out (stdout only)."""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("--model", help="HF folder or .gguf (default: the embedded SmolLM2)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--system", help="system message (chat mode)")
    p.add_argument("--raw", action="store_true", help="no chat template")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int)
    p.add_argument("--block-size", type=int, default=16)


def run(args) -> int:
    from model.default import default_model_path
    from model.generate import generate
    from model.loader import load
    from model.runner import Runner
    from model.sampling import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    model, tok = load(args.model or default_model_path())
    if args.raw:
        prompt = tok.encode(args.prompt, add_special_tokens=True)
    else:
        msgs = ([{"role": "system", "content": args.system}] if args.system else [])
        msgs.append({"role": "user", "content": args.prompt})
        prompt = tok.encode(tok.apply_chat_template(msgs))
    total = len(prompt) + params.max_tokens
    runner = Runner(model, num_pages=-(-total // args.block_size) + 1, num_slots=1,
                    block_size=args.block_size)
    for ev in generate(runner, tok, prompt, params):
        sys.stdout.write(ev.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
