//! Lua scripts. Each mirrors `sluice-core`'s integer math on microseconds (exact mode) or applies
//! one key's flush (synced mode). `s()` formats a number as a whole decimal: Lua's default
//! `tostring` would write `1.7e+15` and lose digits.

/// Common prologue: argument parsing and the result shape
/// `{code, remaining, reset_after_us, retry_after_us}` with code 0 allowed, 1 denied,
/// 2 cost above capacity (remaining holds the capacity).
const PROLOGUE: &str = r"
local function s(x) return string.format('%.0f', x) end
local now = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
";

/// KEYS: state hash (fields w, c). ARGV: now_us, window_us, limit, cost.
pub fn fixed_window() -> String {
    format!(
        "{PROLOGUE}{}",
        r"
if cost > limit then return {2, limit, 0, 0} end
local st = redis.call('HMGET', KEYS[1], 'w', 'c')
local sw = tonumber(st[1] or '0')
local sc = tonumber(st[2] or '0')
local idx = math.floor(now / w)
local window, count = sw, sc
if idx > sw then window = idx; count = 0 end
local reset = (window + 1) * w - now
if reset < 0 then reset = 0 end
if count + cost > limit then return {1, 0, reset, reset} end
count = count + cost
if cost > 0 then
  redis.call('HSET', KEYS[1], 'w', s(window), 'c', s(count))
  redis.call('PEXPIRE', KEYS[1], math.floor(2 * w / 1000) + 1)
end
return {0, limit - count, reset, 0}
"
    )
}

/// KEYS: TAT string. ARGV: now_us, window_us, limit, cost, burst.
pub fn token_bucket() -> String {
    format!(
        "{PROLOGUE}{}",
        r"
local burst = tonumber(ARGV[5])
if burst < 1 then burst = 1 end
if cost > burst then return {2, burst, 0, 0} end
local t = math.floor((w + limit - 1) / limit)
local tau = burst * t
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local start = math.max(tat, now)
local new_tat = start + cost * t
local allow_at = new_tat - tau
if allow_at < 0 then allow_at = 0 end
if now < allow_at then return {1, 0, start - now, allow_at - now} end
local remaining = math.floor((now + tau - new_tat) / t)
if cost == 0 then return {0, remaining, start - now, 0} end
redis.call('SET', KEYS[1], s(new_tat), 'PX', math.floor((new_tat - now) / 1000) + 1)
return {0, remaining, new_tat - now, 0}
"
    )
}

/// KEYS: state hash (fields w, cur, prev). ARGV: now_us, window_us, limit, cost.
pub fn sliding_window() -> String {
    format!(
        "{PROLOGUE}{}",
        r"
if cost > limit then return {2, limit, 0, 0} end
local st = redis.call('HMGET', KEYS[1], 'w', 'cur', 'prev')
local sw = tonumber(st[1] or '0')
local scur = tonumber(st[2] or '0')
local sprev = tonumber(st[3] or '0')
local idx = math.floor(now / w)
local at, cw, ccur, cprev = now, sw, scur, sprev
if idx >= sw then
  if idx == sw + 1 then cw = idx; ccur = 0; cprev = scur
  elseif idx > sw + 1 then cw = idx; ccur = 0; cprev = 0 end
else
  at = sw * w
end
local lag = at - now
local ws = cw * w
local elapsed = at - ws
local weighted = cprev * (w - elapsed)
local wanted = (ccur + cost) * w
local cap = limit * w
local function need(p, b)
  if p == 0 then return 0 end
  local n = w - math.floor(b * w / p)
  if n < 0 then n = 0 end
  return n
end
if weighted + wanted > cap then
  local fits_at
  if ccur + cost <= limit then fits_at = need(cprev, limit - ccur - cost)
  else fits_at = w + need(ccur, limit - cost) end
  local retry = fits_at - elapsed
  if retry < 0 then retry = 0 end
  local reset = (ws + w - at) + lag
  if ccur > 0 then reset = reset + w end
  return {1, 0, reset, retry + lag}
end
local remaining = math.floor((cap - weighted - wanted) / w)
if cost == 0 then
  local reset = (ws + w - at) + lag
  if ccur > 0 then reset = reset + w end
  return {0, remaining, reset, 0}
end
redis.call('HSET', KEYS[1], 'w', s(cw), 'cur', s(ccur + cost), 'prev', s(cprev))
redis.call('PEXPIRE', KEYS[1], math.floor(2 * w / 1000) + 1)
return {0, remaining, (ws + w - at) + w + lag, 0}
"
    )
}

