"""Sentences with code in them, for templates: ``a `b` c`` shows ``b`` as code.

The run rules write node ids and tool names between backticks; a person should
see them set as code, never the backticks themselves.
"""

from __future__ import annotations

import re

from markupsafe import Markup

_CODE = re.compile(r"`([^`]+)`")


def _content(text: str) -> Markup:
    """``text`` escaped for an element's content, where only ``&``, ``<`` and ``>`` mean
    anything: quotes and apostrophes stay as a person wrote them (``the agent's code``).
    The filter is never used inside an attribute."""
    return Markup(text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))


def code_spans(text: str | None) -> Markup:
    """``text`` escaped, with each `quoted` part in a ``<code>`` element."""
    if not text:
        return Markup("")
    parts = _CODE.split(str(text))
    out = []
    for i, part in enumerate(parts):
        out.append(Markup("<code>{}</code>").format(_content(part)) if i % 2 else _content(part))
    return Markup("").join(out)
