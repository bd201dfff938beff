"""Judging a run: each target of ``make bench`` as a ratio of two points, taken pass by pass
and counted where the probe read the host at one speed for both (``HOST_MATCH``)."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from typing import Any

from bench import instructions
from bench.results import (
    ASGI_FLOOR,
    CACHE_HIT,
    CACHE_MISS,
    ECHO_AS_SERVED,
    FLEET_ALONE,
    FLEET_CROWDED,
    FLOOR_AS_SERVED,
    FLOOR_AS_SERVED_ONE,
    FLOOR_AS_SERVED_TWO,
    IDLE_ALONE,
    IDLE_CROWDED,
    OFF_AGAIN,
    ONE_WORKER,
    ONE_WORKER_OFF,
    PEER_BENTOML,
    PEER_MLSERVER,
    PEERS,
    TRACED,
    TWO_WORKERS,
    TWO_WORKERS_OFF,
    Results,
    priority_scenario,
)
from bench.speed import apart

# Issue 10's targets, as ratios within one run.
TARGET_FLOOR_RATIO = 0.85  # small model, c=64, one process: each protocol against the floor


TARGET_TAIL_VS_FLOOR = 2.0  # its p99 against the floor's p99


TARGET_NAIVE_RATIO = 2.5  # V1 against the naive app, c=64, one process and two


TARGET_WORKERS_GAIN = 1.8  # two workers on two cores against one on one


TARGET_BATCHING_GAIN = 4.0  # larger model, c=64: batching on against off


TARGET_ACTIVATION_RATIO = 0.8  # 1e6 float32 binary against the 4 MB echo, c=1 and c=4


TARGET_PEER_RATIO = 5.0  # V2 JSON against MLServer's V2 JSON, c=64, one process each


# Issue 64's: under overload, priority 1's p99 on the model with two levels against the same
# clients' on one queue (tests/service/test_batching_policy.py asserts the same bound).
TARGET_PRIORITY_TAIL = 2 / 3


TARGET_IDLE_CORES = 0.01  # issue 65: an idle server with 21 models loaded, in cores


TARGET_NEIGHBOURS_RATIO = 0.97  # issue 65: the small model with 20 others loaded against alone


# Issue 65's other targets: the small model against the pure ASGI floor at the top concurrency;
# gRPC against its floor; each tracing sampler against tracing off at every concurrency; the
# response cache's hits and misses against no cache, at c=1 and the top concurrency.
TARGET_ASGI_SHARE = 0.5
TARGET_GRPC_FLOOR_RATIO = 0.95
TARGET_TRACED = {"0.01": 0.97, "1.0": 0.5}
TARGET_CACHE_HIT = (1.3, 1.0)  # at c=1, at the top concurrency
TARGET_CACHE_MISS = 0.95


HOST_MATCH = 1.15  # two points whose probe readings (bench.speed) differ by more: not one speed


SATURATED = 0.9  # cores: a 1-worker floor's server using less at its point did not set the pace


def unsaturated(row: dict[str, Any]) -> float | None:
    """A one-worker floor point whose server used less than ``SATURATED`` of its core, where
    it should have (at c >= 4, or the 4 MB echo at any concurrency): the cores it used; else
    None. Against such a floor a ratio flatters: the floor was held back by something else."""
    scenario = row.get("scenario", "")
    if "floor" not in scenario or "--workers 2" in scenario or "server_cores" not in row:
        return None
    expected = row["concurrency"] >= 4 or scenario.startswith("echo")
    cores = float(row["server_cores"])
    return cores if expected and cores < SATURATED else None


RESAMPLES = 2000  # bootstrap resamples of a ratio's passes, for its 95 % interval


def interval(ratios: list[float]) -> tuple[float, float]:
    """The 95 % bootstrap interval of the median of ``ratios`` (one per pass): resampled with
    a fixed seed, so a report is the same each time it is made from the same runs. With three
    passes it is their range; pooled runs narrow it."""
    if len(ratios) == 1:
        return ratios[0], ratios[0]
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(RESAMPLES)
    )
    return medians[int(0.025 * RESAMPLES)], medians[int(0.975 * RESAMPLES) - 1]


def by_round(
    a: dict[str, Any], b: dict[str, Any], measure: str = "rps"
) -> list[tuple[float, float | None]]:
    """a's ``measure`` (requests/s, or ``p99_ms``) over b's within each round, with how far
    apart the host's speed was for the two (``bench.speed.apart``; None if unread): each pass
    drives both a minute or two apart (batching on and off one right after the other), so a
    slow spell of the shared machine that spans the two cancels out, and the probe tells the
    spells that did not. A row without each round's ``measure`` (a report written before it
    was kept) gives its median point's, unread. A round whose b read 0 (no answer in the
    point's time: errors, ``bench.wrk``) has no ratio and is left out."""
    rounds = f"rounds_{measure}"
    if rounds not in a or rounds not in b:
        return [(a[measure] / b[measure], None)] if b[measure] else []
    unread: list[dict[str, float]] = [{}] * len(a[rounds])
    return [
        (x / y, apart(p, q))
        for x, y, p, q in zip(
            a[rounds],
            b[rounds],
            a.get("rounds_host_ms", unread),
            b.get("rounds_host_ms", unread),
            strict=True,
        )
        if y
    ]


