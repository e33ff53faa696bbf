"""The Lua scripts: every lock operation is one atomic script call, one round trip.

Each script takes any number of locks, so one name and many names cost the same
single ``EVALSHA``. Ownership is always compared before a write: a stale holder's
release or extend can never touch the lock of whoever holds the name now.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "ACQUIRE",
    "ACQUIRE_MANY",
    "CLAIM",
    "EXTEND",
    "HELD_ELSEWHERE",
    "RELEASE",
    "RELEASE_MANY",
    "VANISHED",
    "Lua",
    "parse_fences",
]


class Lua:
    """A script and its SHA1, as ``EVALSHA`` names it."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()


# One name is the hot path: a script without a loop or a result table costs the
# server about half as much as the general form (measured on Redis 7).
#
# A script is atomic but not transactional: what it wrote before an error stays
# written. So the fence step is a pcall, and when it fails (the fence key holds
# another type, or the counter is at its limit) the lock just set is deleted before
# the error is returned: nothing stays held for a lease nobody was given.
#
# A call may run twice: redis-py's cluster pipeline sends a command again after a
# connection error, and so may a proxy, though the first may have run. Tokens are
# unique per acquisition, so a lock already holding this call's token was set by
# this call: the script answers its fencing token again (nobody can have bumped the
# counter while the lock was held) instead of "held elsewhere" for our own lock.
ACQUIRE = Lua("""
-- KEYS: lock, fence  ARGV: ttl in ms, token
-- Returns the new fencing token, or 0 when someone else holds the lock.
if redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[1]) then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' and fence.err then
    redis.call('DEL', KEYS[1])
  end
  return fence
end
if redis.call('GET', KEYS[1]) == ARGV[2] then
  return tonumber(redis.call('GET', KEYS[2]))
end
return 0
""")

# A release announces itself on the lock key's channel, for the waiting acquires
# subscribed to it, and only when one is: a PUBLISH in a cluster goes to every node,
# while PUBSUB NUMSUB counts the subscribers of this node alone (a cluster's waiters
# poll, they never subscribe).
RELEASE = Lua("""
-- KEYS: lock  ARGV: token
-- Compare-and-delete; returns 1 if this call freed the lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('PUBSUB', 'NUMSUB', KEYS[1])[2] > 0 then
    redis.call('PUBLISH', KEYS[1], '')
  end
  return 1
end
return 0
""")

# Its answer is one string, not an array: redis-py's pure-Python parser reads an
# array element by element, about 0.6 ms for a thousand names; the string is split
# in a tenth of that (parse_fences).
ACQUIRE_MANY = Lua("""
-- KEYS: lock1, fence1, lock2, fence2, ...  ARGV: ttl in ms, token1, token2, ...
-- Returns per lock its new fencing token, or 0 when someone else holds it,
-- separated by spaces (a lock already holding its token: its fencing token
-- again). If a fence step fails, every lock this call set is deleted again
-- and the error is returned.
local out = {}
for i = 1, #KEYS / 2 do
  if redis.call('SET', KEYS[2 * i - 1], ARGV[i + 1], 'NX', 'PX', ARGV[1]) then
    local fence = redis.pcall('INCR', KEYS[2 * i])
    if type(fence) == 'table' and fence.err then
      for j = 1, i do
        if out[j] ~= '0' then
          redis.call('DEL', KEYS[2 * j - 1])
        end
      end
      return fence
    end
    -- %d: concat would print a Lua number of 15 digits or more as 1e+14.
    out[i] = string.format('%d', fence)
  elseif redis.call('GET', KEYS[2 * i - 1]) == ARGV[i + 1] then
    out[i] = redis.call('GET', KEYS[2 * i])  -- this call ran before: the same answer
  else
    out[i] = '0'
  end
end
return table.concat(out, ' ')
""")

RELEASE_MANY = Lua("""
-- KEYS: lock1, lock2, ...  ARGV: token1, token2, ...
-- Compare-and-delete; returns how many locks this call freed.
local freed = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then
    freed = freed + redis.call('DEL', key)
    if redis.call('PUBSUB', 'NUMSUB', key)[2] > 0 then
      redis.call('PUBLISH', key, '')
    end
  end
end
return freed
""")

EXTEND = Lua("""
-- KEYS: lock1, lock2, ...  ARGV: token1, ttl1 in ms, token2, ttl2, ...
-- Compare-and-pexpire; returns per lock 1 (extended), 0 (gone) or -1 (another holder).
local out = {}
for i, key in ipairs(KEYS) do
  local holder = redis.call('GET', key)
  if holder == ARGV[2 * i - 1] then
    out[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  elseif holder then
    out[i] = -1
  else
    out[i] = 0
  end
end
return out
""")


def parse_fences(answer: bytes | str) -> list[int]:
    """ACQUIRE_MANY's answer: per lock its new fencing token, or 0."""
    return [int(fence) for fence in answer.split()]


VANISHED = 0
"""EXTEND's answer for a lock whose key is gone (expired or deleted)."""
HELD_ELSEWHERE = -1
"""EXTEND's answer for a lock now held under another token."""

# Fire times are microseconds since the epoch: below 2^53 until the year 2255, so a
# Lua number (a double) holds them exactly. The mark is set with the retention as its
# expiry, refreshed by every claim won; its answer is one string, as ACQUIRE_MANY's.
CLAIM = Lua("""
-- KEYS: mark1, mark2, ...  ARGV: retention in ms, fire1, fire2, ...
-- Raises each mark to its fire time where it is below (or missing); returns per
-- mark '1' (raised: the claim is won) or '0', as one string.
local out = {}
for i, key in ipairs(KEYS) do
  local mark = redis.call('GET', key)
  if not mark or tonumber(mark) < tonumber(ARGV[i + 1]) then
    redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
    out[i] = '1'
  else
    out[i] = '0'
  end
end
return table.concat(out)
""")
