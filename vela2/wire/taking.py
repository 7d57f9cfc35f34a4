"""How a worker takes messages from its queue lists and gives them back, each in one atomic step.

A message taken from a queue list is recorded as held (in kombu's `unacked` hash and its
`unacked_index` sorted set, scored with the wall time) by the same Lua script that pops it, so no
moment exists in which it is in neither place: not when the worker dies, not when Redis exits
between popping and replying (a plain BRPOP lost one message that way). The tags are new, unique
per take; the record holds the list the item came from and the item itself, byte for byte, so a
restore puts exactly that item back where it was, whatever it contains.

Redis 6.2 or newer (`RPOP key count`, `BLMOVE`). While Redis is out of memory (noeviction) it
checks memory only at a script's first write: the take's first write is the pop, which frees
memory, so a take still moves items into `unacked` whole (it neither fails halfway nor adds
memory); a restore's first write is the push, which is then refused before anything changed.
The scripts carry no shebang flags, so Redis-compatible servers without them (fakeredis, which
the demo falls back on) run them too.
"""

from __future__ import annotations

MIN_REDIS_VERSION = (6, 2)

# KEYS[1] unacked hash, KEYS[2] unacked_index, KEYS[3..] the lists in the order to take from.
# ARGV[1] now (unix seconds), ARGV[2] the most items to take, ARGV[3] a tag prefix unique to this call.
# Returns {list key, tag, item, list key, tag, item, ...}.
TAKE_SCRIPT = """
local out, left, n = {}, tonumber(ARGV[2]), 0
for i = 3, #KEYS do
  if left <= 0 then break end
  local items = redis.call('RPOP', KEYS[i], left)
  if items then
    for _, item in ipairs(items) do
      n = n + 1
      local tag = ARGV[3] .. '.' .. n
      redis.call('HSET', KEYS[1], tag, KEYS[i] .. '\\0' .. item)
      redis.call('ZADD', KEYS[2], ARGV[1], tag)
      out[#out + 1] = KEYS[i]
      out[#out + 1] = tag
      out[#out + 1] = item
    end
    left = left - #items
  end
end
return out
"""

# KEYS[1] unacked hash, KEYS[2] unacked_index; ARGV[1] the tag, ARGV[2] '1' to push the item at the
# far end of its list (taken last) instead of the near end (taken next).
# Returns 1 restored, 0 nothing held under the tag, -1 a record kombu wrote itself (the caller
# restores those the kombu way: they predate this format).
RESTORE_SCRIPT = """
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
local cut = string.find(rec, '\\0', 1, true)
if not cut then return -1 end
local key, item = string.sub(rec, 1, cut - 1), string.sub(rec, cut + 1)
if ARGV[2] == '1' then redis.call('LPUSH', key, item) else redis.call('RPUSH', key, item) end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""


def held_record(list_key: str | bytes, item: bytes) -> bytes:
    """The `unacked` value the take script writes for `item` taken from `list_key`."""
    key = list_key.encode() if isinstance(list_key, str) else list_key
    return key + b"\0" + item


def split_held(record: bytes) -> tuple[str, bytes] | None:
    """(list key, item) of an `unacked` value written by the take script; None for any other value
    (a record kombu wrote itself: JSON, which never holds a NUL byte)."""
    key, sep, item = record.partition(b"\0")
    return (key.decode("utf-8", "surrogateescape"), item) if sep else None


def version_problem(version: str) -> str | None:
    """Why a Redis server of `version` (INFO's redis_version) cannot hold our queues, or None."""
    try:
        parts = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        return None  # a Redis-compatible server naming its version otherwise: let it try
    if parts < MIN_REDIS_VERSION:
        need = ".".join(map(str, MIN_REDIS_VERSION))
        return f"Redis {version} is too old: the worker needs {need} or newer (RPOP with a count, BLMOVE)"
    return None
