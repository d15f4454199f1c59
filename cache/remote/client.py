"""The S3 side of the remote tier: boto3 in threads, configured only the standard way.

Endpoint, credentials, region and profile come from what every AWS tool reads
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
AWS_PROFILE, ~/.aws/config): the same settings users give MinIO, Ceph RGW, R2 or
SeaweedFS. Requests are signed by botocore, never here.

A remote that fails must not stall the daemon: requests have short timeouts, and
after a failure that says the remote is down (unreachable, timing out, 5xx, access
denied) the client reports itself unavailable for a cool-off that doubles with each
failure (1 s .. 60 s), so lookups skip it instead of waiting on it once a request.
Every request is counted: by operation, bytes each way, failures by kind, latency.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from ckptd.cache.remote.layout import RemoteURL
from ckptd.cache.threads import started_pool

T = TypeVar("T")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
OPS = ("get", "head", "put", "list", "delete")
ERRORS = ("unreachable", "timeout", "denied", "server", "client", "other")
_COOL_MIN, _COOL_MAX = 1.0, 60.0
_MIN_PART = 5 << 20                 # S3's smallest part (but the last)


@dataclass(frozen=True)
class RemoteConfig:
    url: RemoteURL
    concurrency: int = 8            # requests in flight for reads; as many for uploads
    queue_entries: int = 1 << 20    # upload queue bound (keys: the values wait in LMDB)
    part_bytes: int = 16 << 20      # larger objects go up as multipart uploads of this size
    segment_bytes: int = 8 << 20    # blocks a segment object holds, in their bytes
    range_bytes: int = 8 << 20      # the most one ranged GET of a restore asks for (a
                                    # segment: through 20 ms a request, 16 GETs of 8 MiB
                                    # restored 250K tokens ~10% sooner than 24 of 4)
    frame_bytes: int = 512 << 10    # raw page bytes a segment's frame holds (frames.py)
    linger: float = 0.5             # s a state's chain has no new block: it ends there
    interval_linger: float = 30.0   # the same for an interval snapshot (its prefill stopped)
    connect_timeout: float = 2.0    # seconds
    read_timeout: float = 10.0      # seconds without a byte
    upload_attempts: int = 5        # tries per object before it is counted failed
    backoff: float = 0.5            # seconds before the first retry; doubles each time
    fetch_timeout: float = 30.0     # the longest a restore waits for the remote
    lookup_timeout: float = 2.0     # the longest a lookup's search waits for the remote
    max_lists: int = 128            # LISTs one lookup may spend looking for a snapshot
    close_timeout: float = 10.0     # seconds close() lets queued uploads finish

    def __post_init__(self) -> None:
        for name in ("concurrency", "upload_attempts", "max_lists", "queue_entries",
                     "segment_bytes", "range_bytes", "frame_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"remote {name} must be >= 1, got {getattr(self, name)}")
        for name in ("connect_timeout", "read_timeout", "fetch_timeout", "lookup_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"remote {name} must be positive, got {getattr(self, name)}")
        if min(self.backoff, self.close_timeout, self.linger, self.interval_linger) < 0:
            raise ValueError("remote backoff, close_timeout and linger must be >= 0")
        if self.part_bytes < _MIN_PART:
            raise ValueError(f"remote part_bytes must be >= {_MIN_PART} (S3's minimum part)")


class RemoteError(Exception):
    """A request failed for a reason other than a missing object; `kind` is one of
    ERRORS."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ObjectInfo(NamedTuple):
    name: str
    size: int
    modified: float      # seconds since the epoch


def _read_into(body) -> Callable[[memoryview], int]:
    """readinto for a body that has none (botocore before 1.38): read, then copy."""
    def into(view: memoryview) -> int:
        data = body.read(len(view))
        view[:len(data)] = data
        return len(data)
    return into


def _boto():
    try:
        import boto3
        import botocore
        from botocore.config import Config
    except ImportError:
        raise ValueError("--remote needs boto3: pip install 'ckptd[s3]'") from None
    return boto3, botocore, Config


