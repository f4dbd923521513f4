-- A small v2 JSON infer request for `simple`; with SEQ=1 each request carries a
-- sequence_id in the body (for tensorgate) and in X-Sequence-Id (for nginx's hash).
local seq = os.getenv("SEQ") == "1"
local data = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]"
local counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  counter = counter + 1
  local params = ""
  if seq then
    params = '"parameters":{"sequence_id":' .. counter .. '},'
    wrk.headers["X-Sequence-Id"] = tostring(counter)
  end
  local body = '{' .. params .. '"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":' .. data ..
    '},{"name":"INPUT1","shape":[1,16],"datatype":"INT32","data":' .. data .. '}]}'
  return wrk.format(nil, nil, nil, body)
end
