"""People's names: when two are one person's, and when one would pass for another.

Decisions, votes and sessions carry a person's name as text. Two texts can be one name
to a reader: ``Ada`` and ``ada``, a fullwidth ``Ａda``, a Cyrillic ``Аda`` (U+0410), a
``ﬁ`` ligature. So names are compared by their **normal form** (Unicode NFKC, then case
folded), and a name is refused beside another whose **skeleton** is the same: Unicode's
confusables skeleton (UTS #39), each character replaced by the one it is drawn like,
computed over the normal form from the confusables table the ``confusable_homoglyphs``
package keeps (Unicode's ``confusables.txt``).

``localui users add`` refuses a name that looks like an existing person's, and ``localui
users list --check`` lists the pairs already there; a two-person rule counts two names
that look alike as one person (:func:`one_person`), whoever they came from: a sign-in, a
trusted proxy's header, or a name typed with sign-in off.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterable

from localui import freetext

#: The longest name taken: enough for any real name or e-mail address.
MAX_NAME = 120
#: Direction marks ``confusable_homoglyphs`` keeps around right-to-left characters.
_MARKS = "\u200e\u200f"


def normal(name: str) -> str:
    """The form names are compared in: NFKC, case folded, each run of spaces one."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


@functools.cache
def _drawn_like() -> dict[str, str]:
    """Each character of the confusables table and the one it is drawn like (UTS #39's
    prototype). The table lists each look-alike pair both ways; a look-alike maps to
    one prototype only, so a character with a single entry whose other side has several
    is a look-alike of that side. Where each side has only the other, either stands for
    both: the smaller is taken."""
    from confusable_homoglyphs.confusables import confusables_data

    table: dict[str, list[str]] = {}
    for char, alikes in confusables_data.items():
        table[char.strip(_MARKS)] = [str(a["c"]).strip(_MARKS) for a in alikes]
    drawn: dict[str, str] = {}
    for char, alikes in table.items():
        if len(char) != 1 or len(alikes) != 1:
            continue
        [other] = alikes
        if len(other) > 1 or len(table.get(other, ())) > 1:
            drawn[char] = other
        elif other != char:
            drawn[char] = min(char, other)
    return drawn


def skeleton(name: str) -> str:
    """What ``name`` looks like: its normal form, each character replaced by the one it
    is drawn like, case folded again (a prototype may be a capital: ``0`` is drawn like
    ``O``)."""
    drawn = _drawn_like()
    spelled = unicodedata.normalize("NFD", normal(name))
    mapped = "".join(drawn.get(c, c) for c in spelled)
    return unicodedata.normalize("NFD", mapped).casefold()


def one_person(a: str, b: str) -> bool:
    """Whether two names must be taken for one person's: the same normal form, or
    the same skeleton."""
    return normal(a) == normal(b) or skeleton(a) == skeleton(b)


#: How a decision made for an away person names both: ``bob for ada``
#: (``localui.delegation``).
FOR = " for "


def for_text(delegate: str, away: str) -> str:
    """The actor of a decision ``delegate`` made for ``away``: ``bob for ada``."""
    return f"{delegate}{FOR}{away}"


def people_in(actor: str) -> tuple[str, ...]:
    """The people an actor text stands for: itself, and for ``bob for ada`` both bob and
    ada. It is split at every `` for `` in it, since a name may hold one itself
    (``Jack for Hire``): a two-person rule then errs toward counting one person."""
    found = [actor]
    at = actor.find(FOR)
    while at != -1:
        found += [actor[:at], actor[at + len(FOR) :]]
        at = actor.find(FOR, at + 1)
    return tuple(found)


def same_voter(a: str, b: str) -> bool:
    """Whether two votes' actors must count as one person's: :func:`one_person` for any
    person each stands for, so ``bob for ada`` is ada's vote, and bob's too (neither
    ada and her delegate, nor the delegate twice, make two approvals)."""
    return any(one_person(x, y) for x in people_in(a) for y in people_in(b))


def look_alikes(name: str, others: Iterable[str]) -> list[str]:
    """Those of ``others`` that ``name`` would pass for (itself excepted)."""
    return [o for o in others if o != name and one_person(name, o)]


def look_alike_pairs(names: Iterable[str]) -> list[tuple[str, str]]:
    """Every pair of ``names`` that look alike, each once, in the order given."""
    by_skeleton: dict[str, list[str]] = {}
    for name in names:
        by_skeleton.setdefault(skeleton(name), []).append(name)
    return [
        (group[i], group[j])
        for group in by_skeleton.values()
        for i in range(len(group))
        for j in range(i + 1, len(group))
    ]


def typed_name(what: str, text: str) -> str:
    """A name a person typed (sign-in off): one line of at most :data:`MAX_NAME`
    characters, by :mod:`localui.freetext`'s rule."""
    return freetext.line(what, text, limit=MAX_NAME)
