"""The reference model: an independent, deliberately plain reading of ``specs/``.

`ModelAgent` has the interface of `machine.core.AgentCore` and is written rule by
rule from ``shared/reference/semantics.md`` and ``specs/protocol.md``; the
differential test (``tests/test_differential.py``) drives both with the same inputs.
"""

from model.agent import ModelAgent

__all__ = ["ModelAgent"]
