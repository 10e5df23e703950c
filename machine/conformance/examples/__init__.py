"""Example ports for the conformance kit (specs/conformance/README.md).

* `minimal_port` — a complete adapter loop around `machine.core.AgentCore`, written
  against the protocol only: the shape a port's own adapter takes.
* `wrong_port` — the same port with deliberate bugs, to see how failures are reported.
"""
