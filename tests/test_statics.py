"""Static files: minified, gzipped once at level 9, revalidated by ETag, remade when
the file changes, and nothing outside the static folder."""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from localui.paths import static_dir
from localui.views.statics import PrecompressedStatics

GZIP = {"Accept-Encoding": "gzip"}
PLAIN = {"Accept-Encoding": "identity"}


def linked_statics(html: str) -> list[str]:
    return sorted(set(re.findall(r'(?:src|href)="(/static/[^"]+)"', html)))


def test_every_static_a_page_links_comes_gzipped_and_smaller_than_its_source(
    client: TestClient,
) -> None:
    urls = linked_statics(client.get("/approvals").text)
    assert {u.rsplit("/", 1)[1] for u in urls} >= {"localui.css", "desk.js", "page.js"}
    for url in urls:
        source = (static_dir() / url.rsplit("/", 1)[1]).read_bytes()
        with client.stream("GET", url, headers=GZIP) as answer:
            wire = b"".join(answer.iter_raw())
        assert answer.status_code == 200, url
        assert answer.headers["content-encoding"] == "gzip", url
        assert answer.headers["vary"] == "Accept-Encoding", url
        assert int(answer.headers["content-length"]) == len(wire), url
        body = gzip.decompress(wire)
        # Level 9 of what is served: never larger than the middleware's level 1 would be.
        assert len(wire) <= len(gzip.compress(body, compresslevel=1)), url
        assert len(body) <= len(source), url
        if ".min." not in url:
            # Our own files lose their comments and indentation on the way.
            assert len(body) < 0.85 * len(source), url
            assert b"\n  " not in body, url
        plain = client.get(url, headers=PLAIN)
        assert "content-encoding" not in plain.headers, url
        assert plain.content == body, url
        assert plain.headers["etag"] != answer.headers["etag"], url


def test_the_served_code_keeps_what_the_page_relies_on(client: TestClient) -> None:
    desk = client.get("/static/desk.js", headers=GZIP).text
    assert "//" not in desk.replace("://", "")  # no comment survives
    for kept in ("GUARD_MS=300", '"htmx:sseBeforeMessage"', '"Dismiss"', "hx-preserve"):
        assert kept in desk, kept
    css = client.get("/static/localui.css", headers=GZIP).text
    assert "/*" not in css
    assert ".queue-item.gone:not(.decided-here){" in css
    assert "light-dark(#1d2330,#e6e8ee)" in css


def test_a_known_etag_answers_304_without_a_body(client: TestClient) -> None:
    first = client.get("/static/localui.css", headers=GZIP)
    again = client.get(
        "/static/localui.css", headers={**GZIP, "If-None-Match": first.headers["etag"]}
    )
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["etag"] == first.headers["etag"]
    other = client.get("/static/localui.css", headers={**GZIP, "If-None-Match": '"old"'})
    assert other.status_code == 200 and other.content == first.content


def _app(folder: Path) -> TestClient:
    return TestClient(Starlette(routes=[Mount("/s", app=PrecompressedStatics(folder))]))


def test_a_changed_file_is_served_anew(tmp_path: Path) -> None:
    sheet = tmp_path / "a.css"
    sheet.write_text("/* why */\nbody {\n  color: red;\n}\n" * 40)
    client = _app(tmp_path)
    first = client.get("/s/a.css", headers=GZIP)
    assert first.text.startswith("body{color:red}")
    sheet.write_text("main {\n  color: blue;\n}\n" * 40)
    os.utime(sheet, ns=(1, 1))  # a new mtime even on a coarse clock
    second = client.get("/s/a.css", headers=GZIP)
    assert second.text.startswith("main{color:blue}")
    assert second.headers["etag"] != first.headers["etag"]


def test_a_small_file_goes_as_it_is_and_head_has_no_body(tmp_path: Path) -> None:
    (tmp_path / "tiny.js").write_text("var a = 1;\n")
    client = _app(tmp_path)
    answer = client.get("/s/tiny.js", headers=GZIP)
    assert "content-encoding" not in answer.headers  # gzip would only add bytes
    assert answer.text == "var a=1;"
    head = client.head("/s/tiny.js", headers=GZIP)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(answer.content))


@pytest.mark.parametrize(
    "path",
    [
        "/s/../secret.txt",
        "/s/%2e%2e/secret.txt",
        "/s/sub%2fsecret.txt",
        "/s/sub/inner.css",
        "/s/.hidden.css",
        "/s/",
        "/s/missing.css",
        "/s/a%00.css",
        "/s/secret.txt",
    ],
)
def test_nothing_outside_the_folder_is_served(tmp_path: Path, path: str) -> None:
    folder = tmp_path / "static"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "inner.css").write_text("a{}")
    (folder / ".hidden.css").write_text("a{}")
    (tmp_path / "secret.txt").write_text("secret")
    (folder / "secret.txt").symlink_to(tmp_path / "secret.txt")
    answer = _app(folder).get(path)
    assert answer.status_code == 404, answer.text
    assert "secret" not in answer.text


def test_only_get_and_head(tmp_path: Path) -> None:
    (tmp_path / "a.css").write_text("a{}")
    answer = _app(tmp_path).post("/s/a.css")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "GET, HEAD"


def test_pages_are_gzipped_for_another_machine_and_sent_as_they_are_on_this_one(
    app_store: Path,
) -> None:
    """Over loopback compressing a page only spends the server's CPU; a client on
    another machine gets it gzipped (level 1, made per request)."""
    from helpers import LOOPBACK_CLIENT, NO_SIGN_IN

    from localui.app import create_app
    from localui.settings import Settings

    app = create_app(
        Settings(store=str(app_store), sign_in=NO_SIGN_IN, allowed_hosts=("desk.example",))
    )
    bodies = {}
    for name, address in (("here", LOOPBACK_CLIENT), ("elsewhere", ("192.0.2.10", 40000))):
        with TestClient(app, base_url="http://desk.example:8765", client=address) as client:
            with client.stream("GET", "/approvals", headers=GZIP) as answer:
                assert answer.status_code == 200
                wire = b"".join(answer.iter_raw())
                bodies[name] = (answer.headers.get("content-encoding"), wire)
    here, elsewhere = bodies["here"], bodies["elsewhere"]
    assert here[0] is None and elsewhere[0] == "gzip"
    page = gzip.decompress(elsewhere[1])
    assert b'id="approvals-queue"' in page and b'id="approvals-queue"' in here[1]
    assert len(elsewhere[1]) < len(page) / 3
