-- Posts the body in BODY_FILE, with Inference-Header-Content-Length from IHCL if set.
local f = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.body = f:read("*all")
f:close()
wrk.method = "POST"
local ihcl = os.getenv("IHCL")
if ihcl and ihcl ~= "" then
  wrk.headers["Inference-Header-Content-Length"] = ihcl
  wrk.headers["Content-Type"] = "application/octet-stream"
else
  wrk.headers["Content-Type"] = "application/json"
end
