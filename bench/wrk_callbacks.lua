-- wrk script for the ingest benchmark: POSTs pre-signed callbacks, each line of the data file
-- once ("<signature>\t<body>"), and prints a JSON summary line prefixed "BENCHJSON ".
-- Usage: wrk -t T -c C -d D -s bench/wrk_callbacks.lua URL -- <data file> <T>
-- Each thread takes every T-th line, so no callback is sent twice unless the pool runs out
-- (then it wraps around, and the summary says how often).

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

function init(args)
  local path = args[1]
  local nthreads = tonumber(args[2]) or 1
  pool = {}
  local i = 0
  for line in io.lines(path) do
    if i % nthreads == id then
      local signature, body = line:match("^([^\t]*)\t(.*)$")
      pool[#pool + 1] = wrk.format("POST", nil, {
        ["Content-Type"] = "application/json",
        ["X-Processor-Signature"] = signature,
      }, body)
    end
    i = i + 1
  end
  if #pool == 0 then
    error("no callbacks in " .. path)
  end
  index = 0
  wraps = 0
  accepted = 0
  other = 0
end

function request()
  index = index + 1
  if index > #pool then
    index = 1
    wraps = wraps + 1
  end
  return pool[index]
end

function response(status, headers, body)
  if status == 202 then
    accepted = accepted + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local total_accepted, total_other, total_wraps = 0, 0, 0
  for _, thread in ipairs(threads) do
    total_accepted = total_accepted + thread:get("accepted")
    total_other = total_other + thread:get("other")
    total_wraps = total_wraps + thread:get("wraps")
  end
  local e = summary.errors
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_us":%d,"accepted":%d,"other_status":%d,"wraps":%d,' ..
    '"errors_connect":%d,"errors_read":%d,"errors_write":%d,"errors_timeout":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, total_accepted, total_other, total_wraps,
    e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
end
