-- The event catalogue's validator (docs/catalogue.md, "Checking events at
-- publish"): hooklane_try_publish_v1 calls it under the modes warn and
-- enforce. Not a migration: PL/Python is an untrusted language, which only
-- a superuser may create and a managed service may not offer, so
-- `hooklane catalogue mode warn|enforce` runs this file when a mode first
-- needs it, and a database that never checks events never needs it.
-- Running it again changes nothing.

CREATE EXTENSION IF NOT EXISTS plpython3u;

-- The server's Python must have a jsonschema that knows draft 2020-12
-- (Debian's python3-jsonschema, 4.10 or later): found now, rather than
-- at the first publish.
DO LANGUAGE plpython3u $$
try:
    import jsonschema
except ImportError:
    plpy.error("the PostgreSQL server's Python has no jsonschema module: install python3-jsonschema "
               "(4.10 or later) on the database server")
if not hasattr(jsonschema, "Draft202012Validator"):
    plpy.error("the PostgreSQL server's jsonschema module is too old for JSON Schema draft 2020-12: "
               "install python3-jsonschema 4.10 or later on the database server")
$$;

-- Why data (JSON text) validates against none of the type's versions,
-- newest first: "data.<path>: <what> (schema version N, rule R)", the
-- newest version's best match (jsonschema.exceptions.best_match); or the
-- version it validates against, the newest that does. A type without
-- versions has nothing to check: (NULL, NULL).
--
-- Each version's validator is compiled once per backend, kept in GD by
-- (type, version, digest): a version applied again with another schema
-- has another digest, so that the next call compiles the new one. The
-- cache is emptied when it passes 4096 entries. A $ref the schema did not
-- bundle is never fetched (not from the network, not from the server's
-- files): it is reported as the problem.
-- Index: the primary key of catalogue_versions.
CREATE OR REPLACE FUNCTION hooklane_catalogue_problem_v1(type text, data text,
                                                        OUT version integer, OUT problem text)
LANGUAGE plpython3u STABLE
AS $$
import json
import re

import jsonschema
from jsonschema.exceptions import best_match

cache = GD.get("hooklane_catalogue_validators")
if cache is None:
    cache = GD["hooklane_catalogue_validators"] = {}
    GD["hooklane_catalogue_versions"] = plpy.prepare(
        "SELECT version, digest FROM catalogue_versions WHERE type = $1 ORDER BY version DESC", ["text"]
    )
    GD["hooklane_catalogue_schema"] = plpy.prepare(
        "SELECT schema::text AS schema FROM catalogue_versions WHERE type = $1 AND version = $2",
        ["text", "integer"],
    )

    class NotBundled(jsonschema.RefResolver):
        # The schema was bundled at apply: a reference left outside it is
        # the schema's fault, and is never fetched at publish.
        def resolve_remote(self, uri):
            raise jsonschema.RefResolutionError(f"{uri} is outside the schema (not bundled at apply)")

    GD["hooklane_catalogue_resolver"] = NotBundled

plain_key = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def place(path):
    text = "data"
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif plain_key.match(part):
            text += f".{part}"
        else:
            text += "[" + json.dumps(part) + "]"
        if len(text) > 200:
            return text[:200] + "..."
    return text


def validator(number, digest):
    key = (type, number, digest)
    found = cache.get(key)
    if found is None:
        if len(cache) >= 4096:
            cache.clear()
        rows = plpy.execute(GD["hooklane_catalogue_schema"], [type, number])
        schema = json.loads(rows[0]["schema"])
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            # Checked at apply: a row written some other way is reported,
            # as the event's problem, rather than raised at the publisher.
            found = cache[key] = f"the schema is not a valid JSON Schema: {exc.message}"
            return found
        found = cache[key] = jsonschema.Draft202012Validator(
            schema, resolver=GD["hooklane_catalogue_resolver"].from_schema(schema)
        )
    return found


versions = plpy.execute(GD["hooklane_catalogue_versions"], [type])
if len(versions) == 0:
    return (None, None)
instance = json.loads(data)
first = None
for row in versions:
    checker = validator(row["version"], row["digest"])
    if isinstance(checker, str):
        error = checker
    else:
        try:
            error = best_match(checker.iter_errors(instance))
        except jsonschema.RefResolutionError as exc:
            error = exc
        except (jsonschema.exceptions.UnknownType, RecursionError) as exc:
            error = f"the schema could not be checked: {exc.__class__.__name__}"
    if error is None:
        return (row["version"], None)
    if first is None:
        first = (row["version"], error)
number, error = first
if isinstance(error, str):
    what = f"data: {error}"
    rule = "schema"
elif isinstance(error, jsonschema.RefResolutionError):
    what = f"data: the schema refers to what it does not hold: {error}"
    rule = "$ref"
else:
    what = f"{place(error.absolute_path)}: {error.message}"
    rule = error.validator
if len(what) > 1000:
    what = what[:1000] + "..."
return (None, f"{what} (schema version {number}, rule {rule})")
$$;

-- Run as the role calling it, hooklane_try_publish_v1's owner (the
-- function is SECURITY DEFINER), with its schema: pinned, so that no
-- caller's search_path picks the tables it reads.
DO $$
DECLARE
    publisher regrole;
BEGIN
    EXECUTE format('ALTER FUNCTION hooklane_catalogue_problem_v1(text, text) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE 'REVOKE EXECUTE ON FUNCTION hooklane_catalogue_problem_v1(text, text) FROM PUBLIC';
    SELECT p.proowner::regrole INTO publisher
    FROM pg_proc p
    WHERE p.oid = 'hooklane_try_publish_v1(text, text, jsonb, text, text, text)'::regprocedure;
    EXECUTE format('GRANT EXECUTE ON FUNCTION hooklane_catalogue_problem_v1(text, text) TO %s', publisher);
END;
$$;
