"""``/compare?a=RUN&b=RUN``: two runs side by side, step by step.

The rows of both runs are read without payloads and aligned (``localui.compare``);
payloads are read only for the window of pairs shown (``?from=N``, 200 at a time)
and, in chunks from the start, until the first pair that differs is found. Each
pair that differs is diffed as ``/diff`` diffs two rows: in the JSON every one, on
the page the one shown open (the first difference); the others are shown closed and
diffed when a person opens one (``/compare/pair``, as the timeline loads a row), so
a page of 25 differing steps diffs and renders one. The runs list's "Compare" button
sends the two ticked runs as ``?run=X&run=Y``, answered with a redirect to the
page's own URL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from localui import compare, runs
from localui.backends.base import Store
from localui.backends.traces import SpanIndex
from localui.diff import DiffMemo, SectionDiff, diff_rows
from localui.errors import BadRequest, NotFound, no_such_run
from localui.offloop import off_loop
from localui.records import ForkLink, RowDetail, RowHeader, RunFacts
from localui.shortids import shortest_unique
from localui.views.params import parse_count
from localui.views.respond import html_only, is_htmx, nav_ahead, respond, wants_json
from localui.views.state import context
from localui.views.timeline import MAX_ROW_NUMBER
from localui.views.trace import duration_words, steps_by_row, trace_section
from localui.views.transcript import with_turns
from localui.views.urls import Urls, urls_of

#: Pairs the page shows at once; a longer comparison pages (``?from=N``).
COMPARE_PAIRS = 200
#: Pairs whose payloads are read at once while looking for the first difference.
SCAN_CHUNK = 200

_KIND_WORDS: Mapping[str, str] = {
    compare.ONLY_A: "Only in A",
    compare.ONLY_B: "Only in B",
    compare.ORIGIN: "Where the fork starts",
}


@dataclass(frozen=True, slots=True)
class RunSide:
    """One of the two runs, as its own page would sum it up."""

    execution_id: str
    state: str
    agent: str
    rows: int
    #: The run this one was forked from, when it is a fork.
    fork_of: str | None
    #: From the trace, where tracing was on: the first input and the final answer,
    #: the attempts' time and tokens added up.
    traced: bool
    input: str | None
    answer: str | None
    duration_ms: int | None
    tokens: int | None
    url: str
    short_id: str = html_only("")
    duration: str = html_only("")


@dataclass(frozen=True, slots=True)
class PairSide:
    """One run's row of a pair."""

    checkpoint_id: str
    node_id: str
    step_type: str | None
    status: str
    created_at: str
    url: str = html_only("")
    #: The model and tool calls the trace places on this row, in words.
    calls: tuple[str, ...] = html_only(())


@dataclass(frozen=True, slots=True)
class PairView:
    index: int
    #: ``step``, ``origin`` (a fork's first row beside its source row), ``inherited``
    #: (a source row before the branch point), ``only_a`` or ``only_b``.
    kind: str
    a: PairSide | None
    b: PairSide | None
    differs: bool
    #: What differs, in words, and the payload columns compared (pairs that differ).
    summary: str
    sections: tuple[SectionDiff, ...]
    #: The two rows on the diff page, when both runs have the step.
    diff_url: str | None
    anchor: str = html_only("")
    title: str = html_only("")
    #: Where the page loads this pair's differences when it is opened: set for a
    #: pair of two rows that differs and was not diffed for the page.
    body_url: str | None = html_only(None)


@dataclass(frozen=True, slots=True)
class Stretch:
    """Pairs shown together: a fold of identical steps, or one pair that differs."""

    differs: bool
    pairs: tuple[PairView, ...]
    title: str
    open: bool


@dataclass(frozen=True, slots=True)
class PairWindow:
    """Which pairs the page shows: ``count`` of ``total`` from ``start``."""

    start: int
    count: int
    total: int
    earlier_url: str | None
    later_url: str | None


@dataclass(frozen=True, slots=True)
class ComparePage:
    a: RunSide
    b: RunSide
    pairs: tuple[PairView, ...]
    #: The index of the first pair that differs, or null when the runs are step for
    #: step the same.
    first_difference: int | None
    window: PairWindow
    summary: str = html_only("")
    stretches: tuple[Stretch, ...] = html_only(())
    first_difference_url: str | None = html_only(None)
    url: str = html_only("")
    swap_url: str = html_only("")


