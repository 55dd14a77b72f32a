"""Artifacts that point at files of a run (its report, its checkpoint), made so that a person can open them.

A plain S3 URL answers 403 on a private bucket, a prefix (a checkpoint "folder") is no object at all, and a
browser refuses `file://` links from a web page. So: on S3 the artifact is a link presigned for
`storage.link_expiry_s` seconds (at most 7 days, signature v4's limit; temporary credentials such as an
instance role's end it sooner), always to an object: the report page, whose plots are inlined so the one signed
URL shows them, or a checkpoint's `.manifest.json`, which lists its files with their sizes and sha256. For a
local store the artifact says the path to copy on the machine that ran the run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from prefect.artifacts import create_link_artifact, create_markdown_artifact

from tailflow.engines.store import S3Store
from tailflow.engines.store.s3 import MANIFEST_NAME


@dataclass(frozen=True)
class StoredFile:
    """A file of a run for a person to open: `key` in the run's store, what to call it, and why it is there."""
    key: str
    title: str
    description: str


def publish_file_link(store, stored: StoredFile, artifact_key: str, expiry_s: int) -> str:
    """Create (a new version of) artifact `artifact_key` for `stored`; returns the URL or path it shows."""
    if isinstance(store, S3Store):
        url = store.presigned_url(stored.key, expiry_s)
        until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() + expiry_s))
        create_link_artifact(url, link_text=stored.title, key=artifact_key,
                             description=f"{stored.description} ({store.uri(stored.key)}; a presigned link, valid "
                                         f"until {until}: storage.link_expiry_s)")
        return url
    path = store.uri(stored.key)
    create_markdown_artifact(markdown=f"**{stored.title}**, on the machine that ran the run:\n\n```\n{path}\n```\n",
                             key=artifact_key, description=f"{stored.description} (a path to copy: a browser "
                                                           "does not open local files from the UI)")
    return path


def checkpoint_file(store, checkpoint_key: str, run_id: str, iteration: int) -> StoredFile:
    """The checkpoint as something to open: its manifest on S3 (an object, unlike the checkpoint's prefix), the
    directory itself locally (a path to copy)."""
    description = (f"run {run_id}: committed checkpoint after iteration {iteration} (`tailflow export {run_id} DIR` "
                   "copies it as a Hugging Face model directory)")
    if isinstance(store, S3Store):
        return StoredFile(f"{checkpoint_key}/{MANIFEST_NAME}", f"checkpoint iter-{iteration:04d}: its manifest",
                          description)
    return StoredFile(checkpoint_key, f"checkpoint iter-{iteration:04d}", description)
