"""Attachment blobs and the sessions that refer to them: a deleted session's attachments go with
it, unless another session refers to them too (actors/system/blobs.py). Real files in a temp dir."""

from __future__ import annotations

import os

import pytest

from sessionloop.actors.errors import NotFound
from sessionloop.actors.system.blobs import LEGACY, BlobStore


def test_releasing_a_session_deletes_the_blobs_only_it_refers_to_and_keeps_the_shared_ones(tmp_path):
    blobs = BlobStore(str(tmp_path / "blobs"))
    shared = blobs.put(b"the same picture", "a")
    assert blobs.put(b"the same picture", "b") == shared
    own = blobs.put(b"only a's file", "a")
    assert blobs.referrers(shared) == ["a", "b"]
    assert blobs.release_session("a") == [own]
    assert not blobs.exists(own) and blobs.exists(shared)
    assert blobs.referrers(shared) == ["b"]
    assert blobs.release_session("b") == [shared]
    assert not blobs.exists(shared)
    assert os.listdir(tmp_path / "blobs" / "sessions") == []


def test_a_released_session_can_be_released_again_and_takes_no_new_blob(tmp_path):
    blobs = BlobStore(str(tmp_path / "blobs"))
    digest = blobs.put(b"x", "a")
    assert blobs.release_session("a") == [digest]
    assert blobs.release_session("a") == []  # what a restart after a crash in the middle does
    with pytest.raises(NotFound):
        blobs.put(b"late upload for a deleted session", "a")


def test_a_blob_stored_before_references_were_kept_is_never_deleted(tmp_path):
    root = tmp_path / "blobs"
    old = BlobStore(str(root))
    digest = old.put(b"from an older release", "a")
    os.unlink(root / digest[:2] / f"{digest}.refs" / "a")  # what an older release left: the blob alone
    os.rmdir(root / digest[:2] / f"{digest}.refs")
    blobs = BlobStore(str(root))
    assert blobs.put(b"from an older release", "b") == digest
    assert blobs.referrers(digest) == [LEGACY, "b"]  # whoever stored it first is unknown
    blobs.release_session("b")
    assert blobs.exists(digest)


def test_a_session_id_that_cannot_name_a_file_is_refused(tmp_path):
    blobs = BlobStore(str(tmp_path / "blobs"))
    for bad in ("../x", "a/b", "", ".hidden"):
        with pytest.raises(ValueError):
            blobs.put(b"x", bad)
