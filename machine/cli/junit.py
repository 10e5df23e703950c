"""JUnit XML reports for CI systems (``--junit FILE`` of ``check``, ``verify-trace``, ``log validate``).

One ``<testsuites>`` document with one ``<testsuite>``; each checked item (a vector, a
trace, a log) is a ``<testcase>``. The shape is the one CI systems commonly read (Jenkins,
GitLab, GitHub Actions reporters): ``<failure>`` for a check that did not hold, ``<error>``
for one that could not be run (a port failure, a malformed or unreadable file),
``<skipped>`` for one not run or expected to fail. Texts are escaped by the XML writer.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["CaseStatus", "JunitCase", "junit_xml", "write_junit"]

CaseStatus = Literal["passed", "failed", "error", "skipped"]


@dataclass(frozen=True, slots=True)
class JunitCase:
    """One ``<testcase>``: *message* is the one-line reason, *text* the full report."""

    name: str
    classname: str
    status: CaseStatus
    seconds: float = 0.0
    message: str = ""
    text: str = ""
    file: str | None = None


def junit_xml(suite: str, cases: Sequence[JunitCase]) -> str:
    """The XML document (UTF-8 declaration included) for *cases* in one suite."""
    counts = {status: sum(c.status == status for c in cases)
              for status in ("failed", "error", "skipped")}
    total = f"{sum(c.seconds for c in cases):.3f}"
    root = ET.Element("testsuites", name=suite, tests=str(len(cases)),
                      failures=str(counts["failed"]), errors=str(counts["error"]),
                      skipped=str(counts["skipped"]), time=total)
    element = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)),
                            failures=str(counts["failed"]), errors=str(counts["error"]),
                            skipped=str(counts["skipped"]), time=total)
    for case in cases:
        attributes = {"name": _clean(case.name), "classname": _clean(case.classname),
                      "time": f"{case.seconds:.3f}"}
        if case.file is not None:
            attributes["file"] = _clean(case.file)
        item = ET.SubElement(element, "testcase", attributes)
        if case.status != "passed":
            tag = {"failed": "failure", "error": "error", "skipped": "skipped"}[case.status]
            detail = ET.SubElement(item, tag, message=_clean(case.message))
            if case.text:
                detail.text = _clean(case.text)
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'


def _allowed(character: str) -> bool:
    """Whether XML 1.0 can carry *character* (most control characters it cannot, even escaped)."""
    code = ord(character)
    if code < 0x20:
        return character in "\t\n\r"
    return not 0xD800 <= code <= 0xDFFF and code not in (0xFFFE, 0xFFFF)


def _clean(text: str) -> str:
    """*text* with the characters XML cannot carry shown as ``\\xNN``."""
    return "".join(c if _allowed(c) else f"\\x{ord(c):02x}" for c in text)


def write_junit(path: str | Path, suite: str, cases: Sequence[JunitCase]) -> None:
    """Write the report to *path* (raises OSError when it cannot be written)."""
    Path(path).write_text(junit_xml(suite, cases), encoding="utf-8")