/// KEYS: the window's counter (`<key>:<window>`, which synced flushes `INCRBY`), the previous
/// window's. ARGV: now_us, window_us, limit, cost, sliding (1: weigh the previous window in).
/// Mirrors `window_counter.rs`; a new counter lives two windows, as a flush sets it.
pub fn window_counter() -> String {
    format!(
        "{PROLOGUE}{}",
        r"
if cost > limit then return {2, limit, 0, 0} end
local sliding = tonumber(ARGV[5]) == 1
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = 0
if sliding then prev = tonumber(redis.call('GET', KEYS[2]) or '0') end
local elapsed = now % w
local reset = w - elapsed
local weighted = prev * (w - elapsed)
local wanted = (cur + cost) * w
local cap = limit * w
if weighted + wanted > cap then
  local retry = reset
  if sliding and cur + cost <= limit and prev > 0 then
    local fits = math.floor((limit - cur - cost) * w / prev)
    if fits > w then fits = w end
    retry = (w - fits) - elapsed
    if retry < 1 then retry = 1 end
  end
  return {1, 0, reset, retry}
end
if cost > 0 then
  if redis.call('INCRBY', KEYS[1], cost) == cost then
    redis.call('PEXPIRE', KEYS[1], math.floor(2 * w / 1000) + 1)
  end
end
return {0, math.floor((cap - weighted - wanted) / w), reset, 0}
"
    )
}

/// KEYS: sorted set of admissions (member `ts:cost`, score ts), meta hash (newest, total).
/// ARGV: now_us, window_us, limit, cost.
pub fn sliding_log() -> String {
    format!(
        "{PROLOGUE}{}",
        r"
if cost > limit then return {2, limit, 0, 0} end
local newest = tonumber(redis.call('HGET', KEYS[2], 'newest') or '0')
local total = tonumber(redis.call('HGET', KEYS[2], 'total') or '0')
local at = math.max(newest, now)
local lag = at - now
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', s(at - w))
for _, m in ipairs(expired) do
  local c = tonumber(string.match(m, ':(%d+)$'))
  total = total - c
end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', s(at - w)) end
local ttl = math.floor(2 * w / 1000) + 1
redis.call('HSET', KEYS[2], 'newest', s(at), 'total', s(total))
redis.call('PEXPIRE', KEYS[2], ttl)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local reset = lag
if #last > 0 then reset = tonumber(last[2]) + w - at + lag end
if total + cost > limit then
  local to_free = total + cost - limit
  local retry = reset
  local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    local c = tonumber(string.match(all[i], ':(%d+)$'))
    if c >= to_free then retry = tonumber(all[i + 1]) + w - at + lag; break end
    to_free = to_free - c
  end
  return {1, 0, reset, retry}
end
if cost == 0 then return {0, limit - total, reset, 0} end
if #last > 0 and tonumber(last[2]) == at then
  local c = tonumber(string.match(last[1], ':(%d+)$'))
  redis.call('ZREM', KEYS[1], last[1])
  redis.call('ZADD', KEYS[1], s(at), s(at) .. ':' .. s(c + cost))
else
  redis.call('ZADD', KEYS[1], s(at), s(at) .. ':' .. s(cost))
end
total = total + cost
redis.call('HSET', KEYS[2], 'total', s(total))
redis.call('PEXPIRE', KEYS[1], ttl)
return {0, limit - total, w + lag, 0}
"
    )
}

/// KEYS: the fleet's sorted set. ARGV: instance id, live_for_ms. Records the instance at the
/// server's time, drops those not heard from within `live_for_ms`, and returns
/// `{live instances, seconds, microseconds}` (the server's `TIME`).
pub fn announce() -> String {
    r"
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live_for = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%.0f', ms - live_for))
redis.call('PEXPIRE', KEYS[1], live_for)
return {redis.call('ZCARD', KEYS[1]), t[1], t[2]}
"
    .to_owned()
}
