"""One look at the runs index per page: a read request brings each index up to date
once between all its questions (they run in worker threads), an action and a stream
that goes on answering look afresh each time."""

from __future__ import annotations

from collections.abc import Iterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from localui.backends import looks
from localui.offloop import off_loop
from localui.views.looks import OneLookPerRead


class Index:
    """Counts how often it was brought up to date, as the PostgreSQL index's refresh
    would do a round trip each time."""

    def __init__(self) -> None:
        self.refreshes = 0

    def refresh(self) -> None:
        if looks.up_to_date(self):
            return
        self.refreshes += 1
        looks.brought_up_to_date(self)


def app(index: Index) -> Starlette:
    async def page(request: Request) -> JSONResponse:
        # Three questions, each in a worker thread as a page's reads are.
        for _ in range(3):
            await off_loop(index.refresh)
        return JSONResponse({"refreshes": index.refreshes})

    async def stream(request: Request) -> StreamingResponse:
        await off_loop(index.refresh)

        def events() -> Iterator[str]:
            for _ in range(3):
                index.refresh()
                yield f"{index.refreshes}\n"

        return StreamingResponse(events())

    return Starlette(
        routes=[
            Route("/page", page, methods=["GET", "POST"]),
            Route("/stream", stream),
        ],
        middleware=[Middleware(OneLookPerRead)],
    )


def test_a_read_brings_the_index_up_to_date_once_and_the_next_read_again() -> None:
    index = Index()
    with TestClient(app(index)) as client:
        assert client.get("/page").json() == {"refreshes": 1}
        assert client.get("/page").json() == {"refreshes": 2}


def test_an_action_looks_afresh_at_every_question() -> None:
    index = Index()
    with TestClient(app(index)) as client:
        assert client.post("/page").json() == {"refreshes": 3}


def test_a_stream_looks_afresh_once_it_has_started_answering() -> None:
    index = Index()
    with TestClient(app(index)) as client:
        # One look before the answer starts; then each event brings it up to date.
        assert client.get("/stream").text.split() == ["2", "3", "4"]


def test_outside_any_request_nothing_is_taken_as_up_to_date() -> None:
    index = Index()
    index.refresh()
    index.refresh()
    assert index.refreshes == 2
