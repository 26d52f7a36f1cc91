"""The playground's files as a real server sends them, without the key: the page and what it
links are all served from the package (nothing from another host: the machine may be offline),
scripts with a JavaScript type (module scripts need one), the page with its content security
policy; a name that is no file of the page is a 404 in the API's error shape. The page itself
is driven in a browser by the families' playground tests."""

from __future__ import annotations

import re

import httpx
from omni_core.serve import playground

from tests.core.serve.server import API_KEY

PAGES = ("/", "/playground")
LINKED = re.compile(r'(?:src|href)="([^"#]+)"|from "\./([^"]+)"|new URL\("\./([^"]+)"')


def file_links(links: set[str]) -> set[str]:
    return {link for link in links if re.fullmatch(r"[\w.-]+\.(js|css)", link)}


def linked_files(text: str) -> set[str]:
    return {name.removeprefix("playground/") for match in LINKED.findall(text) for name in match if name}


def test_the_page_and_every_file_it_links_are_served_without_the_key(api_server):
    seen, pending = set(), []
    for path in PAGES:
        page = httpx.get(api_server.url + path, timeout=10)
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        assert "default-src 'self'" in page.headers["content-security-policy"]
        links = linked_files(page.text)
        # the rest: the index's links to the playground and /health, the empty icon (data:,)
        assert links - file_links(links) <= {"playground", "health", "data:,"}, path
        pending += file_links(links)
    assert "main.js" in pending and "style.css" in pending
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        served = httpx.get(f"{api_server.url}/playground/{name}", timeout=10)
        assert served.status_code == 200, name
        kind = "text/css" if name.endswith(".css") else "text/javascript"
        assert served.headers["content-type"] == f"{kind}; charset=utf-8", name
        pending += linked_files(served.text)
    # every file the package ships is reached from the page: none is left over
    assert seen == set(playground.ASSETS)


def test_nothing_comes_from_another_host():
    for path in playground.STATIC.iterdir():
        text = path.read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), path.name


def test_a_name_that_is_no_file_is_a_404_in_the_api_shape(api_server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    missing = httpx.get(f"{api_server.url}/playground/secrets.py", headers=headers, timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "the playground has no file 'secrets.py'"
    assert httpx.get(f"{api_server.url}/playground/secrets.py", timeout=10).status_code == 401
    slash = httpx.get(f"{api_server.url}/playground/", timeout=10)
    assert slash.status_code == 307 and slash.headers["location"].endswith("/playground")
