"""The remote tier's tests use a real S3 server: SeaweedFS (tools/bench/seaweed.py),
one per session (tests/conftest.py: s3_server), each test under its own prefix."""

from ckptd.tools.bench.seaweed import (  # noqa: F401
    BUCKET,
    KEY,
    READER_KEY,
    READER_SECRET,
    SECRET,
    SeaweedS3,
    fresh_url,
)
