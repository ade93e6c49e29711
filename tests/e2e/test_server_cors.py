# CORS as vLLM's server answers it (Starlette 1.10's CORSMiddleware under --allowed-origins, --allowed-methods,
# --allowed-headers, --allow-credentials): browsers' preflights get 200 with the Access-Control-Allow-* headers (or
# 400 naming what is disallowed), every response to a request with an Origin carries Access-Control-Allow-Origin,
# streams and errors included; requests without an Origin get only "Vary: Origin".
import json
import subprocess

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import BINARY, MODEL, Server

ORIGIN = "https://app.example"
PREFLIGHT_VARY = "Origin, Access-Control-Request-Method, Access-Control-Request-Headers, Access-Control-Request-Private-Network"


def preflight(base_url, path, origin=ORIGIN, method="POST", headers=None):
    h = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers is not None:
        h["Access-Control-Request-Headers"] = headers
    return httpx.request("OPTIONS", base_url + path, headers=h, timeout=30)


def test_defaults_allow_any_origin(server):
    r = preflight(server.base_url, "/v1/chat/completions", headers="authorization, content-type, x-stainless-os")
    assert r.status_code == 200 and r.text == "OK", r.text
    assert r.headers["access-control-allow-origin"] == "*" and r.headers["vary"] == PREFLIGHT_VARY
    assert r.headers["access-control-allow-methods"] == "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT, QUERY"
    assert r.headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"  # mirrored
    assert r.headers["access-control-max-age"] == "600"
    assert "access-control-allow-credentials" not in r.headers

    # Whole, streamed and error responses to a request with an Origin; none without one.
    r = httpx.get(server.base_url + "/v1/models", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*" and r.headers["vary"] == "Origin"
    r = httpx.get(server.base_url + "/v1/models")
    assert "access-control-allow-origin" not in r.headers and r.headers["vary"] == "Origin"
    body = {"prompt": "Hello", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, headers={"Origin": ORIGIN}) as r:
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
        assert any(line == "data: [DONE]" for line in r.iter_lines())
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": -1}, headers={"Origin": ORIGIN})
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == "*"
    # Cookies change nothing without --allow-credentials; Private Network Access preflights are refused.
    r = httpx.get(server.base_url + "/health", headers={"Origin": ORIGIN, "Cookie": "a=1"})
    assert r.headers["access-control-allow-origin"] == "*" and "access-control-allow-credentials" not in r.headers
    r = httpx.request("OPTIONS", server.base_url + "/v1/models", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "GET", "Access-Control-Request-Private-Network": "true"})
    assert r.status_code == 400 and r.text == "Disallowed CORS private-network"
    # OPTIONS without the preflight headers is not a preflight: the route's 405, with the CORS header.
    r = httpx.request("OPTIONS", server.base_url + "/v1/completions", headers={"Origin": ORIGIN})
    assert r.status_code == 405 and r.headers["access-control-allow-origin"] == "*"


def test_listed_origins_methods_headers_and_credentials():
    s = Server("--allowed-origins", json.dumps([ORIGIN, "http://localhost:3000"]), "--allowed-methods", '["GET", "POST"]',
               "--allowed-headers", '["Authorization", "X-Request-Id"]', "--allow-credentials", "--api-key", "k1")
    try:
        # A preflight needs no API key (browsers send none), as vLLM's authentication skips OPTIONS.
        r = preflight(s.base_url, "/v1/completions", headers="Authorization, content-type")
        assert r.status_code == 200 and r.text == "OK", r.text
        assert r.headers["access-control-allow-origin"] == ORIGIN and r.headers["vary"] == PREFLIGHT_VARY
        assert r.headers["access-control-allow-credentials"] == "true"
        assert r.headers["access-control-allow-methods"] == "GET, POST"
        # The listed headers plus the CORS-safelisted ones, sorted.
        assert r.headers["access-control-allow-headers"] == \
            "Accept, Accept-Language, Authorization, Content-Language, Content-Type, X-Request-Id"
        for kwargs, text in (({"origin": "https://evil.example"}, "Disallowed CORS origin"),
                             ({"method": "DELETE"}, "Disallowed CORS method"),
                             ({"headers": "authorization, x-other"}, "Disallowed CORS headers"),
                             ({"origin": "https://evil.example", "method": "PUT"}, "Disallowed CORS origin, method")):
            r = preflight(s.base_url, "/v1/completions", **kwargs)
            assert r.status_code == 400 and r.text == text, (kwargs, r.status_code, r.text)
            assert "access-control-allow-origin" not in r.headers or kwargs.get("origin") is None
        ok = {"Origin": "http://localhost:3000", "Authorization": "Bearer k1"}
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=ok)
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == "http://localhost:3000" and r.headers["vary"] == "Origin"
        assert r.headers["access-control-allow-credentials"] == "true"
        # A wrong key is still 401, readable by the page that sent it; an unlisted origin gets no allow-origin.
        r = httpx.get(s.base_url + "/v1/models", headers={"Origin": ORIGIN, "Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
        r = httpx.get(s.base_url + "/health", headers={"Origin": "https://evil.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    finally:
        assert s.stop() == 0


def test_credentials_with_any_origin_echo_the_origin():
    # Browsers refuse "*" on a credentialed request: with --allow-credentials every origin gets itself back.
    s = Server("--allow-credentials")
    try:
        r = httpx.get(s.base_url + "/v1/models", headers={"Origin": ORIGIN})
        assert r.headers["access-control-allow-origin"] == ORIGIN and r.headers["vary"] == "Origin"
        assert r.headers["access-control-allow-credentials"] == "true"
        r = preflight(s.base_url, "/v1/completions")
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    finally:
        assert s.stop() == 0


def test_malformed_cors_flags_are_errors():
    for args, words in ((["--allowed-origins", "https://a.example"], "--allowed-origins must be a JSON list"),
                        (["--allowed-methods", '"GET"'], "--allowed-methods must be a JSON list"),
                        (["--allowed-headers", '["a", 3]'], "--allowed-headers must list strings"),
                        (["--allowed-origins", '[""]'], "--allowed-origins entries must be non-empty"),
                        (["--allowed-headers", '["X-A\\u0000B"]'], "no control characters")):
        r = subprocess.run([str(BINARY), "serve", "--model", str(MODEL), "--port", "0", *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and words in r.stderr, (args, r.stderr)