def beside(results: Results, scenario: str, base: str, c: int) -> tuple[float, float, float]:
    """``scenario`` against ``base`` at concurrency ``c``, as a target's ratio is taken: the
    median of its passes (those whose points the probe read at one speed, else all) and its
    95 % interval. For rows with no target: TLS, tracing and the cache against batching on."""
    ratios = by_round(results.find(results.http, scenario, c), results.find(results.http, base, c))
    alike = [ratio for ratio, far in ratios if far is None or far <= HOST_MATCH]
    judged = alike or [ratio for ratio, _ in ratios]
    if not judged:  # the base answered nothing in any round
        return math.nan, math.nan, math.nan
    return (statistics.median(judged), *interval(judged))


Target = tuple[str, str, bool]  # what is judged, what was measured, whether it was met


def targets(results: Results, large: str) -> list[Target]:
    """(target, measured, met) for each of issue 10's targets that this run measured.

    A ratio is the median of its rounds' ratios (``by_round``), counting the rounds in which
    the probe read the host at one speed for both points (within ``HOST_MATCH``), or every
    round if none did; shown beside each point's median and each round's ratio, a round not
    counted in brackets with how far apart the host was.
    """
    judge = Judge(results)
    judge.small_model()
    judge.workers()
    judge.peers_and_grpc()
    judge.costs()
    judge.large_model(large)
    judge.activations()
    judge.priority()
    judge.fleet()
    judge.errors()
    return judge.rows


