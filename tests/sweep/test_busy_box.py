"""A neighbour that arrives mid-sweep: `dinox run` reads the box again before each trial it runs alone."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import TINY
from tests.sweep.test_reliability import dinox_popen, trial_child

TWO = TINY.format(name="neighbour") + "sweep:\n  grid:\n    data.seed: [0, 1]\n"


def test_a_neighbour_that_arrives_after_the_first_trial_starts_is_followed_from_the_next(tmp_path):
    """Two processes start spinning once the first trial's child exists: after the sweep's readings for it.
    The second trial must run with sleeping threads, said in a line where the policy changed, and each trial's
    record says what it ran with (the fork server started again: OpenMP reads its policy when torch loads)."""
    (tmp_path / "s.yaml").write_text(TWO)
    # One torch thread: the first trial, beside the neighbour with spinning threads, has no team to spin in.
    env = {"OMP_NUM_THREADS": "1"}
    proc = dinox_popen(["run", "s.yaml", "--no-system-metrics"], tmp_path, env=env)
    env_policy = "OMP_WAIT_POLICY"
    spinners: list[subprocess.Popen] = []
    try:
        trial_child(proc, 0)
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        out, err = proc.communicate(timeout=300)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    (journal,) = (tmp_path / ".dinox" / "sweeps" / "neighbour").glob("*/results.jsonl")
    results = [json.loads(line)["result"] for line in journal.read_text().splitlines() if '"result"' in line]
    policies = [r["tags"]["dinox.omp_wait_policy"] for r in results]
    assert len(policies) == 2, policies
    # Two cores spinning beside it: the box is busy before the second trial, whatever it was before the first.
    assert policies[1].startswith("PASSIVE (set by dinox: "), policies
    became = [line for line in out.splitlines() if line.startswith("dinox: the box became busy before trial ")]
    if policies[0].startswith("unset"):  # quiet until trial 1 started: the change before trial 2 is said, once
        assert len(became) == 1 and became[0].startswith("dinox: the box became busy before trial 2 "), out
        assert f"{env_policy}=PASSIVE" in became[0], out
    elif became:  # quiet at the sweep's first reading, busy over the span up to trial 1 (another process here)
        assert len(became) == 1 and became[0].startswith("dinox: the box became busy before trial 1 "), out
    else:  # already busy at the first reading: nothing changed after it, the busy box said once
        assert "dinox: the box is busy (" in out, out
