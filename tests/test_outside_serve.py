"""Requests found from outside (`python serve.py` on loopback, real HTTP) that asked for something the server
does not do and got a 200 anyway: each class is replayed through a real server (tests/serving.py) on both
endpoints, as a property over the class."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving import Server, make_chat_checkpoint

ROUTES = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]}, "/v1/completions": {"prompt": "hi"}}
ERROR_KEYS = {"message", "type", "param", "code"}
# what asks for another kind of reply than text: JSON mode, a tool or function call, audio
ASKS = {
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x"}},
                                        {"type": "text", "x": 1}, {"type": "TEXT"}, "json", []]),
    "tool_choice": st.sampled_from(["required", {"type": "function", "function": {"name": "f"}}, "any", [], 0]),
    "function_call": st.sampled_from([{"name": "f"}, "required", "f", []]),
    "modalities": st.sampled_from([["text", "audio"], ["audio"], [], "text", ["TEXT"]]),
    "audio": st.sampled_from([{"voice": "alloy", "format": "wav"}, {}, [], "alloy", False]),
}
NOTHING = {"response_format": [None, {"type": "text"}], "tool_choice": [None, "none", "auto"],
           "function_call": [None, "none", "auto"], "modalities": [None, ["text"]], "audio": [None]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "ckpt.pt"
    make_chat_checkpoint(path, block_size=32)
    s = Server(path, "--max-tokens", "2", "--allow-host", "Proxy.Example")
    yield s
    s.stop()
    assert "Traceback" not in s.log(), s.log()


def post(server: Server, route: str, **fields) -> httpx.Response:
    return server.http.post(server.url + route, content=json.dumps({**ROUTES[route], **fields}))


@settings(max_examples=15)
@given(route=st.sampled_from(sorted(ROUTES)), data=st.data(), name=st.sampled_from(sorted(ASKS)))
def test_class_a_field_asking_for_another_kind_of_reply_is_refused_by_name(server, route, data, name):
    """response_format json_object (JSON mode), tool_choice "required", modalities ["audio"] were ignored: a 200
    with free text, where the client asked for JSON, a tool call or audio. Refused by name, as logprobs is."""
    value = data.draw(ASKS[name])
    r = post(server, route, **{name: value})
    assert r.status_code == 400, (name, value, r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS and err["param"] == name and err["code"] == "unsupported_parameter", err
    assert name in err["message"] and "leave it out" in err["message"], err


@settings(max_examples=8)
@given(route=st.sampled_from(sorted(ROUTES)), data=st.data(), name=st.sampled_from(sorted(NOTHING)))
def test_class_the_same_fields_asking_for_text_only_are_served(server, route, data, name):
    r = post(server, route, max_tokens=2, **{name: data.draw(st.sampled_from(NOTHING[name]))})
    assert r.status_code == 200, r.text


LOOPBACK = ["127.0.0.1", "localhost", "LocalHost", "localhost.", "[::1]", "[0:0:0:0:0:0:0:1]", "[::ffff:127.0.0.1]",
            "proxy.example"]  # the last: its --allow-host
# a name no client on this machine gives a loopback server: what a page of another site sends after its DNS name
# was rebound to 127.0.0.1 (the browser keeps the site's name in Host)
FOREIGN = st.from_regex(r"\A[a-z0-9][a-z0-9.-]{0,30}(:[0-9]{1,5})?\Z").filter(
    lambda h: h.split(":")[0].rstrip(".") not in {"127.0.0.1", "localhost", "proxy.example"})


@settings(max_examples=15)
@given(host=FOREIGN, path=st.sampled_from(["/", "/health", "/v1/models"]))
def test_class_a_loopback_server_refuses_a_host_that_is_not_its_name(server, host, path):
    """serve.py on loopback answered any Host header: a page of another site whose name was rebound to 127.0.0.1
    (DNS rebinding) could load the page, read /v1/models and POST to the API. On loopback only loopback names are
    served; the refusal is OpenAI's error shape, naming the Host and the address to use."""
    r = server.http.get(server.url + path, headers={"Host": host})
    assert r.status_code == 403, (host, path, r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS and err["code"] == "host_not_allowed" and host in err["message"], err
    assert f"as {server.url};" in err["message"] and "--allow-host NAME" in err["message"], err
    r = server.http.post(server.url + "/v1/completions", headers={"Host": host},
                         content=json.dumps(ROUTES["/v1/completions"]))
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", r.text


@pytest.mark.parametrize("name", LOOPBACK)
def test_loopback_names_with_or_without_the_port_are_served(server, name):
    port = server.url.rsplit(":", 1)[1]
    for host in (name, f"{name}:{port}"):
        r = server.http.get(server.url + "/health", headers={"Host": host})
        assert r.status_code == 200 and r.json()["status"] == "ok", (host, r.text)


@settings(max_examples=15)
@given(site=FOREIGN, scheme=st.sampled_from(["http", "https"]), route=st.sampled_from(sorted(ROUTES)))
def test_class_a_page_of_another_site_may_not_post_to_a_loopback_server(server, site, scheme, route):
    """A page of another site that posts to http://127.0.0.1:PORT sends the right Host, and its own Origin (every
    cross-site POST of a browser does, a "simple" text/plain one too, with no preflight): it made the server
    generate for it. An Origin of another name is refused; the server's own page (its Origin one of its names) and
    clients that send no Origin (curl, the openai package) are served."""
    r = server.http.post(server.url + route, headers={"Origin": f"{scheme}://{site}", "Content-Type": "text/plain"},
                         content=json.dumps(ROUTES[route]))
    assert r.status_code == 403, (site, r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS and err["code"] == "origin_not_allowed" and site in err["message"], err
    port = server.url.rsplit(":", 1)[1]
    for origin in (server.url, f"http://localhost:{port}", "https://proxy.example"):
        r = server.http.post(server.url + route, headers={"Origin": origin}, content=json.dumps(ROUTES[route]))
        assert r.status_code == 200, (origin, r.text)


@pytest.mark.parametrize("value,name", [(b"http://127.0.0.1:8000", "127.0.0.1"), (b"https://LocalHost", "localhost"),
                                        (b"http://[::1]:80", "::1"), (b"null", None), (b"file://", None),
                                        (b"http://evil.com", "evil.com"), (b"http://[::1", None)])
def test_an_origin_header_is_read_as_its_sites_name(value, name):
    from server.hosts import origin_host
    assert origin_host(value) == name


# (the value of a Host header, its name as the server compares it), by hand; None: no host[:port] at all
HOST_OF = [(b"127.0.0.1:8000", "127.0.0.1"), (b"LOCALHOST.", "localhost"), (b"[::1]:9", "::1"), (b"[::1]:", "::1"),
           (b"[0:0:0:0:0:0:0:1]", "::1"), (b"[::FFFF:127.0.0.1]:5", "127.0.0.1"), (b"[fe80::1%eth0]", "fe80::1"),
           (b" evil.com:80 ", "evil.com"), (b"[::1]evil.com", None), (b"[::1", None), (b"a:b", None)]


@pytest.mark.parametrize("value,name", HOST_OF)
def test_a_host_header_is_read_as_one_name_per_spelling(value, name):
    from server.hosts import host_of
    assert host_of(value) == name


@pytest.mark.parametrize("bound,given,allowed", [
    ("127.0.0.1", "127.0.0.1", {"127.0.0.1", "localhost", "::1"}),
    ("127.0.0.1", "vm", {"127.0.0.1", "localhost", "::1", "vm"}),  # --host vm, a name /etc/hosts maps to loopback
    ("127.0.0.2", "127.0.0.2", {"127.0.0.1", "localhost", "::1", "127.0.0.2"}),
    ("::1", "::1", {"127.0.0.1", "localhost", "::1"}),
    ("::ffff:127.0.0.1", "::ffff:127.0.0.1", {"127.0.0.1", "localhost", "::1"}),  # loopback, IPv4-mapped
    ("0.0.0.0", "0.0.0.0", None), ("::", "::", None), ("192.168.1.5", "192.168.1.5", None)])
def test_a_loopback_server_answers_this_machines_names_and_an_exposed_one_any(bound, given, allowed):
    from server.hosts import allowed_hosts
    got = allowed_hosts(bound, given)
    assert (got if got is None else set(got)) == allowed


@settings(max_examples=20)
@given(name=st.sampled_from(["", " ", "a b", "evil.com/x", "user@evil.com", "caf\u00e9.example", "a\tb"]) | st.text(
    max_size=10).filter(lambda n: not n.strip() or any(c in n for c in " /@\t\n\r\\") or not n.isascii()))
def test_class_an_allow_host_that_is_no_host_name_is_one_line(name, capsys):
    from errors import run_cli
    from server import cli as serve_cli
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: serve_cli.check_args(serve_cli.build_parser().parse_args(["--allow-host", name])))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: --allow-host takes a host name") and err.count("\n") == 1, err
