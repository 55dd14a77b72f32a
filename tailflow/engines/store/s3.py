"""The artifact store on S3 (or any S3-compatible server): same methods as LocalStore.

What S3 does not give us, and how this file makes up for it:
- no atomic directory rename: `put_dir` uploads every file, then writes
  `<key>/.manifest.json` LAST; `local_dir` uses only what a manifest lists, so a
  half-uploaded checkpoint (no manifest yet) is refused, never loaded;
- no end-to-end integrity we control: every object carries the sha256 of its
  content in its metadata (`x-amz-meta-sha256`) and every read checks it,
  retrying a mismatch a few times before failing;
- no locks: the run lease uses S3's conditional writes (`If-None-Match: *` to
  create, `If-Match: <ETag>` to renew or delete), which S3 has answered with
  412 since 2024 (and moto 5.x too); a concurrent conditional write may get
  409 instead, read here as "lost the race" all the same;
- no append: `append_line` rewrites the object. While it is small (under S3's
  5 MiB minimum part) it is read and written back whole; from 5 MiB on, the
  new object is a multipart upload whose first part is the old object copied
  on the server (UploadPartCopy) and whose second is the new line, so an append
  sends only the line, whatever the file's length (a run's metrics and rollout
  trace grow a row an iteration for days). The sha256 in the metadata comes
  from a running hash this process keeps per key; a process that did not write
  the object last reads it once. One writer per key (the run's lease) is
  assumed, and checked: every append is conditional on the ETag last written.
Transient faults (503 Slow Down, dropped connections, timeouts) are retried by
botocore's "standard" retry mode; what is left after the retries surfaces as one
StoreError line naming the s3:// URI and the reason. Missing or refused
credentials, a missing permission or bucket are a StoreAccessError line saying
how to give the process credentials: no retry (of a flow run either) helps.

Endpoint and credentials come from the standard AWS configuration: environment
variables, profiles, and `AWS_ENDPOINT_URL`, which botocore (>= 1.31) honours.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import mimetypes
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import Boto3Error
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (BotoCoreError, ClientError, FlexibleChecksumError, IncompleteReadError,
                                 NoCredentialsError, PartialCredentialsError, ReadTimeoutError, ResponseStreamingError)

from tailflow.engines.store.local import StoreAccessError, StoreError, Versioned, sha256_of_file

MIB = 1024 * 1024
MANIFEST_NAME = ".manifest.json"
NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
LOST_RACE_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
REFUSED_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "InvalidToken",
                 "TokenRefreshRequired", "AllAccessDisabled", "NoSuchBucket", "403", "Forbidden"}
"""S3 error codes no retry can fix: wrong or expired credentials, no permission, no such bucket (a HEAD's
answer has no body: its refusals are the bare status, 403)."""
log = logging.getLogger("tailflow.store")
CREDENTIALS_HINT = ("give the process that runs tailflow AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (a Prefect "
                    "deployment: in its job variables `env`), AWS_PROFILE, or an instance role, and AWS_ENDPOINT_URL "
                    "for an S3-compatible server (docs/operations.md, S3)")
# A response body that broke off mid-read, or did not match its own checksum: worth reading again.
BROKEN_BODY = (ResponseStreamingError, IncompleteReadError, ReadTimeoutError, FlexibleChecksumError)


LINE_CHUNK = 64 * 1024
"""Bytes read at a time by `read_lines`."""

COPY_FROM = 5 * MIB
"""S3's smallest part but the last: from this size on, an append copies the object on the server."""


@dataclass
class Appended:
    """What this process knows of a key it appended to: the running sha256 of its content, its size and the
    ETag it was written with."""
    hasher: Any
    size: int
    tag: str

    def grown(self, data: bytes, tag: str) -> "Appended":
        self.hasher.update(data)
        return Appended(self.hasher, self.size + len(data), tag)


def content_type(key: str) -> str:
    """What a bucket website or console should show `key` as (report.html and its PNGs, not downloads)."""
    return mimetypes.guess_type(key)[0] or "application/octet-stream"


class InterruptedDownload(Exception):
    """A body that broke off after its headers arrived, where botocore's retries no longer reach."""


@dataclass(frozen=True)
class ManifestEntry:
    """One file of a `put_dir` directory: its path relative to the directory, size and sha256."""
    path: str
    size: int
    sha256: str


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


