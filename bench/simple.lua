-- A small v2 JSON infer request for `simple`; with SEQ=1 each request carries a
-- sequence_id in the body (for tensorgate) and in X-Sequence-Id (for nginx's hash), a new one
-- every SEQLEN requests (default 1).
local seq = os.getenv("SEQ") == "1"
local seqlen = tonumber(os.getenv("SEQLEN") or "1")
-- Each run starts its ids at SEQBASE, so that no run meets the pins an earlier one left.
local seqbase = tonumber(os.getenv("SEQBASE") or "0")
local data = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]"
local counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  counter = counter + 1
  local params = ""
  if seq then
    local id = seqbase + math.floor((counter - 1) / seqlen) + 1
    params = '"parameters":{"sequence_id":' .. id .. '},'
    wrk.headers["X-Sequence-Id"] = tostring(id)
  end
  local body = '{' .. params .. '"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":' .. data ..
    '},{"name":"INPUT1","shape":[1,16],"datatype":"INT32","data":' .. data .. '}]}'
  return wrk.format(nil, nil, nil, body)
end