class RemoteClient:
    def __init__(self, config: RemoteConfig) -> None:
        boto3, botocore, Config = _boto()
        self.config, self.url = config, config.url
        self._exc = botocore.exceptions
        # Retries stay with the callers (uploads back off and count them; reads give up
        # and recompute): botocore's own would multiply every timeout.
        cfg = Config(connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
                     retries={"mode": "standard", "max_attempts": 1},
                     max_pool_connections=2 * config.concurrency + 2)
        self.s3 = boto3.session.Session().client("s3", config=cfg)
        self.endpoint = self.s3.meta.endpoint_url
        self.pool = started_pool(config.concurrency, "ckptd-remote")
        self.lock = threading.Lock()
        self.requests = dict.fromkeys(OPS, 0)
        self.errors = dict.fromkeys(ERRORS, 0)
        self.bytes_down = self.bytes_up = 0
        self.latency = [0] * (len(LATENCY_BUCKETS) + 1)   # per bucket, the last is +Inf
        self.latency_sum = 0.0
        self.latency_ema = 0.02               # seconds per request, for restore planning
        self.down_until = 0.0                 # monotonic time the cool-off ends
        self.cool = _COOL_MIN
        self.last_error: str | None = None

    def available(self) -> bool:
        """False during a cool-off after the remote failed."""
        return time.monotonic() >= self.down_until

    def _failed(self, kind: str, message: str, op: str) -> None:
        with self.lock:
            self.errors[kind] += 1
            self.last_error = message
            # A bad request says nothing of the remote, and a refused put nothing of
            # reads (read-only credentials are a way to run a daemon).
            if kind != "client" and not (kind == "denied" and op == "put"):
                self.down_until = time.monotonic() + self.cool
                self.cool = min(_COOL_MAX, self.cool * 2)

    def gave_up(self, op: str, waited: float) -> None:
        """A caller stopped waiting for requests still out: the remote is slow, as
        good as down for now (counted as a timeout; the cool-off starts)."""
        self._failed("timeout", f"{op}: no answer within {waited:.1f} s", op)

    def _ok(self) -> None:
        if self.cool != _COOL_MIN:
            with self.lock:
                self.cool = _COOL_MIN

    def _call(self, op: str, fn: Callable[[], T], up: int = 0, expect: int = 404) -> T:
        """fn() counted as one `op` request; RemoteError for failures, except the HTTP
        status `expect` (a missing object; 412 for a conditional put that found one),
        which comes back as the botocore error for the caller to read."""
        t0 = time.perf_counter()
        try:
            out = fn()
        except self._exc.ClientError as e:
            self._count(op, time.perf_counter() - t0, up)
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = e.response.get("Error", {}).get("Code", "")
            if status == expect and code != "NoSuchBucket":
                self._ok()
                raise
            kind = ("denied" if status in (401, 403) else "server" if status >= 500
                    else "client")
            self._failed(kind, f"{op}: {status} {code}", op)
            raise RemoteError(kind, f"remote {op} failed: {status} {code}") from None
        except (self._exc.ReadTimeoutError, self._exc.ConnectTimeoutError) as e:
            self._count(op, time.perf_counter() - t0, up)
            self._failed("timeout", f"{op}: {e}", op)
            raise RemoteError("timeout", f"remote {op} timed out") from None
        except (self._exc.EndpointConnectionError, self._exc.ConnectionClosedError,
                self._exc.ConnectionError) as e:
            self._count(op, time.perf_counter() - t0, up)
            self._failed("unreachable", f"{op}: {e}", op)
            raise RemoteError("unreachable", f"remote unreachable: {e}") from None
        except (self._exc.NoCredentialsError, self._exc.PartialCredentialsError) as e:
            self._failed("denied", f"{op}: {e}", op)
            raise RemoteError("denied", f"remote {op}: {e}") from None
        except (self._exc.BotoCoreError, OSError) as e:
            self._count(op, time.perf_counter() - t0, up)
            self._failed("other", f"{op}: {e}", op)
            raise RemoteError("other", f"remote {op} failed: {e}") from None
        self._count(op, time.perf_counter() - t0, up)
        self._ok()
        return out

    def _count(self, op: str, seconds: float, up: int) -> None:
        i = next((i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), len(LATENCY_BUCKETS))
        with self.lock:
            self.requests[op] += 1
            self.bytes_up += up
            self.latency[i] += 1
            self.latency_sum += seconds
            if op in ("head", "list"):        # small requests: latency without transfer
                self.latency_ema = 0.8 * self.latency_ema + 0.2 * seconds

    def get(self, name: str) -> bytes | None:
        """An object's body; None when there is no such object."""
        def fetch() -> bytes:
            r = self.s3.get_object(Bucket=self.url.bucket, Key=name)
            with r["Body"] as body:
                return body.read()
        try:
            data = self._call("get", fetch)
        except self._exc.ClientError:
            return None
        with self.lock:
            self.bytes_down += len(data)
        return data

    def head(self, name: str) -> int | None:
        """An object's size; None when there is no such object."""
        try:
            r = self._call("head", lambda: self.s3.head_object(Bucket=self.url.bucket, Key=name))
        except self._exc.ClientError:
            return None
        return int(r["ContentLength"])

    def get_range(self, name: str, start: int, end: int) -> tuple[bytes, int] | None:
        """Bytes start .. end - 1 of an object, and the object's whole size; None when
        there is no such object. A range past its end is a RemoteError ("client")."""
        def fetch() -> tuple[bytes, int]:
            r = self.s3.get_object(Bucket=self.url.bucket, Key=name,
                                   Range=f"bytes={start}-{end - 1}")
            with r["Body"] as body:
                data = body.read()
            total = r.get("ContentRange", "").rpartition("/")[2]
            return data, int(total) if total.isdigit() else len(data)
        try:
            data, total = self._call("get", fetch)
        except self._exc.ClientError:
            return None
        with self.lock:
            self.bytes_down += len(data)
        return data, total

    def read_into(self, name: str, start: int, buf: memoryview, part: int,
                  progress: Callable[[int, int], bool]) -> bool:
        """Bytes start .. start + len(buf) - 1 of an object read straight into buf,
        `part` bytes a call; progress(size, have) after the headers (have 0: size is the
        object's whole size, before any byte is written) and after each part (False:
        stop reading). False when there is no such object. A body cut short is a
        RemoteError after the parts that came; a body shorter than buf ends early (the
        caller sees have < len(buf))."""
        got = 0

        def fetch() -> None:
            nonlocal got
            r = self.s3.get_object(Bucket=self.url.bucket, Key=name,
                                   Range=f"bytes={start}-{start + len(buf) - 1}")
            total = r.get("ContentRange", "").rpartition("/")[2]
            size = int(total) if total.isdigit() else int(r.get("ContentLength", 0))
            with r["Body"] as body:
                if not progress(size, 0):
                    return
                into = getattr(body, "readinto", None) or _read_into(body)  # botocore < 1.38
                while got < len(buf):
                    n = into(buf[got:got + part])
                    if not n:
                        return
                    got += n
                    if not progress(size, got):
                        return
        try:
            self._call("get", fetch)
        except self._exc.ClientError:
            return False
        finally:
            with self.lock:
                self.bytes_down += got
        return True

    def put(self, name: str, body: bytes) -> bool:
        """Store an object unless one of that name exists (If-None-Match: *): True when
        written, False when it was there already. Bodies over part_bytes go up in parts."""
        try:
            if len(body) > self.config.part_bytes:
                self._multipart(name, body)
            else:
                self._call("put", lambda: self.s3.put_object(
                    Bucket=self.url.bucket, Key=name, Body=body, IfNoneMatch="*"), len(body),
                    expect=412)
        except self._exc.ClientError:
            return False                       # 412: another writer's copy is there
        return True

    def _multipart(self, name: str, body: bytes) -> None:
        b, part = self.url.bucket, self.config.part_bytes
        up = self._call("put", lambda: self.s3.create_multipart_upload(Bucket=b, Key=name))
        uid, parts = up["UploadId"], []
        try:
            for n, off in enumerate(range(0, len(body), part), 1):
                chunk = body[off:off + part]
                r = self._call("put", lambda c=chunk, n=n: self.s3.upload_part(
                    Bucket=b, Key=name, UploadId=uid, PartNumber=n, Body=c), len(chunk))
                parts.append({"PartNumber": n, "ETag": r["ETag"]})
            self._call("put", lambda: self.s3.complete_multipart_upload(
                Bucket=b, Key=name, UploadId=uid, MultipartUpload={"Parts": parts},
                IfNoneMatch="*"), expect=412)
        except BaseException:
            try:                               # parts left behind cost storage: drop them
                self.s3.abort_multipart_upload(Bucket=b, Key=name, UploadId=uid)
            except Exception:                  # the remote is failing: its lifecycle rules
                pass                           # (or `inspect gc`) take them later
            raise

    def list(self, prefix: str, limit: int | None = None) -> list[ObjectInfo]:
        """Objects whose names start with prefix, in name order (at most `limit`)."""
        out: list[ObjectInfo] = []
        token = None
        while limit is None or len(out) < limit:
            kw = {"Bucket": self.url.bucket, "Prefix": prefix,
                  "MaxKeys": 1000 if limit is None else min(1000, limit - len(out))}
            if token:
                kw["ContinuationToken"] = token
            try:
                r = self._call("list", lambda kw=kw: self.s3.list_objects_v2(**kw))
            except self._exc.ClientError:
                return out                     # no such bucket: nothing there
            out += [ObjectInfo(o["Key"], int(o["Size"]), o["LastModified"].timestamp())
                    for o in r.get("Contents", ())]
            token = r.get("NextContinuationToken")
            if not r.get("IsTruncated") or not token:
                break
        return out

    def delete(self, names: list[str]) -> int:
        """Delete objects (1,000 a request); returns how many the remote took."""
        gone = 0
        for i in range(0, len(names), 1000):
            objs = [{"Key": n} for n in names[i:i + 1000]]
            try:
                r = self._call("delete", lambda o=objs: self.s3.delete_objects(
                    Bucket=self.url.bucket, Delete={"Objects": o, "Quiet": True}))
            except self._exc.ClientError:
                continue
            gone += len(objs) - len(r.get("Errors", ()))
        return gone

    def check(self) -> str | None:
        """Why the bucket can't be used, or None when it answers."""
        try:
            self._call("head", lambda: self.s3.head_bucket(Bucket=self.url.bucket))
        except RemoteError as e:
            return str(e)
        except self._exc.ClientError:
            return f"no bucket {self.url.bucket!r} at {self.endpoint}"
        return None

    def stats(self) -> dict:
        with self.lock:
            return {"url": str(self.url), "endpoint": self.endpoint,
                    "available": self.available(), "last_error": self.last_error,
                    "requests": dict(self.requests), "errors": dict(self.errors),
                    "bytes_down": self.bytes_down, "bytes_up": self.bytes_up,
                    "latency": {"buckets": list(LATENCY_BUCKETS), "counts": list(self.latency),
                                "sum": self.latency_sum, "ema_s": self.latency_ema}}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
