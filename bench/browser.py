"""What a cold page load transfers, in a real Chromium.

Each page opens in a fresh browser context (no cache). Every finished request
is counted by Playwright's resource type: the body as the page received it
(uncompressed) and as it came over the wire (``request.sizes()``'s encoded body
size; headers not counted), with the ``content-encoding`` seen. A stream that
stays open (server-sent events) is counted as one request with no body.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
)
#: After ``load``, how long to wait at most for the network to go quiet (lazily
#: loaded chunks, API calls); an open event stream keeps it from ever going quiet.
SETTLE_MS = 5000


@dataclass
class Kind:
    requests: int = 0
    body: int = 0
    wire: int = 0


@dataclass
class PageWeight:
    url: str
    kinds: dict[str, Kind] = field(default_factory=dict)
    encodings: set[str] = field(default_factory=set)
    error: str | None = None

    def _sum(self, names: tuple[str, ...], attr: str) -> int:
        return sum(getattr(k, attr) for n, k in self.kinds.items() if n in names)

    @property
    def js_css_body(self) -> int:
        return self._sum(("script", "stylesheet"), "body")

    @property
    def js_css_wire(self) -> int:
        return self._sum(("script", "stylesheet"), "wire")

    @property
    def html_body(self) -> int:
        return self._sum(("document",), "body")

    @property
    def html_wire(self) -> int:
        return self._sum(("document",), "wire")

    @property
    def total_body(self) -> int:
        return sum(k.body for k in self.kinds.values())

    @property
    def total_wire(self) -> int:
        return sum(k.wire for k in self.kinds.values())

    @property
    def requests(self) -> int:
        return sum(k.requests for k in self.kinds.values())

    def as_json(self) -> dict[str, object]:
        return {
            "url": self.url,
            "error": self.error,
            "encodings": sorted(self.encodings),
            "kinds": {n: vars(k) for n, k in sorted(self.kinds.items())},
            "js_css_body": self.js_css_body,
            "js_css_wire": self.js_css_wire,
            "html_body": self.html_body,
            "html_wire": self.html_wire,
            "total_body": self.total_body,
            "total_wire": self.total_wire,
            "requests": self.requests,
        }


def page_weights(pages: Mapping[str, str]) -> dict[str, PageWeight]:
    """Load each URL cold and count what it transferred, by resource type."""
    from playwright.sync_api import Request, Response, sync_playwright
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    results: dict[str, PageWeight] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        try:
            for name, url in pages.items():
                weight = PageWeight(url=url)
                results[name] = weight
                context = browser.new_context()
                page = context.new_page()
                finished: list[Request] = []
                streams: list[Request] = []

                def on_finished(request: Request, finished: list[Request] = finished) -> None:
                    finished.append(request)

                def on_response(response: Response, streams: list[Request] = streams) -> None:
                    if "text/event-stream" in (response.headers.get("content-type") or ""):
                        streams.append(response.request)

                page.on("requestfinished", on_finished)
                page.on("response", on_response)
                try:
                    response = page.goto(url, wait_until="load", timeout=60_000)
                    if response is None or response.status != 200:
                        weight.error = f"{url} answered {response.status if response else '?'}"
                    try:
                        page.wait_for_load_state("networkidle", timeout=SETTLE_MS)
                    except PlaywrightTimeout:
                        pass
                    for request in finished:
                        if request in streams:
                            continue
                        answer = request.response()
                        if answer is None:
                            continue
                        kind = weight.kinds.setdefault(request.resource_type, Kind())
                        kind.requests += 1
                        try:
                            kind.body += len(answer.body())
                        except Exception:  # a redirect or an aborted body has none
                            pass
                        kind.wire += max(0, request.sizes()["responseBodySize"])
                        encoding = answer.headers.get("content-encoding")
                        if encoding:
                            weight.encodings.add(encoding)
                    if streams:
                        weight.kinds.setdefault("eventsource", Kind()).requests += len(streams)
                except Exception as exc:
                    weight.error = f"{type(exc).__name__}: {exc}"
                finally:
                    context.close()
        finally:
            browser.close()
    return results
