"""Two rows compared for people: what changed between them, column by column.

Pure: two :class:`RowDetail` in, a frozen view model out, no I/O. deepdiff
finds the changes, but only in the parts that differ: it walks every node it is
given (about 0.4 s for a 1 MB snapshot with one change), while ``==`` on parsed
JSON takes about a millisecond. So equal top-level keys are set aside first, and
a conversation is compared message by message: the common start and end are
skipped by equality, messages that only grew at the end become transcript turns,
and deepdiff sees only the messages that changed.

Fields marked ``_HIDDEN`` are presentation only; they follow the views'
``hidden_from_json`` convention (``localui.views.common.html_only``), spelled
here because this module sits below the views.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from localui.records import RowDetail, Unreadable

_HIDDEN: Mapping[str, bool] = {"hidden_from_json": True}

#: The payload columns compared, in the order a person reads them.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("state_snapshot", "State snapshot"),
    ("node_input", "Node input"),
    ("node_output", "Node output"),
    ("interrupt_context", "Interrupt context"),
)

ADDED = "added"
REMOVED = "removed"
CHANGED = "changed"
TYPE_CHANGED = "type_changed"

#: Changes listed per section; past this the list says it was cut short, so a
#: diff of two unrelated conversations stays quick and readable.
MAX_CHANGES = 500
#: Values up to this many characters show inline, longer ones as a block.
INLINE_LIMIT = 80
#: A value's display text stops here; the JSON and the row pages carry all of it.
TEXT_LIMIT = 10_000

_REPORT_KINDS: Mapping[str, str] = {
    "values_changed": CHANGED,
    "type_changes": TYPE_CHANGED,
    "dictionary_item_added": ADDED,
    "iterable_item_added": ADDED,
    "dictionary_item_removed": REMOVED,
    "iterable_item_removed": REMOVED,
}
_LABELS: Mapping[str, str] = {ADDED: "added", REMOVED: "removed", CHANGED: "changed"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Change:
    """One difference: at ``path``, ``old`` (A's value) became ``new`` (B's).

    ``old`` is null for ``added`` and ``new`` is null for ``removed``.
    """

    kind: str
    path: str
    old: Any
    new: Any
    label: str = field(default="", metadata=_HIDDEN)
    #: Display texts; empty when that side has no value (added, removed).
    old_text: str = field(default="", metadata=_HIDDEN)
    new_text: str = field(default="", metadata=_HIDDEN)
    #: Long or multi-line values render as blocks rather than inline.
    block: bool = field(default=False, metadata=_HIDDEN)


@dataclass(frozen=True, slots=True)
class RawText:
    """The stored text of a column that could not be parsed, for one side."""

    side: str
    text: str


@dataclass(frozen=True, slots=True)
class SectionDiff:
    """One payload column of A against the same column of B."""

    name: str
    same: bool
    #: Why the column could not be compared (naming the side), or null.
    unreadable: str | None
    changes: tuple[Change, ...]
    #: Messages B's conversation has after all of A's: it grew at the end.
    appended_messages: tuple[Any, ...]
    #: Messages A's conversation has after all of B's: B is the earlier row.
    removed_messages: tuple[Any, ...]
    #: The parts that are the same on both sides and are not shown, in words.
    unchanged: tuple[str, ...]
    #: More than ``MAX_CHANGES`` changes: only the first ones are listed.
    truncated: bool
    title: str = field(default="", metadata=_HIDDEN)
    summary: str = field(default="", metadata=_HIDDEN)
    unchanged_text: str = field(default="", metadata=_HIDDEN)
    truncated_text: str = field(default="", metadata=_HIDDEN)
    unreadable_raw: tuple[RawText, ...] = field(default=(), metadata=_HIDDEN)
    #: The messages above as transcript turns; the view fills these in.
    appended_turns: tuple[Any, ...] = field(default=(), metadata=_HIDDEN)
    removed_turns: tuple[Any, ...] = field(default=(), metadata=_HIDDEN)


@dataclass(frozen=True, slots=True)
class RowDiff:
    same: bool
    sections: tuple[SectionDiff, ...]
    summary: str = field(default="", metadata=_HIDDEN)


def diff_rows(a: RowDetail, b: RowDetail, *, memo: DiffMemo | None = None) -> RowDiff:
    """Compare the payload columns of row ``a`` (the before) with row ``b`` (the after);
    a page that diffs many pairs of rows hands each the same ``memo``."""
    sides = (f"A ({a.header.node_id})", f"B ({b.header.node_id})")
    sections = tuple(_section_of(name, title, a, b, sides, memo) for name, title in SECTIONS)
    same = all(s.same for s in sections)
    changed = [s.name for s in sections if not s.same and s.unreadable is None]
    unreadable = [s.name for s in sections if s.unreadable is not None]
    if same:
        summary = "No change: " + _join([n for n, _ in SECTIONS], "and") + " are the same."
    else:
        parts = []
        if changed:
            parts.append("Changed: " + _join(changed, "and") + ".")
        if unreadable:
            parts.append("Could not compare: " + _join(unreadable, "and") + ".")
        summary = " ".join(parts)
    return RowDiff(same=same, sections=sections, summary=summary)


def _section_of(
    name: str,
    title: str,
    a: RowDetail,
    b: RowDetail,
    sides: tuple[str, str],
    memo: DiffMemo | None,
) -> SectionDiff:
    """One column of two rows compared; a page's ``memo`` keeps each comparison by the
    columns' text as stored, so the same two values (a tool called with the same
    arguments at every step of both runs) are compared once for the page."""

    def compare() -> SectionDiff:
        return diff_section(
            name, getattr(a, name), getattr(b, name), title=title, sides=sides, memo=memo
        )

    raw_a, raw_b = a.raw.get(name), b.raw.get(name)
    if memo is None or not isinstance(raw_a, str) or not isinstance(raw_b, str):
        return compare()
    return memo.section((name, title, *sides, raw_a, raw_b), compare)


def diff_section(
    name: str,
    a: Any,
    b: Any,
    *,
    title: str = "",
    sides: tuple[str, str] = ("A", "B"),
    memo: DiffMemo | None = None,
) -> SectionDiff:
    """One column compared; either side may be :class:`Unreadable`."""
    title = title or name
    broken = [(side, v) for side, v in zip(sides, (a, b), strict=True) if isinstance(v, Unreadable)]
    if broken:
        reasons = "; ".join(f"on {side} it is not valid JSON ({v.error})" for side, v in broken)
        return SectionDiff(
            name=name,
            same=False,
            unreadable=f"{name} cannot be compared: {reasons}.",
            changes=(),
            appended_messages=(),
            removed_messages=(),
            unchanged=(),
            truncated=False,
            title=title,
            summary="unreadable",
            unreadable_raw=tuple(RawText(side=side, text=v.raw) for side, v in broken),
        )

    found = _Changes()
    appended: tuple[Any, ...] = ()
    removed: tuple[Any, ...] = ()
    unchanged: list[str] = []
    if isinstance(a, dict) and isinstance(b, dict) and a != b:
        rest_a = {k: v for k, v in a.items() if k not in b or b[k] != v}
        rest_b = {k: v for k, v in b.items() if k not in a or k in rest_a}
        unchanged = [_describe((k,), v) for k, v in a.items() if k not in rest_a]
        messages_a, messages_b = rest_a.get("messages"), rest_b.get("messages")
        if (
            name == "state_snapshot"
            and isinstance(messages_a, list)
            and isinstance(messages_b, list)
        ):
            del rest_a["messages"], rest_b["messages"]
            appended, removed, same_messages = _diff_messages(messages_a, messages_b, found, memo)
            unchanged = same_messages + unchanged
        _deep(rest_a, rest_b, (), found, memo)
    else:
        _deep(a, b, (), found, memo)

    changes = found.sorted()
    same = not changes and not appended and not removed
    return SectionDiff(
        name=name,
        same=same,
        unreadable=None,
        changes=changes,
        appended_messages=appended,
        removed_messages=removed,
        unchanged=tuple(unchanged),
        truncated=found.truncated,
        title=title,
        summary=_section_summary(same, len(changes), found.truncated, appended, removed),
        unchanged_text=(
            "Same on both sides, not shown: " + ", ".join(unchanged) + "." if unchanged else ""
        ),
        truncated_text=(
            f"Only the first {MAX_CHANGES} changes are listed; open the rows to see the rest."
            if found.truncated
            else ""
        ),
    )


# --- finding changes ----------------------------------------------------------


class _Changes:
    """Changes collected so far, up to ``MAX_CHANGES``."""

    def __init__(self) -> None:
        self._found: list[tuple[Path, Change]] = []
        self.truncated = False

    @property
    def full(self) -> bool:
        return len(self._found) >= MAX_CHANGES

    def add(self, kind: str, path: Path, old: Any, new: Any) -> None:
        self.add_made(path, _change(kind, path, old, new))

    def add_made(self, path: Path, change: Change) -> None:
        if self.full:
            self.truncated = True
            return
        self._found.append((path, change))

    def sorted(self) -> tuple[Change, ...]:
        return tuple(c for _, c in sorted(self._found, key=lambda pc: _path_key(pc[0])))


def _change(kind: str, path: Path, old: Any, new: Any) -> Change:
    old_text, old_block = _display(old) if kind != ADDED else ("", False)
    new_text, new_block = _display(new) if kind != REMOVED else ("", False)
    label = _LABELS.get(kind) or f"type changed ({_type_name(old)} → {_type_name(new)})"
    return Change(
        kind=kind,
        path=readable_path(path),
        old=old if kind != ADDED else None,
        new=new if kind != REMOVED else None,
        label=label,
        old_text=old_text,
        new_text=new_text,
        block=old_block or new_block,
    )


#: One finding of DeepDiff's, relative to where the two values sit: its kind, its path
#: in A, its path in B, the old value and the new.
Finding = tuple[str, Path, Path, Any, Any]


class DiffMemo:
    """DeepDiff's findings for pairs of values already compared, kept for one page that
    diffs many rows of two runs. Row n+1 of a conversation holds row n's messages again,
    so a comparison of two runs step by step would otherwise diff the same two messages
    once per step; keyed by the values' JSON, a pair is diffed once per page."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, str], tuple[Finding, ...]] = {}
        self._sections: dict[tuple[str, ...], SectionDiff] = {}
        self._changes: dict[tuple[str, str, Path], tuple[tuple[Path, Change], ...]] = {}

    def section(self, key: tuple[str, ...], compare: Callable[[], SectionDiff]) -> SectionDiff:
        """A column's comparison, by its name, its sides' words and both texts as
        stored: equal texts are equal values, so the comparison is the same."""
        found = self._sections.get(key)
        if found is None:
            found = self._sections[key] = compare()
        return found

    def findings(self, a: Any, b: Any) -> tuple[Finding, ...]:
        key = (_fingerprint(a), _fingerprint(b))
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = _findings(a, b)
        return found

    def changes(self, a: Any, b: Any, base: Path) -> tuple[tuple[Path, Change], ...]:
        """The changes between ``a`` and ``b`` found under ``base``, worded once for
        the page: the same two messages at the same place in every step's
        conversation are the same changes."""
        key = (_fingerprint(a), _fingerprint(b), base)
        made = self._changes.get(key)
        if made is None:
            made = self._changes[key] = tuple(
                (path, _change(kind, path, old, new))
                for kind, path, old, new in _placed(self.findings(a, b), base)
            )
        return made