def compare_url(urls: Urls, a: str, b: str, start: int | None = None, anchor: str = "") -> str:
    query: dict[str, str | int | None] = {"a": a, "b": b, "from": start or None}
    return urls.path("compare", query, fragment=anchor or None)


def _anchor(index: int) -> str:
    return f"pair-{index}"


def _run_sides(
    store: Store, traces: SpanIndex | None, a_id: str, b_id: str, urls: Urls
) -> tuple[
    tuple[RunSide, tuple[RowHeader, ...], dict[str, tuple[str, ...]]],
    tuple[RunSide, tuple[RowHeader, ...], dict[str, tuple[str, ...]]],
]:
    """Both runs' sides, read at once (one round trip on PostgreSQL, not six)."""
    for param, execution_id in (("a", a_id), ("b", b_id)):
        # No store holds such an id (PostgreSQL text cannot), and PostgreSQL refuses to look.
        if "\x00" in execution_id:
            raise NotFound(f"{param}: no run with execution id {execution_id!r} in this store")
    reads = store.compare_reads([a_id, b_id])
    return (
        _run_side(store, traces, a_id, "a", urls, reads[a_id]),
        _run_side(store, traces, b_id, "b", urls, reads[b_id]),
    )


def _run_side(
    store: Store,
    traces: SpanIndex | None,
    execution_id: str,
    param: str,
    urls: Urls,
    reads: tuple[RunFacts | None, tuple[RowHeader, ...], ForkLink | None],
) -> tuple[RunSide, tuple[RowHeader, ...], dict[str, tuple[str, ...]]]:
    facts, headers, origin = reads
    if facts is None or not headers:
        listed = facts is not None or store.listed(execution_id)
        raise no_such_run(execution_id, listed=listed, param=param)
    trace = trace_section(traces, execution_id, headers)
    durations = [t.duration_ms for t in trace.attempts if t.duration_ms is not None]
    tokens = [t.tokens for t in trace.attempts if t.tokens is not None]
    total_ms = sum(durations) if durations else None
    calls = {cid: tuple(s.summary for s in steps) for cid, steps in steps_by_row(trace).items()}
    side = RunSide(
        execution_id=execution_id,
        state=runs.state_of(facts),
        agent=runs.run_owner(headers).name,
        rows=len(headers),
        fork_of=origin.source_execution_id if origin is not None else None,
        traced=trace.traced,
        input=trace.input,
        answer=trace.answer,
        duration_ms=total_ms,
        tokens=sum(tokens) if tokens else None,
        url=urls.run(execution_id),
        duration=duration_words(total_ms) if total_ms is not None else "",
    )
    return side, headers, calls


def _details(
    store: Store, pairs: Sequence[compare.Aligned], *, to_diff: Sequence[compare.Aligned] = ()
) -> Mapping[str, RowDetail]:
    """The payloads of the rows that decide whether their pairs differ, and of the
    pairs ``to_diff`` that have two rows (two steps that ended apart are diffed too)."""
    wanted = [pair for pair in pairs if pair.needs_payloads]
    wanted += [pair for pair in to_diff if pair.both_rows]
    ids = list(
        dict.fromkeys(
            row.checkpoint_id for pair in wanted for row in (pair.a, pair.b) if row is not None
        )
    )
    return store.get_rows(ids) if ids else {}


def _same_in_store(store: Store, pairs: Sequence[tuple[int, compare.Aligned]]) -> set[int]:
    """The indexes of ``pairs`` whose two rows' payloads the store holds as equal text
    (so equal values) where the payloads decide whether the pair differs."""
    ids = {
        (a.checkpoint_id, b.checkpoint_id): i
        for i, pair in pairs
        if pair.needs_payloads
        for a, b in [(pair.a, pair.b)]
        if a is not None and b is not None
    }
    return {ids[p] for p in store.same_payloads(list(ids))} if ids else set()


