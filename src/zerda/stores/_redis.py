"""The Redis store: one hash tag per session; a write is one Lua call, a tail one MULTI/EXEC."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    InvalidSessionIdError,
    StoreUnavailableError,
    ZerdaError,
)
from zerda.messages import PINNED, Message, Role
from zerda.parts import Part
from zerda.stores._base import (
    DECODED_CHARACTERS,
    AsyncClosingStore,
    BoundedCache,
    ClosingStore,
    SessionInfo,
    Tail,
    TokenCounts,
    canonical_json,
    check_batch,
    check_ids,
    check_retention,
    check_session_id,
    check_timeout,
    edited,
    empty_tail,
    message_not_found,
    metadata_copy,
    redact,
    same_json,
    session_exists,
    weight_of_text,
)

if TYPE_CHECKING:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster

__all__ = ["EXPIRE_MARGIN", "AsyncRedisStore", "RedisStore", "open_redis_url"]

_T = TypeVar("_T")
_USER = Role.USER
_NUL = b"\0"

EXPIRE_MARGIN = 60.0
"""Seconds Redis keeps a session's keys past its TTL. The TTL itself is logical (on the
writers' clock, as in every store); the keys' own expiry, set at each write, only frees the
memory of sessions nobody purges, so it must never come first, even with clocks a little apart."""

DEFAULT_TIMEOUT = 5.0
# How much longer than its timeout an async call may take before it is cancelled: the socket
# timeouts come first when only one wait was long.
_GRACE = 0.25

# Decoded entries (as much text as DecodedMessages keeps) and log elements kept per store, by
# stored bytes: tails overlap from one read to the next, and decoding costs more than the read.
_ELEMENT_CACHE_SIZE = 1024
# Sessions per pipeline when listing or purging.
_PIPELINE_SIZE = 500
_PREFIX = re.compile(r"[A-Za-z0-9_.:@+=\-]{1,100}")
_INSTALL_HINT = "pip install 'zerda-memory[redis]'"
# URL schemes, and whether each means a Redis Cluster.
_SCHEMES = {
    "redis": False,
    "rediss": False,
    "unix": False,
    "redis+cluster": True,
    "rediss+cluster": True,
}

# -- key layout -----------------------------------------------------------------------------
#
# One session is four keys sharing the hash tag ``{session_id}``, so that one script or one
# MULTI/EXEC can touch them all on Redis Cluster too (session ids cannot hold braces):
#
#   {prefix}:{id}:meta    hash: created, updated (epoch seconds as Python wrote them), count
#                         (messages in the log), strim (system messages retention dropped from
#                         the log), prelude (1 when the log opens with system messages that
#                         came before any turn), base (messages retention dropped from the
#                         log: the position of its first message), and metadata as
#                         "m:<JSON key>" fields holding canonical JSON values
#   {prefix}:{id}:log     list: one element per turn (after the prelude, if any), holding the
#                         turn's messages in order, system messages among them included
#   {prefix}:{id}:system  list: every system message's entry (pinned; retention keeps them)
#   {prefix}:{id}:ids     sorted set: the id of every message ``history`` holds, scored by the
#                         message's position in the session (system messages: +inf, as
#                         retention keeps them), so retention forgets the ids of what it drops
#
# An entry is "<token counts as a JSON object, or nothing>\n<Message.to_json()>"; an element of
# the log is "<messages>,<system messages>" and then each entry, joined by NUL. JSON never holds
# a raw newline or NUL, so both split cleanly.
#
# Why a turn per element: the newest k turns are then LRANGE log -k -1, a read whose position
# needs nothing read first, so a tail is a plain MULTI/EXEC. Redis serves a tail of 10 turns in
# about 9 µs that way; through a script, which copies every byte into Lua and out again, it took
# about 60 µs of the server everyone shares. The price is on writes that add to an open turn:
# the turn's element is rewritten (LSET), O(the turn).
_SUFFIXES = ("meta", "log", "system", "ids")
_META_FIELD = "m:"

# -- Lua: each write is one script (atomic, one round trip) --------------------------------------

_PRELUDE = """
local meta, log, system, ids = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, ttl = ARGV[1], ARGV[2]

local function corrupt(what, value)
  error({err = 'ZERDA-CORRUPT ' .. meta .. ': ' .. what .. ' is ' .. tostring(value)})
end

local function number(value, what)
  local n = tonumber(value)
  if n == nil then corrupt(what, value) end
  return n
end

-- Whether a session last written at `updated` has expired at `now` (logical time).
local function expired(updated)
  return ttl ~= '' and number(updated, 'updated') + tonumber(ttl) <= tonumber(now)
end
"""

_WRITE_PRELUDE = (
    _PRELUDE
    + """
-- The live session's counters, or nil: no session, an expired one, or the remains of one whose
-- meta key is gone (evicted).
local function live()
  local m = redis.call('HMGET', meta, 'updated', 'count', 'strim', 'prelude', 'base')
  if not m[1] or expired(m[1]) then return nil end
  local base = 0
  if m[5] then base = number(m[5], 'base') end
  return {count = number(m[2], 'count'), strim = number(m[3], 'strim'),
          prelude = number(m[4], 'prelude'), base = base}
end

-- The counters of `session` (from live()) for a write at `now`; without one, a fresh session,
-- once the remains of an older one are deleted.
local function writable(session)
  if session then return session end
  redis.call('DEL', meta, log, system, ids)
  redis.call('HSET', meta, 'created', now)
  return {count = 0, strim = 0, prelude = 0, base = 0}
end

-- Writes the counters, and pushes Redis's own expiry back ('0': none).
local function written(s, expire_ms)
  redis.call('HSET', meta, 'updated', now, 'count', s.count, 'strim', s.strim,
    'prelude', s.prelude, 'base', s.base)
  if expire_ms ~= '0' then
    for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], expire_ms) end
  end
end
"""
)

# What the scripts that write the log share: elements made, cut and merged, entries read.
_LOG_PRELUDE = (
    _WRITE_PRELUDE
    + """
local function push(key, items, from, to)
  -- in slices: unpack() has a stack limit
  while from <= to do
    local last = math.min(from + 999, to)
    redis.call('RPUSH', key, unpack(items, from, last))
    from = last + 1
  end
end

-- An element's message and system message counts, and where its first entry begins.
local function header(element)
  local m, s, at = string.match(element, '^(%d+),(%d+)()%z')
  if not m then corrupt('a log element', string.sub(element, 1, 40)) end
  return tonumber(m), tonumber(s), at + 1
end

-- `element` with the messages of `piece` (an element too) added at its end.
local function merged(element, piece)
  if piece == '' then return element end
  if element == '' then return piece end
  local m1, s1, at1 = header(element)
  local m2, s2, at2 = header(piece)
  return (m1 + m2) .. ',' .. (s1 + s2) .. '\\0' .. string.sub(element, at1) .. '\\0'
    .. string.sub(piece, at2)
end

