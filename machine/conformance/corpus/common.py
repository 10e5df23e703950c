"""What the corpus modules share: the scripts' common openings and constants, and the table
form of a family of scenarios that play one script with other arguments.

Each piece has its home here so that the scenario, rule and blind-spot modules (and the
matrix) say it once: a scenario's own definition keeps only what it does of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from machine.conformance.authoring import Session, error, model_failure, notation, scenario
from machine.io import Effect

__all__ = ["ABORT", "FAILURE", "Variant", "admission_pending", "block", "cancel_reports",
           "failed_step_retaining", "inject_during", "live_of", "started", "variants"]

#: A model failure (a request failure, R13.1) that recovery may retry.
FAILURE = model_failure("model unavailable", "UNAVAILABLE")
#: How a model call honours its aborted signal.
ABORT = error("the signal was aborted", "AbortError")


def started(*replies: Any, hold: str | None = None, prompt: str = "go") -> Session:
    """A session with these model *replies*, *prompt* followed up and run: the opening most
    scripts share. With *hold*, the first effect of that kind is held (still outstanding)."""
    s = Session(*replies)
    if hold is not None:
        s.hold(hold)
    s.followup(prompt)
    s.run()
    return s


def admission_pending(s: Session, prompt: str, *staged: str) -> Session:
    """*prompt* followed up and its admission held at {prompt-submit}; then each of *staged*
    injected from plugin:test (a name starting with 's' is steered instead), all staged in the
    open window."""
    s.hold("prompt-submit")
    s.followup(prompt)
    s.run()
    for text in staged:
        if text.startswith("s"):
            s.steer(text)
        else:
            s.inject(text, "plugin:test")
    return s


def failed_step_retaining(context: str, *replies: Any) -> Session:
    """The prompt 'go' whose first step hook stages *context* (from plugin:test) and then
    raises 'step failed': the turn fails before its step, the context is retained (R11.3)."""
    s = Session(*replies)

    def step_hook(e: Effect) -> object:
        s.inject(context, "plugin:test")
        return ("raise", error("step failed"))
    s.handle("step", step_hook, times=1)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') TE(1,error)")
    return s


def block(s: Session) -> None:
    """The held admission decides: blocked (reason 'no'); run."""
    s.resolve("prompt-submit", {"kind": "block", "reason": "no"})
    s.run()


def inject_during(s: Session, seam: str, text: str, src: str = "plugin:test") -> None:
    """While the first {*seam*} is outstanding, context *text* is injected (its handler then
    gives the default answer)."""
    def handler(e: Effect) -> None:
        s.inject(text, src)
    s.handle(seam, handler, times=1)


def live_of(s: Session, *prefixes: str) -> list[str]:
    """The live notifications (as tokens) that start with one of *prefixes*: the reports a
    check picks out, e.g. ``live_of(s, "disc", "ctxdisc")``."""
    return [t for t in s.live() if t.startswith(prefixes)]


def cancel_reports(s: Session, text: str) -> None:
    """A cancel now: what it outputs (controls aside) reads *text*, which ends the live
    notifications."""
    mark = len(s.outputs)
    s.cancel()
    s.run()
    tokens = notation(text)
    assert s.live()[-len(tokens):] == tokens, s.live()
    assert s.trace(controls=False, since=mark) == tokens, s.trace(since=mark)


@dataclass(frozen=True, slots=True)
class Variant:
    """One scenario of a family whose members play one script with other arguments: its id,
    title, rules and tags (as `scenario` takes them) and *play*, the script so called."""
    id: str
    title: str
    rules: Sequence[str]
    tags: Sequence[str]
    play: Callable[[], Session]


def variants(*table: Variant) -> None:
    """Register the scenarios of *table*, in order."""
    for item in table:
        scenario(item.id, item.title, item.rules, item.tags)(item.play)