def _first_difference(
    store: Store, pairs: Sequence[compare.Aligned], known: Mapping[int, bool]
) -> int | None:
    """The first pair that differs; ``known`` says it for the pairs already diffed.

    Pairs whose payloads the store holds as equal are the same without being read
    (two runs that share a long start are compared in the store); only the rest are
    read and compared by value."""
    for start in range(0, len(pairs), SCAN_CHUNK):
        chunk = [i for i in range(start, min(len(pairs), start + SCAN_CHUNK)) if i not in known]
        same = _same_in_store(store, [(i, pairs[i]) for i in chunk])
        details = _details(store, [pairs[i] for i in chunk if i not in same])
        for i in range(start, min(len(pairs), start + SCAN_CHUNK)):
            if i in same:
                continue
            if known[i] if i in known else compare.differs(pairs[i], details):
                return i
    return None


def _pair_side(
    row: RowHeader | None, calls: Mapping[str, tuple[str, ...]], urls: Urls
) -> PairSide | None:
    if row is None:
        return None
    return PairSide(
        checkpoint_id=row.checkpoint_id,
        node_id=row.node_id,
        step_type=row.step_type,
        status=row.status,
        created_at=row.created_at,
        url=urls.row(row.execution_id, row.checkpoint_id),
        calls=calls.get(row.checkpoint_id, ()),
    )


def _step_words(row: RowHeader) -> str:
    return f"{row.node_id} ({row.step_type or 'step'}, {row.status})"


def _pair_diff(
    a: RowHeader, b: RowHeader, details: Mapping[str, RowDetail], memo: DiffMemo
) -> tuple[str, tuple[SectionDiff, ...]]:
    """What differs between a pair's two rows, in words, and the payload columns."""
    a_detail, b_detail = details.get(a.checkpoint_id), details.get(b.checkpoint_id)
    if a_detail is None or b_detail is None:
        return "One of the rows is no longer in the store.", ()
    result = diff_rows(a_detail, b_detail, memo=memo)
    summary = result.summary
    if a.status != b.status:
        summary = f"Status {a.status} → {b.status}. {summary}"
    return summary, tuple(with_turns(s) for s in result.sections)


def pair_url(urls: Urls, index: int, a: RowHeader, b: RowHeader) -> str:
    """The differences of one pair of rows, as the page loads them when it is opened."""
    return urls.path("compare_pair", {"a": a.checkpoint_id, "b": b.checkpoint_id, "pair": index})


def _pair_view(
    index: int,
    pair: compare.Aligned,
    differs: bool,
    details: Mapping[str, RowDetail],
    calls: tuple[Mapping[str, tuple[str, ...]], Mapping[str, tuple[str, ...]]],
    urls: Urls,
    memo: DiffMemo,
    *,
    diffed: bool = True,
) -> PairView:
    """One pair; ``diffed`` false leaves a differing pair's diff to be loaded when the
    pair is opened (``body_url``)."""
    a, b = pair.a, pair.b
    title = _step_words(a) if a is not None else _step_words(b) if b is not None else ""
    if a is not None and b is not None and _step_words(a) != _step_words(b):
        title = f"{_step_words(a)} · {_step_words(b)}"
    sections: tuple[SectionDiff, ...] = ()
    summary = ""
    body_url = None
    if pair.kind == compare.INHERITED:
        summary = "Before the branch point: the fork started from this row's conversation."
    elif differs and a is not None and b is not None and not diffed:
        body_url = pair_url(urls, index, a, b)
    elif differs and a is not None and b is not None:
        summary, sections = _pair_diff(a, b, details, memo)
    elif differs:
        summary = f"{'A' if a is not None else 'B'} has this step; the other run has not."
    else:
        summary = "The same on both sides."
    return PairView(
        index=index,
        kind=pair.kind,
        a=_pair_side(a, calls[0], urls),
        b=_pair_side(b, calls[1], urls),
        differs=differs,
        summary=summary,
        sections=sections,
        diff_url=(
            urls.path("diff", {"a": a.checkpoint_id, "b": b.checkpoint_id})
            if a is not None and b is not None
            else None
        ),
        anchor=_anchor(index),
        title=f"{_KIND_WORDS[pair.kind]}: {title}" if pair.kind in _KIND_WORDS else title,
        body_url=body_url,
    )


