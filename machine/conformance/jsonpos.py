"""Line numbers of values inside a JSON document, for error messages.

`line_of(text, path)` returns the 1-based line where the value at *path*
(a tuple of keys and indices) starts. It runs a small position-tracking
scanner over the text and is only used after a problem has been found, so
the fast path (``json.loads``) stays fast.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence

__all__ = ["line_of"]

_WS = " \t\n\r"
_decoder = json.JSONDecoder()


class _Scanner:
    def __init__(self, text: str, target: Sequence[str | int]) -> None:
        self.text = text
        self.target = tuple(target)
        self.pos = 0
        self.best = 0  # position of the deepest prefix of target found so far

    def skip(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        self.pos = pos

    def value(self, path: tuple[str | int, ...]) -> None:
        self.skip()
        if self.target[: len(path)] == path:
            self.best = self.pos
        if self.pos >= len(self.text):
            raise ValueError("end of text")
        ch = self.text[self.pos]
        if ch == "{":
            self.pos += 1
            self.skip()
            if self.text.startswith("}", self.pos):
                self.pos += 1
                return
            while True:
                self.skip()
                key, end = json.decoder.scanstring(self.text, self.pos + 1)  # type: ignore[attr-defined]
                key_pos = self.pos
                self.pos = end
                self.skip()
                if not self.text.startswith(":", self.pos):
                    raise ValueError("expected ':'")
                self.pos += 1
                child = (*path, key)
                if self.target[: len(child)] == child:
                    self.best = key_pos
                self.value(child)
                self.skip()
                if self.text.startswith(",", self.pos):
                    self.pos += 1
                    continue
                if self.text.startswith("}", self.pos):
                    self.pos += 1
                    return
                raise ValueError("expected ',' or '}'")
        if ch == "[":
            self.pos += 1
            self.skip()
            if self.text.startswith("]", self.pos):
                self.pos += 1
                return
            index = 0
            while True:
                self.value((*path, index))
                index += 1
                self.skip()
                if self.text.startswith(",", self.pos):
                    self.pos += 1
                    continue
                if self.text.startswith("]", self.pos):
                    self.pos += 1
                    return
                raise ValueError("expected ',' or ']'")
        _, end = _decoder.raw_decode(self.text, self.pos)
        self.pos = end


def line_of(text: str, path: Sequence[str | int]) -> int:
    """The 1-based line of the value at *path* (or of its deepest existing ancestor)."""
    scanner = _Scanner(text, path)
    with contextlib.suppress(ValueError, IndexError):
        scanner.value(())
    return text.count("\n", 0, scanner.best) + 1
