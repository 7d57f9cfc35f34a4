"""How a worker takes messages from its queue lists and gives them back, each in one atomic step,
and how producers push them: fair across tenants, with a doorbell idle workers block on.

A message taken from a queue list is recorded as held (in kombu's `unacked` hash and its
`unacked_index` sorted set, scored with the wall time) by the same Lua script that pops it, so no
moment exists in which it is in neither place: not when the worker dies, not when Redis exits
between popping and replying (a plain BRPOP lost one message that way). The tags are new, unique
per take; the record holds the list the item came from and the item itself, byte for byte, so a
restore puts exactly that item back where it was, whatever it contains.

Fair share: a tenant's messages wait on a list of its own (vela2.wire.keys.tenant_list), pushed by
PUSH_SCRIPT, which also enters the tenant in its queue's ring and rings the model's doorbell. The
take serves the ring by start-time fair queueing (TAKE_SCRIPT), so one tenant's backlog does not
hold back another's messages; online before backfill still holds (the online queue's lists are
taken first). A deployment without tenants keeps one list per queue and the take pops it as before.

Redis 6.2 or newer (`RPOP key count`, `BLMOVE`). While Redis is out of memory (noeviction) a script
is refused only at a write that may need memory made before any other write: the take's first such
write follows a pop, which frees memory, so a take still moves items into `unacked` whole (it
neither fails halfway nor adds memory); a restore's and a push's first write is the push, which is
then refused before anything changed. The scripts carry no shebang flags, so Redis-compatible
servers without them (fakeredis, which the demo falls back on) run them too.
"""

from __future__ import annotations

from typing import Any

from vela2.wire import keys, results
from vela2.wire.scripts import Script

MIN_REDIS_VERSION = (6, 2)
_SEP_LUA = "".join(f"\\{ord(c)}" for c in keys.KOMBU_PRIORITY_SEP)  # the separator as Lua escapes


def _lua(script: str) -> str:
    """`script` with the pieces of key names put in from vela2.wire.keys (one definition of each)."""
    return (script.replace("$SEP$", _SEP_LUA).replace("$MARK$", keys.TENANT_LIST_MARK)
            .replace("$RING$", keys.RING_MARK).replace("$CLOCK$", keys.CLOCK_MARK)
            .replace("$BACKFILL$", keys.BACKFILL_SUFFIX))


# KEYS[1] unacked hash, KEYS[2] unacked_index, KEYS[3] the model's doorbell, KEYS[4] the tenants'
# shares (hash), KEYS[5..] the lists in the order to take from: a queue's own list is served fairly
# across its tenants; kombu's priority sub-lists (names holding the separator) are popped plainly.
# ARGV[1] now (unix seconds), ARGV[2] the most items to take, ARGV[3] a tag prefix unique to this call.
# Returns {list key, tag, item, list key, tag, item, ...}.
#
# Fair share (start-time fair queueing over messages): each tenant with messages waiting is a member
# of the queue's ring, scored with its virtual time. The lowest score is served first (a score behind
# the queue's clock, as a tenant that just arrived has, counts as the clock), a quantum of its weight
# in messages (all the take may hold when it is the only one waiting), and moves on by taken/weight.
# The queue's own list (keyless producers, plain Celery) takes part as tenant ''. An empty ring: the
# queue's own list is popped as before. The doorbell is cleared, and rung again when the take
# stopped at its credit (items may be left for the other workers). Nothing waiting (no list and no
# ring exists: one EXISTS) returns at once: an idle worker's take costs two commands, not a dozen.
TAKE_SCRIPT = _lua("""
local SEP, MARK = '$SEP$', '$MARK$'
local out, left, n = {}, tonumber(ARGV[2]), 0
local function take(key, most)
  local items = redis.call('RPOP', key, most)
  if not items then return 0 end
  local held, index = {}, {}
  for _, item in ipairs(items) do
    n = n + 1
    local tag = ARGV[3] .. '.' .. n
    held[#held + 1] = tag
    held[#held + 1] = key .. '\\0' .. item
    index[#index + 1] = ARGV[1]
    index[#index + 1] = tag
    out[#out + 1] = key
    out[#out + 1] = tag
    out[#out + 1] = item
  end
  redis.call('HSET', KEYS[1], unpack(held))  -- one HSET and one ZADD for the items of one list
  redis.call('ZADD', KEYS[2], unpack(index))
  left = left - #items
  return #items
end
local function take_fair(q)
  local ring = q .. SEP .. '$RING$'
  if redis.call('ZCARD', ring) == 0 then return take(q, left) end
  local clock = q .. SEP .. '$CLOCK$'
  local v = tonumber(redis.call('GET', clock) or '0')
  while left > 0 do
    local t, s
    local top = redis.call('ZRANGE', ring, 0, 0, 'WITHSCORES')
    if #top > 0 then t, s = top[1], tonumber(top[2]) end
    local own = redis.call('LLEN', q) > 0 and not redis.call('ZSCORE', ring, '')
    if own and (t == nil or v <= s) then t, s = '', v end
    if t == nil then break end
    if s < v then s = v end
    local key = q
    if t ~= '' then key = q .. SEP .. MARK .. t end
    local w = tonumber(redis.call('HGET', KEYS[4], t) or '1') or 1
    if w <= 0 then w = 1 end
    local most = left
    if redis.call('ZCARD', ring) + (own and 1 or 0) > 1 then most = math.min(left, math.max(1, math.floor(w))) end
    local got = take(key, most)
    v = s
    if redis.call('LLEN', key) == 0 then redis.call('ZREM', ring, t)
    else redis.call('ZADD', ring, s + got / w, t) end
  end
  if n > 0 then redis.call('SET', clock, v) end
end
redis.call('DEL', KEYS[3])
local watched = {}
for i = 5, #KEYS do
  watched[#watched + 1] = KEYS[i]
  if not string.find(KEYS[i], SEP, 1, true) then watched[#watched + 1] = KEYS[i] .. SEP .. '$RING$' end
end
if redis.call('EXISTS', unpack(watched)) == 0 then return out end
for i = 5, #KEYS do
  if left <= 0 then break end
  if string.find(KEYS[i], SEP, 1, true) then take(KEYS[i], left) else take_fair(KEYS[i]) end
end
if left <= 0 then redis.call('RPUSH', KEYS[3], '1') end
return out
""")


