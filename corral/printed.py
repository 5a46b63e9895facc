"""What a job prints, in pieces: the cut note of a stored output, and the order of live chunks.

A job's stored ``output`` is the end of what its attempt printed; when the start was cut, a first line
says how much (:func:`cut_note`). Live chunks (``WatchOutput``) name their attempt and their offset,
in characters, into what that attempt printed. :class:`PrintedCursor` turns chunks that may overlap
(the stored end after the live pieces, a watch taken up again after a restart) into text each
character of which is shown once, in order, and says how much was left out in between.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["OutputChunk", "PrintedCursor", "cut_note", "split_cut_note"]

_CUT_NOTE = re.compile(r"\[\.\.\. (\d+) characters before this were cut\]\n")


def cut_note(cut: int) -> str:
    """The first line of a stored output whose first ``cut`` characters were left out."""
    return f"[... {cut} characters before this were cut]\n"


def split_cut_note(output: str) -> tuple[int, str]:
    """``(offset, text)`` of a stored output: where its text starts in what the attempt printed (the
    characters its cut note says were left out; 0 without a note), and the text after the note."""
    match = _CUT_NOTE.match(output)
    if match is None:
        return 0, output
    return int(match.group(1)), output[match.end() :]


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """A piece of what attempt ``attempt`` printed, starting ``offset`` characters in."""

    attempt: int
    offset: int
    text: str

    @property
    def end(self) -> int:
        """The offset just past this chunk."""
        return self.offset + len(self.text)


@dataclass(frozen=True, slots=True)
class Fresh:
    """What :meth:`PrintedCursor.take` lets through: ``skipped`` characters left out before ``chunk``."""

    chunk: OutputChunk
    skipped: int


class PrintedCursor:
    """How far into each attempt's output a reader has got; see the module docstring."""

    def __init__(self) -> None:
        self._ends: dict[int, int] = {}

    def take(self, chunk: OutputChunk) -> Fresh | None:
        """The part of ``chunk`` not yet seen (None: nothing new), and how much was missed before it."""
        end = self._ends.get(chunk.attempt, 0)
        if chunk.end <= end and chunk.attempt in self._ends:
            return None
        text = chunk.text
        offset = chunk.offset
        if offset < end:
            text = text[end - offset :]
            offset = end
        if not text:
            return None
        self._ends[chunk.attempt] = offset + len(text)
        return Fresh(OutputChunk(chunk.attempt, offset, text), offset - end)
