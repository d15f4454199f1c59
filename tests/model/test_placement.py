"""--device / --dtype: names, what auto picks, CUDA refused cleanly where there is none,
and the dtype in the weights fingerprint."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ckptd.daemon.config import ServeConfig
from ckptd.model.loader import load_model
from ckptd.model.placement import check_names, resolve

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def test_auto_is_cuda_bf16_else_cpu_fp32():
    where = resolve("auto", "auto")
    if torch.cuda.is_available():
        assert (where.device.type, where.dtype) == ("cuda", torch.bfloat16)
    else:
        assert (where.device, where.dtype) == (torch.device("cpu"), torch.float32)
    assert resolve("cpu", "bfloat16").dtype == torch.bfloat16
    assert resolve("cpu", "float16").dtype == torch.float16


@pytest.mark.parametrize("device,dtype,flag", [
    ("gpu", "auto", "--device"), ("cuda:x", "auto", "--device"), ("CPU", "auto", "--device"),
    ("cpu", "fp8", "--dtype"), ("cpu", "bf16", "--dtype")])
def test_bad_names_name_the_flag(device, dtype, flag):
    with pytest.raises(ValueError, match=flag):
        check_names(device, dtype)
    with pytest.raises(ValueError, match=flag.removeprefix("--")):
        ServeConfig(device=device, dtype=dtype)


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_is_a_value_error(device):
    with pytest.raises(ValueError, match=f"--device {device}: .*use --device cpu"):
        resolve(device, "auto")


def test_a_cuda_index_past_the_devices_is_refused():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA to count devices")
    n = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"{n} CUDA device"):
        resolve(f"cuda:{n}", "auto")


@no_cuda
@pytest.mark.parametrize("command", ["serve", "generate"])
def test_cli_refuses_cuda_in_one_line(command, tmp_path):
    args = ["--device", "cuda", "--cache-dir", str(tmp_path)] if command == "serve" \
        else ["--device", "cuda", "--prompt", "hi"]
    p = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", command, *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda" in lines[0] and "Traceback" not in p.stderr
    assert not (tmp_path / "daemon.lock").exists()     # refused before the cache was touched


def test_the_dtype_is_part_of_the_fingerprint(tiny_hybrid_dir):
    prints = {load_model(tiny_hybrid_dir, dt).fingerprint
              for dt in (torch.float32, torch.bfloat16, torch.float16)}
    assert len(prints) == 3


def test_enforce_eager_and_device_flags_reach_the_config():
    import argparse

    from ckptd.daemon.flags import add_arguments, from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = from_args(p.parse_args(["--enforce-eager", "--device", "cpu", "--dtype",
                                  "bfloat16"]), {})
    assert (cfg.enforce_eager, cfg.device, cfg.dtype) == (True, "cpu", "bfloat16")
    cfg = from_args(p.parse_args([]), {"CKPTD_DEVICE": "cuda:1", "CKPTD_ENFORCE_EAGER": "0"})
    assert (cfg.enforce_eager, cfg.device, cfg.dtype) == (False, "cuda:1", "auto")


def test_generate_on_the_cpu_in_bf16(tiny_hybrid_dir):
    p = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "generate", "--model",
                        str(tiny_hybrid_dir), "--device", "cpu", "--dtype", "bfloat16",
                        "--enforce-eager", "--raw", "--prompt", "hello there",
                        "--max-tokens", "4"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout
