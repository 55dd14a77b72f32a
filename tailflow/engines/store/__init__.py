"""The artifact store: `open_store(storage.uri)` gives a LocalStore or an S3Store, same methods."""
from __future__ import annotations

import re
from pathlib import Path

from tailflow.engines.store.local import LocalStore, StoreAccessError, StoreError
from tailflow.engines.store.s3 import S3Store

# Bucket names as S3 accepts them, loosely (older buckets may have capitals and underscores).
BUCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,254}")


ArtifactStore = LocalStore | S3Store
"""What the flows hold: either store, used only through the methods both have."""


def local_working_dir(store: ArtifactStore, key: str) -> Path:
    """A local folder for files a library insists on writing itself (W&B): the run's own folder for a local
    store, a cache folder for S3."""
    if isinstance(store, LocalStore):
        return store.path(key)
    folder = Path.home() / ".cache" / "tailflow" / "work" / store.bucket / store.prefix / key
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def open_store(uri: str) -> ArtifactStore:
    """The store for `storage.uri`: `s3://bucket/prefix` is S3, anything else a local folder."""
    if not uri.startswith("s3://"):
        return LocalStore(uri)
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    if not BUCKET_NAME.fullmatch(bucket):
        raise StoreError(f"storage.uri: {uri!r} names no valid bucket; expected s3://<bucket>/<prefix>")
    return S3Store(bucket, prefix)


__all__ = ["ArtifactStore", "LocalStore", "S3Store", "StoreAccessError", "StoreError", "local_working_dir",
           "open_store"]
