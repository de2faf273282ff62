"""The Kubernetes objects `recipeforge launch --k8s` writes, checked as the API server would: the Job against
the vendored CRD schema of its API (tests/data/k8s, unknown fields refused as `kubectl apply --validate=strict`
does), the ConfigMap against core/v1's rules. Shared by the unit and command tests of the manifests."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
import yaml

from recipeforge.backends.k8s import K8sApi
from recipeforge.cli import main

jsonschema = pytest.importorskip("jsonschema", reason="the dev extra's jsonschema validates the manifests")

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "tests" / "data" / "k8s"
RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")       # the TrainJob CRD's CEL rule on metadata.name
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# The ConfigMap's shape (core/v1, which ships no CRD): what the API server checks of the fields used.
CONFIG_MAP_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "data"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"enum": ["v1"]}, "kind": {"enum": ["ConfigMap"]},
        "metadata": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string", "maxLength": 253, "pattern": DNS1123_SUBDOMAIN},
                                    "namespace": {"type": "string"},
                                    "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "data": {"type": "object", "additionalProperties": False,
                 "patternProperties": {r"^[-._a-zA-Z0-9]+$": {"type": "string"}}},
    },
}
MAX_CONFIG_MAP_BYTES = 1 << 20  # etcd's limit on an object


def _strict(schema):
    """`schema` with unknown fields refused (`kubectl apply --validate=strict`): see SOURCE.md."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_validator(api: K8sApi):
    """A Draft 4 validator (OpenAPI v3's schema dialect) of the vendored CRD of `api`."""
    crd = json.loads((SCHEMAS / f"{api}.schema.json").read_text())
    return crd, jsonschema.Draft4Validator(_strict(crd["openAPIV3Schema"]))


def check_job(job: dict, api: K8sApi) -> None:
    crd, validator = crd_validator(api)
    errors = sorted(validator.iter_errors(job), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:10])
    assert job["apiVersion"] == f"{crd['group']}/{crd['version']}" and job["kind"] == crd["kind"]
    name = job["metadata"]["name"]
    assert RFC1035.match(name) and len(name) <= 63, name


def check_config_map(cm: dict) -> None:
    jsonschema.Draft4Validator(CONFIG_MAP_SCHEMA).validate(cm)
    assert len(json.dumps(cm).encode()) < MAX_CONFIG_MAP_BYTES


def manifests(tmp_path: Path, recipe: Path, *args: str) -> list[dict]:
    out = tmp_path / f"{recipe.stem}-{len(list(tmp_path.iterdir()))}.yaml"
    assert main(["launch", "--k8s", str(recipe), "--image", "ghcr.io/acme/recipeforge:1", "--pvc", "runs",
                 "-o", str(out), *args]) == 0
    return list(yaml.safe_load_all(out.read_text()))