def take_keys(lists: list[str], bell: str, unacked: str = keys.UNACKED_KEY,
              unacked_index: str = keys.UNACKED_INDEX_KEY) -> list[str]:
    """The KEYS of TAKE_SCRIPT: take from `lists` (in that order) of the model whose bell is `bell`."""
    return [unacked, unacked_index, bell, keys.TENANT_SHARES_KEY, *lists]


# KEYS[1] the list, KEYS[2] its queue's ring, KEYS[3] the model's doorbell; ARGV[1] the tenant (''
# for none: the queue's own list), ARGV[2] the most messages the list may hold (0: no limit), ARGV[3]
# the messages counted against it (this call's and those of the calls that follow it in one push),
# ARGV[4..] the messages, LPUSHed in order. Returns 0 when pushed, else what the list would have
# held (nothing pushed). The doorbell is rung only by a push onto an empty list: a list that holds
# messages already was rung for when it last became non-empty, or by the take that left them (it
# rings when it stops at its credit), so a worker is on its way (one command less per push).
PUSH_LUA = """
local function push(list, ring, bell, tenant, limit, counted, first)
  limit = tonumber(limit)
  if limit > 0 then
    local would = redis.call('LLEN', list) + tonumber(counted)
    if would > limit then return would end
  end
  local held = redis.call('LPUSH', list, unpack(ARGV, first))
  if tenant ~= '' then redis.call('ZADD', ring, 'NX', 0, tenant) end
  if held == #ARGV - first + 1 then redis.call('RPUSH', bell, '1') end
  return 0
end
"""  # the push as a Lua function (the messages: ARGV[first..]), for PUSH_SCRIPT and CLAIM_PUSH_SCRIPT
PUSH_SCRIPT = PUSH_LUA + "return push(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], 4)\n"

# One request's claim and push in one call (producer.Client.submit where the broker is the result
# store's Redis: one round trip, one script, instead of two of each). KEYS its marker, its result, then
# push_keys; ARGV[1] the number of claim arguments n, ARGV[2..n+1] claim_args, then the tenant, the
# limit, the messages counted, the message. Returns {claim code, 0 or what the list would have held}:
# pushed unless the claim said conflict (1) or answered (3), or the limit refused it (then the marker
# this call wrote is taken back).
CLAIM_PUSH_SCRIPT = results.CLAIM_LUA + PUSH_LUA + """
local n = tonumber(ARGV[1])
local code = claim(KEYS[1], KEYS[2], {unpack(ARGV, 2, n + 1)})
if code == 1 or code == 3 then return {code, 0} end
local refused = push(KEYS[3], KEYS[4], KEYS[5], ARGV[n + 2], ARGV[n + 3], ARGV[n + 4], n + 5)
if refused > 0 and code == 2 then redis.call('DEL', KEYS[1]) end
return {code, refused}
"""
PUSH_MAX = 1000  # messages one PUSH_SCRIPT call carries (Lua's unpack has a stack limit)


