"""Find the field a malformed request breaks, so the error can name it.

Protobuf refuses a string field whose bytes are not UTF-8 but does not say which field. This walks
the wire format with the message's descriptor and returns the dotted path of the first such field
(``jobs[2].name``, ``labels[0].value``).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise IndexError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def find_invalid_utf8(descriptor: Descriptor | Any, data: bytes, prefix: str = "") -> str | None:
    """The path of the first string field in ``data`` that is not UTF-8, or None."""
    pos = 0
    seen: dict[int, int] = {}
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, pos = _varint(data, pos)
                continue
            if wire == 1:
                pos += 8
                continue
            if wire == 5:
                pos += 4
                continue
            if wire != 2:
                return None
            length, pos = _varint(data, pos)
            chunk = data[pos : pos + length]
            pos += length
            fd = descriptor.fields_by_number.get(number)
            if fd is None:
                continue
            index = seen.get(number, 0)
            seen[number] = index + 1
            repeated = bool(fd.is_repeated)
            name = f"{prefix}{fd.name}[{index}]" if repeated else f"{prefix}{fd.name}"
            if fd.type == FieldDescriptor.TYPE_STRING:
                try:
                    chunk.decode("utf-8")
                except UnicodeDecodeError:
                    return name
            elif fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type is not None:
                found = find_invalid_utf8(fd.message_type, chunk, name + ".")
                if found is not None:
                    return found
    except IndexError:
        return None
    return None