class Judge:
    """The targets of one run (or pool), judged section by section into ``rows``."""

    def __init__(self, results: Results) -> None:
        self.results = results
        self.rows: list[Target] = []
        self.top = max(r["concurrency"] for r in results.http)
        self.concurrencies = sorted({r["concurrency"] for r in results.http})

    def http(self, scenario: str, c: int | None = None) -> dict[str, Any]:
        """The HTTP (or gRPC) point of ``scenario`` at ``c`` (default: the top concurrency)."""
        return self.results.find(self.results.http, scenario, self.top if c is None else c)

    def compare(
        self,
        name: str,
        a: dict[str, Any],
        b: dict[str, Any],
        goal: float,
        share: bool = False,
        unit: Callable[[dict[str, Any]], float] | None = None,
        units: str = "req/s",
        spec: str = ".0f",
        measure: str = "rps",
        at_most: bool = False,
    ) -> None:
        """A row for a against b, when both were measured; a share is shown in per cent. The
        ratio is of ``measure`` (``by_round``): the median of its passes with its 95 % interval,
        met when the interval's lower end is at ``goal`` or above (``at_most``: its upper end
        at ``goal`` or below); each point is shown as ``unit`` of its row (default:
        ``measure``)."""
        if not (a and b):
            return
        failed = errors_of(a) + errors_of(b)
        if failed:  # a point with errors measured something else than its target asks
            self.rows.append((name, f"not measured: {failed} failed answers in its points", False))
            return
        if (cores := unsaturated(b)) is not None:
            self.rows.append((name, f"not measured: the floor's server used {cores:.2f} cores, "
                              f"under {SATURATED:g} (not saturated)", False))  # fmt: skip
            return

        def value(row: dict[str, Any]) -> float:
            return unit(row) if unit is not None else float(row[measure])

        rounds = [
            (ratio, far, far is None or far <= HOST_MATCH) for ratio, far in by_round(a, b, measure)
        ]
        if not rounds:
            base = b.get("scenario", "its base")
            self.rows.append((name, f"not measured: {base} answered nothing", False))
            return
        alike = [ratio for ratio, _, counted in rounds if counted]
        judged = alike or [ratio for ratio, _, _ in rounds]
        middle, (low, high) = statistics.median(judged), interval(judged)
        form = "{:.0%}" if share else "{:.2f}x"
        if goal and goal in {float(form.format(x).rstrip("%x")) / (100 if share else 1)
                             for x in (middle, low, high)}:  # fmt: skip
            form = "{:.1%}" if share else "{:.3f}x"  # too close to call at that precision
        shown = [
            form.format(ratio) if counted else f"({form.format(ratio)}: host {far:.2f}x apart)"
            for ratio, far, counted in rounds
        ]
        unmatched = "" if alike else "; no round read the host at one speed, all counted"
        measured = (
            f"{form.format(middle)} [95 % {form.format(low)}-{form.format(high)}] "
            f"({value(a):{spec}} / {value(b):{spec}} {units}; "
            f"by round {' / '.join(shown)}{unmatched})"
        )
        # Met only when the whole interval is on the goal's side: one that straddles it is not.
        self.rows.append((name, measured, high <= goal if at_most else low >= goal))

    def small_model(self) -> None:
        """The small model against the floors, its tail, and batching on against off."""
        floor, served = self.http("http floor"), self.http(FLOOR_AS_SERVED)
        for kind in ("v1", "v2-json", "v2-binary"):
            row = self.http(f"{kind} predict, batching on")
            self.compare(
                f"{kind} at c={self.top} >= {TARGET_FLOOR_RATIO:.0%} of the HTTP floor",
                row,
                floor,
                TARGET_FLOOR_RATIO,
                share=True,
            )
            self.compare(
                f"{kind} at c={self.top} >= {TARGET_ASGI_SHARE:.0%} of the pure ASGI floor (what "
                "is left above uvicorn's own cost)",
                row,
                self.http(ASGI_FLOOR),
                TARGET_ASGI_SHARE,
                share=True,
            )
            self.compare(
                f"{kind} at c={self.top} against the floor served as the service serves "
                "(no target: the app's share alone)",
                row,
                served,
                0.0,
                share=True,
            )
            self.compare(
                f"{kind} at c={self.top}: p99 <= {TARGET_TAIL_VS_FLOOR:g}x the floor's p99",
                row,
                floor,
                TARGET_TAIL_VS_FLOOR,
                units="ms",
                spec=".1f",
                measure="p99_ms",
                at_most=True,
            )
            for c in self.concurrencies:
                self.compare(
                    f"{kind} at c={c}: batching on >= off",
                    self.http(f"{kind} predict, batching on", c),
                    self.http(f"{kind} predict, batching off", c),
                    1.0,
                )
                if kind == "v1":  # the A/A pair beside it: how far apart two alike servers read
                    self.compare(
                        f"v1 at c={c}: batching off against a second batching-off server (no "
                        "target: two identical servers, driven as on and off are)",
                        self.http("v1 predict, batching off", c),
                        self.http(OFF_AGAIN, c),
                        0.0,
                    )
        if counted := self.results.instructions:  # what the c=1 rows' timings are within noise of
            on, off = (counted[state] for state in instructions.STATES)
            self.rows.append(
                (
                    "in process, one request at a time: batching on's instructions per request "
                    "against off's (no target: counted by callgrind, not timed)",
                    f"{on / off:.3f}x ({on:,.0f} / {off:,.0f})",
                    True,
                )
            )

    def workers(self) -> None:
        """The naive app, and two workers against one."""
        v1, naive = self.http("v1 predict, batching on"), self.http("naive app")
        self.compare(
            f"v1 at c={self.top} >= {TARGET_NAIVE_RATIO:g}x the naive app",
            v1,
            naive,
            TARGET_NAIVE_RATIO,
        )
        # Against the 1-worker twins driven beside the 2-worker rows; runs before they were
        # measured have only the main rows, a quarter of an hour earlier.
        two = self.http(TWO_WORKERS)
        # Judged against what this machine gives a server with the service's sockets: with
        # wrk on the same two cores, the floor's own gain may fall short of the target.
        goal, floor_two = TARGET_WORKERS_GAIN, self.http(FLOOR_AS_SERVED_TWO)
        floor_one = self.http(FLOOR_AS_SERVED_ONE)
        if floor_two and floor_one and not errors_of(floor_two) + errors_of(floor_one):
            gains = [r for r, _ in by_round(floor_two, floor_one)]
            floor_gain = statistics.median(gains) if gains else goal
            if floor_gain < goal:
                goal = round(floor_gain, 2)
        self.compare(
            f"v1 at c={self.top}: 2 workers >= {goal:g}x 1 worker ({TARGET_WORKERS_GAIN:g}x, or "
            "the floor served as the service serves' own 2-worker gain in this run if less)",
            two,
            self.http(ONE_WORKER) or v1,
            goal,
        )
        self.compare(
            f"v1 at c={self.top} with batching off: 2 workers against 1 (no target: one worker "
            "batches all the connections, each of two half of them)",
            self.http(TWO_WORKERS_OFF),
            self.http(ONE_WORKER_OFF),
            0.0,
        )
        self.compare(
            f"v1 at c={self.top}, 2 workers each: >= {TARGET_NAIVE_RATIO:g}x the naive app",
            two,
            self.http("naive app, uvicorn --workers 2"),
            TARGET_NAIVE_RATIO,
        )
        self.compare(
            f"the HTTP floor at c={self.top}: 2 workers against 1 (no target: what this machine "
            "gives the stack)",
            self.http("http floor, uvicorn --workers 2"),
            self.http("http floor, uvicorn --workers 1") or self.http("http floor"),
            0.0,
        )
        self.compare(
            f"the HTTP floor served as the service serves at c={self.top}: 2 workers against 1 (no "
            "target: what this machine gives the service's server, each worker on its own "
            "socket)",
            self.http(FLOOR_AS_SERVED_TWO),
            self.http(FLOOR_AS_SERVED_ONE),
            0.0,
        )

    def peers_and_grpc(self) -> None:
        """MLServer and BentoML, and gRPC against its floor and HTTP."""
        v1 = self.http("v1 predict, batching on")
        self.compare(
            f"v2-json at c={self.top} >= {TARGET_PEER_RATIO:g}x {PEER_MLSERVER}",
            self.http("v2-json predict, batching on"),
            self.http(f"{PEER_MLSERVER} v2-json"),
            TARGET_PEER_RATIO,
        )
        self.compare(
            f"v1 at c={self.top} against {PEER_BENTOML} (no target)",
            v1,
            self.http(PEER_BENTOML),
            0.0,
        )
        grpc = self.http("grpc predict, batching on")
        self.compare(
            f"grpc at c={self.top} >= {TARGET_GRPC_FLOOR_RATIO:g}x the gRPC floor",
            grpc,
            self.http("grpc floor"),
            TARGET_GRPC_FLOOR_RATIO,
        )
        self.compare(
            f"grpc at c={self.top} against v2-binary over HTTP (no target)",
            grpc,
            self.http("v2-binary predict, batching on"),
            0.0,
        )
        self.compare(
            f"grpc-stream at c={self.top} against grpc (no target: {self.top} requests in flight "
            f"on one ModelStreamInfer call, against {self.top} ModelInfer calls)",
            self.http("grpc-stream predict, batching on"),
            grpc,
            0.0,
        )

    def costs(self) -> None:
        """Tracing and the response cache against the same server without them (issue 65)."""
        plain = "v1 predict, batching on"
        for ratio, scenario in TRACED.items():
            goal = TARGET_TRACED[ratio]
            for c in self.concurrencies:
                self.compare(
                    f"{scenario} at c={c} >= {goal:g}x tracing off",
                    self.http(scenario, c),
                    self.http(plain, c),
                    goal,
                )
        for c, goal in sorted(dict(zip((1, self.top), TARGET_CACHE_HIT, strict=True)).items()):
            self.compare(
                f"{CACHE_HIT} at c={c} >= {goal:g}x no cache",
                self.http(CACHE_HIT, c),
                self.http(plain, c),
                goal,
            )
            self.compare(
                f"{CACHE_MISS} at c={c} >= {TARGET_CACHE_MISS:g}x no cache",
                self.http(CACHE_MISS, c),
                self.http(plain, c),
                TARGET_CACHE_MISS,
            )

    def large_model(self, large: str) -> None:
        """The larger model: batching on against off."""
        self.compare(
            f"{large} at c={self.top}: batching on >= {TARGET_BATCHING_GAIN:g}x off",
            self.http(f"{large} v2-binary, batching on"),
            self.http(f"{large} v2-binary, batching off"),
            TARGET_BATCHING_GAIN,
        )
        for c in self.concurrencies[
            :-1
        ]:  # never slower than off, for any model (its batches on threads)
            self.compare(
                f"{large} at c={c}: batching on >= off",
                self.http(f"{large} v2-binary, batching on", c),
                self.http(f"{large} v2-binary, batching off", c),
                1.0,
            )

    def activations(self) -> None:
        """The activation kernels against the echo."""
        for kernel, scenario in (
            ("accurate", "gelu, float32 binary"),
            ("native", "gelu native, float32 binary"),
        ):
            for c in (1, 4):
                gelu = self.results.find(self.results.activations, scenario, c)
                self.compare(
                    f"activation ({kernel} kernel), 1e6 float32 binary at c={c} >= "
                    f"{TARGET_ACTIVATION_RATIO:.0%} of the echo floor",
                    gelu,
                    self.results.find(self.results.activations, "echo floor", c),
                    TARGET_ACTIVATION_RATIO,
                    share=True,
                    unit=megabytes,
                    units="MB/s",
                )
                if kernel == "native":
                    self.compare(
                        f"activation (native kernel) at c={c} against the echo served as the "
                        "service serves (no target: the route's share alone)",
                        gelu,
                        self.results.find(self.results.activations, ECHO_AS_SERVED, c),
                        0.0,
                        share=True,
                        unit=megabytes,
                        units="MB/s",
                    )

    def priority(self) -> None:
        """Priority levels under overload (``bench.priority``): the higher level's p99 against
        the same clients' on one queue, driven at once, while the lower level is refused."""
        rows = self.results.priority
        if not rows:
            return
        beside = max(r["concurrency"] for r in rows)  # the lower-level clients of the overload

        def point(model: str, level: str, low: int = beside) -> dict[str, Any]:
            return self.results.find(rows, priority_scenario(model, level), low)

        ranked, plain = point("ranked", "high"), point("plain", "high")
        self.compare(
            f"priority 1 beside {beside} clients at priority 2: its p99 with two levels <= "
            f"{TARGET_PRIORITY_TAIL:.0%} of the same clients' on one queue",
            ranked, plain, TARGET_PRIORITY_TAIL, share=True, units="ms", spec=".1f",
            measure="p99_ms", at_most=True,
        )  # fmt: skip
        self.compare(
            f"priority 1 beside {beside} clients at priority 2, with two levels: its p99 against "
            "its own alone (no target: what the overload costs the higher level)",
            ranked, point("ranked", "high", 0), 0.0, units="ms", spec=".1f", measure="p99_ms",
        )  # fmt: skip
        low, plain_low = point("ranked", "low"), point("plain", "low")
        if low and plain_low:
            refused = low.get("rounds_refused_per_s", [low["refused_per_s"]])
            shown = " / ".join(f"{r:.0f}" for r in refused)
            self.rows.append((
                "priority 2's surplus refused at once with two levels, in every pass (none on "
                "one queue)",
                f"{shown} refused/s by pass, {low['rps']:.0f} answered/s; one queue "
                f"{plain_low['refused_per_s']:.0f} refused/s",
                all(r > 0 for r in refused) and plain_low["refused_per_s"] == 0,
            ))  # fmt: skip

    def fleet(self) -> None:
        """Many models (``bench.fleet``): the small model with 20 others loaded against alone,
        and the two servers idle."""
        self.compare(
            f"v1 at c={self.top} with 20 other models loaded >= {TARGET_NEIGHBOURS_RATIO:.0%} of "
            "its model alone",
            self.http(FLEET_CROWDED),
            self.http(FLEET_ALONE),
            TARGET_NEIGHBOURS_RATIO,
            share=True,
        )
        self.compare(
            f"v1 at c={self.top} with 20 other models loaded: the server's CPU per request "
            "against its model alone's (no target: steadier than requests/s where other work "
            "shares the server's core)",
            self.http(FLEET_CROWDED),
            self.http(FLEET_ALONE),
            0.0,
            units="µs",
            spec=".1f",
            measure="cpu_us_per_request",
        )
        goals = {IDLE_CROWDED: TARGET_IDLE_CORES, IDLE_ALONE: None}
        for row in self.results.idle:
            goal = goals.get(row["scenario"])
            name = (
                f"{row['scenario']}: < {goal:g} cores"
                if goal is not None
                else f"{row['scenario']} (no target: what the server costs idle without them)"
            )
            self.rows.append((name, *idle_measured(row, goal)))

    def errors(self) -> None:
        """No errors, but the peers' (shown)."""
        ours: list[dict[str, Any]] = []
        for row in self.results.http + self.results.activations:
            if not row["scenario"].startswith(PEERS):
                ours.append(row)
            elif errors := row.get("rounds_errors", row["errors"]):  # a peer's, shown, no target
                self.rows.append(
                    (
                        f"{row['scenario']} at c={row['concurrency']}: errors (no target)",
                        f"{errors} errors",
                        True,
                    )
                )
        errors = sum(r.get("rounds_errors", r["errors"]) for r in ours)
        self.rows.append(
            (
                "zero errors (every round of every point but the peers')",
                f"{errors} errors",
                errors == 0,
            )
        )