def push_keys(queue: str, tenant: str | None) -> list[str]:
    """The KEYS of PUSH_SCRIPT for `tenant`'s messages on `queue` (None: the queue's own list)."""
    return [keys.tenant_list(queue, tenant), keys.fair_ring(queue), keys.bell_key(queue)]


# KEYS the queues; ARGV kombu's priority steps. Read only. Returns per queue: messages waiting (its
# own list, its priority sub-lists and its tenants' lists), the number of tenants listed, then
# tenant, its messages waiting, ...
DEPTH_SCRIPT = _lua("""
local SEP, MARK = '$SEP$', '$MARK$'
local out = {}
for _, q in ipairs(KEYS) do
  local total = redis.call('LLEN', q)
  for _, p in ipairs(ARGV) do total = total + redis.call('LLEN', q .. SEP .. p) end
  local tenants = {}
  for _, t in ipairs(redis.call('ZRANGE', q .. SEP .. '$RING$', 0, -1)) do
    if t ~= '' then
      local c = redis.call('LLEN', q .. SEP .. MARK .. t)
      total = total + c
      if c > 0 then tenants[#tenants + 1] = t; tenants[#tenants + 1] = c end
    end
  end
  out[#out + 1] = total
  out[#out + 1] = #tenants / 2
  for _, x in ipairs(tenants) do out[#out + 1] = x end
end
return out
""")


def depth_call(queues: list[str]) -> tuple[list[str], list[int]]:
    """DEPTH's (KEYS, ARGV) over `queues`."""
    return list(queues), list(keys.KOMBU_PRIORITY_STEPS)


def read_depths(queues: list[str], reply: list[Any]) -> dict[str, tuple[int, dict[str, int]]]:
    """DEPTH_SCRIPT's reply: queue -> (messages waiting, {tenant: its messages waiting})."""
    out: dict[str, tuple[int, dict[str, int]]] = {}
    i = 0
    for q in queues:
        total, k = int(reply[i]), int(reply[i + 1])
        pairs = reply[i + 2 : i + 2 + 2 * k]
        out[q] = (total, {_text(pairs[j]): int(pairs[j + 1]) for j in range(0, len(pairs), 2)})
        i += 2 + 2 * k
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# KEYS[1] unacked hash, KEYS[2] unacked_index; ARGV[1] the tag, ARGV[2] '1' to push the item at the
# far end of its list (taken last) instead of the near end (taken next). A tenant's item enters its
# tenant in the ring again (it left when its list emptied). An item put back on an empty list rings
# its model's doorbell, as a push onto an empty list does (the bell's name is made from the list's:
# the one key not in KEYS, as the record names the list only here; a standalone Redis allows it).
# Returns 1 restored, 0 nothing held under the tag, -1 a record kombu wrote itself (the caller
# restores those the kombu way: they predate this format).
RESTORE_SCRIPT = _lua("""
local SEP, MARK = '$SEP$', '$MARK$'
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
local cut = string.find(rec, '\\0', 1, true)
if not cut then return -1 end
local key, item = string.sub(rec, 1, cut - 1), string.sub(rec, cut + 1)
local held
if ARGV[2] == '1' then held = redis.call('LPUSH', key, item) else held = redis.call('RPUSH', key, item) end
if held == 1 then
  local q = key
  local sep = string.find(q, SEP, 1, true)
  if sep then q = string.sub(q, 1, sep - 1) end
  local bf = '$BACKFILL$'
  if #q > #bf and string.sub(q, -#bf) == bf then q = string.sub(q, 1, #q - #bf) end
  redis.call('RPUSH', q .. SEP .. 'bell', '1')
end
local mark = string.find(key, SEP .. MARK, 1, true)
if mark then
  redis.call('ZADD', string.sub(key, 1, mark - 1) .. SEP .. '$RING$', 'NX', 0, string.sub(key, mark + #SEP + #MARK))
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
""")


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


# Run by their SHA1 (vela2.wire.scripts): what producers, workers and readers call.
TAKE, PUSH, DEPTH, RESTORE = Script(TAKE_SCRIPT), Script(PUSH_SCRIPT), Script(DEPTH_SCRIPT), Script(RESTORE_SCRIPT)
CLAIM_PUSH = Script(CLAIM_PUSH_SCRIPT)