def _stretches(views: Sequence[PairView], first: int | None) -> tuple[Stretch, ...]:
    found: list[Stretch] = []
    for start, end, differs in compare.stretches([v.differs for v in views]):
        if differs:
            found.extend(Stretch(True, (v,), v.title, v.index == first) for v in views[start:end])
            continue
        shown = views[start:end]
        count = len(shown)
        inherited = all(v.kind == compare.INHERITED for v in shown)
        step = "step" if count == 1 else "steps"
        what = f"{step} before the branch point" if inherited else f"identical {step}"
        words = f"{count} {what}"
        ends = shown[0].title if count == 1 else f"{shown[0].title} … {shown[-1].title}"
        found.append(Stretch(False, tuple(shown), f"{words}: {ends}", False))
    return tuple(found)


def _window(urls: Urls, a: str, b: str, total: int, start: int) -> PairWindow:
    start = min(start, max(0, total - 1))
    end = min(total, start + COMPARE_PAIRS)
    return PairWindow(
        start=start,
        count=end - start,
        total=total,
        earlier_url=(compare_url(urls, a, b, max(0, start - COMPARE_PAIRS)) if start > 0 else None),
        later_url=compare_url(urls, a, b, end) if end < total else None,
    )


def build_compare_page(
    store: Store,
    urls: Urls,
    a_id: str,
    b_id: str,
    *,
    start: int = 0,
    traces: SpanIndex | None = None,
    diff_all: bool = True,
) -> ComparePage:
    """The comparison; ``diff_all`` false diffs only the pair shown open (the page),
    true every pair that differs in the window (the JSON)."""
    (a, a_rows, a_calls), (b, b_rows, b_calls) = _run_sides(store, traces, a_id, b_id, urls)
    shown = shortest_unique([a_id, b_id])
    a = _with_short_id(a, shown)
    b = _with_short_id(b, shown)
    aligned = compare.align(a_rows, b_rows)
    window = _window(urls, a_id, b_id, len(aligned), start)
    in_window = range(window.start, window.start + window.count)
    # Pairs whose payloads the store holds as equal text are the same without being
    # read: only the others are read, parsed and diffed (half of two sibling runs'
    # rows, whose conversations match step for step up to where they part).
    same = _same_in_store(store, [(i, aligned[i]) for i in in_window])
    read = [aligned[i] for i in in_window if i not in same]
    details = _details(store, read, to_diff=read if diff_all else ())
    flags = {i: False if i in same else compare.differs(aligned[i], details) for i in in_window}
    first = _first_difference(store, aligned, flags)
    diffed: set[int] = set(in_window)
    if not diff_all:
        diffed = {first} if first is not None and first in in_window else set()
        # The open pair's rows, where only their headers said they differ (so they
        # were not read to tell): read here, unless the first read had them.
        opened = [
            aligned[i]
            for i in diffed
            if any(
                r is not None and r.checkpoint_id not in details
                for r in (aligned[i].a, aligned[i].b)
            )
        ]
        if opened:
            details = {**details, **_details(store, (), to_diff=opened)}
    # The steps of two conversations repeat their earlier messages: each pair of
    # messages is diffed once for the page.
    memo = DiffMemo()
    views = tuple(
        _pair_view(
            i, aligned[i], flags[i], details, (a_calls, b_calls), urls, memo, diffed=i in diffed
        )
        for i in in_window
    )
    if first is None:
        summary = f"The two runs are step for step the same ({len(aligned)} steps)."
    else:
        differing = sum(flags.values())
        summary = (
            f"The runs first differ at step {first + 1} of {len(aligned)}; "
            f"{differing} of the {window.count} steps shown differ."
        )
    first_url = None
    if first is not None:
        page_of_first = window.start if first in in_window else first - first % COMPARE_PAIRS
        first_url = compare_url(urls, a_id, b_id, page_of_first, _anchor(first))
    return ComparePage(
        a=a,
        b=b,
        pairs=views,
        first_difference=first,
        window=window,
        summary=summary,
        stretches=_stretches(views, first),
        first_difference_url=first_url,
        url=compare_url(urls, a_id, b_id, window.start),
        swap_url=compare_url(urls, b_id, a_id, window.start),
    )


