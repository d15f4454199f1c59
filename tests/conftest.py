"""Shared fixtures: tiny random-weight models written once per test session."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os

import pytest

from ckptd.tools.openmp import wait_passively

# The test session and the daemons it starts wait for OpenMP work passively, as ckptd's
# commands do (tools/openmp.py): libgomp reads the policy when torch loads it
wait_passively()


def _share_the_cores() -> None:
    """Under pytest-xdist each worker takes its share of the cores for OpenMP (torch's
    ops and the daemons a test starts, which inherit the variable), rather than each
    running as many threads as there are cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // workers))


_share_the_cores()

import torch  # noqa: E402

# Triton reads TRITON_INTERPRET when it is first imported, and the conftest below imports
# fla (through transformers), which imports Triton: set it first where there is no GPU,
# as tests/kernels/conftest.py says the kernel tests need
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from ckptd.tools.make_tiny import make_tiny  # noqa: E402

# Every daemon a test starts (a child process inherits this) checks the cache's
# invariants whenever it goes idle, and exits non-zero at shutdown if one broke:
# the tests that stop a daemon assert its exit code (daemon/runtime.py).
os.environ["CKPTD_CHECK_INVARIANTS"] = "1"


def _transformers_on_torch() -> None:
    """fla-core is a test dependency (the compile gate compiles its kernels), and where it
    imports, transformers routes its gated DeltaNet models through fla's Triton kernels,
    which do not run on the CPU: point the references back at transformers' own torch
    functions (the decorator keeps them as __wrapped__)."""
    if torch.cuda.is_available() or importlib.util.find_spec("fla") is None:
        return
    for arch in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
        mod = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
        for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
            setattr(mod, name, inspect.unwrap(getattr(mod, name)))


_transformers_on_torch()
_KERNELS = {name: os.environ.get(name) for name in ("CKPTD_KERNELS", "CKPTD_EXTERNAL_KERNELS")}


@pytest.fixture(autouse=True)
def kernels_are_chosen_through_dispatch(monkeypatch):
    """kernels/dispatch.py reads CKPTD_KERNELS and CKPTD_EXTERNAL_KERNELS once: a test
    that sets the variables instead of dispatch.MODE / EXTERNAL would change nothing
    in this process. Fails such a test rather than let it pass untested. (Requests
    monkeypatch so that it checks before monkeypatch undoes the test's changes.)"""
    yield
    changed = [n for n, v in _KERNELS.items() if os.environ.get(n) != v]
    assert not changed, (f"{', '.join(changed)} changed during the test: set dispatch.MODE "
                         "or dispatch.EXTERNAL instead (the variables are read once)")


@pytest.fixture(scope="session")
def tiny_hybrid_dir(tmp_path_factory):
    return make_tiny("qwen3_5_text", tmp_path_factory.mktemp("tiny-hybrid"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory):
    """Qwen3.5-MoE: Gated DeltaNet + gated attention + 8 experts, 2 per token."""
    return make_tiny("qwen3_5_moe_text", tmp_path_factory.mktemp("tiny-moe"))


@pytest.fixture(scope="session")
def tiny_moe_model(tiny_moe_dir):
    from ckptd.model.loader import load_model
    return load_model(tiny_moe_dir)


@pytest.fixture(scope="session", params=["qwen3_5_text", "llama"])
def tiny_dir(request, tiny_hybrid_dir, tiny_llama_dir):
    return tiny_hybrid_dir if request.param == "qwen3_5_text" else tiny_llama_dir


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from ckptd.model.loader import load_model
    return load_model(tiny_dir)


# written by transformers' own classes (tools/tiny_ssm.py): the selective state space
# hybrids, and the sliding-window attention models
SSM_ARCHES = ("nemotron_h", "granitemoehybrid", "falcon_h1", "mamba2", "jamba")
SWA_ARCHES = ("gemma3", "gpt_oss")
HF_ARCHES = SSM_ARCHES + SWA_ARCHES


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """{make-tiny arch: folder} of every model transformers' classes write."""
    root = tmp_path_factory.mktemp("tiny-hf")
    return {arch: make_tiny(arch, root / arch) for arch in HF_ARCHES}


@pytest.fixture(scope="session")
def hf_models(hf_dirs):
    """{make-tiny arch: loaded model} (fp32, CPU)."""
    from ckptd.model.loader import load_model
    return {arch: load_model(folder) for arch, folder in hf_dirs.items()}


@pytest.fixture(scope="session")
def ssm_dirs(hf_dirs):
    """{model_type: make-tiny folder} of every state space hybrid."""
    return {arch: hf_dirs[arch] for arch in SSM_ARCHES}


@pytest.fixture(scope="session")
def ssm_models(hf_models):
    """{model_type: loaded model} (fp32, CPU)."""
    return {arch: hf_models[arch] for arch in SSM_ARCHES}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server (SeaweedFS) on loopback for the whole session: started once,
    SIGKILLed at the end. Tests keep apart by prefix (tests/s3.py: fresh_url)."""
    from tests.s3 import SeaweedS3

    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield server.wait_ready()
    finally:
        server.kill()


@pytest.fixture(scope="session")
def tiny_vision(tmp_path_factory):
    """Multimodal tiny checkpoints by arch, written by transformers' own classes
    (`make-tiny --vision`), each with its text GGUF and mmproj GGUF from llama.cpp's
    converter: {arch: (folder, gguf, mmproj)}, made on first use."""
    from ckptd.tools.make_tiny_vision import make_tiny_vision

    made: dict[str, tuple] = {}

    def get(arch: str = "qwen3_5_text"):
        if arch not in made:
            root = tmp_path_factory.mktemp(f"tiny-vision-{arch}")
            folder, mmproj = make_tiny_vision(arch, root / "hf", gguf=root / "tiny.gguf")
            made[arch] = (folder, root / "tiny.gguf", mmproj)
        return made[arch]
    return get
