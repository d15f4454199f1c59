"""llama.cpp's own server tests against ckptd: a few per area, on a tiny model, through
the adapter `python -m ckptd.tools.llama_suite` uses (the whole run: docs/COMPATIBILITY.md)."""

from __future__ import annotations

import socket

import pytest

from ckptd.tools import llama_suite
from ckptd.tools.llama_adapter import environment, translate

# API-level tests that hold on any model: one or two per area
SUBSET = ["unit/test_basic.py::test_server_models",
          "unit/test_tokenize.py::test_tokenize_detokenize",
          "unit/test_security.py::test_correct_api_key_anthropic_header",
          "unit/test_security.py::test_openai_library_correct_api_key",
          "unit/test_chat_completion.py::test_completion_with_grammar",
          "unit/test_metrics.py::test_metrics_disabled",
          "unit/test_compat_anthropic.py::test_anthropic_messages_basic",
          "unit/test_sleep.py::test_server_sleep"]


def test_exclusions_each_give_a_reason():
    ex = llama_suite.exclusions()
    assert ex and all(r.split(":")[0] in ("out of scope", "test model", "intended difference")
                      for r in ex.values())


def test_adapter_maps_llama_server_flags():
    args = translate(["--port", "9", "--temp", "0.8", "--seed", "42", "--hf-repo", "x",
                      "--ctx-size", "512", "--parallel", "2", "--no-slots", "--alias", "a"], {})
    assert args[args.index("--max-context") + 1] == "256" and "--no-metrics" in args
    assert args[args.index("--drain-timeout") + 1] == "0"    # SIGTERM cancels, as llama-server
    args = translate(["--ctx-size", "256", "--parallel", "4", "--kv-unified"], {})
    assert args[args.index("--max-context") + 1] == "256"    # a request may use all of it
    assert args[args.index("--parallel") + 1] == "4"
    assert args[args.index("--cors-origins") + 1] == "*"
    with pytest.raises(ValueError, match="embeddings"):
        translate(["--embedding"], {})
    # the suite's adapter is for its own model: ckptd's takes its place, or none is served
    args = translate(["--lora", "./tmp/moe_shakespeare15M.gguf"], {"CKPTD_SUITE_LORA": "/a"})
    assert args[args.index("--lora") + 1] == "/a"
    with pytest.raises(ValueError, match="CKPTD_SUITE_LORA"):
        translate(["--lora", "x.gguf"], {})
    assert "--n-predict" not in translate(["--n-predict", "-1"], {})
    # llama-server's --n-predict is the default a request's own limit overrides,
    # not a cap (ckptd's --max-tokens)
    args = translate(["--n-predict", "64"], {})
    assert args[args.index("--n-predict") + 1] == "64" and "--max-tokens" not in args
    args = translate(["--sleep-idle-seconds", "1", "--backend_sampling"], {})
    assert args[args.index("--sleep-idle-seconds") + 1] == "1" and "--backend-sampling" in args


def test_suite_environment_is_its_own(tmp_path):
    """The caller's CKPTD_* settings (an API key above all) never reach the suite's
    daemons, and the suite's servers get a free port, not llama-server's 8080 (where
    another server would answer /health, open without a key, and then 401 every test)."""
    base = {"CKPTD_API_KEY": "leaked", "CKPTD_PORT": "1", "CKPTD_CHECK_INVARIANTS": "1",
            "PYTEST_CURRENT_TEST": "x", "PATH": "/bin"}
    daemon = environment(base)
    assert "CKPTD_API_KEY" not in daemon and "CKPTD_PORT" not in daemon
    assert daemon["CKPTD_CHECK_INVARIANTS"] == "1" and daemon["PATH"] == "/bin"
    suite = llama_suite.environment(tmp_path, None, base)
    assert "PYTEST_CURRENT_TEST" not in suite and int(suite["PORT"]) != 8080
    with socket.socket() as s:              # the port is free
        s.bind(("127.0.0.1", int(suite["PORT"])))


@pytest.mark.slow
def test_suite_subset_passes(tiny_llama_dir):
    """A few of llama.cpp's own tests per area, through the tool (the whole run:
    docs/COMPATIBILITY.md)."""
    try:
        llama_suite.fetch(llama_suite.ROOT / "third_party")
    except RuntimeError as e:                  # no network and no sdist: nothing to run
        pytest.skip(str(e))
    code = llama_suite.run([*SUBSET, "-p", "no:randomly"], str(tiny_llama_dir),
                           llama_suite.ROOT / "third_party")
    assert code == 0


def test_adapter_maps_the_vision_flags():
    """The suite's media folder and no-mmproj switch reach ckptd; its own vision tower
    (for its own model) is replaced by CKPTD_SUITE_MMPROJ, or by none."""
    args = translate(["--media-path", "../../../tools", "--mmproj-url", "https://x"],
                     {"CKPTD_SUITE_MMPROJ": "/m.gguf"})
    assert args[args.index("--media-path") + 1] == "../../../tools"
    assert args[args.index("--mmproj") + 1] == "/m.gguf" and "https://x" not in args
    args = translate(["--no-mmproj"], {"CKPTD_SUITE_MMPROJ": "/m.gguf"})
    assert "--no-mmproj" in args and "--mmproj" not in args


@pytest.mark.slow
def test_suite_vision_subset_passes(tiny_vision):
    """llama.cpp's vision tests that hold on any multimodal model (its /models
    capabilities, images it refuses), on the tiny multimodal Qwen3.5."""
    try:
        llama_suite.fetch(llama_suite.ROOT / "third_party")
    except RuntimeError as e:
        pytest.skip(str(e))
    code = llama_suite.run(["unit/test_vision_api.py", "-k",
                            "v1_models_supports or malformed or ggml", "-p", "no:randomly"],
                           str(tiny_vision()[0]), llama_suite.ROOT / "third_party")
    assert code == 0


def test_start_timeout_is_the_tools(tmp_path):
    """The suite's 60-s wait for a server to start is set on every run (a loaded machine
    needs more to load ckptd's model); only that line changes."""
    utils = tmp_path / "utils.py"
    utils.write_text("DEFAULT_HTTP_TIMEOUT = 60\n\nDEFAULT_REQUEST_TIMEOUT = 600\n")
    llama_suite.start_timeout(tmp_path, 300)
    assert utils.read_text() == "DEFAULT_HTTP_TIMEOUT = 300\n\nDEFAULT_REQUEST_TIMEOUT = 600\n"
    llama_suite.start_timeout(tmp_path, 45)                  # again, on a later run
    assert utils.read_text().startswith("DEFAULT_HTTP_TIMEOUT = 45\n")
    utils.write_text("TIMEOUT = 60\n")                       # a suite that changed: said
    with pytest.raises(RuntimeError, match="DEFAULT_HTTP_TIMEOUT"):
        llama_suite.start_timeout(tmp_path, 300)
