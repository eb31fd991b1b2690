"""The ``WebhookEventType`` resource as Hooklane reads it, in local mode
(``hooklane eventtype apply``) and in the operator alike: the spec of one
event type of the catalogue (docs/catalogue.md) and its checks.

A spec is checked whole before anything is stored: the name's pattern (an
event's type), every version's schema (JSON Schema draft 2020-12), its
example against that schema, and the schema's ``$ref``s. A reference
inside the schema (``#/...``) stays; one to a file is resolved when the
type is applied and bundled into the schema's ``$defs`` (only the CLI has
files to read); one to the network is refused, so that nothing is ever
fetched, at apply or at publish. Errors name the field, as
``spec.versions[1].example: 'amount' is a required property``."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import date
from typing import Annotated, Any

import jsonschema
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from hooklane.bounded_yaml import load_yaml_documents
from hooklane.checks import K8S_NAME_PATTERN, NO_CONTROLS_PATTERN, walk
from hooklane.errors import InvalidInput, shown
from hooklane.spec import API_VERSION

KIND = "WebhookEventType"
PLURAL = "webhookeventtypes"
# An event's type, as events carry it (hooklane/checks.py: EVENT_TYPE), and
# as migration 0023's CHECK on catalogue_types.name repeats it.
NAME_PATTERN = r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*"
MAX_NAME = 255
MAX_DESCRIPTION = 4096
MAX_GROUP = 255
MAX_VERSION = 1000
# Per type: every version is stored and shown; a type with more is a
# catalogue of its own.
MAX_VERSIONS = 100
# A schema's JSON text, bundled: it is compiled at publish (cached by its
# digest) and rendered in the portal. An example is a payload, bounded as one.
MAX_SCHEMA_BYTES = 256 * 1024
MAX_EXAMPLE_BYTES = 64 * 1024
# Files a schema may refer to, bundled into it (the CLI only), and its depth
# of references from file to file.
MAX_REFERENCED_FILES = 64

_NAME = re.compile(NAME_PATTERN)
_K8S_NAME = re.compile(K8S_NAME_PATTERN)
_NO_CONTROLS = re.compile(NO_CONTROLS_PATTERN)
# An absolute URI's scheme (RFC 3986): http:, https:, urn:, file: ...
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_DEF_KEY = re.compile(r"[^A-Za-z0-9_.-]")

_UNION_BRANCHES = frozenset({"dict[str,any]", "bool"})
_TOP_LEVEL = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})

# A loader of the files a schema refers to: given a path relative to the
# file holding the reference (or to the manifest), its JSON or YAML
# content and the path the next relative references start from.
FileLoader = Callable[[str, str], tuple[Any, str]]


class Deprecation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    since: date


class VersionSpec(BaseModel):
    """One version of a type: its schema and an example that validates."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    version: Annotated[StrictInt, Field(ge=1, le=MAX_VERSION)]
    # "schema" is a BaseModel method's name.
    json_schema: Annotated[dict[str, Any] | StrictBool, Field(alias="schema")]
    example: dict[str, Any]


class EventTypeSpec(BaseModel):
    """A checked event type, its schemas bundled: what is stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[StrictStr, Field(min_length=1, max_length=MAX_NAME, pattern=f"^(?:{NAME_PATTERN})$")]
    description: Annotated[StrictStr, Field(max_length=MAX_DESCRIPTION)] = ""
    group: Annotated[StrictStr, Field(min_length=1, max_length=MAX_GROUP)] | None = None
    versions: Annotated[list[VersionSpec], Field(min_length=1, max_length=MAX_VERSIONS)]
    deprecated: Deprecation | None = None
    archived: StrictBool = False

    @property
    def latest(self) -> int:
        return max(v.version for v in self.versions)

    @property
    def deprecated_since(self) -> date | None:
        return None if self.deprecated is None else self.deprecated.since


def check_resource_name(resource_name: str, spec_name: Any) -> None:
    """A ``spec.name`` must come down to the resource's name, lowercased with
    ``_`` as ``-``: two resources can then never declare the same type (the
    API server says the same in the CRD). Without one, the resource's name
    is the type's."""
    if isinstance(spec_name, str) and resource_name != resource_name_for(spec_name):
        raise InvalidInput(
            "metadata.name",
            f"must be {shown(resource_name_for(spec_name))} (spec.name lowercased, '_' as '-'),"
            f" not {shown(resource_name)}",
        )


