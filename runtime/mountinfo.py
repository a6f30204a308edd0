"""Reading /proc/<pid>/mountinfo: the one decoder of its escaped fields for the runtime and the layers above.

Pure string work, no imports beyond the stdlib: safe to import on any path.
"""
from __future__ import annotations


def unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as a backslash and three octal digits."""
    if "\\" not in field:
        return field
    out, i = bytearray(), 0
    raw = field.encode(errors="surrogateescape")
    while i < len(raw):
        if raw[i] == 0x5C and len(raw[i + 1:i + 4]) == 3 and raw[i + 1:i + 4].isdigit():
            out.append(int(raw[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode(errors="surrogateescape")