@contextmanager
def s3_errors(uri: str) -> Iterator[None]:
    """Turn what boto3 raises into the store's errors: FileNotFoundError, or one line: StoreAccessError when the
    credentials, permissions or bucket are wrong (no retry helps), StoreError otherwise."""
    try:
        yield
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code in NOT_FOUND_CODES:
            raise FileNotFoundError(f"{uri} does not exist in the artifact store") from None
        if code in REFUSED_CODES:
            raise StoreAccessError(f"{uri}: S3 refused the request ({one_line(error)}); {CREDENTIALS_HINT}") from None
        raise StoreError(f"{uri}: {one_line(error)}") from None
    except (NoCredentialsError, PartialCredentialsError) as error:
        raise StoreAccessError(f"{uri}: no usable AWS credentials ({one_line(error)}); {CREDENTIALS_HINT}") from None
    except (BotoCoreError, Boto3Error) as error:
        raise StoreError(f"{uri}: {one_line(error)}") from None


def make_client(max_attempts: int, connect_timeout: float, read_timeout: float) -> Any:
    """Signature v4 for every request and presigned link (botocore presigns S3 links with the deprecated v2
    unless told; v4 links expire after at most 7 days, `storage.link_expiry_s`'s bound). A session of its own:
    boto3's default one keeps the credentials it found first."""
    config = Config(retries={"max_attempts": max_attempts, "mode": "standard"}, signature_version="s3v4",
                    connect_timeout=connect_timeout, read_timeout=read_timeout)
    return boto3.session.Session().client("s3", config=config)  # credentials as the environment has them now