def _deep(a: Any, b: Any, base: Path, found: _Changes, memo: DiffMemo | None = None) -> None:
    """deepdiff of two values, its findings recorded under ``base``."""
    if a == b:
        return
    if found.full:
        found.truncated = True
        return
    if memo is not None:
        for path, change in memo.changes(a, b, base):
            found.add_made(path, change)
        return
    for kind, path, old, new in _placed(_findings(a, b), base):
        found.add(kind, path, old, new)


def _placed(findings: Sequence[Finding], base: Path) -> Iterator[tuple[str, Path, Any, Any]]:
    """Each finding as ``(kind, path, old, new)`` under ``base``: paths of added values
    count in B, of the others in A."""
    for kind, old_path, new_path, old, new in findings:
        if kind == ADDED:
            yield ADDED, base + new_path, None, new
        elif kind == REMOVED:
            yield REMOVED, base + old_path, old, None
        else:
            yield kind, base + old_path, old, new


#: The JSON values a flat object's keys may hold for :func:`_flat_findings`.
_SCALARS = (str, int, float, bool, type(None))
#: Numbers compare by value (``ignore_numeric_type_changes``); a boolean is no number.
_NUMBERS = (int, float)


def _flat_findings(a: Any, b: Any) -> tuple[Finding, ...] | None:
    """What DeepDiff finds between two objects whose values are all scalars (a chat
    message, a tool's arguments), found directly; None for anything else.

    Written here rather than asked of DeepDiff because this is most of what a compare
    page diffs and DeepDiff costs a fifth of a millisecond a call. It keeps to where
    DeepDiff's answer is plain: a key that is only on one side is added or removed, a
    string, boolean or null that changed keeps its type (numbers that differ, and a
    number that became a string, DeepDiff compares its own way), a null that became a value
    or the other way round is a type change, NaN equals NaN (``ignore_nan_inequality``).
    Anything else goes to DeepDiff."""
    if type(a) is not dict or type(b) is not dict:
        return None
    found: list[Finding] = []
    for key, old in a.items():
        if type(old) not in _SCALARS or type(key) is not str:
            return None
        if key not in b:
            found.append((REMOVED, (key,), (key,), old, None))
            continue
        new = b[key]
        if type(new) is not type(old):
            if type(old) in _NUMBERS and type(new) in _NUMBERS and old == new:
                continue  # 40 and 40.0
            if type(new) not in _SCALARS or old is not None and new is not None:
                return None
            found.append((TYPE_CHANGED, (key,), (key,), old, new))
        elif old != new and not (type(old) is float and math.isnan(old) and math.isnan(new)):
            if type(old) in _NUMBERS:
                return None  # DeepDiff compares numbers by their leading digits
            found.append((CHANGED, (key,), (key,), old, new))
    for key, new in b.items():
        if key not in a:
            if type(new) not in _SCALARS or type(key) is not str:
                return None
            found.append((ADDED, (key,), (key,), None, new))
    return tuple(found)


