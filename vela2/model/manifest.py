"""A checkpoint's identity, computed when it is written: `manifest.json` beside the weights.

The digest every answer carries (RowResult.served_by.digest) is blake2b over the bytes of the
checkpoint's config, tokenizer, calibration and weight files. Hashing 15-18 GB of weights took a 9B
worker ~15-20 s of its start, so every writer of a checkpoint (`vela2 import`, `train`,
`init-demo`, `calibrate`, `vela2 manifest`) records each file's size, hash and (for safetensors)
header hash here, and a start checks the manifest cheaply:

- the set of files is the one recorded, every size matches, every safetensors header hashes as
  recorded (a few kB per shard), and the small files (config, tokenizer, calibration) are hashed
  in full (milliseconds);
- the weights' bytes are then hashed in the background by a serving worker (`verify`), which stops
  taking work if they disagree (worker.runtime.verify).

A checkpoint without a manifest, or one whose cheap check fails (a file replaced by hand), is hashed
in full at start as before, with a log line saying how to avoid it. No torch here: the worker's
parent process and `vela2 manifest` use it without loading the model stack.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vela2.errors import CheckpointError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 1
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
IDENTITY_FILES = ("config.json", "tokenizer.json", "calibration.json")  # hashed into the digest beside the weights
DIGEST_CHUNK = 1 << 20  # bytes read per hash update, into one buffer per file: 8 files hashed at once hold 8 MB
# (16 MB chunks held 128 MB, an import's peak memory grew by it); hashlib releases the GIL on updates this size
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header


def inside(path: Path, name: str, what: str = "file") -> Path:
    """`path`/`name` when it is a regular file of the directory `path` itself: `name` a plain file
    name (no separator, no `..`, not absolute) and, through any symlink, still inside `path`.
    CheckpointError naming it otherwise (a checkpoint or an imported directory must not make us read,
    or copy, a file elsewhere)."""
    if not isinstance(name, str) or not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise CheckpointError(f"{path}: {what} {name!r} must be a file of the directory itself (no path)")
    full = path / name
    real, root = full.resolve(), path.resolve()
    if real.parent != root and root not in real.parents:
        raise CheckpointError(f"{full}: a link to {real}, outside {path}: refused")
    if full.exists() and not real.is_file():
        raise CheckpointError(f"{full}: not a regular file")
    return full


def index_map(path: Path) -> dict[str, str]:
    """tensor name -> shard file name, from the safetensors index of `path`, every shard confined to
    the directory (`inside`). CheckpointError for an index that is not one."""
    try:
        weight_map = json.loads((path / INDEX).read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path / INDEX}: not a safetensors index ({e})") from e
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{path / INDEX}: weight_map must be a JSON object of file names")
    for name in set(weight_map.values()):
        inside(path, name, f"the shard named by {INDEX}")
    return weight_map


def weight_file_names(path: Path) -> list[str]:
    """The weight files of checkpoint `path`, by name, sorted: the index's shards, or WEIGHTS.
    Reads the index only (no safetensors file is opened). CheckpointError when there are none or
    when the index names a file outside the directory."""
    if (path / INDEX).is_file():
        return sorted(set(index_map(path).values()))
    if (path / WEIGHTS).is_file():
        inside(path, WEIGHTS)
        return [WEIGHTS]
    raise CheckpointError(f"{path} holds neither {WEIGHTS} nor {INDEX}")


def identity_files(path: Path, random_weights: bool = False) -> list[str]:
    """The names of the files the digest covers, in digest order: the small files present, then the
    weight files (none with `random_weights`: benchmarks serve seeded random weights)."""
    small = [name for name in IDENTITY_FILES if (path / name).is_file()]
    return small + ([] if random_weights else weight_file_names(path))


def file_hash(path: Path, limit_bps: float | None = None) -> str:
    """blake2b-128 of a file's bytes; `limit_bps` caps the read rate (a background check)."""
    h = hashlib.blake2b(digest_size=16)
    t0, done = time.monotonic(), 0
    buf = bytearray(DIGEST_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            done += n
            if limit_bps:
                ahead = done / limit_bps - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)
    return h.hexdigest()


def header_hash(path: Path) -> str:
    """blake2b-128 of a safetensors file's header (`header_bytes`): a cheap fingerprint of its layout."""
    return hashlib.blake2b(header_bytes(path), digest_size=16).hexdigest()


def header_bytes(path: Path) -> bytes:
    """A safetensors file's header as stored: its 8-byte length, then the JSON of tensor names, dtypes,
    shapes and offsets. CheckpointError when the file has none (too short, over MAX_HEADER_BYTES)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path}: not a safetensors file (header of {n:,} bytes)")
        body = f.read(n)
    if len(body) != n:
        raise CheckpointError(f"{path}: truncated safetensors header ({len(body):,} of {n:,} bytes)")
    return head + body


def combine(hashes: list[tuple[str, str]], random_weights: bool = False) -> str:
    """The checkpoint digest from (file name, file hash) pairs in digest order."""
    outer = hashlib.blake2b(digest_size=16)
    for name, part in hashes:
        outer.update(f"{name}\0{part}\0".encode())
    if random_weights:
        outer.update(b"random-weights")
    return outer.hexdigest()


def hash_files(path: Path, names: list[str]) -> list[str]:
    """Each named file's hash, files read in parallel threads."""
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(names)))) as pool:
        return list(pool.map(lambda name: file_hash(path / name), names))


