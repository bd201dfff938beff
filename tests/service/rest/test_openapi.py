"""The OpenAPI document tells the truth, and its UIs render with no network."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

ERROR_REF = "#/components/schemas/ErrorResponse"


class References(HTMLParser):
    """Every src and href in a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_render_from_local_assets_only(client, page: str) -> None:
    response = client.get(page)
    assert response.status_code == 200
    html = response.text
    parser = References()
    parser.feed(html)
    assert len(parser.urls) >= 2, parser.urls  # the script and a stylesheet or icon
    assert not re.search(r"https?://", html), "the page names an external URL"
    for url in parser.urls:
        assert url.startswith("/"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 100, url
        if url.endswith(".css"):
            assert not re.search(r"url\(\s*['\"]?https?://", asset.text), url
    assert "/openapi.json" in html
    assert client.get("/openapi.json").status_code == 200


def test_validator_badge_is_off(client) -> None:
    # Swagger UI would otherwise load its validator badge from validator.swagger.io.
    assert '"validatorUrl": null' in client.get("/docs").text


def _operations(document: dict):
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def test_no_422_and_every_error_is_the_error_body(client) -> None:
    document = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, method, operation in _operations(document):
        codes = set(operation["responses"])
        assert "422" not in codes, (method, path)
        for code, response in operation["responses"].items():
            if code.startswith(("4", "5")) and path != "/v2/health/ready":
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": ERROR_REF}, (method, path, code)
