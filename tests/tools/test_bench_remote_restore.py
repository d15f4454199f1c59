"""tools/bench/remote_restore at a toy length, on the session's SeaweedFS: every daemon
restores the whole context (from the remote, then from its own LMDB) with the cold
answer, the second context's upload adds only its new segments, and the report is
written."""

from __future__ import annotations

import json

import pytest

from ckptd.tools.bench import remote_restore
from tests.s3 import fresh_url


@pytest.mark.slow                     # five daemon starts
def test_bench_remote_restore_smoke(s3_server, tmp_path, monkeypatch):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CKPTD_BENCH_BUCKET", "")          # the bench sets it; put back after
    out = tmp_path / "out"
    code = remote_restore.main(["--length", "3072", "--shared", "2048", "--out", str(out),
                                "--url", fresh_url(), "--latency", "0.005",
                                "--serve-arg=--remote-segment-bytes=256KiB"])
    assert code == 0
    row = json.loads((out / "results.json").read_text())["row"]
    assert row["same_tokens"]
    for daemon in ("direct", "latency"):
        r = row[daemon]
        assert r["remote"]["tier"] == "remote" and r["remote"]["cached"] == 3072 + 24
        assert r["lmdb"]["tier"] == "disk" and r["lmdb"]["cached"] == 3072 + 24
        assert r["get"]["bytes"] == r["remote"]["fetch"]["bytes"] > 0
    first, added = row["cold"]["uploads"], row["second"]["added"]
    # 256 KiB segments are 1,024 tokens of the tiny hybrid: the second context shares
    # the first two cells, and puts only the third.
    assert 0 < added["segment_bytes"] < 0.5 * first["segment_bytes"], (first, added)
    assert "| B (loopback) |" in (out / "report.md").read_text()


def test_bench_remote_ranges_reads_every_byte(s3_server, monkeypatch, capsys):
    from ckptd.tools.bench import remote_ranges

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    assert remote_ranges.main(["--mb", "3", "--segment-mib", "1", "--range-mib", "1",
                               "--repeat", "1", "--latency", "0.005", "--url",
                               fresh_url()]) == 0
    out = capsys.readouterr().out
    assert "| loopback | 3.1 MB in 3 objects | 3 |" in out, out
    assert "| +10 ms a request | 3.1 MB in 3 objects | 3 |" in out, out


def test_bench_keep_folder_finds_its_store_and_answers_again(tmp_path, monkeypatch):
    """remote_restore --keep: the SeaweedFS data and the prefix stay in the folder, so a
    later run finds what the first put (a 250K cold prefill is set up once), and the
    cold step's results are taken from it only for the same --length and --shared."""
    import os

    from ckptd.tools.bench.seaweed import local_unless

    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(k, os.environ.get(k, ""))       # put back after the test
    keep = tmp_path / "keep"
    with local_unless(None, "bench", keep=keep / "s3") as url:
        first = url
        boto = _s3()
        boto.put_object(Bucket=url[5:].split("/")[0], Key=url.split("/", 3)[3] + "/x",
                        Body=b"kept")
    with local_unless(None, "bench", keep=keep / "s3") as url:
        assert url == first
        body = _s3().get_object(Bucket=url[5:].split("/")[0],
                                Key=url.split("/", 3)[3] + "/x")["Body"].read()
        assert body == b"kept"
    with pytest.raises(SystemExit, match="not with --url"):
        remote_restore.main(["--keep", str(keep), "--url", "s3://b/p", "--length", "64",
                             "--shared", "32"])


def _s3():
    import boto3

    return boto3.client("s3")