def is_type_name(value: str) -> bool:
    return len(value) <= MAX_NAME and _NAME.fullmatch(value) is not None


def resource_name_for(type_name: str) -> str:
    return type_name.lower().replace("_", "-")


def parse_spec(
    resource_name: str, spec: Any, load: FileLoader | None = None, base: str = ""
) -> EventTypeSpec:
    """Check a WebhookEventType's spec and bundle the files its schemas
    refer to (through ``load``, from ``base``; without a loader a file
    reference is refused). Raises ``InvalidInput`` naming the field."""
    if not isinstance(spec, dict):
        raise InvalidInput("spec", f"must be a mapping, not {shown(spec)}")
    for path, value in walk(spec, "spec"):
        _check_json_value(path, value)
    try:
        checked = EventTypeSpec.model_validate({"name": resource_name, **spec})
    except ValidationError as exc:
        raise _invalid(exc) from None
    check_resource_name(resource_name, spec.get("name"))
    if checked.group is not None and not _NO_CONTROLS.fullmatch(checked.group):
        raise InvalidInput("spec.group", f"must not contain control characters: {shown(checked.group)}")
    seen: set[int] = set()
    versions = []
    for i, version in enumerate(checked.versions):
        field = f"spec.versions[{i}]"
        if version.version in seen:
            raise InvalidInput(f"{field}.version", f"{version.version} is listed twice: versions are unique")
        seen.add(version.version)
        schema = bundle(version.json_schema, f"{field}.schema", load, base)
        check_schema(schema, f"{field}.schema")
        check_example(schema, version.example, f"{field}.example")
        versions.append(version.model_copy(update={"json_schema": schema}))
    return checked.model_copy(update={"versions": versions})


def parse_manifest(doc: Any, load: FileLoader | None = None, base: str = "") -> EventTypeSpec:
    """A whole WebhookEventType document (apiVersion, kind, metadata, spec)."""
    if not isinstance(doc, dict):
        raise InvalidInput("manifest", f"must be a mapping, not {shown(doc)}")
    if doc.get("apiVersion") != API_VERSION:
        raise InvalidInput("apiVersion", f"must be {API_VERSION}, not {shown(doc.get('apiVersion'))}")
    if doc.get("kind") != KIND:
        raise InvalidInput("kind", f"must be {KIND}, not {shown(doc.get('kind'))}")
    unknown = sorted(str(key) for key in doc if key not in _TOP_LEVEL)
    if unknown:
        raise InvalidInput(unknown[0], "is not a field of a WebhookEventType")
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict):
        raise InvalidInput("metadata", "must be a mapping with a name")
    name = metadata.get("name")
    if not isinstance(name, str) or len(name) > 253 or not _K8S_NAME.fullmatch(name):
        raise InvalidInput(
            "metadata.name", f"must be a lowercase DNS-style name (RFC 1123), not {shown(name)}"
        )
    if "namespace" in metadata:
        raise InvalidInput("metadata.namespace", "must not be set: a WebhookEventType is cluster-scoped")
    return parse_spec(name, doc.get("spec"), load, base)


