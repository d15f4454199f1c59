"""Write a random LoRA adapter for a model as a PEFT folder (adapter_config.json +
adapter_model.safetensors): for tests, and for llama.cpp's server suite, whose own
adapter is for its own test model (tools/llama_adapter.py maps --lora to one of these).

    ckptd make-lora MODEL OUT [--rank 4] [--alpha 8] [--seed 0] [--std 0.05]

A and B are both random (PEFT initializes B to zero: an adapter that changes nothing),
so the adapter visibly changes the model's answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ckptd.model.loader import load_model
from ckptd.model.lora.targets import adaptable

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_lora(model, out: str | Path, rank: int = 4, alpha: float = 8.0, seed: int = 0,
              std: float = 0.05, targets: tuple[str, ...] = PROJECTIONS) -> Path:
    """A PEFT folder adapting every linear of `model` whose last name is in `targets`."""
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(adaptable(model)):
        if name.rpartition(".")[2] not in targets:
            continue
        mod = model.get_submodule(name)
        a = torch.randn(rank, mod.in_features, generator=g) / mod.in_features ** 0.5
        b = torch.randn(mod.out_features, rank, generator=g) * std
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
    if not tensors:
        raise ValueError(f"the model has no linear named {', '.join(targets)}")
    save_file(tensors, out / "adapter_model.safetensors", metadata={"format": "pt"})
    conf = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets),
            "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
            "base_model_name_or_path": None}
    (out / "adapter_config.json").write_text(json.dumps(conf, indent=1))
    return out


def add_arguments(p) -> None:
    p.add_argument("model", help="HF folder or .gguf file the adapter is for")
    p.add_argument("out", help="folder to write (adapter_config.json, adapter_model.safetensors)")
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--alpha", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std", type=float, default=0.05, help="spread of B's entries")


def run(args) -> int:
    model = load_model(args.model)
    print(make_lora(model, args.out, args.rank, args.alpha, args.seed, args.std))
    return 0
