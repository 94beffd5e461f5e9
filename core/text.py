"""Text for a message: a value quoted, masked and clipped to one line, and characters that could rewrite a
terminal line escaped."""

from __future__ import annotations

import unicodedata

from core.secrets import mask_secrets


def quoted(value: object, limit: int = 80) -> str:
    """A value for an error message: masked, clipped, and one line (repr escapes breaks)."""
    text = mask_secrets(str(value))
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


# Control characters (ESC, BEL, CR, LF, other C0 and C1), invisible format characters (bidi overrides,
# zero-width) and line/paragraph separators: quoted raw, any of them can rewrite or hide a terminal line.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# Plus lone surrogates: a file name that is not UTF-8 decodes to them, and they cannot be printed.
_ESCAPED_CATEGORIES = _UNSAFE_CATEGORIES | {"Cs"}


def has_unsafe_characters(text: str) -> bool:
    """Whether `text` holds a control, invisible format or line separator character."""
    return any(unicodedata.category(char) in _UNSAFE_CATEGORIES for char in text)


def escaped(value: object) -> str:
    """`value` as text for a message or log line, each unsafe character or lone surrogate written as its
    Python escape (ESC as \\x1b); the rest, non-ASCII letters included, is left readable."""
    return "".join(
        ascii(char)[1:-1] if unicodedata.category(char) in _ESCAPED_CATEGORIES else char
        for char in str(value)
    )
