"""A port that declines the seams the original implementation lacks (PROTOCOL.md §Skipping).

    python -m machine.conformance.examples.original_like_port

It is the minimal port with the capabilities a port of the original lists: ``seed``,
``append`` and ``observer``, but neither ``prepare-result`` nor ``request-header``, so the
vectors tagged ``extension:prepare-result`` and ``extension:request-header`` are skipped.
"""

from __future__ import annotations

from typing import Any

from machine.conformance.examples.minimal_port import Port


class OriginalLikePort(Port):
    name = "original-like-port"

    def hello(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        [reply] = super().hello(request)
        reply["capabilities"] = ["seed", "append", "observer"]
        return [reply]


if __name__ == "__main__":
    OriginalLikePort().serve()
