"""`ckptd make-tiny`'s command line: a text model (tools/make_tiny.py) or, with
--vision, a multimodal one (tools/make_tiny_vision.py, which builds on make_tiny's
tokenizer: the command sits above both, so neither imports the other back)."""

from __future__ import annotations

from ckptd.tools import make_tiny as tiny
from ckptd.tools.make_tiny_vision import make_tiny_vision

# the multimodal checkpoints' names for the text archs they hold (--vision)
MULTIMODAL = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


def add_arguments(p) -> None:
    p.add_argument("--arch", required=True, choices=tiny.ARCHES + tuple(MULTIMODAL))
    p.add_argument("--out", required=True, help="folder to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gguf", metavar="FILE",
                   help="also write an F32 GGUF of it with llama.cpp's converter")
    p.add_argument("--fim", action="store_true", help="add fill-in-the-middle tokens")
    p.add_argument("--vocab-of", metavar="MODEL",
                   help="take this model's vocabulary (a folder or GGUF): a draft for it")
    p.add_argument("--vision", action="store_true",
                   help="a multimodal checkpoint (qwen3_5_text / qwen3_5_moe_text only) "
                        "written by transformers' Qwen3_5(Moe)ForConditionalGeneration; "
                        "with --gguf, also the mmproj GGUF beside it (mmproj-<name>)")


def run(args) -> int:
    args.arch = MULTIMODAL.get(args.arch, args.arch)
    if args.vision:
        out, mmproj = make_tiny_vision(args.arch, args.out, args.seed, args.gguf)
        print(f"wrote tiny multimodal {args.arch} model to {out}"
              + (f" and {args.gguf}, {mmproj}" if args.gguf else ""))
        return 0
    out = tiny.make_tiny(args.arch, args.out, args.seed, args.gguf, fim=args.fim,
                         vocab_of=args.vocab_of)
    print(f"wrote tiny {args.arch} model to {out}" + (f" and {args.gguf}" if args.gguf else ""))
    return 0
