"""The event catalogue as people and programs read it: its entries (a
type with its versions), their JSON in the admin and tenant APIs, and a
version's schema as the rows of a table for the portal. No I/O: the store
reads the entries (hooklane/store/catalogue_reads.py), the API and the
portal show them, hooklane/catalogue_openapi.py exports them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any
from urllib.parse import unquote

from hooklane.selfservice import within

# How deep the portal's table follows nested objects, and how many rows it
# shows of one schema: a schema is the platform's, but a deep or huge one
# must not make a page of megabytes. What is cut is still in the raw JSON.
MAX_ROW_DEPTH = 8
MAX_ROWS = 500


@dataclass(frozen=True)
class CatalogueVersion:
    """One version of a type: its JSON Schema (draft 2020-12, bundled) and
    an example that validates against it."""

    version: int
    schema: Any
    example: dict[str, Any]


@dataclass(frozen=True)
class CatalogueEntry:
    """One event type of the catalogue, with its versions, oldest first."""

    name: str
    description: str
    group: str | None
    deprecated_since: date | None
    archived: bool
    versions: tuple[CatalogueVersion, ...]

    @property
    def latest(self) -> CatalogueVersion | None:
        return self.versions[-1] if self.versions else None


def entry_json(entry: CatalogueEntry) -> dict[str, Any]:
    """An entry as the admin API and the tenant API answer it, alike."""
    latest = entry.latest
    return {
        "name": entry.name,
        "description": entry.description,
        "group": entry.group,
        "deprecated": entry.deprecated_since is not None,
        "deprecated_since": None if entry.deprecated_since is None else entry.deprecated_since.isoformat(),
        "archived": entry.archived,
        "latest_version": None if latest is None else latest.version,
        "versions": [
            {"version": v.version, "schema": v.schema, "example": v.example} for v in entry.versions
        ],
    }


def grouped(entries: Iterable[CatalogueEntry]) -> list[tuple[str | None, list[CatalogueEntry]]]:
    """The entries by group, groups by name and the types without one
    last; each group's types by name."""
    groups: dict[str | None, list[CatalogueEntry]] = {}
    for entry in entries:
        groups.setdefault(entry.group, []).append(entry)
    order = sorted(groups, key=lambda g: (g is None, g or ""))
    return [(g, sorted(groups[g], key=lambda e: e.name)) for g in order]


@dataclass(frozen=True)
class SchemaRow:
    """One property of a schema as the portal's table shows it: ``path``
    names it from the top (``customer.address.city``, ``items[].sku``),
    ``depth`` indents it under its parent."""

    path: str
    name: str
    depth: int
    type: str
    required: bool
    description: str


def schema_rows(schema: Any) -> tuple[list[SchemaRow], bool]:
    """The properties of ``schema`` as table rows, nested objects (and
    the objects of arrays) after their parent one level deeper; and whether
    rows were left out (:data:`MAX_ROWS`, :data:`MAX_ROW_DEPTH`, a schema
    that refers to itself). A ``$ref`` to a place inside the schema is
    followed; one elsewhere shows as its address."""
    rows: list[SchemaRow] = []
    cut = _walk(schema, schema, "", 0, rows, frozenset({"#"}))
    return rows, cut


def _walk(root: Any, node: Any, prefix: str, depth: int, rows: list[SchemaRow], seen: frozenset[str]) -> bool:
    node, seen, looped = _resolved(root, node, seen)
    if looped:
        return True
    if not isinstance(node, dict):
        return False
    properties = node.get("properties")
    if not isinstance(properties, dict):
        items = node.get("items")
        if node.get("type") == "array" and isinstance(items, dict) and prefix:
            return _walk(root, items, prefix + "[]", depth, rows, seen)
        return False
    if depth >= MAX_ROW_DEPTH:
        return True
    listed = node.get("required")
    required: list[Any] = listed if isinstance(listed, list) else []
    cut = False
    # jsonb keeps no author's order of keys: the required ones first, then
    # the others, each by name.
    for name, sub in sorted(properties.items(), key=lambda item: (item[0] not in required, item[0])):
        if len(rows) >= MAX_ROWS:
            return True
        path = f"{prefix}.{name}" if prefix else name
        target, _, _ = _resolved(root, sub, seen)
        rows.append(SchemaRow(path, name, depth, type_text(sub), name in required, _description(sub, target)))
        cut = _walk(root, sub, path, depth + 1, rows, seen) or cut
    return cut


def _resolved(root: Any, node: Any, seen: frozenset[str]) -> tuple[Any, frozenset[str], bool]:
    """``node``, or what its local ``$ref`` points at; True when following
    it would loop."""
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
        ref = node["$ref"]
        if ref in seen:
            return node, seen, True
        seen = seen | {ref}
        found = pointed(root, ref)
        if found is None:
            return node, seen, False
        node = found
    return node, seen, False


def pointed(root: Any, ref: str) -> Any:
    """What the JSON Pointer fragment ``ref`` (``#/$defs/Address``) points
    at in ``root``; None when nothing is there."""
    node = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        token = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def _description(sub: Any, target: Any) -> str:
    for node in (sub, target):
        if isinstance(node, dict):
            for key in ("description", "title"):
                if isinstance(node.get(key), str):
                    return str(node[key])
    return ""


def type_text(schema: Any) -> str:
    """What a value of ``schema`` is, in a few words: ``string (date-time)``,
    ``array of integer``, ``one of: "a", "b"``, ``Address``."""
    if schema is True:
        return "any"
    if schema is False:
        return "nothing"
    if not isinstance(schema, dict):
        return ""
    if isinstance(schema.get("$ref"), str):
        return schema["$ref"].rsplit("/", 1)[-1] or "object"
    if "const" in schema:
        return f"exactly {_literal(schema['const'])}"
    if isinstance(schema.get("enum"), list):
        return "one of: " + ", ".join(_literal(v) for v in schema["enum"][:20])
    for key, word in (("oneOf", "one of"), ("anyOf", "any of"), ("allOf", "all of")):
        if isinstance(schema.get(key), list):
            return f"{word}: " + " | ".join(type_text(s) for s in schema[key][:10])
    kinds = schema.get("type")
    text = " or ".join(kinds) if isinstance(kinds, list) else kinds if isinstance(kinds, str) else ""
    if text == "array" and isinstance(schema.get("items"), dict):
        text = f"array of {type_text(schema['items']) or 'any'}"
    if isinstance(schema.get("format"), str):
        text = f"{text} ({schema['format']})".strip()
    return text or ("object" if "properties" in schema else "any")


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def pickable(entries: Iterable[CatalogueEntry], rules: Sequence[str]) -> list[CatalogueEntry]:
    """The types the portal's picker offers: not archived (refused at
    publish: nothing would come), and among the types the platform lets
    tenants choose (``HOOKLANE_PORTAL_EVENT_TYPES``; none: every type)."""
    return [e for e in entries if not e.archived and (not rules or any(within(e.name, r) for r in rules))]


def picker_split(patterns: Sequence[str], names: Iterable[str]) -> tuple[list[str], list[str]]:
    """An endpoint's event types as the portal's form shows them: those
    that are a catalogue type's name (ticked in the picker), and the rest
    (patterns such as ``order.*``, and names the catalogue lacks), typed."""
    known = set(names)
    return [p for p in patterns if p in known], [p for p in patterns if p not in known]


def picked_types(picked: Sequence[str], typed: Sequence[str]) -> list[str]:
    """The event types of a form that posts the picker's ticked types and
    the typed patterns: both, each once, ticked first."""
    return list(dict.fromkeys([*picked, *typed]))