def idle_measured(row: dict[str, Any], goal: float | None) -> tuple[str, bool]:
    """An idle row (``bench.fleet``) as a target's measured text and whether it is met: the
    median cores over its passes with their 95 % interval and each pass's load average, met
    when the whole interval is below ``goal`` (None: no target)."""
    passes = row["rounds_cores"]
    low, high = interval(passes)
    shown = " / ".join(f"{x:.4f}" for x in passes)
    loads = "; ".join(row.get("rounds_load", []))
    load = f"; load average {loads}" if loads else ""
    text = f"{row['cores']:.4f} cores [95 % {low:.4f}-{high:.4f}] (by round {shown}{load})"
    return text, goal is None or high < goal


def errors_of(row: dict[str, Any]) -> int:
    """A point's failed answers (non-2xx or socket errors), over all its rounds."""
    return int(row.get("rounds_errors", row.get("errors", 0)))


def megabytes(row: dict[str, Any]) -> float:
    """MB/s of request body (float32 input for the activation rows)."""
    return float(row["rps"] * row["request_bytes"] / 1e6)


def targets_table(results: Results) -> list[str]:
    """The targets as a Markdown table: target, measured, met."""
    lines = ["| target | measured | met |", "|---|---|---|"]
    for target, measured, met in targets(results, results.environment["large_model"]):
        lines.append(f"| {target} | {measured} | {'yes' if met else '**no**'} |")
    return lines