-- The entries of a log element, in order.
local function split(element)
  local m, _, at = header(element)
  local out = {}
  while true do
    local nul = string.find(element, '\\0', at, true)
    if not nul then break end
    out[#out + 1] = string.sub(element, at, nul - 1)
    at = nul + 1
  end
  out[#out + 1] = string.sub(element, at)
  if #out ~= m then corrupt('a log element', string.sub(element, 1, 40)) end
  return out
end

-- The element holding `entries`, `system_count` of them system messages.
local function element_of(entries, system_count)
  return #entries .. ',' .. system_count .. '\\0' .. table.concat(entries, '\\0')
end

-- An entry's message, decoded (cjson: for what a pattern cannot read).
local function message(entry)
  local nl = string.find(entry, '\\n', 1, true)
  local ok, m = false, nil
  if nl then ok, m = pcall(cjson.decode, string.sub(entry, nl + 1)) end
  if not ok or type(m) ~= 'table' or type(m.role) ~= 'string' then
    corrupt('an entry', string.sub(entry, 1, 60))
  end
  return m
end

-- An entry's role: Message.to_json() writes it first, so a pattern reads it.
local function role(entry)
  local nl = string.find(entry, '\\n', 1, true)
  local r = nl and string.match(entry, '^{"role":"(%a+)"', nl + 1)
  return r or message(entry).role
end

local function pinned(r)
  return r == 'system' or r == 'developer'
end
"""
)

# ARGV[3]: expiry in ms ('0': none); ARGV[4]: max messages ('0': keep all); ARGV[5]: messages in
# the batch; ARGV[6]: new turns in it; ARGV[7]: how many of its messages have an id, then for
# each the id and its offset in the batch ('s' for a system message). Then its leading system
# messages and what follows them up to its first user message (both elements, '' for none), one
# element per new turn, and the entry of each system message of the batch.
#
# Returns how many messages it stored: all of them, or none when every one has an id the
# session holds (a retry). When only some ids are held it writes nothing and returns their
# numbers (1 for the first id given): the caller sends the batch again without them.
_APPEND = (
    _LOG_PRELUDE
    + """
local keep, added, groups = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local named = tonumber(ARGV[7])
local at = 8 + 2 * named  -- the batch's first element
local session = live()
if session and named > 0 then
  local held = {}
  for i = 1, named do
    if redis.call('ZSCORE', ids, ARGV[6 + 2 * i]) then held[#held + 1] = i end
  end
  if #held == added then
    written(session, ARGV[3])
    return 0
  end
  if #held > 0 then return held end
end
local s = writable(session)
local first = s.base + s.count  -- the position of the batch's first message
local turns = redis.call('LLEN', log) - s.prelude
if turns > 0 then
  -- Up to its first user message, the batch continues the open turn.
  local more = merged(ARGV[at], ARGV[at + 1])
  if more ~= '' then redis.call('LSET', log, -1, merged(redis.call('LINDEX', log, -1), more)) end
else
  -- No turn yet: system messages join the prelude; the first other message starts a turn.
  if ARGV[at] ~= '' then
    if s.prelude == 1 then
      redis.call('LSET', log, 0, merged(redis.call('LINDEX', log, 0), ARGV[at]))
    else
      redis.call('RPUSH', log, ARGV[at])
      s.prelude = 1
    end
  end
  if ARGV[at + 1] ~= '' then redis.call('RPUSH', log, ARGV[at + 1]) end
end
push(log, ARGV, at + 2, at + 1 + groups)
push(system, ARGV, at + 2 + groups, #ARGV)
s.count = s.count + added
local scored = {}
for i = 1, named do
  local offset = ARGV[7 + 2 * i]
  if offset == 's' then scored[#scored + 1] = 'inf' else scored[#scored + 1] = first + offset end
  scored[#scored + 1] = ARGV[6 + 2 * i]
  if #scored >= 1000 or i == named then
    redis.call('ZADD', ids, unpack(scored))
    scored = {}
  end
end

-- Retention: keep at least `keep` messages, dropping the prelude and whole turns from the
-- front; reads the elements it drops, and one more.
if keep > 0 and s.count > keep then
  turns = redis.call('LLEN', log) - s.prelude
  local gone, gone_system = 0, 0
  if s.prelude == 1 then gone, gone_system = header(redis.call('LINDEX', log, 0)) end
  local dropped = 0
  while dropped + 1 < turns do
    local m, sys = header(redis.call('LINDEX', log, s.prelude + dropped))
    if s.count - (gone + m) < keep then break end
    gone, gone_system, dropped = gone + m, gone_system + sys, dropped + 1
  end
  if dropped > 0 then
    redis.call('LTRIM', log, s.prelude + dropped, -1)
    s.count, s.strim, s.prelude = s.count - gone, s.strim + gone_system, 0
    s.base = s.base + gone
    -- The ids of the dropped messages go; those of system messages (+inf) stay.
    redis.call('ZREMRANGEBYSCORE', ids, '-inf', '(' .. s.base)
  end
end
written(s, ARGV[3])
return added
"""
)

# ARGV[3]: expiry in ms; ARGV[4...]: the ids to delete, each once. Returns how many messages it
# deleted. What is left is laid out again as if appended in one batch to an empty session (as
# InMemoryStore rebuilds it): its turns recomputed, every message at its new position, the
# system messages retention dropped from the log back at its head (strim and base 0).
_DELETE_MESSAGES = (
    _LOG_PRELUDE
    + """
local s = live()
if not s then return 0 end
-- Where the messages to delete are: positions in the history (system messages retention dropped
-- first, then the log) for the others, by their ids' scores; ids alone for system messages.
local gone, gone_pinned, wanted = {}, {}, false
for i = 4, #ARGV do
  local score = redis.call('ZSCORE', ids, ARGV[i])
  if score == 'inf' then
    gone_pinned[ARGV[i]], wanted = true, true
  elseif score then
    gone[s.strim + number(score, 'a position') - s.base], wanted = ARGV[i], true
  end
end
if not wanted then return 0 end

local history = {}
if s.strim > 0 then history = redis.call('LRANGE', system, 0, s.strim - 1) end
for _, element in ipairs(redis.call('LRANGE', log, 0, -1)) do
  for _, entry in ipairs(split(element)) do history[#history + 1] = entry end
end

-- What is left, cut into its leading system messages and its turns.
local leading, turns, pinned_entries, moved, dropped = {}, {}, {}, {}, {}
local kept = 0
for h, entry in ipairs(history) do
  local r = role(entry)
  local p = pinned(r)
  local drop = false
  if p then
    if next(gone_pinned) then
      local id = message(entry).id
      if type(id) == 'string' and gone_pinned[id] then
        drop = true
        dropped[#dropped + 1] = id
      end
    end
  elseif gone[h - 1] then
    -- The id's score says where its message is; the message says so too, or the data is not
    -- what this script wrote.
    if message(entry).id ~= gone[h - 1] then corrupt('the position of id', gone[h - 1]) end
    drop = true
  end
  if not drop then
    if not p then moved[h - 1] = kept end
    kept = kept + 1
    if r == 'user' or (#turns == 0 and not p) then
      turns[#turns + 1] = {entries = {}, system = 0}
    end
    local turn = turns[#turns]
    if p then pinned_entries[#pinned_entries + 1] = entry end
    if turn then
      turn.entries[#turn.entries + 1] = entry
      if p then turn.system = turn.system + 1 end
    else
      leading[#leading + 1] = entry
    end
  end
end
local removed = #history - kept
if removed == 0 then return 0 end

-- The ids: those deleted go, the others move to their new positions.
local scored = {}
local held = redis.call('ZRANGEBYSCORE', ids, '-inf', '(inf', 'WITHSCORES')
for i = 1, #held, 2 do
  local new = moved[s.strim + number(held[i + 1], 'a position') - s.base]
  if new then
    scored[#scored + 1] = new
    scored[#scored + 1] = held[i]
  else
    dropped[#dropped + 1] = held[i]
  end
end
for from = 1, #dropped, 1000 do
  redis.call('ZREM', ids, unpack(dropped, from, math.min(from + 999, #dropped)))
end
for from = 1, #scored, 1000 do
  redis.call('ZADD', ids, unpack(scored, from, math.min(from + 999, #scored)))
end

local elements = {}
if #leading > 0 then elements[1] = element_of(leading, #leading) end
for _, turn in ipairs(turns) do elements[#elements + 1] = element_of(turn.entries, turn.system) end
redis.call('DEL', log, system)
push(log, elements, 1, #elements)
push(system, pinned_entries, 1, #pinned_entries)
s.count, s.strim, s.base = kept, 0, 0
if #leading > 0 then s.prelude = 1 else s.prelude = 0 end
written(s, ARGV[3])
return removed
"""
)

# ARGV[3]: expiry in ms. Removes the newest turn, the last element of the log: its messages go,
# but for its system messages, which join the element before it (the turn before, or the
# prelude; they become the prelude when there is neither). Returns the entries removed, in
# order. O(the turn): the other messages keep their positions, and the system messages that
# move are scored +inf.
_POP_TURN = (
    _LOG_PRELUDE
    + """
local s = live()
if not s then return {} end
local turns = redis.call('LLEN', log) - s.prelude
if turns <= 0 then return {} end
local last = redis.call('LINDEX', log, -1)
local size = header(last)
local popped, stay = {}, {}
for _, entry in ipairs(split(last)) do
  if pinned(role(entry)) then stay[#stay + 1] = entry else popped[#popped + 1] = entry end
end
if #popped == 0 then corrupt('the last element of the log', 'a turn of system messages') end
-- The ids of its messages: every position from its first message on (system messages: +inf).
redis.call('ZREMRANGEBYSCORE', ids, s.base + s.count - size, '(inf')
if #stay == 0 then
  redis.call('RPOP', log)
elseif turns > 1 or s.prelude == 1 then
  redis.call('LSET', log, -2, merged(redis.call('LINDEX', log, -2), element_of(stay, #stay)))
  redis.call('RPOP', log)
else
  redis.call('LSET', log, -1, element_of(stay, #stay))
  s.prelude = 1
end
s.count = s.count - #popped
written(s, ARGV[3])
return popped
"""
)

# ARGV[3]: expiry in ms; ARGV[4]: the index of the log element holding the message ('' for none:
# a system message retention dropped from the log); ARGV[5]: its index in the system list (''
# for none: not a system message); ARGV[6]: its entry as the caller read it; ARGV[7]: the entry
# to store instead. Returns 1 if it did, 0 if the message is no longer there as read (edited,
# deleted, or moved since): then the caller reads it again. Ids are unique in a session, so an
# entry found as read is the very message read; writes that only add to the element holding it
# do not make the edit read again.
_EDIT_MESSAGE = (
    _LOG_PRELUDE
    + """
local s = live()
if not s then return 0 end
local where, at, old, new = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
-- A system message read outside the log must still be (a delete may have put it back in).
if where == '' and tonumber(at) >= s.strim then return 0 end
local element = nil
if where ~= '' then
  local raw = redis.call('LINDEX', log, where)
  if not raw then return 0 end
  local entries = split(raw)
  local found = false
  for i, entry in ipairs(entries) do
    if entry == old then
      entries[i], found = new, true
      break
    end
  end
  if not found then return 0 end
  local _, system_count = header(raw)
  element = element_of(entries, system_count)
end
if at ~= '' and redis.call('LINDEX', system, at) ~= old then return 0 end
if element then redis.call('LSET', log, where, element) end
if at ~= '' then redis.call('LSET', system, at, new) end
written(s, ARGV[3])
return 1
"""
)

# The second step of a fork, on the new session's keys alone (on a cluster the source may live
# on another node): ARGV[3]: expiry in ms; ARGV[4]: '1' to create the session, '0' to check it
# only; ARGV[5]: 1 if the log opens with a prelude; ARGV[6]: messages in the log; ARGV[7]: log
# elements; ARGV[8]: system entries; ARGV[9]: ids; ARGV[10]: metadata fields; then the log
# elements, the system entries, each id and its score, and each metadata field and its value.
# Returns 0 when the session holds messages or metadata (it then writes nothing), else 1.
_FORK = (
    _LOG_PRELUDE
    + """
local session = live()
if session then
  if session.count + session.strim > 0 then return 0 end
  for _, name in ipairs(redis.call('HKEYS', meta)) do
    if string.sub(name, 1, 2) == 'm:' then return 0 end
  end
end
if ARGV[4] ~= '1' then return 1 end
local elements, entries = tonumber(ARGV[7]), tonumber(ARGV[8])
local named, fields = tonumber(ARGV[9]), tonumber(ARGV[10])
local s = writable(nil)
local at = 11
push(log, ARGV, at, at + elements - 1)
at = at + elements
push(system, ARGV, at, at + entries - 1)
at = at + entries
for from = at, at + 2 * named - 1, 1000 do
  redis.call('ZADD', ids, unpack(ARGV, from, math.min(from + 999, at + 2 * named - 1)))
end
at = at + 2 * named
for i = at, at + 2 * fields - 1, 2 do redis.call('HSET', meta, ARGV[i], ARGV[i + 1]) end
s.prelude, s.count = tonumber(ARGV[5]), tonumber(ARGV[6])
written(s, ARGV[3])
return 1
"""
)

# ARGV[3]: expiry in ms; ARGV[4...]: field, value pairs (an empty value deletes the field).
_UPDATE_METADATA = (
    _WRITE_PRELUDE
    + """
local s = writable(live())
for i = 4, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', meta, ARGV[i])
  else
    redis.call('HSET', meta, ARGV[i], ARGV[i + 1])
  end
end
written(s, ARGV[3])
return 1
"""
)

# ARGV[3]: expiry in ms; ARGV[4]: the metadata field; ARGV[5]: the value expected there (JSON,
# '' for none); ARGV[6]: the value to set ('' deletes the field); ARGV[7]: 'json' to compare
# the values as JSON values, 'text' to compare the texts alone.
#
# Returns 1 if it set the value, 0 if the field does not hold the value expected, or {current
# value} when it cannot tell (doubles cannot tell 10^40 from 10^40 + 1, nor cjson {} from []):
# then the caller compares, and if the values are the same, calls again with that text
# expected, in 'text' mode. Values are stored as canonical JSON, so the text compare is the
# common case; the JSON compare is for equal values written apart (1 and 1.0, or by an older
# Zerda, whose JSON was not canonical).
_COMPARE_AND_SET = (
    _WRITE_PRELUDE
    + """
local field, expected, value, mode = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local EXACT = 9007199254740992  -- 2^53: doubles above it are not every integer

-- Whether two decoded JSON values are the same (nil: cannot tell).
local function same(a, b)
  local ta = type(a)
  if ta ~= type(b) then return false end
  if ta == 'number' then
    if a ~= b then return false end
    if math.abs(a) >= EXACT then return nil end
    return true
  end
  if ta ~= 'table' then return a == b end  -- strings, booleans, cjson.null
  local na, nb = 0, 0
  for _ in pairs(a) do na = na + 1 end
  for _ in pairs(b) do nb = nb + 1 end
  if na ~= nb then return false end
  if na == 0 then return nil end  -- {} or []: decoded alike
  local unsure = false
  for k, v in pairs(a) do
    local w = b[k]
    if w == nil then return false end
    local r = same(v, w)
    if r == false then return false end
    if r == nil then unsure = true end
  end
  if unsure then return nil end
  return true
end

local session = live()
local current = false
if session then current = redis.call('HGET', meta, field) end
if not current or expected == '' then
  if current or expected ~= '' then return 0 end
elseif current ~= expected then
  if mode == 'text' then return {current} end
  local ok, a = pcall(cjson.decode, current)
  if not ok then return {current} end
  local verdict = same(a, cjson.decode(expected))
  if verdict == nil then return {current} end
  if not verdict then return 0 end
end
local s = writable(session)
if value == '' then
  redis.call('HDEL', meta, field)
else
  redis.call('HSET', meta, field, value)
end
written(s, ARGV[3])
return 1
"""
)

# Deletes the session, even a damaged one; 1 if it was live.
_DELETE = (
    _PRELUDE
    + """
local updated = redis.call('HGET', meta, 'updated')
local live = updated and tonumber(updated) and not expired(updated)
redis.call('DEL', meta, log, system, ids)
if live then return 1 end
return 0
"""
)

# Deletes the session if it has expired (checked here, atomically: a writer may have just
# refreshed it); 1 if it did.
_PURGE = (
    _PRELUDE
    + """
local updated = redis.call('HGET', meta, 'updated')
if updated and tonumber(updated) and expired(updated) then
  redis.call('DEL', meta, log, system, ids)
  return 1
end
return 0
"""
)

# Returns false for no live session, else {created, updated, messages, turns}.
_INFO = (
    _PRELUDE
    + """
local m = redis.call('HMGET', meta, 'created', 'updated', 'count', 'strim', 'prelude')
if not m[2] or expired(m[2]) then return false end
local messages = number(m[3], 'count') + number(m[4], 'strim')
return {m[1], m[2], messages, redis.call('LLEN', log) - number(m[5], 'prelude')}
"""
)

SCRIPTS: dict[str, str] = {
    "append": _APPEND,
    "update_metadata": _UPDATE_METADATA,
    "compare_and_set": _COMPARE_AND_SET,
    "delete": _DELETE,
    "purge": _PURGE,
    "info": _INFO,
    "delete_messages": _DELETE_MESSAGES,
    "pop_turn": _POP_TURN,
    "edit_message": _EDIT_MESSAGE,
    "fork": _FORK,
}
_SHAS = {name: hashlib.sha1(source.encode()).hexdigest() for name, source in SCRIPTS.items()}

# -- what the operations ask for, and what the drivers do ---------------------------------------

Arg = str | bytes | int


@dataclass(frozen=True, slots=True)
class _Call:
    """Run one script: one round trip."""

    script: str
    keys: tuple[str, ...]
    args: tuple[Arg, ...]


@dataclass(frozen=True, slots=True)
class _Calls:
    """Run scripts in one pipeline (not a transaction); the replies, in order."""

    calls: tuple[_Call, ...]


@dataclass(frozen=True, slots=True)
class _Multi:
    """Run commands, a script call among them maybe, in one MULTI/EXEC (one read command
    alone is sent as it is): one round trip, one atomic step; the replies, in order."""

    commands: tuple[tuple[Arg, ...] | _Call, ...]


@dataclass(frozen=True, slots=True)
class _Scan:
    """Every key matching ``match``, on every primary (SCAN: O(keys in the database))."""

    match: str


_Request = _Call | _Calls | _Multi | _Scan
_Flow = Generator[_Request, Any, _T]
"""An operation written once: it yields requests, and is sent each request's replies."""


@dataclass(frozen=True, slots=True)
class _Command:
    """I/O: send one command; its reply (a server's error reply is returned, not raised)."""

    args: tuple[Arg, ...]


@dataclass(frozen=True, slots=True)
class _Pipeline:
    """I/O: send commands at once, in a MULTI/EXEC if ``transaction``; their replies, a
    server's error reply in the place of its command's."""

    commands: tuple[tuple[Arg, ...], ...]
    transaction: bool


@dataclass(frozen=True, slots=True)
class _LoadScripts:
    """I/O: load every script (on every primary of a cluster)."""


_Op = _Command | _Pipeline | _LoadScripts | _Scan
_Ops = Generator[_Op, Any, _T]
"""What a driver runs: the I/O of an operation, scripts the server lacks loaded on the way."""


@dataclass(frozen=True, slots=True)
class _Turn:
    """A decoded log element: every message in order, and those a tail shows (not system
    messages) with their counts."""

    every: tuple[Message, ...]
    shown: tuple[Message, ...]
    counts: tuple[dict[str, Any] | None, ...]


def _redis_module() -> Any:
    try:
        import redis
        import redis.asyncio
        import redis.asyncio.cluster
        import redis.cluster
    except ImportError as exc:  # pragma: no cover - the extra is installed in development
        raise ConfigurationError(
            f"the Redis store needs redis-py: {_INSTALL_HINT} ({exc})"
        ) from exc
    return redis


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parts(element: bytes | str) -> list[bytes] | list[str]:
    """A log element cut at its NULs: its header, then its entries."""
    if isinstance(element, bytes):
        return element.split(_NUL)
    return element.split("\0")


def _evalsha(call: _Call) -> tuple[Arg, ...]:
    return ("EVALSHA", _SHAS[call.script], len(call.keys), *call.keys, *call.args)


def _field(key: str) -> str:
    """The meta hash field of metadata ``key`` (ASCII JSON: any key, and never a counter's)."""
    return _META_FIELD + json.dumps(key)


def _pairs(reply: Any) -> Mapping[Any, Any]:
    """A hash read whole, its fields as the client gives them (bytes, or str if it decodes
    responses): redis-py gives a dict (RESP3, or its RESP2 callback), or the flat list a bare
    RESP2 reply is (in a cluster's MULTI/EXEC)."""
    if isinstance(reply, list):
        return dict(zip(reply[::2], reply[1::2], strict=True))
    return reply or {}


def _redis_url(url: str, cluster: bool) -> tuple[str, bool]:
    """``url`` as redis-py takes it, and whether it is a cluster's (``cluster``, or a
    ``redis+cluster://`` URL); :class:`ConfigurationError`, never a password, for one that
    cannot be parsed or that a cluster cannot take."""
    shown = redact(url)
    accepted = "use redis://, rediss://, unix://, redis+cluster:// or rediss+cluster://"
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigurationError(f"not a Redis URL: {shown!r}: {exc}; {accepted}") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigurationError(f"not a Redis URL: {shown!r}; {accepted}")
    try:
        parts.port  # noqa: B018 - urllib checks the port when it is read
    except ValueError:
        raise ConfigurationError(
            f"not a Redis URL: {shown!r}: its port is not a number from 0 to 65535"
        ) from None
    cluster = cluster or _SCHEMES[scheme]
    if scheme == "unix":
        if cluster:
            raise ConfigurationError(f"{shown!r}: a Redis Cluster is reached over TCP, not unix://")
    else:
        db = parts.path.strip("/")
        if db and not (db.isascii() and db.isdigit()):
            raise ConfigurationError(
                f"not a Redis URL: {shown!r}: the database, after the host, must be a number"
            )
        if cluster:
            parts = parts._replace(scheme=scheme.removesuffix("+cluster"))
            url = urlunsplit(parts)
    try:
        options = _redis_module().connection.parse_url(url)
    except ValueError as exc:
        raise ConfigurationError(f"not a Redis URL: {shown!r}: {redact(str(exc))}") from None
    if cluster:
        if options.get("db", 0) != 0:
            raise ConfigurationError(
                f"{shown!r}: a Redis Cluster has database 0 only, got {options['db']}"
            )
        # redis-py's cluster client drops the options it does not know, silently.
        unknown = sorted(set(options) - set(_redis_module().cluster.REDIS_ALLOWED_KEYS))
        if unknown:
            raise ConfigurationError(f"not a Redis URL: {shown!r}: unknown options {unknown}")
    return url, cluster


def _is_cluster(client: Any) -> bool:
    module = _redis_module()
    return isinstance(client, (module.cluster.RedisCluster, module.asyncio.cluster.RedisCluster))


def _describe(client: Any) -> str:
    """``redis://host:port/db`` for a client (``redis+cluster://`` a seed node of a cluster's),
    never with its password."""
    if _is_cluster(client):
        node = client.get_default_node()
        if node is None:  # an asyncio cluster client not used yet
            node = next(iter(client.nodes_manager.startup_nodes.values()), None)
        if node is None:
            return "redis+cluster://"
        return f"redis+cluster://{node.host}:{node.port}"
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


def _client_options(timeout: float, *, asynchronous: bool) -> dict[str, Any]:
    """Options of the clients a store makes from a URL (the URL's own query overrides them).

    ``timeout`` bounds every wait on the server: connecting, and each reply. redis-py retries
    a command whose connection failed; an append whose reply was lost would then be stored
    again (harmless for messages with ids, not for others), and the wait would double. So no
    retries: a failure is one clean StoreUnavailableError, and the next call reconnects (the
    pool replaces connections the server closed).

    Maintenance notifications (a Redis Enterprise feature, "auto" by default over RESP3) are
    off: they stretch the timeouts during a maintenance, and while on, redis-py 8 stops
    checking that an idle pooled connection is still open, so the first calls after a server
    restart would fail.
    """
    from redis.backoff import NoBackoff
    from redis.maint_notifications import MaintNotificationsConfig

    if asynchronous:
        from redis.asyncio.retry import Retry as AsyncRetry

        retry: Any = AsyncRetry(NoBackoff(), 0)
    else:
        from redis.retry import Retry

        retry = Retry(NoBackoff(), 0)
    return {
        "retry": retry,
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }


class _RedisBase:
    """Everything but the I/O: keys, arguments, the flows of each operation, decoding."""

    _client: Any

    def __init__(
        self,
        url: str | None,
        client: Any,
        asynchronous: bool,
        prefix: str,
        ttl: float | None,
        max_messages: int | None,
        timeout: float,
        cluster: bool,
        clock: Callable[[], float],
    ) -> None:
        module = _redis_module()
        name = type(self).__name__
        if asynchronous:
            plain, clustered = module.asyncio.Redis, module.asyncio.cluster.RedisCluster
            cluster_client = "a redis.asyncio.cluster.RedisCluster"
            wanted = f"a redis.asyncio.Redis client or {cluster_client}"
        else:
            plain, clustered = module.Redis, module.cluster.RedisCluster
            cluster_client = "a redis.cluster.RedisCluster"
            wanted = f"a redis.Redis client or {cluster_client}"
        if (url is None) == (client is None):
            raise ConfigurationError(
                f"{name} takes a url or a client, exactly one; got "
                f"{'neither' if url is None else 'both'}"
            )
        if url is not None and not isinstance(url, str):
            raise ConfigurationError(f"url must be a redis:// URL string, got {type(url).__name__}")
        if client is not None and not isinstance(client, (plain, clustered)):
            raise ConfigurationError(
                f"{name} takes {wanted}, got {type(client).__module__}.{type(client).__qualname__}"
            )
        if not isinstance(cluster, bool):
            raise ConfigurationError(f"cluster must be True or False, got {cluster!r}")
        check_retention(ttl, max_messages)
        self.timeout = check_timeout(timeout)
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"prefix must be 1 to 100 ASCII letters, digits or _ . : @ + = -, got {prefix!r}"
            )
        self._make: Callable[[], Any] | None = None
        if url is not None:
            target, cluster = _redis_url(url, cluster)
            self.url = redact(url)
            options = _client_options(self.timeout, asynchronous=asynchronous)
            factory = clustered if cluster else plain

            def make() -> Any:
                return factory.from_url(target, **options)

            if cluster and not asynchronous:
                # A sync cluster client asks the cluster for its slots when it is made: made
                # at first use, so that making a store never waits on a server.
                self._make, client = make, None
            else:
                try:
                    client = make()
                    if not cluster:
                        # redis-py takes any query parameter, and fails on those it does not
                        # know at the first connection: make one (no I/O) to fail here.
                        pool = client.connection_pool
                        pool.connection_class(**pool.connection_kwargs)
                except (
                    ValueError,
                    TypeError,
                    module.RedisError,
                    module.exceptions.RedisClusterException,
                ) as exc:
                    raise ConfigurationError(
                        f"not a Redis URL: {self.url!r}: {redact(str(exc))}"
                    ) from None
        else:
            if cluster and not isinstance(client, clustered):
                raise ConfigurationError(
                    f"{name}(cluster=True) takes {cluster_client} client, "
                    f"got {type(client).__module__}.{type(client).__qualname__}"
                )
            cluster = isinstance(client, clustered)
            self.url = _describe(client)
        self.cluster = cluster
        self._client = client
        self._owns_client = url is not None
        self._connecting = threading.Lock()
        self._decoding(client is not None and _decodes(client))
        self._errors: tuple[type[BaseException], ...] = (
            module.RedisError,
            module.exceptions.RedisClusterException,
            OSError,
            asyncio.TimeoutError,  # an async call past its deadline (not an OSError on 3.10)
        )
        self._response_error: type[Exception] = module.ResponseError
        self._no_script: type[Exception] = module.exceptions.NoScriptError
        self.prefix = prefix
        self.ttl = ttl
        self.max_messages = max_messages
        self._clock = clock
        self._ttl_arg = "" if ttl is None else repr(float(ttl))
        self._expire_arg = "0" if ttl is None else str(math.ceil((ttl + EXPIRE_MARGIN) * 1000))
        self._keep_arg = str(max_messages or 0)
        self._head = f"{prefix}:{{"
        self._decoded: BoundedCache[bytes | str, tuple[Message, dict[str, Any] | None]] = (
            BoundedCache(DECODED_CHARACTERS, weight_of_text)
        )
        self._elements: BoundedCache[bytes | str, _Turn] = BoundedCache(_ELEMENT_CACHE_SIZE)
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, prefix={self.prefix!r})"

    def _connected(self) -> Any:
        """The client; a sync cluster client made from a URL is made here, at first use."""
        client = self._client
        if client is None:
            with self._connecting:
                if self._client is None:
                    assert self._make is not None
                    made = self._make()
                    self._decoding(_decodes(made))
                    self._client = made
                client = self._client
        return client

    def _decoding(self, decodes: bool) -> None:
        """Read replies as the client gives them: str if it decodes responses, else bytes."""
        self._decodes_responses = decodes
        names = ("updated", "count", "strim", "prelude")
        self._state_fields: tuple[bytes | str, ...] = (
            names if decodes else tuple(name.encode() for name in names)
        )
        self._metadata_prefix: bytes | str = _META_FIELD if decodes else _META_FIELD.encode()

    # -- keys and arguments -------------------------------------------------------------------

    def _keys(self, session_id: str) -> tuple[str, ...]:
        check_session_id(session_id)
        head = f"{self._head}{session_id}}}:"
        return tuple(head + suffix for suffix in _SUFFIXES)

    def _clocked(self) -> tuple[str, str]:
        return repr(float(self._clock())), self._ttl_arg

    def _session_of(self, key: bytes | str) -> str | None:
        """The session id in one of this store's keys (``None`` for another key)."""
        text = _text(key)
        if not text.startswith(self._head):
            return None
        session_id, sep, suffix = text[len(self._head) :].rpartition("}:")
        if not sep or suffix not in _SUFFIXES:
            return None
        try:
            return check_session_id(session_id)
        except InvalidSessionIdError:
            return None  # not a key this store wrote

    def _error(self, exc: BaseException, doing: str) -> ZerdaError:
        """The Zerda error for a redis-py error (the caller chains it)."""
        text = redact(str(exc))
        where = f"Redis store {self.url}: cannot {doing}"
        # A pipeline's error reads "Command # 2 (...) of pipeline caused error: WRONGTYPE ...".
        corrupt = "WRONGTYPE" in text or "ZERDA-CORRUPT" in text
        if corrupt and isinstance(exc, self._response_error):
            return CorruptDataError(f"{where}: the stored data is not what Zerda writes: {text}")
        return StoreUnavailableError(f"{where}: {type(exc).__name__}: {text}")

    def _closed_error(self) -> StoreUnavailableError:
        return StoreUnavailableError(f"Redis store {self.url} is closed")

    # -- from requests to I/O, written once for both drivers ----------------------------------

    def _ops(self, flow: _Flow[_T]) -> _Ops[_T]:
        """The I/O of ``flow``, request by request."""
        reply: Any = None
        while True:
            try:
                request = flow.send(reply)
            except StopIteration as stop:
                result: _T = stop.value
                return result
            reply = yield from self._perform(request)

    def _perform(self, request: _Request) -> _Ops[Any]:
        """One request's I/O. A script the server does not know (NOSCRIPT: a new or restarted
        server) did nothing, so its command runs again once the scripts are loaded."""
        if isinstance(request, _Call):  # the common case first, in short
            command = _evalsha(request)
            reply = yield _Command(command)
            if isinstance(reply, self._no_script):
                yield _LoadScripts()
                reply = yield _Command(command)
            if isinstance(reply, Exception):
                raise reply
            return reply
        if isinstance(request, _Scan):
            return (yield request)
        transaction = False
        if isinstance(request, _Calls):
            commands = tuple(_evalsha(call) for call in request.calls)
        else:
            commands = tuple(c if isinstance(c, tuple) else _evalsha(c) for c in request.commands)
            transaction = len(commands) > 1
        if len(commands) == 1:
            replies: list[Any] = [(yield _Command(commands[0]))]
        else:
            replies = list((yield _Pipeline(commands, transaction)))
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, self._no_script)]
        if missing:
            yield _LoadScripts()
            if transaction:  # the reads beside the script ran: run the whole block again
                replies = list((yield _Pipeline(commands, transaction)))
            else:
                again = [commands[i] for i in missing]
                if len(again) == 1:
                    replies[missing[0]] = yield _Command(again[0])
                else:
                    fresh = yield _Pipeline(tuple(again), False)
                    for i, reply in zip(missing, fresh, strict=True):
                        replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    # -- encoding and decoding ----------------------------------------------------------------

    @staticmethod
    def _entries(
        messages: Sequence[Message], given: TokenCounts
    ) -> tuple[list[bytes], list[dict[str, Any] | None]]:
        """Each message's stored entry, and its counts (as a tail decodes them)."""
        n = len(messages)
        counts: list[dict[str, Any] | None]
        if not given:
            heads, counts = [""] * n, [None] * n
        elif len(given) == 1:
            # The common case, one counter: format the objects directly (check_batch made sure
            # the counts are ints).
            ((name, column),) = given.items()
            key = json.dumps(name)
            heads = [f"{{{key}:{c}}}" for c in column]
            counts = [{name: c} for c in column]
        else:
            counts = [{name: c[i] for name, c in given.items()} for i in range(n)]
            heads = [json.dumps(c, separators=(",", ":")) for c in counts]
        # Message checks its text is valid Unicode, so every entry has a UTF-8 form.
        return [
            f"{head}\n{m.to_json()}".encode() for m, head in zip(messages, heads, strict=True)
        ], counts

    @staticmethod
    def _pieces(messages: Sequence[Message], entries: Sequence[bytes]) -> tuple[int, list[bytes]]:
        """The batch cut where turns start, as the append script takes it: how many new turns,
        and the elements (leading system messages, what follows them up to the first user
        message, each new turn), then each system message's entry."""
        n = len(messages)
        system = [m.role in PINNED for m in messages]
        users = [i for i, m in enumerate(messages) if m.role is _USER]
        first_user = users[0] if users else n
        first_other = next((i for i in range(first_user) if not system[i]), first_user)

        def element(begin: int, end: int) -> bytes:
            if begin == end:
                return b""
            head = f"{end - begin},{sum(system[begin:end])}".encode()
            return _NUL.join([head, *entries[begin:end]])

        turns = [element(a, b) for a, b in itertools.pairwise([*users, n])]
        return len(turns), [
            element(0, first_other),
            element(first_other, first_user),
            *turns,
            *(entries[i] for i in range(n) if system[i]),
        ]

    def _append_args(
        self, messages: Sequence[Message], entries: Sequence[bytes]
    ) -> tuple[Arg, ...]:
        groups, elements = self._pieces(messages, entries)
        named: list[Arg] = []
        for offset, m in enumerate(messages):
            if m.id is not None:
                named += (m.id, "s" if m.role in PINNED else offset)
        return (
            *self._clocked(),
            self._expire_arg,
            self._keep_arg,
            len(messages),
            groups,
            len(named) // 2,
            *named,
            *elements,
        )

    def _remember(
        self, entries: Sequence[bytes], messages: Sequence[Message], counts: Sequence[Any]
    ) -> None:
        """Let the next tail find a batch just written already decoded."""
        if self._decodes_responses:
            keys: Iterable[bytes | str] = (entry.decode() for entry in entries)
        else:
            keys = entries
        self._decoded.put_many(list(zip(keys, zip(messages, counts, strict=True), strict=True)))

    def _entry(
        self, raw: bytes | str, session_id: str, remember: bool = True
    ) -> tuple[Message, dict[str, Any] | None]:
        hit = self._decoded.get(raw)
        if hit is None:
            hit = self._decoded.recall(raw)
        if hit is not None:
            return hit
        try:
            text = _text(raw)
            head, sep, body = text.partition("\n")
            if not sep:
                raise ValueError(f"no newline in {text[:60]!r}")
            message = Message.from_json(body)
            counts = json.loads(head) if head else None
            if counts is not None and not isinstance(counts, dict):
                raise ValueError(f"token counts are not a JSON object: {head[:60]!r}")
        except (ValueError, TypeError) as exc:  # InvalidMessageError is a ValueError
            raise self._corrupt(session_id, f"an entry cannot be decoded: {exc}") from exc
        hit = (message, counts)
        if remember:
            self._decoded.put(raw, hit)
        return hit

    def _element(self, raw: bytes | str, session_id: str, remember: bool = True) -> _Turn:
        """A log element, decoded."""
        hit = self._elements.get(raw)
        if hit is None:
            hit = self._elements.recall(raw)
        if hit is not None:
            return hit
        parts = _parts(raw)
        head = _text(parts[0])
        sizes = head.split(",")
        if (
            len(sizes) != 2
            or not all(x.isdigit() for x in sizes)
            or not 0 < int(sizes[0]) == len(parts) - 1
        ):
            raise self._corrupt(session_id, f"a log element starts {head[:40]!r}")
        decoded = [self._entry(entry, session_id, remember) for entry in parts[1:]]
        shown = [(m, c) for m, c in decoded if m.role not in PINNED]
        hit = _Turn(
            tuple(m for m, _ in decoded),
            tuple(m for m, _ in shown),
            tuple(c for _, c in shown),
        )
        if remember:
            self._elements.put(raw, hit)
        return hit

    def _corrupt(self, session_id: str, what: str) -> CorruptDataError:
        return CorruptDataError(f"Redis store {self.url}: session {session_id!r}: {what}")

    def _meta(self, session_id: str, fields: Sequence[Any]) -> list[int] | None:
        """``updated`` checked (``None``: no live session), then the integer fields after it."""
        if not fields or fields[0] is None:
            return None
        try:
            if self.ttl is not None and float(fields[0]) + self.ttl <= self._clock():
                return None
            return [int(x) for x in fields[1:]]
        except (TypeError, ValueError) as exc:
            raise self._corrupt(session_id, f"its meta key reads {list(fields)!r:.200}") from exc

    def _metadata(self, session_id: str, fields: Mapping[Any, Any]) -> dict[str, Any]:
        """The session metadata in a meta hash read whole (see :func:`_pairs`)."""
        metadata: dict[str, Any] = {}
        prefix = self._metadata_prefix
        for name, value in fields.items():
            if name[:2] == prefix:
                try:
                    metadata[json.loads(name[2:])] = json.loads(value)
                except (ValueError, RecursionError) as exc:
                    raise self._corrupt(
                        session_id, f"its metadata field {name!r} cannot be decoded: {exc}"
                    ) from exc
        return metadata

    def _value(self, session_id: str, key: str, raw: bytes | str) -> Any:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise self._corrupt(
                session_id, f"its metadata {key!r} cannot be decoded: {exc}"
            ) from exc

    # -- the operations, written once ----------------------------------------------------------

    def _append(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        then_tail: tuple[int | None, str | None] | None = None,
    ) -> _Flow[tuple[int, Tail | None]]:
        """The append, and with ``then_tail`` (turns, counter) the tail right after it, in
        the same MULTI/EXEC. One round trip, unless the session holds some, not all, of the
        batch's ids: the script then writes nothing and names them, and the batch goes again
        without them."""
        check_batch(messages, tokens)
        keys = self._keys(session_id)
        entries, counts = self._entries(messages, tokens or {})
        kept = list(range(len(messages)))
        batch: Sequence[Message] = messages
        sent: Sequence[bytes] = entries
        reads = () if then_tail is None else self._tail_commands(keys, then_tail[0])
        while True:
            call = _Call("append", keys, self._append_args(batch, sent))
            if then_tail is None:
                reply = yield call
            else:
                replies = yield _Multi((call, *reads))
                reply = replies[0]
            if not isinstance(reply, list):
                break
            named = [i for i in kept if messages[i].id is not None]
            held = {named[int(n) - 1] for n in reply}
            kept = [i for i in kept if i not in held]
            batch, sent = [messages[i] for i in kept], [entries[i] for i in kept]
        stored = int(reply)
        if stored:
            self._remember(sent, batch, [counts[i] for i in kept])
        if then_tail is None:
            return stored, None
        return stored, self._tail_of(session_id, replies[1:], then_tail[0], then_tail[1])

    @staticmethod
    def _tail_commands(keys: Sequence[str], turns: int | None) -> tuple[tuple[Arg, ...], ...]:
        meta, log, system = keys[:3]
        commands: list[tuple[Arg, ...]] = [
            ("HGETALL", meta),
            ("LLEN", log),
            ("LRANGE", system, 0, -1),
        ]
        if turns is None or turns > 0:
            commands.append(("LRANGE", log, 0 if turns is None else -turns, -1))
        return tuple(commands)

    def _tail(self, session_id: str, turns: int | None, counter: str | None) -> _Flow[Tail]:
        replies = yield _Multi(self._tail_commands(self._keys(session_id), turns))
        return self._tail_of(session_id, replies, turns, counter)

    def _tail_of(
        self, session_id: str, replies: Sequence[Any], turns: int | None, counter: str | None
    ) -> Tail:
        """The tail from the replies to :meth:`_tail_commands`."""
        fields = _pairs(replies[0])
        get = fields.get
        state = self._meta(session_id, [get(name) for name in self._state_fields])
        if state is None:
            return empty_tail()
        count, strim, prelude = state
        total_turns = int(replies[1]) - prelude
        n = total_turns if turns is None else min(max(0, turns), total_turns)
        elements = replies[3][len(replies[3]) - n :] if n > 0 else []
        messages: list[Message] = []
        offsets: list[int] = []
        tokens: list[int | None] = []
        element = self._element
        for raw in elements:
            turn = element(raw, session_id)
            if turn.every[0].role in PINNED:
                raise self._corrupt(session_id, "an element of its log does not start a turn")
            offsets.append(len(messages))
            messages.extend(turn.shown)
            if counter is not None:
                tokens.extend([c.get(counter) if c else None for c in turn.counts])
        pinned = [self._entry(raw, session_id) for raw in replies[2]]
        system_tokens: list[int | None] = []
        if counter is not None:
            system_tokens = [counts.get(counter) if counts else None for _, counts in pinned]
        return Tail(
            tuple(m for m, _ in pinned),
            messages,
            offsets,
            total_turns,
            strim + count,
            tokens if counter is not None else (),
            system_tokens if counter is not None else (),
            self._metadata(session_id, fields),
        )

    def _history(self, session_id: str) -> _Flow[list[Message]]:
        meta, log, system = self._keys(session_id)[:3]
        replies = yield _Multi(
            (("HMGET", meta, "updated", "strim"), ("LRANGE", system, 0, -1), ("LRANGE", log, 0, -1))
        )
        fields = self._meta(session_id, replies[0])
        if fields is None:
            return []
        # A whole session would flush the caches of the tails that memories read again.
        out = [self._entry(raw, session_id, remember=False)[0] for raw in replies[1][: fields[0]]]
        for raw in replies[2]:
            out.extend(self._element(raw, session_id, remember=False).every)
        return out

    def _get_metadata(self, session_id: str) -> _Flow[dict[str, Any]]:
        (reply,) = yield _Multi((("HGETALL", self._keys(session_id)[0]),))
        fields = _pairs(reply)
        if self._meta(session_id, [fields.get(self._state_fields[0])]) is None:
            return {}
        return self._metadata(session_id, fields)

    def _update_metadata(self, session_id: str, values: Mapping[str, Any]) -> _Flow[None]:
        copied = metadata_copy(values)
        keys = self._keys(session_id)
        pairs: list[str] = []
        for key, value in copied.items():
            # Canonical JSON: compare_and_set compares texts first; "" (deletes) is never JSON.
            pairs += (_field(key), "" if value is None else canonical_json(value))
        yield _Call("update_metadata", keys, (*self._clocked(), self._expire_arg, *pairs))

    def _compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> _Flow[bool]:
        copied = metadata_copy({key: value}, reserved=True)[key]
        wanted = metadata_copy({key: expected}, reserved=True)[key]
        keys = self._keys(session_id)
        new = "" if copied is None else canonical_json(copied)
        old: Arg = "" if wanted is None else canonical_json(wanted)
        mode = "json"
        while True:
            args = (*self._clocked(), self._expire_arg, _field(key), old, new, mode)
            reply = yield _Call("compare_and_set", keys, args)
            if not isinstance(reply, list):
                return bool(int(reply))
            # The script could not tell: compare here, and if the values are the same, set it
            # if the field still holds that very text (else look again).
            (current,) = reply
            if not same_json(self._value(session_id, key, current), wanted):
                return False
            old, mode = current, "text"

    def _list_sessions(self) -> _Flow[list[SessionInfo]]:
        found = yield _Scan(f"{self._head}*}}:meta")
        ids = sorted({s for s in map(self._session_of, found) if s is not None})
        clocked = self._clocked()
        out: list[SessionInfo] = []
        for chunk in _chunks(ids, _PIPELINE_SIZE):
            replies = yield _Calls(tuple(_Call("info", self._keys(s), clocked) for s in chunk))
            for session_id, reply in zip(chunk, replies, strict=True):
                if not reply:
                    continue  # expired, or deleted since the scan
                try:
                    created, updated = float(reply[0]), float(reply[1])
                    messages, turns = int(reply[2]), int(reply[3])
                except (TypeError, ValueError) as exc:
                    raise self._corrupt(session_id, f"its meta key reads {reply!r:.200}") from exc
                expires = None if self.ttl is None else updated + self.ttl
                out.append(SessionInfo(session_id, messages, turns, created, updated, expires))
        return out

    def _delete_session(self, session_id: str) -> _Flow[bool]:
        reply = yield _Call("delete", self._keys(session_id), self._clocked())
        return bool(reply)

    # -- editing the log ------------------------------------------------------------------------

    def _delete_messages(self, session_id: str, ids: Collection[str]) -> _Flow[int]:
        """One script: the messages go, what is left is laid out again (O(the session))."""
        wanted = list(dict.fromkeys(check_ids(ids)))
        keys = self._keys(session_id)
        if not wanted:
            return 0
        reply = yield _Call("delete_messages", keys, (*self._clocked(), self._expire_arg, *wanted))
        return int(reply)

    def _pop_turn(self, session_id: str) -> _Flow[list[Message]]:
        """One script, O(the newest turn)."""
        reply = yield _Call(
            "pop_turn", self._keys(session_id), (*self._clocked(), self._expire_arg)
        )
        return [self._entry(raw, session_id, remember=False)[0] for raw in reply]

    def _edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> _Flow[Message]:
        """Read the message, edit it here (``edited`` checks the content and stamps it), then
        store it with a script that does so only if the message is still there as read; else
        read it again. Two round trips; an edit or delete in between is never overwritten."""
        keys = self._keys(session_id)
        while True:
            found = yield from self._find(session_id, keys, message_id)
            if found is None:
                raise message_not_found(session_id, message_id)
            old, message, where, at = found
            now = self._clock()
            new = edited(message, content, now)
            entry = f"\n{new.to_json()}".encode()  # its token counts dropped
            args = (
                repr(float(now)),
                self._ttl_arg,
                self._expire_arg,
                "" if where is None else where,
                "" if at is None else at,
                old,
                entry,
            )
            if int((yield _Call("edit_message", keys, args))):
                self._remember([entry], [new], [None])
                return new

    def _find(
        self, session_id: str, keys: Sequence[str], message_id: str
    ) -> _Flow[tuple[bytes | str, Message, int | None, int | None] | None]:
        """The message ``message_id`` of the session, read in one MULTI/EXEC: its stored entry,
        the message, the index of the log element holding it and its index in the system list
        (``None`` for none); ``None`` when the session holds no such message."""
        meta, log, system = keys[:3]
        replies = yield _Multi(
            (("HMGET", meta, "updated", "strim"), ("LRANGE", system, 0, -1), ("LRANGE", log, 0, -1))
        )
        fields = self._meta(session_id, replies[0])
        if fields is None:
            return None
        strim = fields[0]
        for at, raw in enumerate(replies[1][:strim]):
            message = self._entry(raw, session_id, remember=False)[0]
            if message.id == message_id:
                return raw, message, None, at
        pinned = strim  # the system list's index of the next system message in the log
        for where, raw in enumerate(replies[2]):
            turn = self._element(raw, session_id, remember=False)
            for i, message in enumerate(turn.every):
                is_pinned = message.role in PINNED
                if message.id == message_id:
                    return _parts(raw)[i + 1], message, where, pinned if is_pinned else None
                pinned += is_pinned
        return None

    def _fork(self, session_id: str, new_session_id: str, at: str | None) -> _Flow[int]:
        """Two steps, as the sessions may live on two nodes of a cluster: the source's log,
        counts and metadata read in one MULTI/EXEC (one instant), then the new session written
        by one script that first checks it holds nothing (at once, or not at all)."""
        target = self._keys(new_session_id)
        meta, log, system = self._keys(session_id)[:3]
        replies = yield _Multi(
            (("HGETALL", meta), ("LRANGE", system, 0, -1), ("LRANGE", log, 0, -1))
        )
        fields = _pairs(replies[0])
        state = self._meta(session_id, [fields.get(name) for name in self._state_fields])
        raws: list[bytes | str] = []
        messages: list[Message] = []
        if state is not None:
            for raw in replies[1][: state[1]]:  # system messages retention dropped
                raws.append(raw)
                messages.append(self._entry(raw, session_id, remember=False)[0])
            for raw in replies[2]:
                raws.extend(_parts(raw)[1:])
                messages.extend(self._element(raw, session_id, remember=False).every)
        end = len(messages)
        if at is not None:
            end = next((i + 1 for i, m in enumerate(messages) if m.id == at), 0)
            if not end:
                raise message_not_found(session_id, at)
        del messages[end:]
        entries = [raw if isinstance(raw, bytes) else raw.encode() for raw in raws[:end]]
        # The copy laid out as an append of it to an empty session would lay it out.
        groups, pieces = self._pieces(messages, entries)
        elements = [p for p in pieces[:2] if p] + pieces[2 : 2 + groups]
        pinned = pieces[2 + groups :]
        named: list[Arg] = []
        for i, m in enumerate(messages):
            if m.id is not None:
                named += ("inf" if m.role in PINNED else i, m.id)
        copied: list[Arg] = []
        if state is not None:
            prefix = self._metadata_prefix
            for name, value in fields.items():
                if name[:2] == prefix:
                    copied += (name, value)
        args = (
            *self._clocked(),
            self._expire_arg,
            "0" if state is None else "1",
            1 if pieces[0] else 0,
            len(messages),
            len(elements),
            len(pinned),
            len(named) // 2,
            len(copied) // 2,
            *elements,
            *pinned,
            *named,
            *copied,
        )
        if not int((yield _Call("fork", target, args))):
            raise session_exists(new_session_id)
        return len(messages)

    def _clear(self) -> _Flow[None]:
        # Every key of the prefix, meta or not: remains of evicted sessions go too.
        found = yield _Scan(f"{self._head}*}}:*")
        ids = sorted({s for s in map(self._session_of, found) if s is not None})
        clocked = self._clocked()
        for chunk in _chunks(ids, _PIPELINE_SIZE):
            yield _Calls(tuple(_Call("delete", self._keys(s), clocked) for s in chunk))

    def _purge_expired(self) -> _Flow[int]:
        if self.ttl is None:
            return 0
        found = yield _Scan(f"{self._head}*}}:meta")
        ids = sorted({s for s in map(self._session_of, found) if s is not None})
        clocked = self._clocked()
        purged = 0
        for chunk in _chunks(ids, _PIPELINE_SIZE):
            replies = yield _Calls(tuple(_Call("purge", self._keys(s), clocked) for s in chunk))
            purged += sum(int(r) for r in replies)
        return purged


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    return (items[i : i + size] for i in range(0, len(items), size))


def _decodes(client: Any) -> bool:
    return bool(client.get_encoder().decode_responses)


def open_redis_url(url: str, **options: Any) -> RedisStore:
    """A :class:`RedisStore` for ``url``, which may name its key prefix: ``?prefix=NAME``
    (what ``open_store`` and ``zerda --db`` accept; every other part goes to redis-py).
    ``redis+cluster://host:port`` (or ``rediss+cluster://``) opens a Redis Cluster from that
    seed node."""
    url = _prefix_option(url, options)
    return RedisStore(url, **options)


def open_async_redis_url(url: str, **options: Any) -> AsyncRedisStore:
    """The :class:`AsyncRedisStore` of the same ``url`` as :func:`open_redis_url` takes."""
    url = _prefix_option(url, options)
    return AsyncRedisStore(url, **options)


def _prefix_option(url: str, options: dict[str, Any]) -> str:
    """``url`` without its ``?prefix=NAME``, which goes into ``options``."""
    if not isinstance(url, str):
        raise ConfigurationError(f"url must be a redis:// URL string, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
    except ValueError:
        return url  # the store says what is wrong with it
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [value for name, value in query if name == "prefix"]
    if prefixes:
        options.setdefault("prefix", prefixes[-1])
        rest = urlencode([(name, value) for name, value in query if name != "prefix"])
        url = urlunsplit(parts._replace(query=rest))
    return url


class RedisStore(_RedisBase, ClosingStore):
    """Sessions in Redis or Redis Cluster, shared by any number of workers.

    Give a ``url`` (``redis://[:password@]host:port/db``, ``rediss://`` for TLS,
    ``unix:///path.sock``; ``redis+cluster://host:port`` or ``cluster=True`` for a Redis
    Cluster, from that seed node) or a ``client`` (a ``redis.Redis`` or a
    ``redis.cluster.RedisCluster``, which the store uses as it is and never closes).

    Each ``append`` is one Lua script call: the batch, its token counts, the turn index,
    retention and expiry in one atomic step, so concurrent writers never interleave and a call
    that fails stores nothing. A message whose ``id`` the session already holds is skipped in
    that same step, so a retry of an append whose reply was lost stores nothing twice. Each
    ``tail`` is one MULTI/EXEC reading the newest turns, the pinned system messages and the
    session's metadata, whatever the session's length; ``append_then_tail`` is both in one
    MULTI/EXEC. ``compare_and_set`` is one script: metadata values are stored as canonical
    JSON, compared as text, or as JSON values when the texts differ. Every call is one round
    trip, but listing, clearing and purging (and an append of a batch the session holds part
    of: the script stores nothing and names the held ids, and the rest goes again).

    Editing the log: ``delete_messages`` and ``pop_turn`` are one script each.
    ``edit_message`` reads the message, edits it here and stores it by a script that first
    checks it is still there as read (else it reads again); ``fork`` reads the source in one
    MULTI/EXEC and writes the new session by one script (on a cluster the two may live on two
    nodes), so the copy is the source as it was at one instant.

    Keys are ``{prefix}:{session_id}:meta|log|system|ids``: the braces keep a session in one
    hash slot, so on a cluster every script and MULTI/EXEC runs on one node. Listing, clearing
    and purging SCAN the prefix's keys on every primary: O(keys in the database), for admin
    work; ``clear`` is not atomic against concurrent writers.

    ``ttl`` and ``max_messages`` behave as in :class:`~zerda.stores.InMemoryStore`; with a
    ``ttl``, each write also sets Redis's own expiry on the session's keys (ttl +
    :data:`EXPIRE_MARGIN`), so abandoned sessions free their memory unpurged.

    ``timeout`` (seconds, default 5) bounds every wait on the server of a client the store
    makes from a URL: connecting and each reply (the URL's ``socket_timeout`` and
    ``socket_connect_timeout`` win if it sets them). A server that cannot be reached, or that
    stops answering, raises :class:`~zerda.StoreUnavailableError` within it (the URL without
    its password, redis-py's error chained); once it is back, the same store works again.
    Such a client does not retry: a write whose reply was lost may have been applied, and is
    the caller's to retry (messages with ids are then stored once). A given ``client`` keeps
    its own timeouts and retries. Stored data that is not Zerda's raises
    :class:`~zerda.CorruptDataError`.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | redis.cluster.RedisCluster | None = None,
        prefix: str = "zerda",
        ttl: float | None = None,
        max_messages: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        cluster: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(url, client, False, prefix, ttl, max_messages, timeout, cluster, clock)

    @property
    def client(self) -> redis.Redis | redis.cluster.RedisCluster:
        """The redis-py client (a cluster client made from a URL connects when first used)."""
        try:
            client: redis.Redis | redis.cluster.RedisCluster = self._connected()
        except self._errors as exc:
            raise self._error(exc, "connect") from exc
        return client

    def _drive(self, flow: _Flow[_T], doing: str) -> _T:
        if self._closed:
            raise self._closed_error()
        ops = self._ops(flow)
        reply: Any = None
        try:
            while True:
                try:
                    op = ops.send(reply)
                except StopIteration as stop:
                    result: _T = stop.value
                    return result
                reply = self._do(op)
        except self._errors as exc:
            raise self._error(exc, doing) from exc

    def _do(self, op: _Op) -> Any:
        client = self._connected()
        if isinstance(op, _Command):
            try:
                return client.execute_command(*op.args)
            except self._response_error as exc:
                return exc
        if isinstance(op, _Pipeline):
            with client.pipeline(transaction=op.transaction) as pipe:
                for args in op.commands:
                    pipe.execute_command(*args)
                return pipe.execute(raise_on_error=False)
        if isinstance(op, _LoadScripts):
            for source in SCRIPTS.values():
                client.script_load(source)
            return None
        return list(client.scan_iter(match=op.match, count=1000))

    # -- the contract ----------------------------------------------------------------------------

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        stored, _ = self._drive(
            self._append(session_id, messages, tokens), f"append to {session_id!r}"
        )
        return stored

    def append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        stored, tail = self._drive(
            self._append(session_id, messages, tokens, (turns, counter)),
            f"append to {session_id!r}",
        )
        assert tail is not None
        return stored, tail

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return self._drive(self._tail(session_id, turns, counter), f"read {session_id!r}")

    def history(self, session_id: str) -> list[Message]:
        return self._drive(self._history(session_id), f"read {session_id!r}")

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        return self._drive(self._get_metadata(session_id), f"read {session_id!r}")

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        self._drive(self._update_metadata(session_id, values), f"write {session_id!r}")

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        return self._drive(
            self._compare_and_set(session_id, key, expected, value), f"write {session_id!r}"
        )

    def list_sessions(self) -> list[SessionInfo]:
        return self._drive(self._list_sessions(), "list sessions")

    def delete_session(self, session_id: str) -> bool:
        return self._drive(self._delete_session(session_id), f"delete {session_id!r}")

    def delete_messages(self, session_id: str, ids: Collection[str]) -> int:
        """One script: the messages go with their counts and ids, and what is left is laid
        out again (its turns recomputed); O(the session), like a history read."""
        return self._drive(
            self._delete_messages(session_id, ids), f"delete messages of {session_id!r}"
        )

    def pop_turn(self, session_id: str) -> list[Message]:
        """One script, O(the newest turn)."""
        return self._drive(self._pop_turn(session_id), f"pop a turn of {session_id!r}")

    def fork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        """Two atomic steps, as the two sessions may live on two nodes of a cluster: the
        source's log, token counts and metadata are read at one instant (one MULTI/EXEC), then
        the new session is written at once by one script, which writes nothing and raises
        :class:`~zerda.SessionExistsError` if it holds messages or metadata by then. A write to
        the source between the two steps is not in the copy."""
        return self._drive(
            self._fork(session_id, new_session_id, at),
            f"fork {session_id!r} into {new_session_id!r}",
        )

    def edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        """The message read (one MULTI/EXEC) and edited here, then stored by one script only
        if it is still there as read (else read again): a concurrent edit or delete is never
        overwritten."""
        return self._drive(
            self._edit_message(session_id, message_id, content), f"edit {session_id!r}"
        )

    def clear(self) -> None:
        self._drive(self._clear(), "clear")

    def purge_expired(self) -> int:
        return self._drive(self._purge_expired(), "purge expired sessions")

    def close(self) -> None:
        """Close the client the store made (not one it was given); later calls raise."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client and self._client is not None:
            self._client.close()


class AsyncRedisStore(_RedisBase, AsyncClosingStore):
    """The async protocol over ``redis.asyncio``: :class:`RedisStore`'s keys, scripts and
    behaviour (``timeout`` and ``cluster`` too), each call awaited on the event loop (never a
    blocking call in ``async def``).

    Give a ``url`` or a ``client`` (a ``redis.asyncio.Redis`` or a
    ``redis.asyncio.cluster.RedisCluster``, never closed by the store). Like redis.asyncio's
    clients, a store belongs to the event loop that first uses it; on another loop it raises
    :class:`~zerda.ZerdaError` before sending anything. It has no sync methods on purpose: a
    memory over it uses its async methods natively. Close with ``await store.aclose()`` or
    ``async with``.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster | None = None,
        prefix: str = "zerda",
        ttl: float | None = None,
        max_messages: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        cluster: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(url, client, True, prefix, ttl, max_messages, timeout, cluster, clock)
        self.client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster = self._client
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _drive(self, flow: _Flow[_T], doing: str) -> _T:
        if self._closed:
            raise self._closed_error()
        # redis.asyncio's connections belong to the loop that opened them: on another loop
        # they fail in the middle of a command, after it may have been sent. Refuse up front.
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise ZerdaError(
                f"{self!r} was first used on another event loop, and redis.asyncio clients "
                "belong to one loop: make the store (and its client) in the loop that uses it"
            )
        ops = self._ops(flow)
        reply: Any = None
        try:
            while True:
                try:
                    op = ops.send(reply)
                except StopIteration as stop:
                    result: _T = stop.value
                    return result
                reply = await self._bounded(op)
        except self._errors as exc:
            raise self._error(exc, doing) from exc

    async def _bounded(self, op: _Op) -> Any:
        """``op``, given up ``timeout`` (+ a grace) after it started: a new connection's
        handshake and the command each wait up to ``timeout`` on the socket, and together they
        must not. Cancelled mid-read, redis-py drops the connection."""
        if not self._owns_client:
            return await self._do(op)  # a client of yours: its own timeouts
        if sys.version_info >= (3, 11):  # a deadline on this task, no task of its own
            async with asyncio.timeout(self.timeout + _GRACE):
                return await self._do(op)
        return await asyncio.wait_for(self._do(op), self.timeout + _GRACE)

    async def _do(self, op: _Op) -> Any:
        client: Any = self.client  # redis-py leaves execute_command untyped
        if self.cluster:
            # Learn the slots before any command: tasks that set a new client off together
            # would each start it, and redis-py 8.1 then closes connections others are using.
            await client.initialize()
        if isinstance(op, _Command):
            try:
                return await client.execute_command(*op.args)
            except self._response_error as exc:
                return exc
        if isinstance(op, _Pipeline):
            async with client.pipeline(transaction=op.transaction) as pipe:
                for args in op.commands:
                    pipe.execute_command(*args)
                return await pipe.execute(raise_on_error=False)
        if isinstance(op, _LoadScripts):
            for source in SCRIPTS.values():
                await client.script_load(source)
            return None
        return [key async for key in client.scan_iter(match=op.match, count=1000)]

    # -- the contract ----------------------------------------------------------------------------

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        stored, _ = await self._drive(
            self._append(session_id, messages, tokens), f"append to {session_id!r}"
        )
        return stored

    async def aappend_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        stored, tail = await self._drive(
            self._append(session_id, messages, tokens, (turns, counter)),
            f"append to {session_id!r}",
        )
        assert tail is not None
        return stored, tail

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return await self._drive(self._tail(session_id, turns, counter), f"read {session_id!r}")

    async def ahistory(self, session_id: str) -> list[Message]:
        return await self._drive(self._history(session_id), f"read {session_id!r}")

    async def aget_metadata(self, session_id: str) -> dict[str, Any]:
        return await self._drive(self._get_metadata(session_id), f"read {session_id!r}")

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        await self._drive(self._update_metadata(session_id, values), f"write {session_id!r}")

    async def acompare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        return await self._drive(
            self._compare_and_set(session_id, key, expected, value), f"write {session_id!r}"
        )

    async def alist_sessions(self) -> list[SessionInfo]:
        return await self._drive(self._list_sessions(), "list sessions")

    async def adelete_session(self, session_id: str) -> bool:
        return await self._drive(self._delete_session(session_id), f"delete {session_id!r}")

    async def adelete_messages(self, session_id: str, ids: Collection[str]) -> int:
        return await self._drive(
            self._delete_messages(session_id, ids), f"delete messages of {session_id!r}"
        )

    async def apop_turn(self, session_id: str) -> list[Message]:
        return await self._drive(self._pop_turn(session_id), f"pop a turn of {session_id!r}")

    async def afork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        """:meth:`RedisStore.fork`: the source read at one instant, then the new session
        written at once."""
        return await self._drive(
            self._fork(session_id, new_session_id, at),
            f"fork {session_id!r} into {new_session_id!r}",
        )

    async def aedit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        return await self._drive(
            self._edit_message(session_id, message_id, content), f"edit {session_id!r}"
        )

    async def aclear(self) -> None:
        await self._drive(self._clear(), "clear")

    async def apurge_expired(self) -> int:
        return await self._drive(self._purge_expired(), "purge expired sessions")

    async def aclose(self) -> None:
        """Close the client the store made (not one it was given); later calls raise."""
        if self._closed:
            return
        self._closed = True
        # A client opened on a loop that has ended has nothing left to close from here.
        if self._owns_client and self._loop in (None, asyncio.get_running_loop()):
            await self.client.aclose()
