"""Tied leaders measured again head to head: the rounds read back, each pair's order by a sign test over their
paired rounds, and the figures a plan takes from them. Pure: `dinox head-to-head` (dinox.verify) measures the
rounds and asks `settled` when to stop; decide reads them.

Why rounds, interleaved: a sweep measures its trials minutes apart, and the rate a box gives moves between
them by more than the difference a tie hides (issue 33: one configuration's windows moved 157-198 img/s
between identical sweeps, and decide recommended whichever of six noisy figures came out highest). A round
measures each leader once, back to back, in an order that reverses every round (A B, B A, A B, ...), so
what drifts through a pair of rounds favours neither, and each round compares the trials under the same
conditions. Google Benchmark interleaves its repetitions (at random) for the same reason.

The rule. A is faster than B where A won enough of their paired rounds for a two-sided sign test at
p <= 1/16 with at least 5 rounds: 5 of 5, 6 of 6, 7 of 7, 8 of 8, 8 of 9. The measuring side looks after
rounds 5, 7 and 9 (9: Google Benchmark's recommended repetitions for a comparison), so under a true tie the
order comes out settled about one time in ten; what that costs is small, as two trials that are truly equal
plan the same days whichever leads. Otherwise the two are tied. A trial settled slower than any other cannot
be the fastest, so it leaves the plan; those left unbeaten are tied with each other and the plan takes the
slowest of them. Either way the plan's rate is the rounds' own, measured after the leaders were chosen: the
winner's curse (picking the highest of noisy figures, then planning with that figure) does not reach the
forecast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dinox import record as rec
from dinox.isolate.contention import policy_of
from dinox.store.trial_record import MAX_IMAGES_PER_S_PER_DEVICE, TrialRecord, code_span

MIN_ROUNDS = 5
LOOKS = (5, 7, 9)  # the rounds after which the measuring side asks whether the order is settled
MAX_ROUNDS = LOOKS[-1]
SIGNIFICANCE = 1 / 16  # a two-sided sign test's p at 5 of 5
GROUP_FORMAT = "%Y%m%dT%H%M%S"  # a head-to-head's id starts with when it began (UTC), so ids sort by time


@dataclass(frozen=True)
class Round:
    """One trial measured once in a round: its timed windows' rate and range."""

    trial_run: str
    number: int  # from 1
    images_per_s: float
    slow_ips: float
    fast_ips: float
    windows: int
    omp_policy: str = ""  # what its child's OpenMP threads did (dinox.omp_wait_policy's text): "" not recorded


@dataclass(frozen=True)
class Bout:
    """One trial against another: paired rounds won and lost, and what they settle."""

    first: str  # the trial's run id
    first_name: str
    other: str  # the other trial's run id
    other_name: str
    won: int
    lost: int
    order: int  # 1 the first is faster, -1 the other is, 0 tied (not settled)
    head_to_head: str = ""  # the head-to-head whose rounds these are (its id): the last the two took part in

    def describe(self) -> str:
        rounds, first, other = self.won + self.lost, code_span(self.first_name), code_span(self.other_name)
        if self.order > 0:
            return f"{first} faster than {other} in {self.won} of {rounds} rounds"
        if self.order < 0:
            return f"{other} faster than {first} in {self.lost} of {rounds} rounds"
        return f"{first} and {other} tied ({self.won} rounds to {self.lost})"


