"""JSON parsing without `import json`: json.decoder compiles regular expressions at import (re + enum, ~8 ms),
which every `create` would pay. CPython's C scanner (_json) does the actual parsing, exactly as json.loads does.

Falls back to the json module where _json is unavailable. Only loads; writing is state.dumps_json.
"""
from __future__ import annotations

_WS = " \t\n\r"


class _Context:
    # the attributes _json.make_scanner reads (the same defaults json.JSONDecoder uses)
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}[name]


try:
    import _json
    _scan = _json.make_scanner(_Context())
except (ImportError, AttributeError):  # pragma: no cover - other Pythons
    _scan = None


def loads(data: bytes | str) -> object:
    """Like json.loads; raises ValueError (with the position) on malformed input."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    if text.startswith("\ufeff"):
        raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
    if _scan is None:
        import json
        return json.loads(text)
    i = 0
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    try:
        obj, end = _scan(text, i)
    except StopIteration as e:
        raise ValueError(f"Expecting value: {_where(text, e.value)}") from None
    except SystemError:
        # CPython 3.11's scanner can fail to build some error messages when json.decoder was never imported;
        # on this (error-only) path let the json module produce the precise message
        import json
        json.loads(text)
        raise ValueError("malformed JSON") from None
    while end < n and text[end] in _WS:
        end += 1
    if end != n:
        raise ValueError(f"Extra data: {_where(text, end)}")
    return obj


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line} column {col} (char {pos})"
