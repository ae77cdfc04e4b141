"""Validates the HTTP API's OpenAPI document and JSON instances against the committed schemas.

Usage: check_schemas.py CASES.json

CASES.json: {"openapi": PATH or null, "cases": [{"schema": PATH, "pointer": "/components/schemas/X"
or "", "instance": ..., "what": "..."}]}. The OpenAPI document is checked with openapi-spec-validator;
each instance with jsonschema (draft 2020-12) against the schema at `pointer` in its file, references
resolved within that file; a case with "valid": false must fail its schema. Prints one line per case; exits 1 when any fails.
"""

import json
import sys

import jsonschema
import referencing
from referencing.jsonschema import DRAFT202012


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as handle:
        job = json.load(handle)
    failures = 0
    if job.get("openapi"):
        from openapi_spec_validator import validate

        with open(job["openapi"], encoding="utf-8") as handle:
            document = json.load(handle)
        validate(document)
        print(f"valid OpenAPI {document['openapi']}: {len(document['paths'])} paths")
    loaded = {}
    for case in job["cases"]:
        path = case["schema"]
        if path not in loaded:
            with open(path, encoding="utf-8") as handle:
                loaded[path] = json.load(handle)
        document = loaded[path]
        resource = DRAFT202012.create_resource(document)
        # References inside the file resolve against its own `$id`, where it has one.
        uri = resource.id() or "urn:ragstream:checked"
        registry = referencing.Registry().with_resource(uri, resource)
        schema = {"$ref": f"{uri}#{case['pointer']}"}
        validator = jsonschema.Draft202012Validator(schema, registry=registry)
        errors = sorted(validator.iter_errors(case["instance"]), key=lambda e: list(e.path))
        if not case.get("valid", True):
            # An instance the job refuses must fail its schema too.
            if errors:
                print(f"refused as expected {case['what']}: {errors[0].message[:200]}")
            else:
                failures += 1
                print(f"ACCEPTED {case['what']}, which the job refuses")
            continue
        if errors:
            failures += 1
            for error in errors[:5]:
                where = "/".join(str(p) for p in error.absolute_path)
                print(f"INVALID {case['what']}: at /{where}: {error.message[:300]}")
        else:
            print(f"valid {case['what']}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