def _findings(a: Any, b: Any) -> tuple[Finding, ...]:
    """What DeepDiff finds between two values that differ, each change on its own."""
    flat = _flat_findings(a, b)
    return flat if flat is not None else _deepdiff_findings(a, b)


class _KeptOutOfThread:
    """An import finder that answers "not installed" for one top-level module, to one
    thread only: the others import it as ever. Written here because no library does
    this, and the import system's own spelling of "not installed" (a ``None`` in
    ``sys.modules``) holds for every thread at once."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.thread = threading.get_ident()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == self.module and threading.get_ident() == self.thread:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@contextmanager
def _kept_out_of_this_thread(module: str) -> Iterator[None]:
    finder = _KeptOutOfThread(module)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def load_deepdiff() -> None:
    """Import DeepDiff, without pydantic where nothing has imported it yet.

    DeepDiff imports pydantic only to tell pydantic models apart from other objects
    (``deepdiff.helper`` has a stand-in class for when it is missing); what is diffed
    here is parsed JSON, never a model. A viewer serving no agents has no other use for
    pydantic: kept out, DeepDiff costs 2.4 MB resident instead of 6.1 (measured in
    ``localui serve`` at its first diff), which is what takes a PostgreSQL viewer's
    memory over its budget. Kept out of this thread's import only, so it can be loaded
    while other threads import what they like (pydantic too, for an agent's models);
    where pydantic is loaded already, it is DeepDiff's as ever. ``localui serve`` loads
    it at start, in its main thread (30-40 ms on 2 slow cores); elsewhere the first diff
    that needs it does."""
    if "deepdiff" in sys.modules:
        return
    with _kept_out_of_this_thread("pydantic"):
        import deepdiff  # noqa: F401


def _deepdiff_findings(a: Any, b: Any) -> tuple[Finding, ...]:
    """:func:`_findings` as DeepDiff finds them."""
    # Imported here: deepdiff (and what it pulls in) is start-up time every page pays
    # for otherwise, and only a diff needs it.
    load_deepdiff()
    from deepdiff import DeepDiff

    tree = DeepDiff(
        a,
        b,
        view="tree",
        ignore_order=False,
        # Report a dict's keys one by one even when few are shared, not the dict whole.
        threshold_to_diff_deeper=0,
        # Numbers compare by value (40 == 40.0), as the equality checks above do.
        ignore_numeric_type_changes=True,
        ignore_nan_inequality=True,
    )
    findings: list[Finding] = []
    for report, levels in tree.items():
        for level in levels:
            old_path = tuple(level.path(output_format="list"))
            new_path = tuple(level.path(output_format="list", use_t2=True))
            kind = _REPORT_KINDS.get(report)
            if kind is not None:
                findings.append((kind, old_path, new_path, level.t1, level.t2))
            else:
                # Only ``iterable_item_moved`` remains for JSON: it left one place, came to another.
                findings.append((REMOVED, old_path, new_path, level.t1, None))
                findings.append((ADDED, old_path, new_path, None, level.t2))
    return tuple(findings)


def _diff_messages(
    a: list[Any], b: list[Any], found: _Changes, memo: DiffMemo | None = None
) -> tuple[tuple[Any, ...], tuple[Any, ...], list[str]]:
    """``(appended, removed, unchanged)`` of two conversations; other changes go to ``found``.

    Paths of changed and removed messages count in A, of added ones in B.
    """
    prefix = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        prefix += 1
    unchanged = [_describe_run("messages", prefix)] if prefix else []
    if prefix == len(a):
        return tuple(b[prefix:]), (), unchanged
    if prefix == len(b):
        return (), tuple(a[prefix:]), unchanged

    suffix = 0
    while suffix < min(len(a), len(b)) - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    if suffix:
        unchanged.append("the last message" if suffix == 1 else f"the last {suffix:,} messages")
    window_a, window_b = a[prefix : len(a) - suffix], b[prefix : len(b) - suffix]
    opcodes: Sequence[tuple[str, int, int, int, int]]
    if len(window_a) == len(window_b):
        opcodes = [("replace", 0, len(window_a), 0, len(window_b))]
    else:
        matcher = SequenceMatcher(
            None,
            [_fingerprint(m) for m in window_a],
            [_fingerprint(m) for m in window_b],
            autojunk=False,
        )
        opcodes = matcher.get_opcodes()
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal":
            continue
        for i, j in zip(range(i1, i2), range(j1, j2), strict=False):
            if window_a[i] != window_b[j]:
                _deep(window_a[i], window_b[j], ("messages", prefix + i), found, memo)
        for i in range(i1 + (j2 - j1), i2):
            found.add(REMOVED, ("messages", prefix + i), window_a[i], None)
        for j in range(j1 + (i2 - i1), j2):
            found.add(ADDED, ("messages", prefix + j), None, window_b[j])
    return (), (), unchanged


def _fingerprint(value: Any) -> str:
    """A key equal only for equal JSON values: ``repr`` tells 1 from 1.0 and True, NaN
    from null, and is a quarter of the cost of sorted JSON (a compare page takes two
    hundred). Two equal objects with their keys in another order key apart, which
    costs a diff, never a wrong one."""
    return repr(value)


# --- words --------------------------------------------------------------------


def readable_path(path: Sequence[str | int]) -> str:
    """``("messages", 2, "content")`` as ``messages[2].content``; the root as ``(whole value)``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _IDENTIFIER.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(part, ensure_ascii=False)}]"
    return text or "(whole value)"