def load_manifests(
    raw: bytes, source: str, load: FileLoader | None = None, base: str = ""
) -> list[EventTypeSpec]:
    """Every WebhookEventType of a YAML stream, each checked; an error
    names the document (counted from 1) when the stream holds several."""
    documents = [doc for doc in load_yaml_documents(raw, source) if doc is not None]
    if not documents:
        raise InvalidInput(source, "holds no WebhookEventType")
    specs: list[EventTypeSpec] = []
    names: set[str] = set()
    for number, doc in enumerate(documents, 1):
        try:
            spec = parse_manifest(doc, load, base)
        except InvalidInput as exc:
            if len(documents) == 1:
                raise
            raise InvalidInput(f"{source} (document {number}) {exc.field}", exc.message) from None
        if spec.name in names:
            raise InvalidInput(f"{source} (document {number})", f"declares {spec.name} a second time")
        names.add(spec.name)
        specs.append(spec)
    return specs


def check_schema(schema: dict[str, Any] | bool, field: str) -> None:
    """A valid draft 2020-12 schema of at most ``MAX_SCHEMA_BYTES`` whose
    every ``$ref`` points inside itself."""
    size = len(canonical_json(schema).encode())
    if size > MAX_SCHEMA_BYTES:
        raise InvalidInput(field, f"is {size} bytes of JSON: at most {MAX_SCHEMA_BYTES}")
    if isinstance(schema, dict) and schema.get("$schema", Draft202012Validator.META_SCHEMA["$id"]) not in (
        Draft202012Validator.META_SCHEMA["$id"],
        Draft202012Validator.META_SCHEMA["$id"] + "#",
    ):
        raise InvalidInput(
            f"{field}.$schema", f"must be {Draft202012Validator.META_SCHEMA['$id']} (draft 2020-12) or absent"
        )
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidInput(_at(field, exc.absolute_path), exc.message) from None
    for path, value in _refs(schema, field):
        if not value.startswith("#"):
            raise InvalidInput(
                path, f"{shown(value)} is not inside the schema: only #/... references are kept"
            )
    # A local reference to a place the schema does not have fails only when
    # an event reaches it: resolve every one now.
    resolver = Registry().resolver_with_root(
        Resource.from_contents(schema, default_specification=DRAFT202012)
    )
    for path, value in _refs(schema, field):
        try:
            resolver.lookup(value)
        except Unresolvable:
            raise InvalidInput(path, f"{shown(value)} points nowhere in the schema") from None


def check_example(schema: dict[str, Any] | bool, example: dict[str, Any], field: str) -> None:
    size = len(canonical_json(example).encode())
    if size > MAX_EXAMPLE_BYTES:
        raise InvalidInput(field, f"is {size} bytes of JSON: at most {MAX_EXAMPLE_BYTES}")
    error = jsonschema.exceptions.best_match(Draft202012Validator(schema).iter_errors(example))
    if error is not None:
        raise InvalidInput(_at(field, error.absolute_path), error.message)