def full_digest(path: str | Path, *, random_weights: bool = False) -> str:
    """The digest from every byte of the files (no manifest consulted)."""
    path = Path(path)
    names = identity_files(path, random_weights)
    return combine(list(zip(names, hash_files(path, names), strict=True)), random_weights)


def write(path: str | Path, known: dict[str, str] | None = None) -> dict[str, Any]:
    """Write `path`/manifest.json for the checkpoint's files as they are now; returns it.
    `known`: file name -> hash already computed for these very bytes (`calibrate` rewrites one small
    file and keeps the weights' hashes of a manifest that still checks)."""
    path = Path(path)
    names = identity_files(path)
    known = known or {}
    todo = [n for n in names if n not in known]
    hashes = {**known, **dict(zip(todo, hash_files(path, todo), strict=True))}
    files: dict[str, Any] = {}
    for name in names:
        entry: dict[str, Any] = {"size": (path / name).stat().st_size, "blake2b": hashes[name]}
        if name.endswith(".safetensors"):
            entry["header_blake2b"] = header_hash(path / name)
        files[name] = entry
    manifest = {"format": FORMAT, "digest": combine([(n, hashes[n]) for n in names]), "files": files}
    tmp = path / f".{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.chmod(tmp, 0o644)
    tmp.replace(path / MANIFEST)  # atomic: a reader sees the old manifest or the new, never half
    return manifest


def reusable_hashes(path: str | Path) -> dict[str, str]:
    """File name -> hash from the manifest of `path` when its cheap check passes now (a writer about
    to replace one file keeps the others' hashes: `write(path, known=...)`), else {}."""
    path = Path(path)
    manifest = read(path)
    if manifest is None or cheap_check(path, manifest) is not None:
        return {}
    return {name: entry["blake2b"] for name, entry in manifest["files"].items()}


def read(path: Path) -> dict[str, Any] | None:
    """The manifest of checkpoint `path`, or None when it has none (or one of another format)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        log.warning("%s is not JSON (%s): ignored", path / MANIFEST, e)
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        log.warning("%s: format %r, not %d: ignored", path / MANIFEST,
                    manifest.get("format") if isinstance(manifest, dict) else None, FORMAT)
        return None
    return manifest


def cheap_check(path: Path, manifest: dict[str, Any]) -> str | None:
    """None when the files agree with `manifest` as far as a cheap look tells (names, sizes,
    safetensors headers, small files hashed in full); else what disagrees, in words."""
    files = manifest.get("files") or {}
    try:
        names = identity_files(path)
    except CheckpointError as e:
        return str(e)
    if set(names) != set(files):
        gone, new = sorted(set(files) - set(names)), sorted(set(names) - set(files))
        return f"files differ (not in the manifest: {new or 'none'}; missing: {gone or 'none'})"
    for name in names:
        entry, f = files[name], path / name
        if f.stat().st_size != entry.get("size"):
            return f"{name}: {f.stat().st_size:,} bytes; the manifest says {entry.get('size')}"
        if "header_blake2b" in entry and header_hash(f) != entry["header_blake2b"]:
            return f"{name}: its safetensors header differs from the manifest's"
        if not name.endswith(".safetensors") and file_hash(f) != entry.get("blake2b"):
            return f"{name}: its bytes differ from the manifest's"
    if combine([(n, files[n]["blake2b"]) for n in names]) != manifest.get("digest"):
        return "the manifest's digest does not match its own file hashes"
    return None


@dataclass(frozen=True)
class Identity:
    """A checkpoint's digest, and how it was had: `manifest` (checked cheaply; the weights' bytes
    still to verify with `verify`) or hashed in full."""

    digest: str
    manifest: dict[str, Any] | None = None  # the manifest the digest came from, None: hashed in full


def identify(path: str | Path, *, random_weights: bool = False) -> Identity:
    """The checkpoint's identity for a start: from its manifest when the cheap check passes, else
    every file hashed (a log line says why and how to avoid it)."""
    path = Path(path)
    if random_weights:
        return Identity(full_digest(path, random_weights=True))
    manifest = read(path)
    problem = "it has no manifest.json" if manifest is None else cheap_check(path, manifest)
    if problem is None:
        assert manifest is not None
        return Identity(str(manifest["digest"]), manifest)
    size = sum((path / n).stat().st_size for n in identity_files(path))
    t0 = time.monotonic()
    digest = full_digest(path)
    log.warning("%s: %s, so its identity was hashed from every byte (%.1f GB in %.1f s); `vela2 manifest %s` "
                "writes a manifest that makes this a cheap check", path, problem, size / 1e9,
                time.monotonic() - t0, path)
    return Identity(digest)


def verify(path: str | Path, manifest: dict[str, Any], *, limit_bps: float | None = None) -> str | None:
    """Hash every file of `path` the manifest lists and compare; None when all agree, else which
    file disagrees, in words. `limit_bps` caps the read rate (a serving worker's background check)."""
    path = Path(path)
    for name, entry in sorted((manifest.get("files") or {}).items()):
        try:
            got = file_hash(path / name, limit_bps)
        except OSError as e:
            return f"{name}: cannot be read ({e.strerror or e})"
        if got != entry.get("blake2b"):
            return f"{name}: its bytes hash to {got}; the manifest says {entry.get('blake2b')}"
    return None
