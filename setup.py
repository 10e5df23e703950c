"""The two build steps pyproject.toml cannot express (the metadata is all in pyproject.toml).

* The repository's ``model/`` folder (the reference model) is installed as the private
  package ``machine._model`` (a package-dir mapping), so the distribution claims no top-level
  import name but ``machine``: a user's own ``model.py`` shadows nothing turnstile imports.
* The spec's documents, the conformance kit (``PROTOCOL.md``, ``README.md``,
  ``vector.schema.json``, ``corpus.json``, the vectors) and the example scripts and logs are
  copied from ``specs/`` into ``machine/_specs/`` of the built package, at build time, so a
  wheel (and the wheel built from the sdist, which carries ``specs/``) is self-contained. An
  editable install copies nothing: it reads ``specs/`` in the checkout (``machine/specfiles.py``).

The corpus's authoring code (``machine/conformance/corpus/``, which writes the vectors and
the example logs of ``specs/``) ships too, with its data file ``original-steps.tsv``: in a
wheel, ``python -m machine.conformance.corpus --check`` checks the shipped corpus.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: What is shipped from specs/, as globs relative to it (machine/specfiles.py reads them).
SPEC_FILES = (
    "*.md",
    "machines/*.md",
    "machines/*.svg",
    "examples/*.json",
    "examples/*.jsonl",
    "conformance/*.md",
    "conformance/*.json",
    "conformance/vectors/*.json",
    "conformance/skeletons/*.ts",
)
SHIPPED_SPECS = Path("machine", "_specs")


def spec_files(root: Path) -> list[Path]:
    """The files under *root* (a specs/ folder) that the package ships, sorted, relative."""
    found = {path.relative_to(root) for pattern in SPEC_FILES for path in root.glob(pattern)
             if path.is_file()}
    return sorted(found)


class BuildWithSpecs(build_py):
    """``build_py`` that also copies the shipped spec files into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads specs/ in place
        source = HERE / "specs"
        files = spec_files(source)
        if not any(path.parts[:2] == ("conformance", "vectors") for path in files):
            raise SystemExit(f"setup.py: no conformance vectors under {source}/conformance/vectors")
        target = Path(self.build_lib) / SHIPPED_SPECS
        if target.exists():
            shutil.rmtree(target)  # a stale copy must not keep a vector that was removed
        for relative in files:
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / relative, destination)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        shipped = [] if getattr(self, "editable_mode", False) else [
            str(Path(self.build_lib) / SHIPPED_SPECS / relative)
            for relative in spec_files(HERE / "specs")]
        return [*super().get_outputs(include_bytecode), *shipped]


setup(
    packages=[*find_packages(include=["machine", "machine.*"]), "machine._model"],
    package_dir={"machine._model": "model"},
    package_data={"machine": ["py.typed"], "machine._model": ["py.typed"],
                  # what machine.conformance.corpus.build reads (importlib.resources)
                  "machine.conformance.corpus": ["original-steps.tsv"]},
    cmdclass={"build_py": BuildWithSpecs},
)
