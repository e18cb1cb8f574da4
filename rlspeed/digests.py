"""The SHA-256 of every file rlspeed writes into a folder, kept in that folder's
``SHA256SUMS`` (the format ``sha256sum`` writes and ``sha256sum -c`` checks), and checked
before a file is read back: a damaged file, or one put in place of what rlspeed wrote, is
refused rather than parsed.

A file is replaced by renaming a new version over it, and the manifest too: the two renames
cannot be one. The manifest therefore lists the new digest beside the old one before the file
is renamed, and drops the old one after; a crash between any two steps leaves a file whose
digest is listed. One process writes a folder (a run's, a trial's), so a lock per process
keeps its writers in order.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

MANIFEST = "SHA256SUMS"
# A manifest lists a run folder's few files: anything larger is not one rlspeed wrote.
MANIFEST_BYTES = 1 << 20
_CHUNK = 1 << 20
_lock = threading.Lock()


class DigestError(ValueError):
    """A file that is not, byte for byte, the one rlspeed wrote (or not one it wrote)."""


def of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def recording(path: Path, digest: str) -> Iterator[None]:
    """Around the rename that puts a file with ``digest`` at ``path``: the manifest lists it
    from before the rename, and only it from after (the old version's digest goes)."""
    path = Path(path)
    with _lock:
        listed = _read(path.parent)
        old = listed.get(path.name, [])
        _write(path.parent, {**listed, path.name: [*old, digest]})
        try:
            yield
        except BaseException:
            _write(path.parent, {**listed, path.name: old} if old else _without(listed, path))
            raise
        _write(path.parent, {**listed, path.name: [digest]})


def check(path: Path, limit: int, what: str) -> None:
    """Raise DigestError unless ``path`` is at most ``limit`` bytes and its digest is listed
    in its folder's manifest; ``what`` names the kind of file in the message."""
    path = Path(path)
    size = path.stat().st_size
    if size > limit:
        raise DigestError(f"{path.name} is {size:,} bytes, more than any {what} ({limit:,})")
    manifest = path.parent / MANIFEST
    if not manifest.is_file():
        raise DigestError(
            f"{path.name} has no {MANIFEST} beside it: an rlspeed before digests wrote it, or "
            f"not rlspeed; to vouch for the folder's files: cd {path.parent} && sha256sum "
            f"{' '.join(_vouchable(path.parent))} > {MANIFEST}"
        )
    listed = _read(path.parent).get(path.name)
    if not listed:
        raise DigestError(f"{path.name} is not listed in its folder's {MANIFEST}")
    if of_file(path) not in listed:
        raise DigestError(
            f"{path.name} is not the file rlspeed wrote (damaged, or replaced): its SHA-256 "
            f"differs from the one in {MANIFEST}"
        )


def _vouchable(folder: Path) -> list[str]:
    patterns = ("config.yaml", "metrics.json", "checkpoint*", "resume*.npz")
    return sorted({p.name for pattern in patterns for p in folder.glob(pattern) if p.is_file()})


def _without(listed: dict[str, list[str]], path: Path) -> dict[str, list[str]]:
    return {name: digests for name, digests in listed.items() if name != path.name}


def _read(folder: Path) -> dict[str, list[str]]:
    """File name -> its listed digests; a manifest that is not one rlspeed wrote raises."""
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    if path.stat().st_size > MANIFEST_BYTES:
        raise DigestError(f"{MANIFEST} is larger than any rlspeed writes ({MANIFEST_BYTES:,})")
    listed: dict[str, list[str]] = {}
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        digest, _, name = line.partition(" ")
        name = name.removeprefix(" ").removeprefix("*")  # sha256sum's text or binary mark
        if len(digest) != 64 or not name or "/" in name or digest.strip("0123456789abcdef"):
            raise DigestError(f"{MANIFEST} line {number} is not '<sha256>  <file name>'")
        listed.setdefault(name, []).append(digest)
    return listed


def _write(folder: Path, listed: dict[str, list[str]]) -> None:
    text = "".join(f"{d}  {name}\n" for name, digests in listed.items() for d in digests)
    tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, folder / MANIFEST)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
