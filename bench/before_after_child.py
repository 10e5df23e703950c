"""One side of bench item before-after, run in a fresh interpreter (bench/before_after.py).

This file is loaded by path, under a name of its own, so that the ``bench`` and ``machine``
packages it imports are those of the tree it measures (first on ``PYTHONPATH``): the
working tree's or an earlier commit's, taken with ``git archive``. It imports only the
standard library itself. Its arguments are the tree and a JSON list of measures (each
naming the module of that tree that holds its entry point); it prints one JSON line with a
result or the reason it failed for each measure.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import logging
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any


def _inside(module: ModuleType, tree: Path) -> bool:
    location = getattr(module, "__file__", None)
    return location is not None and Path(location).resolve().is_relative_to(tree)


def _install_model(tree: Path) -> None:
    """The reference model is installed as ``machine._model`` (setup.py maps ``model/``
    there); an editable install would map it to its own checkout, so this tree's
    ``model/`` is loaded under that name before anything imports it."""
    import machine
    init = tree / "model" / "__init__.py"
    if not init.is_file():
        return      # the tree has no model: measures that need it say so when they fail
    spec = importlib.util.spec_from_file_location(
        "machine._model", init, submodule_search_locations=[str(init.parent)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {init} as machine._model")
    module = importlib.util.module_from_spec(spec)
    sys.modules["machine._model"] = module
    spec.loader.exec_module(module)
    machine._model = module     # type: ignore[attr-defined]


def check_imports(tree: Path) -> dict[str, str]:
    """Fail unless ``machine``, its reference model and ``bench`` come from *tree*; the
    file each was imported from."""
    import machine
    _install_model(tree)
    modules = [machine, importlib.import_module("bench")]
    if (tree / "model").is_dir():
        modules.append(importlib.import_module("machine._model"))
    for module in modules:
        if not _inside(module, tree):
            raise ImportError(f"{module.__name__} was imported from "
                              f"{getattr(module, '__file__', None)}, not from {tree}")
    return {module.__name__: str(module.__file__) for module in modules}


def measure(spec: dict[str, Any], tree: Path) -> dict[str, Any]:
    """Run one measure; CPU time is this process's (``time.process_time``)."""
    module = importlib.import_module(spec["module"])
    if not _inside(module, tree):
        raise ImportError(f"{spec['module']} was imported from {module.__file__}, "
                          f"not from {tree}")
    gc.collect()
    kind = spec["kind"]
    if kind == "core":
        run = module.run_sync(spec["workload"], spec["turns"])
        return {"cpu_s": run.cpu, "count": run.durable, "turns": run.turns}
    if kind == "runtime":
        run = module.run_async(spec["workload"], spec["turns"])
        return {"cpu_s": run.cpu, "count": run.turns, "turns": run.turns}
    if kind == "explore":
        logging.getLogger("turnstile").setLevel(logging.ERROR)
        search = spec["search"]
        if search != "classic" and search not in module.CONFIGURATIONS:
            raise LookupError(f"{spec['module']}.CONFIGURATIONS has no {search!r} (it has "
                              f"{', '.join(map(repr, module.CONFIGURATIONS))})")
        explorer = (module.classic_explorer() if search == "classic"
                    else module.CONFIGURATIONS[search].explorer())
        started = time.process_time()
        result = explorer.run(spec["depth"])
        cpu = time.process_time() - started
        if result.failure is not None:
            raise AssertionError(f"the explorer found a violation: {result.failure}")
        return {"cpu_s": cpu, "count": result.states}
    raise ValueError(f"unknown measure kind {kind!r}")


def main(argv: list[str]) -> int:
    tree = Path(argv[0]).resolve()
    specs: list[dict[str, Any]] = json.loads(argv[1])
    print(json.dumps({"imports": check_imports(tree)}), flush=True)
    for spec in specs:
        try:
            line: dict[str, Any] = {"figure": spec["figure"], **measure(spec, tree)}
        except Exception as error:     # reported as the figure's reason
            detail = traceback.format_exception_only(type(error), error)[-1].strip()
            line = {"figure": spec["figure"], "error": detail}
        print(json.dumps(line), flush=True)
    return 0
