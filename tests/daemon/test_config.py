"""ckptd serve settings: sizes, flags over CKPTD_* variables over defaults, validation."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ckptd.daemon.config import ServeConfig, parse_size
from ckptd.daemon.flags import add_arguments, from_args


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("text,want", [("4096", 4096), ("20GB", 20 * 10**9),
                                       ("512MiB", 512 * 2**20), ("1.5k", 1500),
                                       (" 2 gib ", 2 * 2**30), ("0", 0)])
def test_parse_size(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "lots", "-5", "10 parsecs", "1e9"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text, "--disk-budget")


def test_flags_win_over_environment_over_defaults(tmp_path):
    env = {"CKPTD_PORT": "9000", "CKPTD_PARALLEL": "2", "CKPTD_HOST_BUDGET": "1GiB",
           "XDG_DATA_HOME": str(tmp_path)}
    cfg = from_args(_args("--port", "9100"), env)
    assert cfg.port == 9100 and cfg.parallel == 2 and cfg.host_budget == 2**30
    assert cfg.cache_dir == tmp_path / "ckptd"
    assert cfg.block_size == 16 and cfg.host == "127.0.0.1" and cfg.loopback
    assert from_args(_args("--cache-dir", "x"), {}).cache_dir == Path("x")
    assert from_args(_args("--threads", "1"), {"CKPTD_THREADS": "2"}).threads == 1
    assert from_args(_args(), {"CKPTD_THREADS": "2"}).threads == 2
    assert from_args(_args(), {}).threads is None


@pytest.mark.parametrize("kw,field", [
    ({"port": 70000}, "port"), ({"block_size": 0}, "block_size"),
    ({"snapshot_interval": 100}, "snapshot_interval"), ({"parallel": 8, "step_tokens": 4},
                                                        "step_tokens"),
    ({"queue_size": 0}, "queue_size"), ({"log_format": "xml"}, "log_format"),
    ({"dtype": "int8"}, "dtype"), ({"model": "/no/such/model"}, "model"),
    ({"max_context": 1}, "max_context"), ({"api_key": " "}, "api_key"),
    ({"step_tokens": 10**6}, "step_tokens"), ({"threads": 0}, "threads"),
    ({"max_snapshots": 1}, "max_snapshots")])
def test_invalid_settings_name_the_setting(kw, field):
    with pytest.raises(ValueError, match=field):
        ServeConfig(**kw)


def test_max_snapshots_reaches_the_engine(tiny_dir, tmp_path):
    from ckptd.daemon.service import Service

    cfg = from_args(_args("--max-snapshots", "5", "--cache-dir", str(tmp_path), "--model",
                          str(tiny_dir)), {})
    service = Service(cfg)
    service.load()
    try:
        cache = service.rt.cache          # the stops' plan and the store's thinning
        assert cache.stops.max_snapshots == cache.checkpoints.max_snapshots == 5
    finally:
        service.close()


def test_bad_flag_value_names_the_flag():
    with pytest.raises(ValueError, match="--parallel"):
        from_args(_args("--parallel", "many"), {})


def test_remote_from_flag_or_environment():
    assert from_args(_args("--remote", "s3://bucket/a/b"), {}).remote == "s3://bucket/a/b"
    assert from_args(_args(), {"CKPTD_REMOTE": "s3://bucket"}).remote == "s3://bucket"
    assert from_args(_args(), {}).remote is None
    for bad in ("bucket/x", "s3://", "s3://Bad_Bucket", "s3://ok-bucket/a//b"):
        with pytest.raises(ValueError, match="--remote"):
            ServeConfig(remote=bad)


@pytest.mark.parametrize("command", ["serve", "generate", "make-tiny", "inspect", "bench"])
def test_every_command_prints_its_help(command, capsys):
    """A '%' in a help text (like "40% of the memory") once made argparse raise on --help."""
    from ckptd.tools.cli import main
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0 and "--" in capsys.readouterr().out