def bundle(schema: Any, field: str, load: FileLoader | None, base: str) -> Any:
    """``schema`` with every reference to a file replaced by one into its
    ``$defs``, where the file's schema is copied (under a key made from its
    path); network references are refused, never fetched."""
    if not isinstance(schema, dict):
        return schema
    bundled: dict[str, Any] = {}
    keys: dict[str, str] = {}

    def rewrite(node: Any, path: str, here: str, root_key: str | None) -> Any:
        if isinstance(node, list):
            return [rewrite(child, f"{path}[{i}]", here, root_key) for i, child in enumerate(node)]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, child in node.items():
            if key == "$ref" and isinstance(child, str):
                out[key] = reference(child, f"{path}.$ref", here, root_key)
            else:
                out[key] = rewrite(child, f"{path}.{key}", here, root_key)
        return out

    def reference(ref: str, path: str, here: str, root_key: str | None) -> str:
        target, _, fragment = ref.partition("#")
        if not target:
            # Inside the document holding it: the schema, or a bundled file.
            return ref if root_key is None else f"#/$defs/{root_key}{fragment}"
        if _SCHEME.match(target) or target.startswith("//"):
            if target.lower().startswith(("http:", "https:", "//")):
                raise InvalidInput(
                    path, f"{shown(ref)} is on the network: schemas are never fetched; copy it into $defs"
                )
            raise InvalidInput(
                path, f"{shown(ref)}: only #/... references and relative file paths are supported"
            )
        if load is None:
            raise InvalidInput(
                path,
                f"{shown(ref)} refers to a file: a resource holds its whole schema (put it in $defs),"
                " or apply it with `hooklane eventtype apply`, which bundles files",
            )
        if target.startswith("/"):
            raise InvalidInput(path, f"{shown(ref)}: a file is named relative to the manifest")
        try:
            content, where = load(target, here)
        except InvalidInput as exc:
            raise InvalidInput(path, f"{shown(ref)}: {exc.message}") from None
        key = keys.get(where)
        if key is None:
            if len(keys) >= MAX_REFERENCED_FILES:
                raise InvalidInput(path, f"refers to more than {MAX_REFERENCED_FILES} files")
            key = _unique_key(where, set(keys.values()) | set(schema.get("$defs") or {}))
            keys[where] = key
            if isinstance(content, dict):
                content = {k: v for k, v in content.items() if k not in ("$id", "$schema")}
            elif not isinstance(content, bool):
                raise InvalidInput(path, f"{shown(ref)} does not hold a schema (an object or a boolean)")
            bundled[key] = rewrite(content, f"{path} ({target})", where, key)
        return f"#/$defs/{key}{fragment}"

    result = rewrite(schema, field, base, None)
    if bundled:
        result["$defs"] = {**(result.get("$defs") or {}), **bundled}
    return result


def _unique_key(where: str, taken: set[str]) -> str:
    stem = _DEF_KEY.sub("_", where.rsplit("/", 1)[-1]) or "file"
    key, n = stem, 1
    while key in taken:
        n += 1
        key = f"{stem}_{n}"
    return key


def _refs(schema: Any, field: str) -> list[tuple[str, str]]:
    found = []
    for path, value in walk(schema, field):
        if isinstance(value, dict) and isinstance(value.get("$ref"), str):
            found.append((f"{path}.$ref", value["$ref"]))
    return found


def _check_json_value(path: str, value: Any) -> None:
    # A YAML manifest may hold what JSON cannot: an unquoted timestamp, a
    # set, NaN. The API server would refuse it; so does this.
    if value is None or isinstance(value, (str, bool, int, dict, list)):
        return
    if isinstance(value, float) and math.isfinite(value):
        return
    if isinstance(value, date) and path.endswith("spec.deprecated.since"):
        return
    raise InvalidInput(path, f"is not a JSON value: {shown(value)} (quote it)")


def _at(field: str, path: Any) -> str:
    parts = [f"[{p}]" if isinstance(p, int) else f".{p}" for p in path]
    return field + "".join(parts)


def _invalid(exc: ValidationError) -> InvalidInput:
    error = exc.errors()[0]
    # pydantic names a union's branches in the location, after the field.
    loc = [p for p in error["loc"] if not (isinstance(p, str) and p in _UNION_BRANCHES)]
    path = _at("spec", loc)
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "is not a field of a WebhookEventType"
    elif error["type"] == "string_pattern_mismatch" and loc == ["name"]:
        message = f"must be an event type like 'order.paid' (letters, digits, '_' and '-', dot-separated), not {shown(error['input'])}"
    elif loc[-1:] == ["schema"]:
        message = f"must be a JSON Schema (an object or a boolean), not {shown(error['input'])}"
    elif error["type"] == "missing":
        message = "is required"
    return InvalidInput(path, message)


def canonical_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def stored_versions(spec: EventTypeSpec) -> list[tuple[int, str, str]]:
    """(version, schema JSON, example JSON) of each version, as the store takes them."""
    return [(v.version, canonical_json(v.json_schema), canonical_json(v.example)) for v in spec.versions]
