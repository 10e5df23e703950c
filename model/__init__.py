"""The reference model: an independent, deliberately plain reading of ``specs/``.

`ModelAgent` has the interface of `machine.core.AgentCore` and is written rule by
rule from ``shared/reference/semantics.md`` and ``specs/protocol.md``; the
differential test (``tests/test_differential.py``) drives both with the same inputs.

This folder is installed as the private package ``machine._model`` (setup.py): import it
as ``from machine._model import ModelAgent``. Its own imports are relative, so the same
files work under either name; the distribution installs no top-level ``model``.
"""

from .agent import ModelAgent

__all__ = ["ModelAgent"]