def _path_key(path: Path) -> tuple[tuple[int, int, str], ...]:
    return tuple((1, 0, p) if isinstance(p, str) else (0, p, "") for p in path)


def _display(value: Any) -> tuple[str, bool]:
    """A value as a person reads it: JSON inline, or a block when long or multi-line."""
    if isinstance(value, str) and (len(value) > INLINE_LIMIT or "\n" in value):
        return _cut(value), True
    compact = json.dumps(value, ensure_ascii=False, default=str)
    if len(compact) <= INLINE_LIMIT:
        return compact, False
    return _cut(json.dumps(value, indent=2, ensure_ascii=False, default=str)), True


def _cut(text: str) -> str:
    if len(text) <= TEXT_LIMIT:
        return text
    return f"{text[:TEXT_LIMIT]}… ({len(text) - TEXT_LIMIT:,} more characters)"


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _describe(path: Path, value: Any) -> str:
    if isinstance(value, list):
        return f"{readable_path(path)} ({_count(len(value), 'item')})"
    if isinstance(value, dict):
        return f"{readable_path(path)} ({_count(len(value), 'key')})"
    return readable_path(path)


def _describe_run(name: str, count: int) -> str:
    if count == 1:
        return f"{name}[0] (1 message)"
    return f"{name}[0]–[{count - 1}] ({count} messages)"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n:,} {noun}s"


def _join(names: Sequence[str], word: str) -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + f" {word} " + names[-1]


def _section_summary(
    same: bool,
    changes: int,
    truncated: bool,
    appended: tuple[Any, ...],
    removed: tuple[Any, ...],
) -> str:
    if same:
        return "no change"
    parts = []
    if appended:
        parts.append(f"{_count(len(appended), 'new message')} in B")
    if removed:
        parts.append(f"{_count(len(removed), 'message')} only in A")
    if changes:
        parts.append(("more than " if truncated else "") + _count(changes, "change"))
    return ", ".join(parts)