def _with_short_id(side: RunSide, shown: Mapping[str, str]) -> RunSide:
    return replace(side, short_id=shown.get(side.execution_id, side.execution_id))


def _runs(request: Request) -> tuple[str, str]:
    """``a`` and ``b`` from the query; a 400 that says what is missing otherwise."""
    params = request.query_params
    a, b = params.get("a", "").strip(), params.get("b", "").strip()
    missing = [name for name, value in (("a", a), ("b", b)) if not value]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise BadRequest(
            f"Pick two runs to compare: {' and '.join(missing)} {verb} missing."
            " Use ?a=EXECUTION_ID&b=EXECUTION_ID, or tick two runs on the runs list."
        )
    return a, b


async def compare_runs(request: Request) -> Response:
    """Two runs aligned; ``?run=X&run=Y`` (the runs list's form) goes to ``?a=X&b=Y``."""
    ctx = context(request)
    params = request.query_params
    ticked = [v.strip() for v in params.getlist("run") if v.strip()]
    if ticked and "a" not in params and "b" not in params:
        if len(ticked) != 2:
            raise BadRequest(
                f"Tick exactly two runs to compare; {len(ticked)} "
                + ("was" if len(ticked) == 1 else "were")
                + " ticked."
            )
        url = compare_url(urls_of(request), ticked[0], ticked[1])
        if request.scope.get("localui.format") == "json":
            url = urls_of(request).path("compare_json", {"a": ticked[0], "b": ticked[1]})
        return RedirectResponse(url, status_code=303)
    a, b = _runs(request)
    start_text = params.get("from")
    start = 0 if start_text is None else parse_count("from", start_text, maximum=MAX_ROW_NUMBER)
    urls = urls_of(request)
    nav_ahead(request)
    diff_all = wants_json(request)
    page = await off_loop(
        lambda: build_compare_page(
            ctx.store, urls, a, b, start=start, traces=ctx.traces, diff_all=diff_all
        )
    )
    return await respond(request, "pages/compare.html", page)


@dataclass(frozen=True, slots=True)
class PairBody:
    """A closed pair's differences, loaded when a person opens it."""

    anchor: str
    summary: str
    sections: tuple[SectionDiff, ...]


def build_pair_body(store: Store, a_id: str, b_id: str, index: int) -> PairBody:
    for param, checkpoint_id in (("a", a_id), ("b", b_id)):
        if "\x00" in checkpoint_id:
            raise NotFound(f"{param}: no row with checkpoint id {checkpoint_id!r} in this store")
    details = store.get_rows([a_id, b_id])
    for param, checkpoint_id in (("a", a_id), ("b", b_id)):
        if checkpoint_id not in details:
            raise NotFound(f"{param}: no row with checkpoint id {checkpoint_id!r} in this store")
    a, b = details[a_id].header, details[b_id].header
    summary, sections = _pair_diff(a, b, details, DiffMemo())
    return PairBody(anchor=_anchor(index), summary=summary, sections=sections)


async def compare_pair(request: Request) -> Response:
    """One pair's differences, the fragment a closed pair of ``/compare`` loads when it
    is opened; a person who opens the link itself gets the two rows' diff page."""
    params = request.query_params
    a, b = params.get("a", "").strip(), params.get("b", "").strip()
    missing = [name for name, value in (("a", a), ("b", b)) if not value]
    if missing:
        raise BadRequest(
            f"Name the two rows: {' and '.join(missing)} missing."
            " Use ?a=CHECKPOINT_ID&b=CHECKPOINT_ID&pair=N."
        )
    index = parse_count("pair", params.get("pair", "0"), maximum=MAX_ROW_NUMBER)
    urls = urls_of(request)
    if not is_htmx(request):
        return RedirectResponse(urls.path("diff", {"a": a, "b": b}), status_code=303)
    body = await off_loop(build_pair_body, context(request).store, a, b, index)
    return context(request).templates.TemplateResponse(
        request, "partials/_compare_pair_body.html", {"pair": body}
    )