class S3Store:
    """Artifacts under `s3://<bucket>/<prefix>/`; keys are '/'-separated, as in LocalStore."""

    def __init__(self, bucket: str, prefix: str = "", client: Any = None, cache_dir: str | Path | None = None, *,
                 multipart_threshold: int = 64 * MIB, max_attempts: int = 10, connect_timeout: float = 10.0,
                 read_timeout: float = 60.0, verify_attempts: int = 3):
        """`multipart_threshold` is also the part size (S3's minimum part is 5 MiB); `max_attempts`
        and the timeouts configure the client built here (ignored when `client` is given). Note
        botocore reads `retries.max_attempts` as retries after the first try: 2 means 3 requests.
        `verify_attempts` is how many times a download that fails its sha256 is tried."""
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client if client is not None else make_client(max_attempts, connect_timeout, read_timeout)
        cache_root = Path(cache_dir).expanduser() if cache_dir else Path("~/.cache/tailflow/s3").expanduser()
        self.cache_root = cache_root / bucket / self.prefix
        self.transfer = TransferConfig(multipart_threshold=multipart_threshold, multipart_chunksize=multipart_threshold,
                                       preferred_transfer_client="classic")
        self.verify_attempts = verify_attempts
        self.appended: dict[str, Appended] = {}

    # -- naming ---------------------------------------------------------------

    def clean_key(self, key: str) -> str:
        parts = [part for part in key.split("/") if part]
        if any(part in (".", "..") for part in parts):
            raise StoreError(f"key {key!r} escapes the store root {self.uri()}")
        return "/".join(parts)

    def object_key(self, key: str) -> str:
        return "/".join(part for part in (self.prefix, self.clean_key(key)) if part)

    def uri(self, key: str = "") -> str:
        return "s3://" + "/".join(part for part in (self.bucket, self.object_key(key)) if part)

    # -- objects --------------------------------------------------------------

    def exists(self, key: str) -> bool:
        """True for an object at `key`, or for a "directory" with any object under `key/`."""
        with s3_errors(self.uri(key)):
            if self.clean_key(key):
                try:
                    self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))
                    return True
                except ClientError as error:
                    if error.response.get("Error", {}).get("Code") not in NOT_FOUND_CODES:
                        raise
            # A HEAD 404 cannot tell a missing key from a missing bucket; the listing can (and raises).
            listing = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.dir_prefix(key), MaxKeys=1)
            return listing.get("KeyCount", 0) > 0

    def write_bytes(self, key: str, data: bytes) -> None:
        """One object, whole or not at all (S3 PUTs are atomic); large payloads go multipart."""
        extra = {"Metadata": {"sha256": hashlib.sha256(data).hexdigest()}, "ContentType": content_type(key)}
        self.appended.pop(key, None)
        with s3_errors(self.uri(key)):
            if len(data) < self.transfer.multipart_threshold:
                self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=data, **extra)
            else:
                self.client.upload_fileobj(io.BytesIO(data), self.bucket, self.object_key(key),
                                           ExtraArgs=extra, Config=self.transfer)

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode())

    def read_bytes(self, key: str) -> bytes:
        return self.read_tagged(key)[0]

    def read_tagged(self, key: str) -> tuple[bytes, str]:
        """The object's bytes, checked against its sha256, and its ETag (FileNotFoundError if there is none)."""
        def fetch() -> tuple[tuple[bytes, str], str, str | None]:
            response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
            try:
                data = response["Body"].read()
            except BROKEN_BODY as error:
                raise InterruptedDownload(one_line(error)) from error
            expected = response.get("Metadata", {}).get("sha256")
            return (data, response["ETag"]), hashlib.sha256(data).hexdigest(), expected
        return self.verified(self.uri(key), fetch)

    def read_text(self, key: str) -> str:
        return self.read_bytes(key).decode()

    def read_lines(self, key: str) -> Iterator[str]:
        """The object's lines, streamed: a reader of an object that grows with the run (metrics.jsonl) holds a
        chunk and a line, not the object. Its sha256 is checked at the end, so a bad or broken download raises
        StoreError after the lines before it were yielded, and is not read again: a reader that must not act on
        part of a bad copy reads it whole (`read_bytes`)."""
        uri = self.uri(key)
        with s3_errors(uri):
            response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
            digest, rest = hashlib.sha256(), b""
            try:
                for chunk in response["Body"].iter_chunks(LINE_CHUNK):
                    digest.update(chunk)
                    *lines, rest = (rest + chunk).split(b"\n")
                    yield from (line.decode() + "\n" for line in lines)
            except BROKEN_BODY as error:
                raise StoreError(f"{uri}: download interrupted ({one_line(error)})") from error
        if rest:
            yield rest.decode()
        expected = response.get("Metadata", {}).get("sha256")
        if expected is not None and digest.hexdigest() != expected:
            raise StoreError(f"{uri}: sha256 mismatch (stored {expected}, downloaded {digest.hexdigest()})")

    def presigned_url(self, key: str, expiry_s: int) -> str:
        """A URL that GETs the object at `key` without credentials for `expiry_s` seconds (signed here, offline,
        with this process's credentials; on a private bucket the plain URL answers 403)."""
        with s3_errors(self.uri(key)):
            return self.client.generate_presigned_url("get_object", ExpiresIn=int(expiry_s),
                                                      Params={"Bucket": self.bucket, "Key": self.object_key(key)})

    def append_line(self, key: str, line: str) -> None:
        """Append one line (a JSONL row); one writer per key. Below `COPY_FROM` bytes the object is read and
        written back; from there on only the line is sent (the module's docstring). If the object changed
        since this process last appended (another writer, a `write_bytes`), it is read again and appended to."""
        data = (line.rstrip("\n") + "\n").encode()
        known = self.appended.pop(key, None)
        if known is not None and known.size >= COPY_FROM:
            try:
                tag = self.conditional(key, lambda: self.append_by_copy(key, known, data))
            except FileNotFoundError:  # deleted since
                tag = None
            if tag is not None:
                self.appended[key] = known.grown(data, tag)
                return
        try:
            existing, tag = self.read_tagged(key)
        except FileNotFoundError:
            existing, tag = b"", None
        body = existing + data
        metadata = {"sha256": hashlib.sha256(body).hexdigest()}
        condition = {"IfMatch": tag} if tag is not None else {"IfNoneMatch": "*"}
        put = lambda: self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=body,  # noqa: E731
                                             Metadata=metadata, ContentType=content_type(key), **condition)["ETag"]
        written = self.conditional(key, put) or self.landed(key, metadata["sha256"])
        if written is None:
            raise StoreError(f"{self.uri(key)}: changed by another writer while a line was appended to it")
        self.appended[key] = Appended(hashlib.sha256(body), len(body), written)

    def landed(self, key: str, sha256: str) -> str | None:
        """The object's ETag if its content is the one whose sha256 is given: a write whose answer was lost
        landed, and its retry found its own write (a precondition refused, an upload already completed)."""
        with s3_errors(self.uri(key)):
            try:
                head = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))
            except ClientError:
                return None
        return head["ETag"] if head.get("Metadata", {}).get("sha256") == sha256 else None

    def append_by_copy(self, key: str, known: "Appended", data: bytes) -> str | None:
        """A new object of two parts: the current one, copied on the server if its ETag is still `known.tag`,
        then `data`. Its ETag; None if the object changed. The HEAD is for servers that ignore the copy's
        condition (moto 5 does); S3 honours it, which closes the gap between the HEAD and the copy."""
        target = {"Bucket": self.bucket, "Key": self.object_key(key)}
        if self.client.head_object(**target)["ETag"] != known.tag:
            return None
        digest = known.hasher.copy()
        digest.update(data)
        upload = self.client.create_multipart_upload(**target, Metadata={"sha256": digest.hexdigest()},
                                                     ContentType=content_type(key))["UploadId"]
        try:
            copied = self.client.upload_part_copy(**target, UploadId=upload, PartNumber=1, CopySource=target,
                                                  CopySourceIfMatch=known.tag)["CopyPartResult"]["ETag"]
            added = self.client.upload_part(**target, UploadId=upload, PartNumber=2, Body=data)["ETag"]
            parts = [{"PartNumber": 1, "ETag": copied}, {"PartNumber": 2, "ETag": added}]
            try:
                return self.client.complete_multipart_upload(**target, UploadId=upload,
                                                             MultipartUpload={"Parts": parts})["ETag"]
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") == "NoSuchUpload":  # a retry of one that landed
                    tag = self.landed(key, digest.hexdigest())
                    if tag is not None:
                        return tag
                raise
        except BaseException:
            try:
                self.client.abort_multipart_upload(**target, UploadId=upload)
            except (ClientError, BotoCoreError):
                log.warning("%s: could not abort an unfinished append's multipart upload %s", self.uri(key), upload)
            raise

    def verified(self, uri: str, fetch: Callable[[], tuple[Any, str, str | None]]) -> Any:
        """Run `fetch` (-> value, its sha256, the expected sha256 or None) until the digests agree;
        an InterruptedDownload is fetched again too."""
        problem = ""
        for _ in range(self.verify_attempts):
            with s3_errors(uri):
                try:
                    value, actual, expected = fetch()
                except InterruptedDownload as error:
                    problem = f"download interrupted ({error})"
                    log.warning("%s: %s; reading it again", uri, problem)
                    continue
            if expected is None or actual == expected:  # None: written by another tool, accepted unverified
                return value
            problem = f"sha256 mismatch (stored {expected}, downloaded {actual})"
            log.warning("%s: %s; reading it again", uri, problem)
        raise StoreError(f"{uri}: {problem} in {self.verify_attempts} attempts")

    # -- conditional writes (the run lease, engines/runs/lease.py) ---------------------------------

    def read_versioned(self, key: str) -> Versioned | None:
        with s3_errors(self.uri(key)):
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") in NOT_FOUND_CODES:
                    return None
                raise
            data = response["Body"].read()
        server_now = response["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
        now = parsedate_to_datetime(server_now).timestamp() if server_now else time.time()
        return Versioned(data, response["ETag"], max(0.0, now - response["LastModified"].timestamp()))

    def conditional(self, key: str, call: Callable[[], Any]) -> Any:
        """`call`'s answer, or None when S3 refused its precondition (someone else wrote first)."""
        with s3_errors(self.uri(key)):
            try:
                return call()
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") in LOST_RACE_CODES:
                    return None
                raise

    def create_if_absent(self, key: str, data: bytes) -> str | None:
        put = lambda: self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=data,  # noqa: E731
                                             IfNoneMatch="*")["ETag"]
        return self.conditional(key, put)

    def replace_if(self, key: str, data: bytes, tag: str) -> str | None:
        put = lambda: self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=data,  # noqa: E731
                                             IfMatch=tag)["ETag"]
        return self.conditional(key, put)

    def delete_if(self, key: str, tag: str) -> bool:
        delete = lambda: self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key), IfMatch=tag)  # noqa
        return self.conditional(key, delete) is not None

    # -- directories ----------------------------------------------------------

    def dir_prefix(self, key: str) -> str:
        object_key = self.object_key(key)
        return f"{object_key}/" if object_key else ""

    def list_objects(self, key: str, delimiter: str = "") -> Iterator[dict[str, Any]]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.dir_prefix(key), Delimiter=delimiter)
        yield from pages

    def list_dir(self, key: str = "") -> list[str]:
        """Child names under `key/`: objects and "subdirectories", sorted, hidden names skipped."""
        start = len(self.dir_prefix(key))
        names: set[str] = set()
        with s3_errors(self.uri(key)):
            for page in self.list_objects(key, delimiter="/"):
                names.update(entry["Prefix"][start:].rstrip("/") for entry in page.get("CommonPrefixes", []))
                names.update(entry["Key"][start:] for entry in page.get("Contents", []))
        return sorted(name for name in names if name and not name.startswith("."))

    def list_files(self, key: str = "") -> list[str]:
        """Every object under `key/`, as paths relative to it, sorted; hidden names skipped: one listing (a
        request per 1,000 objects), not one per folder."""
        start = len(self.dir_prefix(key))
        names: list[str] = []
        with s3_errors(self.uri(key)):
            for page in self.list_objects(key):
                names += [entry["Key"][start:] for entry in page.get("Contents", [])]
        return sorted(name for name in names if name and not any(part.startswith(".") for part in name.split("/")))

    def delete_prefix(self, key: str) -> None:
        """Remove every object under `key/` (checkpoint retention); nothing there is fine."""
        if not self.clean_key(key):
            raise StoreError(f"refusing to delete the whole store {self.uri()}")
        with s3_errors(self.uri(key)):
            for page in self.list_objects(key):
                objects = [{"Key": entry["Key"]} for entry in page.get("Contents", [])]
                if not objects:
                    continue
                response = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
                if response.get("Errors"):
                    first = response["Errors"][0]
                    raise StoreError(f"{self.uri(key)}: could not delete {first.get('Key')}: {first.get('Code')}")

    def put_dir(self, key: str, local_dir: str | Path) -> None:
        """Copy a local directory under `key`, replacing what was there.

        Order matters: the old manifest goes first (from then on readers refuse the directory),
        then the old objects, then the new files, then the new manifest, last."""
        source = Path(local_dir)
        entries = [ManifestEntry(path.relative_to(source).as_posix(), path.stat().st_size, sha256_of_file(path))
                   for path in sorted(source.rglob("*")) if path.is_file()]
        if any(entry.path == MANIFEST_NAME for entry in entries):
            raise StoreError(f"{source}/{MANIFEST_NAME}: that name is reserved for the store's manifest")
        with s3_errors(self.uri(key)):
            self.client.delete_object(Bucket=self.bucket, Key=self.object_key(f"{key}/{MANIFEST_NAME}"))
        self.delete_prefix(key)
        for entry in entries:
            with s3_errors(self.uri(f"{key}/{entry.path}")):
                self.client.upload_file(str(source / entry.path), self.bucket, self.object_key(f"{key}/{entry.path}"),
                                        ExtraArgs={"Metadata": {"sha256": entry.sha256}}, Config=self.transfer)
        manifest = {"files": [asdict(entry) for entry in entries]}
        self.write_text(f"{key}/{MANIFEST_NAME}", json.dumps(manifest, indent=1))

    def has_dir(self, key: str) -> bool:
        """A complete directory stored by `put_dir`: its manifest, uploaded last, exists."""
        return self.exists(f"{key}/{MANIFEST_NAME}")

    def read_manifest(self, key: str) -> list[ManifestEntry]:
        try:
            manifest = json.loads(self.read_bytes(f"{key}/{MANIFEST_NAME}"))
        except FileNotFoundError:
            if self.exists(key):
                raise StoreError(f"{self.uri(key)} has no {MANIFEST_NAME}: its upload never finished; "
                                 "refusing to use a partial directory") from None
            raise FileNotFoundError(f"{self.uri(key)} is not a directory in the artifact store") from None
        entries = [ManifestEntry(**entry) for entry in manifest["files"]]
        for entry in entries:
            self.clean_key(entry.path)  # a manifest must not send a download outside the cache directory
        return entries

    def local_dir(self, key: str) -> Path:
        """A local copy of the directory at `key`, exactly as its manifest lists it.

        Kept in the cache directory: files already there with the right sha256 are not
        downloaded again, files the manifest does not list are removed."""
        entries = self.read_manifest(key)
        target = self.cache_root / self.clean_key(key)
        target.mkdir(parents=True, exist_ok=True)
        for entry in entries:
            path = target / entry.path
            if not (path.is_file() and path.stat().st_size == entry.size and sha256_of_file(path) == entry.sha256):
                self.download_file(f"{key}/{entry.path}", path, entry.sha256)
        remove_unlisted(target, {entry.path for entry in entries})
        return target

    def download_file(self, key: str, path: Path, sha256: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.close(handle)

        def fetch() -> tuple[None, str, str]:
            self.client.download_file(self.bucket, self.object_key(key), temp_name, Config=self.transfer)
            return None, sha256_of_file(Path(temp_name)), sha256

        try:
            self.verified(self.uri(key), fetch)
            os.replace(temp_name, path)
        finally:
            Path(temp_name).unlink(missing_ok=True)


def remove_unlisted(root: Path, listed: set[str]) -> None:
    """Delete cached files (and then empty folders) that are not in the current manifest."""
    for path in sorted(root.rglob("*"), reverse=True):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and relative not in listed:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
