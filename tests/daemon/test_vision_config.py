"""The image flags: checked before anything loads, and a vision tower that is not the
model's refused at start with one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptd.daemon.config import ServeConfig
from ckptd.tools.make_tiny_vision import make_tiny_vision


@pytest.mark.parametrize("kw,field", [
    ({"mmproj": "/no/such.gguf"}, "mmproj"), ({"media_path": "/no/such/dir"}, "media_path"),
    ({"image_max_bytes": 0}, "image_max_bytes"), ({"image_max_side": -1}, "image_max_side"),
    ({"image_min_tokens": 50, "image_max_tokens": 10}, "image_min_tokens"),
    ({"image_max_tokens": 0}, "image_max_tokens")])
def test_invalid_image_settings_name_the_setting(kw, field):
    with pytest.raises(ValueError, match=field):
        ServeConfig(**kw)


def test_a_foreign_mmproj_is_refused_at_start(tiny_vision, tiny_hybrid_dir, tmp_path):
    """The tiny text model's vocabulary has no image tokens: not this mmproj's model."""
    mmproj = tiny_vision()[2]
    out = subprocess.run([sys.executable, "-m", "ckptd.tools.cli", "serve", "--model",
                          str(tiny_hybrid_dir), "--mmproj", str(mmproj), "--cache-dir",
                          str(tmp_path / "c"), "--port", "0"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "image_pad" in out.stderr and mmproj.name in out.stderr
    assert "Traceback" not in out.stderr


def test_vision_needs_a_qwen_arch(tmp_path):
    with pytest.raises(ValueError, match="--vision takes"):
        make_tiny_vision("llama", tmp_path / "x")
