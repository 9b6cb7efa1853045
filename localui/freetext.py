"""Text people type (reasons, typed names, field values, a fork's input): the one rule
for what is taken, and how what is kept is written to a terminal.

What a person types reaches the tool in ``Resume.metadata``, the decision record, every
``/decisions`` page, the chat targets and ``localui decisions export``. So it is refused
(400, saying which character and where) when it holds a control character other than
newline and tab (NUL, ESC sequences that set a terminal's title or clear its screen, a
lone carriage return), or a bidirectional override or isolate (U+202A–U+202E,
U+2066–U+2069) that would show the text in another order than it was written; and it
is bounded. A browser sends a textarea's line breaks as CR LF: those are taken as
newlines. Records written before the rule, and text that did not come from a person
(a run id an agent chose), are escaped by :func:`for_terminal` on their way to one.
"""

from __future__ import annotations

import unicodedata

from localui.errors import BadRequest

#: The longest reason taken, as a policy's text fields (``localui.policy.MAX_TEXT``).
MAX_REASON = 2000
#: The bidirectional overrides and isolates: LRE, RLE, PDF, LRO, RLO, LRI, RLI, FSI, PDI.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
#: The control characters a person's text may hold.
KEPT_CONTROLS = frozenset("\n\t")


def _refused(char: str) -> bool:
    if char in KEPT_CONTROLS:
        return False
    return char in BIDI_CONTROLS or unicodedata.category(char) == "Cc"


def _named(char: str) -> str:
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X}" + (f" {name}" if name else "")


def check(name: str, text: str, *, limit: int | None) -> str:
    """``text`` trimmed, its CR LF pairs made newlines; a 400 naming ``name`` when it is
    longer than ``limit`` characters or holds a character :data:`BIDI_CONTROLS` or a
    control other than newline and tab."""
    text = text.replace("\r\n", "\n").strip()
    if limit is not None and len(text) > limit:
        raise BadRequest(f"{name} is longer than {limit:,} characters ({len(text):,})")
    for at, char in enumerate(text):
        if _refused(char):
            kind = "a bidirectional override" if char in BIDI_CONTROLS else "a control character"
            raise BadRequest(
                f"{name} holds {kind} ({_named(char)}) at character {at + 1}: only newlines and"
                " tabs are taken besides printable text"
            )
    return text


def reason(text: str) -> str:
    """A decision's reason: :func:`check` with :data:`MAX_REASON`."""
    return check("reason", text, limit=MAX_REASON)


def line(name: str, text: str, *, limit: int) -> str:
    """One line (a typed name): :func:`check`, and no newline or tab either."""
    text = check(name, text, limit=limit)
    if "\n" in text or "\t" in text:
        raise BadRequest(f"{name} is one line: no newlines or tabs")
    return text


def for_terminal(text: str) -> str:
    """``text`` with every character :func:`check` refuses written as its escape
    (``\\x1b``, ``\\u202e``), so printing it never drives the terminal or reorders what
    it shows. Newlines and tabs stay; so does a CR before a newline (a CSV line end)."""
    if not any(_refused(c) for c in text):
        return text
    out = []
    for at, char in enumerate(text):
        if char == "\r" and text[at + 1 : at + 2] == "\n":
            out.append(char)
        elif _refused(char):
            out.append(f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out)
