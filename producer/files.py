"""Files of the OpenAI Files API (issue 39), as the HTTP route keeps them: a tenant's uploads (purpose
``batch``: the JSONL input of a batch) in the result store, under the same expiry and stored_bytes
quota as results.

A file is two keys (its id `file-<32 hex>`, tenant-scoped as request ids are): `vela2:file:<id>`, a
hash of what the Files API returns (filename, purpose, bytes, created_at, expires_at) plus the
stored-bytes bucket it was counted in, and `vela2:file-data:<id>`, its content; both live
`expires_s` (the route's ``--file-expires-s``, default a day, as bulk jobs' results), and each
tenant's `vela2:files:<tenant>` sorted set lists its files by creation (expired ones dropped as they
are met). The bytes are counted in the tenant's stored bytes (vela2.wire.usage) by the script that
writes them and given back when the file is deleted or expires, so the stored_bytes quota holds
uploads and answers together. Content is read back in READ_CHUNK pieces (GETRANGE): a download never
holds a whole file in the route's memory.

A batch's output and error files are not copies: `output_file_id` / `error_file_id` name views
(`<batch id>-output`, `<batch id>-errors`) of the job's stored answers, streamed from them
(producer.jobs.job_lines) once the job has ended.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from vela2.wire import keys, usage
from vela2.wire.scripts import Script
from vela2.wire.usage import COUNT_LUA

FILE_ID_PREFIX = "file-"
DEFAULT_FILE_EXPIRES_S = 86_400  # a day: as long as a bulk job's results live
PURPOSES = ("batch",)  # what this route keeps files for
READ_CHUNK = 1 << 20  # bytes of a file's content read per round trip
OUTPUT_SUFFIX, ERRORS_SUFFIX = "-output", "-errors"  # a batch's output and error files: views of its job


def new_file_id() -> str:
    """A fresh file id (`file-<32 hex>`)."""
    return FILE_ID_PREFIX + uuid.uuid4().hex


def file_key(wire_id: str) -> str:
    return f"vela2:file:{wire_id}"


def file_data_key(wire_id: str) -> str:
    return f"vela2:file-data:{wire_id}"


def files_key(tenant: str | None) -> str:
    return f"vela2:files:{tenant or ''}"


def job_view(file_id: str) -> tuple[str, str] | None:
    """(job id, "output" or "errors") when `file_id` names a batch's output or error file, else None."""
    for suffix, kind in ((OUTPUT_SUFFIX, "output"), (ERRORS_SUFFIX, "errors")):
        if file_id.endswith(suffix) and file_id.startswith("batch_"):
            return file_id[: -len(suffix)], kind
    return None


# KEYS the file's hash, its content, the tenant's index, the tenant's stored-bytes hash; ARGV the file id
# (as the caller names it), filename, purpose, bytes, created_at, expires_at, TTL, the usage bucket and
# how long the usage hash must live, the content.
PUT_SCRIPT = COUNT_LUA + """
local ttl = tonumber(ARGV[7])
redis.call('SET', KEYS[2], ARGV[10], 'EX', ttl)
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'filename', ARGV[2], 'purpose', ARGV[3], 'bytes', ARGV[4],
           'created_at', ARGV[5], 'expires_at', ARGV[6], 'bucket', ARGV[8])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
if redis.call('TTL', KEYS[3]) < ttl then redis.call('EXPIRE', KEYS[3], ttl) end
count_stored(KEYS[4], ARGV[8], #KEYS[2] + tonumber(ARGV[4]), ARGV[9])
return 1
"""

