"""What an installation provides, checked in the development environment.

The fresh-environment checks are in ``tests/test_packaging.py``; these are the fast ones:
where the spec files are found (`machine.specfiles`), ``corpus.json`` errors, ``python -m
machine``, the ``testing`` extra's ImportError, the demo without a corpus, and the JSON and
JUnit reports of ``verify-trace`` and ``explore``, and that the README's shell commands
name make targets and subcommands that exist.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from machine import __version__, specfiles
from machine.checking.search import CONFIGURATIONS
from machine.cli.main import main
from machine.runtime import demo

ROOT = Path(__file__).resolve().parents[1]
A5 = ROOT / "specs" / "conformance" / "vectors" / "A5-idle-steer-is-a-prompt.json"


def test_the_checkout_s_specs_are_used_in_a_checkout() -> None:
    assert specfiles.spec_root() == ROOT / "specs"
    assert specfiles.conformance_dir() == ROOT / "specs" / "conformance"
    assert specfiles.vectors_dir() == ROOT / "specs" / "conformance" / "vectors"


def test_the_shipped_copy_is_used_when_there_is_no_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = tmp_path / "machine" / "_specs"
    (shipped / "conformance" / "vectors").mkdir(parents=True)
    (shipped / "conformance" / "vector.schema.json").write_text("{}", encoding="utf-8")
    monkeypatch.setattr(specfiles, "SHIPPED_SPECS", shipped)
    monkeypatch.setattr(specfiles, "CHECKOUT_SPECS", tmp_path / "specs")     # not a checkout
    assert specfiles.spec_root() == shipped
    assert specfiles.vectors_dir() == shipped / "conformance" / "vectors"
    monkeypatch.setattr(specfiles, "SHIPPED_SPECS", tmp_path / "nothing")
    assert specfiles.spec_root() is None and specfiles.vectors_dir() is None
    with pytest.raises(specfiles.CorpusInfoError, match="no conformance kit found"):
        specfiles.corpus_info()


@pytest.mark.parametrize(("text", "problem"), [
    ("[1]", "must be a JSON object"),
    ("{", "invalid JSON"),
    ('{"corpus": "1", "vectorFormat": 1, "adapterProtocol": 1, "traceFormat": 1}',
     "/corpus: must be a version string MAJOR.MINOR"),
    ('{"corpus": "1.0", "vectorFormat": 0, "adapterProtocol": 1, "traceFormat": 1}',
     "/vectorFormat: must be a positive integer"),
    ('{"corpus": "1.0", "vectorFormat": 1, "adapterProtocol": true, "traceFormat": 1}',
     "/adapterProtocol: must be a positive integer"),
])
def test_a_malformed_corpus_json_is_named(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / "corpus.json").write_text(text, encoding="utf-8")
    with pytest.raises(specfiles.CorpusInfoError) as raised:
        specfiles.corpus_info(tmp_path)
    assert str(raised.value).startswith(f"{tmp_path / 'corpus.json'}: {problem}")
    with pytest.raises(specfiles.CorpusInfoError, match="cannot read"):
        specfiles.corpus_info(tmp_path / "none")


def test_python_dash_m_machine_is_the_command_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "machine", "--version"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (
        0, f"turnstile {__version__} (distribution turnstile-agent)\n")


@pytest.mark.parametrize("module", ["machine.checking.testing", "machine.checking.strategies"])
def test_without_hypothesis_the_testing_modules_name_the_extra(module: str) -> None:
    code = ("import sys; sys.modules['hypothesis'] = None\n"   # as if it were not installed
            f"import {module}")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert (f"ImportError: {module} needs Hypothesis, which is an optional dependency: install "
            "it with pip install 'turnstile-agent[testing]'") in result.stderr


def test_the_demo_fails_when_the_installation_has_no_corpus(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "spec_root", lambda: None)
    out = io.StringIO()
    assert demo.run_demo(out, colour=False) == 1
    assert "no conformance vectors found (looked in" in out.getvalue()
    assert "the installation is incomplete" in out.getvalue()


def test_verify_trace_json_and_junit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "run.jsonl"
    assert main(["record", str(A5), "--trace", "-o", str(trace)]) == 0
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(trace.read_text(encoding="utf-8").replace('"placement":"queued"',
                                                               '"placement":"steering"', 1),
                     encoding="utf-8")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"trace": 2}\n', encoding="utf-8")
    capsys.readouterr()
    report = tmp_path / "traces.xml"
    status = main(["verify-trace", "--json", "--junit", str(report), str(trace), str(wrong),
                   str(bad), str(tmp_path / "none.jsonl")])
    captured = capsys.readouterr()
    assert status == 3
    ok, diverges, malformed, missing = (json.loads(line) for line in captured.out.splitlines())
    assert (ok["verdict"], ok["sessions"], ok["file"]) == ("ok", 1, str(trace))
    assert ok["lines"] == len(trace.read_text(encoding="utf-8").splitlines())
    assert diverges["verdict"] == "diverges"
    assert diverges["divergence"]["difference"] == \
        'at /placement: expected "queued", got "steering"'
    assert diverges["divergence"]["context"][0]["line"] == 1
    assert (malformed["verdict"], malformed["line"], malformed["field"]) == \
        ("malformed", 1, "/trace")
    assert missing["verdict"] == "unreadable"
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "2")


def test_explore_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explore", "--depth", "2", "--model", "--quiet", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["model"] and result["violation"] is None
    assert result["depth"] == 2 and result["states"] > 1 and result["transitions"] > 1
    assert result["commands"] == list(CONFIGURATIONS["idle"].commands)
    assert result["configuration"] == "idle" and "R16" in result["families"]


def test_a_model_module_of_the_user_s_shadows_nothing(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("raise SystemExit('the user model.py was imported')\n",
                                       encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "machine", "explore", "--depth", "1",
                             "--model", "--quiet"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("no violation\n")


def _readme_shell_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
            if line.split("#")[0].strip()]


def test_the_readme_s_make_targets_and_commands_exist() -> None:
    commands = _readme_shell_commands()
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w.-]+):", makefile, re.M))
    made = [command.split()[1] for command in commands if command.startswith("make ")]
    assert {"wheel", "test", "demo"} <= set(made)
    assert set(made) <= targets, sorted(set(made) - targets)
    subcommands = {command.split()[1] for command in commands
                   if command.startswith("turnstile ") and not command.split()[1].startswith("-")}
    assert {"demo", "check"} <= subcommands
    for name in sorted(subcommands):
        result = subprocess.run([sys.executable, "-m", "machine", name, "--help"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (name, result.stderr)
    # installing from a checkout comes first; the index command is kept for when it is published
    installs = [command for command in commands if command.startswith("pip install")]
    assert installs[0].startswith("pip install .")
    assert any(".whl" in command for command in installs)
