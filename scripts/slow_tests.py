#!/usr/bin/env python3
"""tests/slow.txt from a run's durations: every test whose setup or call took a second or more, with its seconds
(setup and call) as a comment: tests/conftest.py marks each `slow`, and runs the modules holding the longest
ones first (xdist hands each worker a contiguous share; a test of minutes collected last would start late).

    python -m pytest -p no:randomly --durations=0 --durations-min=1.0 | python scripts/slow_tests.py > tests/slow.txt

A test in the list is marked `slow` (tests/conftest.py), so `pytest -m "not slow"` is the fast loop. Service
tests (PostgreSQL, an MLflow server, Slurm) are marked by their fixtures and need not be listed.
"""

from __future__ import annotations

import re
import sys

LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def main() -> int:
    slow: dict[str, float] = {}
    for line in sys.stdin:
        m = LINE.match(line)
        if m and m.group(2) in ("setup", "call") and float(m.group(1)) >= 1.0:
            node = m.group(3)
            slow[node] = slow.get(node, 0.0) + float(m.group(1))
    print("# Tests measured at a second or more (scripts/slow_tests.py writes this list); marked slow.")
    for node in sorted(slow):
        print(f"{node}  # {slow[node]:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
