"""JSON Schemas as the providers' structured-output formats accept them (specs/runtime.md RT23).

A run's ``output_type`` (RT23) is described as JSON Schema by pydantic; each provider takes
only a subset for its native structured output, so each adapter turns the schema into what
its API accepts, or says that it cannot (the run then uses a final-answer tool instead):

* `openai_format`: Chat Completions ``response_format`` ``json_schema``. Strict mode (the
  output is guaranteed to fit) needs every object closed (``additionalProperties: false``)
  and every property required, and no ``$ref`` with sibling keys; a schema that fits is
  sent ``strict``, any other one non-strict (a hint the model follows; the run validates
  the output either way).
* `anthropic_format`: Messages ``output_config.format`` ``json_schema``: every object
  closed, no recursion; numeric, length and item-count constraints are not supported, so
  they move into the description (the run still validates them). A schema with an open
  object (``dict[str, X]``) or recursion is refused (None).

Pure functions of plain JSON; no SDK needed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["anthropic_format", "openai_format"]

#: Constraints Anthropic's structured outputs do not take (the run validates them).
_ANTHROPIC_UNSUPPORTED: Final = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                 "multipleOf", "minLength", "maxLength", "maxItems")


def _defs(schema: Mapping[str, Any]) -> dict[str, Any]:
    defs = schema.get("$defs")
    return dict(defs) if isinstance(defs, Mapping) else {}


def _ref_name(ref: object) -> str | None:
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return ref[len("#/$defs/"):]
    return None


def _recursive(schema: Mapping[str, Any]) -> bool:
    """Whether a ``$defs`` entry reaches itself through ``$ref``s."""
    defs = _defs(schema)

    def refs(node: object) -> set[str]:
        found: set[str] = set()
        if isinstance(node, Mapping):
            name = _ref_name(node.get("$ref"))
            if name is not None:
                found.add(name)
            for value in node.values():
                found |= refs(value)
        elif isinstance(node, list):
            for value in node:
                found |= refs(value)
        return found

    edges = {name: refs(body) for name, body in defs.items()}

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for name in edges.get(start, ()):
            if name == target or (name not in seen and reaches(name, target, seen | {name})):
                return True
        return False
    return any(reaches(name, name, {name}) for name in edges)


#: Keywords whose value is a schema, a list of schemas, or a mapping of names to schemas.
_ONE: Final = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
               "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_MANY: Final = ("anyOf", "oneOf", "allOf", "prefixItems")
_NAMED: Final = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def _schemas(node: Any) -> list[dict[str, Any]]:
    """Every schema in *node*, itself first (keywords are only read where a schema is: a
    property named ``default`` or ``minimum`` is a name, not a keyword)."""
    if not isinstance(node, dict):
        return []
    out = [node]
    for key, value in node.items():
        if key in _ONE:
            out += _schemas(value)
        elif key in _MANY and isinstance(value, list):
            for item in value:
                out += _schemas(item)
        elif key in _NAMED and isinstance(value, dict):
            for item in value.values():
                out += _schemas(item)
    return out


def _objects(node: Any, visit: Any) -> None:
    """Call *visit* on every object schema (with ``properties`` or of type ``object``)."""
    for schema in _schemas(node):
        if schema.get("type") == "object" or "properties" in schema:
            visit(schema)


def _inline_sibling_refs(node: Any, defs: Mapping[str, Any]) -> None:
    """Each ``{"$ref": ..., "description": ...}`` gets the referenced schema merged in, in
    place (strict mode refuses keys beside a ``$ref``; *node* is not recursive)."""
    for schema in _schemas(node):
        name = _ref_name(schema.get("$ref"))
        if name is not None and len(schema) > 1 and name in defs:
            del schema["$ref"]
            for key, value in copy.deepcopy(defs[name]).items():
                schema.setdefault(key, value)
            _inline_sibling_refs(schema, defs)


def openai_format(schema: Mapping[str, Any], name: str, description: str | None
                  ) -> dict[str, Any]:
    """The Chat Completions ``response_format`` for *schema* (see the module docstring)."""
    body = copy.deepcopy(dict(schema))
    strict = not _recursive(body)
    if strict:
        _inline_sibling_refs(body, _defs(body))
    fits = [strict]

    def close(node: dict[str, Any]) -> None:
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping) or extra is True:
            fits[0] = False
        else:
            node["additionalProperties"] = False
        properties = node.get("properties")
        if not isinstance(properties, Mapping) or set(node.get("required", ())) != set(properties):
            fits[0] = False
    _objects(body, close)
    if fits[0]:
        _drop(body, "default")
    out: dict[str, Any] = {"name": name, "schema": body, "strict": fits[0]}
    if description:
        out["description"] = description
    return {"type": "json_schema", "json_schema": out}


def anthropic_format(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Messages ``output_config.format`` for *schema*, or None when Anthropic's
    structured outputs cannot take it (see the module docstring)."""
    if _recursive(schema):
        return None
    body = copy.deepcopy(dict(schema))
    fits = [True]

    def close(node: dict[str, Any]) -> None:
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping) or extra is True:
            fits[0] = False
        node["additionalProperties"] = False
    _objects(body, close)
    if not fits[0]:
        return None
    _move_constraints(body)
    return {"type": "json_schema", "schema": body}


def _move_constraints(node: Any) -> None:
    for schema in _schemas(node):
        moved = [f"{key}: {schema.pop(key)}" for key in _ANTHROPIC_UNSUPPORTED if key in schema]
        items = schema.get("minItems")
        if isinstance(items, int) and items > 1:
            moved.append(f"minItems: {schema.pop('minItems')}")
        if moved:
            note = "(" + ", ".join(moved) + ")"
            text = schema.get("description")
            schema["description"] = f"{text} {note}" if isinstance(text, str) and text else note


def _drop(node: Any, key: str) -> None:
    for schema in _schemas(node):
        schema.pop(key, None)
