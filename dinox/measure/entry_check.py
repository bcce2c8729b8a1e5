"""`python -m dinox.measure.entry_check REQUEST_JSON RESULT_JSON`: each `kind: python` objective of a spec
imported and built on the CPU, as a trial would build it, and its result held to the protocol; one line per
entry that cannot give a step. `dinox validate`, `plan`, `run` and `submit` run it (dinox.cli.common) so a
bad entry is exit 2 before anything is recorded, never a child's traceback; the parent never imports it.

The request is ``{"specs": [trial spec, ...], "groups": [how many of them each spec file gave, ...]}``; the
result ``{"problems": [[index, field, message], ...]}``. What the entry prints goes to stderr: the result file
is the only answer. `dinox validate` of several spec files checks them all in one child (cli/common.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable

import torch

from dinox.contract import one_line
from dinox.entrypoints import EntryError
from dinox.isolate import lifeline
from dinox.measure import models, user_step
from dinox.spec.data_sources import PythonData
from dinox.spec.objectives import PythonObjective
from dinox.spec.sections import TrialSpec


def check(specs: list[TrialSpec], groups: list[int] | None = None) -> list[tuple[int, str, str]]:
    """(index of the first spec of its group with it, the field, what is wrong) for each distinct entry that cannot
    give a step (objective) or a sample (data). `groups`: how many of the specs, in order, each spec file gave
    (`dinox validate` of several; None: one file). Each file is told of its own bad entries; each distinct entry
    is built once."""
    group_of = [g for g, n in enumerate(groups or [len(specs)]) for _ in range(n)]
    built: dict[str, str] = {}
    told: set[tuple[int, str]] = set()
    out = []
    for i, spec in enumerate(specs):
        for part, build in (("objective", _objective), ("data", _data)):
            section = getattr(spec, part)
            if not isinstance(section, (PythonObjective, PythonData)):
                continue
            key = json.dumps(
                [part, section.model_dump(mode="json"), spec.model.model_dump(mode="json")], sort_keys=True
            )
            if (group_of[i], key) in told:
                continue
            told.add((group_of[i], key))
            if key not in built:
                built[key] = _problem(part, build, spec, section)
            if built[key]:
                out.append((i, f"{part}.entry", built[key]))
    return out


def _problem(
    part: str, build: Callable[[TrialSpec], None], spec: TrialSpec, section: PythonObjective | PythonData
) -> str:
    """What is wrong with one entry, built as a trial builds it; "" where nothing is."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            build(spec)
        return ""
    except EntryError as e:
        return str(e).removeprefix(f"{part}.entry ")
    except Exception as e:  # noqa: BLE001 - dinox's own part of the build (the timm model): said, not raised
        return one_line(f"{section.entry}: {type(e).__name__}: {e}", 400)


def _objective(spec: TrialSpec) -> None:
    o = spec.objective
    assert isinstance(o, PythonObjective)
    user_step.build(o, user_step.Context(spec.model, torch.device("cpu"), spec.precision, o.num_classes, o.options))


def _data(spec: TrialSpec) -> None:
    from dinox.data import user_data
    from dinox.data.views import view_plan

    d = spec.data
    assert isinstance(d, PythonData)
    o = spec.objective
    classes = max(getattr(o, "num_classes", 1), 1)
    channels = models.in_chans(spec.model)  # what the trial hands the dataset too
    context = user_data.DataContext(spec.model.img_size, channels, classes, view_plan(spec), 1, d.options)
    sample = user_data.first_sample(user_data.build(d, context), d)
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
        what = f"a {len(sample)}-tuple" if isinstance(sample, (tuple, list)) else type(sample).__name__
        raise EntryError(f"data.entry {d.entry}: a sample is {what}; the step takes (image or views, label) pairs")


def main(request_json: str, result_json: str) -> int:
    request = json.loads(open(request_json).read())
    specs = [TrialSpec.model_validate(s) for s in request["specs"]]
    problems = check(specs, request.get("groups"))
    tmp = f"{result_json}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"problems": problems}, f)
    os.replace(tmp, result_json)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m dinox.measure.entry_check REQUEST_JSON RESULT_JSON")
    lifeline.die_with_parent(lifeline.env_parent())
    code = main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no teardown of what the entry started (threads, atexit hooks): the answer is written
