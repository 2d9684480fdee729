"""Lua scripts of the Redis limiter. Each runs atomically on the server, so a check and its take
cannot interleave with another replica's (stops a burst split over replicas from overshooting
a limit). Clock: the server's TIME, in ms, never the client's (replicas' clocks disagree).

Keys of one tenant share the hash tag `{tenant}` so the script is valid on Redis Cluster.
Buckets are hashes {level, ts, cap}; an absent bucket is full, so a bucket key expires once it
has refilled (one window after its last take; longer for a bucket in debt). Leases are a ZSET reservation id -> expiry;
expired leases (a replica died holding them) are purged before counting.

The arithmetic mirrors bucket.py; levels come back as '%.17g' strings (exact doubles) and
the Python side judges a refusal from them with the same `judge` the local limiter uses.
"""

from __future__ import annotations

_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local function fmt(x) return string.format('%.17g', x) end
local function level(key, cap, window)
  if cap <= 0 then return 0 end
  local h = redis.call('HMGET', key, 'level', 'ts')
  local lvl, ts = tonumber(h[1]), tonumber(h[2])
  if lvl == nil or ts == nil then return cap end
  return math.min(cap, lvl + math.max(0, now - ts) * cap / window)
end
"""

# KEYS: requests bucket, tokens bucket, leases
# ARGV: rpm, tpm, max concurrent (-1 = unlimited), tokens, reservation id, window ms, lease ms
# -> {1 | 0, requests level, tokens level, leases in flight}  (after the take when 1)
ACQUIRE = (
    _PRELUDE
    + """
local rpm, tpm, maxc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local need, window, lease = tonumber(ARGV[4]), tonumber(ARGV[6]), tonumber(ARGV[7])
local req = level(KEYS[1], rpm, window)
local tok = level(KEYS[2], tpm, window)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local inflight = redis.call('ZCARD', KEYS[3])
if (rpm >= 0 and req < 1) or (tpm >= 0 and tok < need) or (maxc >= 0 and inflight >= maxc) then
  return {0, fmt(req), fmt(tok), inflight}
end
local ttl = math.ceil(window) + 1000
if rpm >= 0 then
  req = req - 1
  redis.call('HSET', KEYS[1], 'level', fmt(req), 'ts', fmt(now), 'cap', rpm)
  redis.call('PEXPIRE', KEYS[1], ttl)
end
if tpm >= 0 then
  tok = tok - need
  redis.call('HSET', KEYS[2], 'level', fmt(tok), 'ts', fmt(now), 'cap', tpm)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
redis.call('ZADD', KEYS[3], fmt(now + lease), ARGV[5])
redis.call('PEXPIRE', KEYS[3], math.ceil(lease) + 1000)
return {1, fmt(req), fmt(tok), inflight + 1}
"""
)

_ADD_TOKENS = """
local function add_tokens(key, cap, delta, window)
  if cap <= 0 or delta == 0 then return end
  local lvl = math.min(cap, level(key, cap, window) + delta)
  redis.call('HSET', key, 'level', fmt(lvl), 'ts', fmt(now), 'cap', cap)
  -- Kept until it has refilled: a bucket in debt takes longer than one window.
  redis.call('PEXPIRE', key, math.ceil((cap - lvl) * window / cap) + 1000)
end
"""

# KEYS: tokens bucket, leases.  ARGV: reservation id, delta (+ refund / - charge), window ms,
# tpm when the lease was taken (-1 = unlimited)
# -> 1 if the lease was held (and the tokens settled), 0 if already released or expired.
# The ZREM is the idempotency guard: a second release finds nothing and settles nothing.
# The level may go below zero (debt: tokens generated beyond the reservation).
RELEASE = (
    _PRELUDE
    + _ADD_TOKENS
    + """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
add_tokens(KEYS[1], tonumber(ARGV[4]), tonumber(ARGV[2]), tonumber(ARGV[3]))
return 1
"""
)

# KEYS: tokens bucket, leases.  ARGV: reservation id, tokens to take, window ms, tpm
# -> 1 if the lease is held (and the tokens taken, debt allowed), 0 otherwise.
CHARGE = (
    _PRELUDE
    + _ADD_TOKENS
    + """
if redis.call('ZSCORE', KEYS[2], ARGV[1]) == false then return 0 end
add_tokens(KEYS[1], tonumber(ARGV[4]), -tonumber(ARGV[2]), tonumber(ARGV[3]))
return 1
"""
)

# KEYS: requests bucket, tokens bucket, leases.  ARGV: rpm, tpm, window ms
# -> {requests level, tokens level, leases in flight}; writes nothing.
PEEK = (
    _PRELUDE
    + """
local rpm, tpm, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local inflight = redis.call('ZCOUNT', KEYS[3], '(' .. fmt(now), '+inf')
return {fmt(level(KEYS[1], rpm, window)), fmt(level(KEYS[2], tpm, window)), inflight}
"""
)