# KEYS the file's hash, its content, the tenant's index, the tenant's stored-bytes hash; ARGV the file
# id. Gives its bytes back to the bucket they were counted in. Returns 1 deleted, 0 no such file.
DELETE_SCRIPT = """
redis.call('ZREM', KEYS[3], ARGV[1])
local got = redis.call('HMGET', KEYS[1], 'bytes', 'bucket')
if not got[1] then return 0 end
if redis.call('HEXISTS', KEYS[4], got[2]) == 1 then
  local left = redis.call('HINCRBY', KEYS[4], got[2], -(#KEYS[2] + tonumber(got[1])))
  if left <= 0 then redis.call('HDEL', KEYS[4], got[2]) end
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""
PUT, DELETE = Script(PUT_SCRIPT), Script(DELETE_SCRIPT)


@dataclass(frozen=True)
class FileInfo:
    """A file as the Files API returns it (OpenAI's FileObject)."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    expires_at: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": self.expires_at, "status_details": None}


def _info(fields: dict[Any, Any]) -> FileInfo | None:
    f = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
         for k, v in fields.items()}
    if "bytes" not in f:
        return None
    return FileInfo(id=f["id"], bytes=int(f["bytes"]), created_at=int(float(f["created_at"])),
                    filename=f["filename"], purpose=f["purpose"], expires_at=int(float(f["expires_at"])))


class Files:
    """One tenant's files in one Redis (a redis.asyncio client): put, info, list, content, delete.
    `wire` turns the caller's file id into the stored one (producer.scope.Scope.wire)."""

    def __init__(self, redis: Any, tenant: str | None, wire: Any, expires_s: int = DEFAULT_FILE_EXPIRES_S):
        self.redis, self.tenant, self.wire, self.expires_s = redis, tenant, wire, int(expires_s)

    def _keys(self, file_id: str) -> list[str]:
        w = self.wire(file_id)
        return [file_key(w), file_data_key(w), files_key(self.tenant), keys.stored_key(self.tenant or "")]

    async def put(self, file_id: str, filename: str, purpose: str, content: bytes) -> FileInfo:
        """Keep `content` as file `file_id` (counted in the tenant's stored bytes); its FileInfo."""
        now = time.time()
        at, keep = usage.count_args(self.expires_s, now)
        info = FileInfo(id=file_id, bytes=len(content), created_at=int(now), filename=filename, purpose=purpose,
                        expires_at=int(now) + self.expires_s)
        await PUT.run_async(self.redis, self._keys(file_id),
                            [file_id, filename, purpose, len(content), info.created_at, info.expires_at,
                             self.expires_s, at, keep, content])
        return info

    async def info(self, file_id: str) -> FileInfo | None:
        """The file's FileInfo, None when there is none (never uploaded, deleted, expired, another tenant's)."""
        return _info(await self.redis.hgetall(file_key(self.wire(file_id))))

    async def all(self, purpose: str | None = None) -> list[FileInfo]:
        """Every file of the tenant here (of `purpose`, if given), oldest first; the index entries of
        files that expired are dropped on the way. One round trip per hundred files."""
        index = files_key(self.tenant)
        ids = [i.decode() if isinstance(i, bytes) else i for i in await self.redis.zrange(index, 0, -1)]
        out: list[FileInfo] = []
        gone: list[str] = []
        for k in range(0, len(ids), 100):
            pipe = self.redis.pipeline(transaction=False)
            for i in ids[k:k + 100]:
                pipe.hgetall(file_key(self.wire(i)))
            for i, fields in zip(ids[k:k + 100], await pipe.execute(), strict=True):
                info = _info(fields)
                if info is None:
                    gone.append(i)
                elif purpose is None or info.purpose == purpose:
                    out.append(info)
        if gone:
            await self.redis.zrem(index, *gone)
        return out

    async def content(self, file_id: str) -> AsyncIterator[bytes]:
        """The file's content, READ_CHUNK bytes per round trip (check `info` first: a file gone
        meanwhile ends the stream early)."""
        key = file_data_key(self.wire(file_id))
        pos = 0
        while True:
            piece = await self.redis.getrange(key, pos, pos + READ_CHUNK - 1)
            if not piece:
                return
            yield piece
            if len(piece) < READ_CHUNK:
                return
            pos += len(piece)

    async def delete(self, file_id: str) -> bool:
        """Delete the file (its bytes given back to the tenant's stored bytes); False when there is none."""
        return bool(await DELETE.run_async(self.redis, self._keys(file_id), [file_id]))
