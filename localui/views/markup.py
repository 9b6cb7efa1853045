"""Sentences with code in them, for templates: ``a `b` c`` shows ``b`` as code.

The run rules write node ids and tool names between backticks; a person should
see them set as code, never the backticks themselves.
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

_CODE = re.compile(r"`([^`]+)`")


def code_spans(text: str | None) -> Markup:
    """``text`` escaped, with each `quoted` part in a ``<code>`` element."""
    if not text:
        return Markup("")
    parts = _CODE.split(str(text))
    out = []
    for i, part in enumerate(parts):
        out.append(Markup("<code>{}</code>").format(part) if i % 2 else escape(part))
    return Markup("").join(out)
