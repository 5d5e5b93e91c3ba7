"""sha256 of a file, streamed: the checksum every manifest records (sources, plugin library)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: str | Path) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks (hashlib releases the GIL while hashing)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()
