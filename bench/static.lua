-- The small v2 JSON infer request for `simple`, the same body every time: wrk sends it
-- without running Lua per request, so that the load generator costs as little as it can.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local data = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]"
wrk.body = '{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":' .. data ..
  '},{"name":"INPUT1","shape":[1,16],"datatype":"INT32","data":' .. data .. '}]}'