@dataclass
class HeadToHead:
    """The rounds of one head-to-head (`group`: its dinox.head_to_head tag)."""

    group: str
    rounds: list[Round] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # trial run id -> run name (decide fills it), for words
    # The head-to-heads begun before this one, oldest first (`read` fills it): where two trials last met, when
    # one of them has met others since.
    earlier: list[HeadToHead] = field(default_factory=list, repr=False, compare=False)

    @property
    def runs(self) -> list[str]:
        return list(dict.fromkeys(r.trial_run for r in self.rounds))

    def of(self, run: str) -> list[Round]:
        return [r for r in self.rounds if r.trial_run == run]

    def policy(self, run: str) -> str:
        """The OpenMP policy (dinox.omp_wait_policy's text) of its latest round: the step its plan's figure is of,
        which `dinox verify` trains."""
        rs = self.of(run)
        return max(rs, key=lambda r: r.number).omp_policy if rs else ""

    def planning(self, run: str) -> list[Round]:
        """Its rounds under its latest round's OpenMP policy. dinox reads the box before each round and makes
        the threads sleep where it is busy, so a neighbour that came or went mid head-to-head leaves rounds of two
        steps (on a small CPU step sleeping threads run at about half the rate): each round still orders its
        pair, both measured under one policy, but a figure pooled over both steps is of neither."""
        word = policy_of(self.policy(run))
        return [r for r in self.of(run) if policy_of(r.omp_policy) == word]

    def mixed(self) -> str:
        """Where its rounds ran under more than one OpenMP policy (the box crossed dinox's busy line between
        them), the policies' words in the order they came ("unset, PASSIVE"); "" where they ran under one."""
        words = list(dict.fromkeys(policy_of(r.omp_policy) for r in sorted(self.rounds, key=lambda r: r.number)))
        return ", ".join(w or "none recorded" for w in words) if len(words) > 1 else ""

    def pooled(self, run: str) -> float:
        """Images over wall time across its rounds of one step (`planning`): each round times the same images,
        so the harmonic mean."""
        rates = [r.images_per_s for r in self.planning(run)]
        return len(rates) / sum(1 / x for x in rates) if rates else math.nan

    def span(self, run: str) -> tuple[float, float, int]:
        """Its slowest and fastest window over its rounds of one step (`planning`), and the windows behind them."""
        rs = self.planning(run)
        return min(r.slow_ips for r in rs), max(r.fast_ips for r in rs), sum(r.windows for r in rs)

    def paired(self, a: str, b: str) -> tuple[int, int]:
        """Rounds a was faster in, and rounds b was (a round where the two were equal counts for neither)."""
        rates_b = {r.number: r.images_per_s for r in self.of(b)}
        pairs = [(r.images_per_s, rates_b[r.number]) for r in self.of(a) if r.number in rates_b]
        return sum(x > y for x, y in pairs), sum(y > x for x, y in pairs)

    def bout(self, a: str, b: str) -> Bout:
        won, lost = self.paired(a, b)
        return Bout(a, self.names.get(a, a), b, self.names.get(b, b), won, lost, order_of(won, lost), self.group)

    def outcome(self, lead: str) -> list[Bout]:
        """What the rounds say of each other trial against the leader: the leader's own bout where it settled
        one, else the bout of whichever trial was settled faster than it, else the tie with the leader."""
        out = []
        for run in self.runs:
            if run == lead:
                continue
            own = self.bout(lead, run)
            beaten = [b for other in self.runs if other != run and (b := self.bout(other, run)).order > 0]
            out.append(own if own.order or not beaten else beaten[0])
        return out

    def unbeaten(self) -> list[str]:
        """The trials no other was settled faster than, fastest pooled first: the ones that may still be the
        fastest."""
        runs = sorted(self.runs, key=lambda r: -self.pooled(r))
        return [a for a in runs if not any(self.bout(b, a).order > 0 for b in runs if b != a)]

    def leader(self) -> str:
        """The fastest pooled of the unbeaten trials."""
        return (self.unbeaten() or sorted(self.runs, key=lambda r: -self.pooled(r)))[0]

    def planned(self) -> float:
        """The figure decide plans with after these rounds: the unbeaten trials' slowest pooled (the leader's
        own where the rounds settled it)."""
        return min(self.pooled(r) for r in (self.unbeaten() or self.runs))

    def settled(self) -> bool:
        """One trial is left unbeaten: the measuring side stops."""
        return len(self.unbeaten()) == 1

    def last_met(self, a: str, b: str) -> HeadToHead | None:
        """The latest head-to-head, this one or one before it, in which both took part: its rounds order the two.
        A trial measured again with others later keeps the order an earlier head-to-head settled against one
        it has not met since (without it, decide tied the two again by their sweep ranges and asked for the
        head-to-head that had already settled them)."""
        return next((h for h in (self, *reversed(self.earlier)) if a in h.runs and b in h.runs), None)


def sign_test(won: int, lost: int) -> float:
    """Two-sided p of `won` against `lost` paired rounds under "neither is faster"."""
    n = won + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(max(won, lost), n + 1)) / 2**n
    return min(1.0, 2 * tail)


def order_of(won: int, lost: int) -> int:
    """1 where the rounds settle the first trial faster, -1 the second, 0 where they do not."""
    if won + lost < MIN_ROUNDS or won == lost or sign_test(won, lost) > SIGNIFICANCE:
        return 0
    return 1 if won > lost else -1


def read(records: list[TrialRecord]) -> dict[str, HeadToHead]:
    """Each trial run's latest head-to-head (its rounds from dinox.role = head_to_head runs): a trial that took
    part in several is planned with the last one it took part in, and two trials are ordered by the last one
    they both took part in (`last_met`). A round without a rate is not a round."""
    groups: dict[str, HeadToHead] = {}
    for r in records:
        group, run = r.tags.get(rec.HEAD_TO_HEAD, ""), r.tags.get(rec.REMEASURES, "")
        m = r.metrics
        ips, number, windows = m.get(rec.IMAGES_PER_S, math.nan), _count(m.get(rec.ROUND)), _count(m.get(rec.WINDOWS))
        if not (group and run and number and math.isfinite(ips) and 0 < ips <= MAX_IMAGES_PER_S_PER_DEVICE):
            continue  # another tool's run, or an edited store: not a round
        slow, fast = (x if math.isfinite(x) and x > 0 else ips for x in (m.get(k, ips) for k in _ENDS))
        h = groups.setdefault(group, HeadToHead(group))
        policy = r.tags.get(rec.OMP_WAIT_POLICY, "")
        h.rounds.append(Round(run, number, ips, min(slow, ips), max(fast, ips), windows or 1, policy))
    latest: dict[str, HeadToHead] = {}
    ordered = [groups[g] for g in sorted(groups)]  # its id begins with when it started (GROUP_FORMAT)
    for i, h in enumerate(ordered):
        h.earlier = ordered[:i]
        for run in h.runs:
            latest[run] = h
    return latest


_ENDS = (rec.IMAGES_PER_S_MIN, rec.IMAGES_PER_S_MAX)


def _count(value: float | None) -> int | None:
    """A positive whole number from the store, or None."""
    ok = value is not None and math.isfinite(value) and value >= 1 and float(value).is_integer()
    return int(value) if ok else None  # type: ignore[arg-type]
