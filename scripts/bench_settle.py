#!/usr/bin/env python3
"""Do the trial's timed windows time the step continuous training runs? Three ways of starting a window, in one
process, on the trial's own loader, model and step (TrialRun's setup, as `dinox verify` trains with them):

  continuous  windows back to back after 10 untimed steps (`--lead-in N`: N): the loader as training keeps it
  drained     a round, then the pipeline steadied as the trial does it (dinox.measure.batches.Batches.settle:
              the batches the workers made ready taken untimed, one step on the one waited for), then the window
  full        a round, then the window at once: the workers' queues as the round left them, full

The round is what a trial runs between two timed windows: its ablation windows (compute alone on a batch
already on the device, then a host batch copied each step), half of measure.ablation_steps each (a window's
steps unless set), while the workers keep loading and nothing takes their batches (`--pause S`: a sleep of S
seconds instead). Where `drained` and `continuous` agree, the windows time the step training runs; where
`full` runs above them, a window that skipped the steadying is flattered by the backlog (a loader-bound trial).
The batches the workers held ready as each window ended are printed too: a drained window that ends with the
queue full has refilled it inside its own time. The patterns alternate, their order rotated each round:

    python scripts/bench_settle.py SPEC                          # the grid's first trial, 4 rounds
    python scripts/bench_settle.py SPEC --trial 2 --rounds 6 --pause 1
    python scripts/bench_settle.py SPEC --set loader.num_workers=1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

PATTERNS = ("continuous", "drained", "full")
WINDOWS = 3  # per pattern and round


def patterns(  # noqa: ANN001 - loop: a Loop
    loop, steps: int, ablation: int, pause_s: float | None, lead_in: int, ends: dict[str, list[int]]
) -> dict[str, Callable[[], list[float]]]:
    """Each pattern's windows (images/s); `loop` is a dinox.measure.loop.Loop past its warm-up. `ends` gets, by
    pattern, the batches the workers held ready as each window ended (the queue a drained window refilled)."""
    per_round = max(1, -(-ablation // 2))  # as the trial's rounds: half of measure.ablation_steps each

    def timed(name: str) -> float:
        ips = loop.window(steps).images_per_s
        ends[name].append(loop.batches.batches_waiting() or 0)
        return ips

    def between() -> None:
        if pause_s is not None:
            time.sleep(pause_s)
            return
        loop.window(per_round, "device", loop.last_device)
        loop.window(per_round, "host")

    def continuous() -> list[float]:
        for _ in range(lead_in):
            loop.untimed_step()
        return [timed("continuous") for _ in range(WINDOWS)]

    def after_pause(steady: bool) -> list[float]:
        out = []
        for _ in range(WINDOWS):
            between()
            if steady:
                loop.steady()
            out.append(timed("drained" if steady else "full"))
        return out

    return {"continuous": continuous, "drained": lambda: after_pause(True), "full": lambda: after_pause(False)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec")
    p.add_argument("--trial", type=int, default=1, help="the grid point, numbered as dinox names its runs (1-)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help="as dinox run's")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--pause", type=float, help="a sleep of this many seconds between windows instead of a round")
    p.add_argument("--lead-in", type=int, default=10, help="untimed steps before the continuous windows")
    a = p.parse_args()
    if a.rounds < 1 or a.lead_in < 0 or (a.pause is not None and a.pause < 0):
        p.error("--rounds is 1 or more, --lead-in and --pause 0 or more")
    if not a.spec.isprintable():  # printed below, and in any error: one line of printable characters, as dinox's
        print(f"error: {a.spec!r}: a path is one line of printable characters", file=sys.stderr)
        return 2
    from dinox.cli.common import load_trials
    from dinox.errors import DinoxError

    try:
        _doc, trials = load_trials(a.spec, sets=tuple(a.sets))
    except DinoxError as e:  # a bad spec or --set: dinox's own one-line message, as `dinox run` prints it
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    from dinox.measure.batches import Batches  # torch and timm: once the spec is known to be good
    from dinox.measure.trial import TrialRun

    if not 1 <= a.trial <= len(trials):
        sys.exit(f"--trial {a.trial}: the grid has trials 1-{len(trials)}")
    spec = trials[a.trial - 1].spec
    run = TrialRun(spec, {}, {}, {})
    run.setup()
    loop = run.make_loop()
    lo = spec.loader
    ready = lo.num_workers * (lo.prefetch_factor or 2)
    loop.batches = Batches(run.loader, loop.timeline.host_clock, ready)
    for _ in range(spec.measure.warmup_steps):
        loop.untimed_step()
    steps = spec.measure.bench_steps
    print(
        f"trial {a.trial} of {a.spec}: batch {spec.size} x {spec.accumulation}, {lo.num_workers} workers "
        f"({ready} batches ready at most), windows of {steps} steps, "
        f"{'an ablation round' if a.pause is None else f'a {a.pause:g} s sleep'} between; images/s"
    )
    ends: dict[str, list[int]] = {name: [] for name in PATTERNS}
    ways = patterns(loop, steps, spec.measure.ablation_steps or steps, a.pause, a.lead_in, ends)
    rates: dict[str, list[float]] = {name: [] for name in PATTERNS}
    print("round  " + "  ".join(f"{name:>10}" for name in PATTERNS))
    for r in range(a.rounds):
        order = PATTERNS[r % len(PATTERNS) :] + PATTERNS[: r % len(PATTERNS)]
        for name in order:
            rates[name] += ways[name]()
        print(f"{r + 1:>5}  " + "  ".join(f"{statistics.median(rates[n][-WINDOWS:]):>10.1f}" for n in PATTERNS))
    base = statistics.median(rates["continuous"])
    print("median " + "  ".join(f"{statistics.median(rates[n]):>10.1f}" for n in PATTERNS))
    print("vs continuous " + "  ".join(f"{n} {statistics.median(rates[n]) / base - 1:+.1%}" for n in PATTERNS[1:]))
    print(f"steadying: {loop.settle_s:.3f} s in all")
    print("ready as a window ended (median) " + "  ".join(f"{n} {statistics.median(ends[n]):g}" for n in PATTERNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
