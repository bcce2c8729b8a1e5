"""`dinox schema`: the spec's JSON Schema stays in step with the models and the shipped file."""

from pathlib import Path

import jsonschema
import pytest
import yaml

from dinox.spec.schema import SCHEMA_FILE, render, spec_schema
from dinox.spec.sections import TrialSpec
from tests.conftest import ROOT, run_dinox

SPECS = sorted((ROOT / "specs").glob("*.yaml"))


def test_the_shipped_schema_is_what_dinox_schema_prints():
    proc = run_dinox(["schema"], cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout == render()
    assert (ROOT / "specs" / SCHEMA_FILE).read_text() == render(), "run: dinox schema > specs/dinox.schema.json"


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_shipped_spec_is_valid_under_the_schema(path: Path):
    jsonschema.validate(yaml.safe_load(path.read_text()), spec_schema())


def test_every_section_and_field_is_in_the_schema_and_unknown_keys_are_refused():
    schema = spec_schema()
    assert set(schema["properties"]) == set(TrialSpec.model_fields) | {"sweep"}
    with pytest.raises(jsonschema.ValidationError, match="batchsize"):
        jsonschema.validate({"name": "x", "model": {"name": "resnet18"}, "batchsize": 3}, schema)
    # Every section forbids extra keys (pydantic's extra="forbid"): the schema says so too.
    sections = [d for d in schema["$defs"].values() if d.get("type") == "object" and "properties" in d]
    assert sections and all(d.get("additionalProperties") is False for d in sections)
