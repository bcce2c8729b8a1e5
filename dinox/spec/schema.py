"""The spec file's JSON Schema, from the pydantic models, for editor completion and checking.

Shipped specs start with `# yaml-language-server: $schema=dinox.schema.json`, which the YAML language
server (VS Code's YAML extension, Neovim's yamlls) reads; `dinox schema > specs/dinox.schema.json` renews the
file, and a test keeps the shipped file equal to this output.
"""

from __future__ import annotations

import json
from typing import Any

from dinox.spec.sections import SweepSpec, TrialSpec

SCHEMA_FILE = "dinox.schema.json"  # beside the shipped specs


def spec_schema() -> dict[str, Any]:
    """TrialSpec's fields plus the `sweep` section: the shape of a spec file."""
    schema = TrialSpec.model_json_schema()
    sweep = SweepSpec.model_json_schema()
    defs = schema.setdefault("$defs", {})
    defs.update(sweep.pop("$defs", {}))
    defs["SweepSpec"] = sweep
    schema["properties"]["sweep"] = {"$ref": "#/$defs/SweepSpec"}
    schema["title"] = "dinox spec"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def render() -> str:
    return json.dumps(spec_schema(), indent=2, sort_keys=True) + "\n"
