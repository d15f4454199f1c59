from __future__ import annotations

import pytest
import torch

from model.spec import AttentionSpec, RecurrentSpec, StateSpec

B = 4


def hybrid_spec(dtype=torch.bfloat16):
    return StateSpec(B, AttentionSpec(2, 2, 8, dtype),
                     RecurrentSpec(3, 24, 4, 2, 8, 8, conv_dtype=dtype))


def attention_spec(dtype=torch.float16):
    return StateSpec(B, AttentionSpec(3, 2, 8, dtype), None)


def fake_pages(spec, tokens, first, n):
    """Deterministic 'KV' for blocks first..first+n-1: a function of the tokens only, so a
    test can check that what comes back belongs to exactly those tokens."""
    out = []
    for i in range(first, first + n):
        seed = hash(tuple(tokens[: (i + 1) * spec.block_size])) % (2 ** 31)
        g = torch.Generator().manual_seed(seed)
        out.append(torch.randn(spec.kv_shape(), generator=g).to(spec.attention.dtype))
    return torch.stack(out)


def fake_snapshot(spec, tokens):
    g = torch.Generator().manual_seed(hash(tuple(tokens)) % (2 ** 31))
    r = len(tokens) % spec.block_size
    out = {"kv": torch.randn(spec.kv_shape(r), generator=g).to(spec.attention.dtype)}
    if spec.recurrent:
        out["conv"] = torch.randn(spec.conv_shape(), generator=g).to(spec.recurrent.conv_dtype)
        out["ssm"] = torch.randn(spec.ssm_shape(), generator=g)
    return out


@pytest.fixture(params=["hybrid", "attention"])
def spec(request):
    return hybrid_spec() if request.param == "hybrid" else attention_spec()
