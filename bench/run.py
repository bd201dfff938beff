"""``make bench``: the inference path under load, against the HTTP floor, the naive app and the
compute floor, every figure with the CPU it took.

In one run on this machine: start the service (batching on and off), the HTTP floor app (by stock
uvicorn, and as the service serves) and the naive app as real uvicorn processes, each pinned to one
core with every thread checked (see ``bench.proc``); drive them with wrk pinned to the other core
at each concurrency, recording requests/s, p50, p99, errors, the server's CPU use, the
hypervisor's steal (repeating points taken under high steal) and a probe's reading of the host's
speed (``bench.speed``) per point. Then two worker processes against one, the larger model where
batching matters, raw activation evaluation of 1e6 values against a 4 MB echo, onnxruntime's
in-process ``session.run`` (the compute floor) and where a request's time goes. Writes
``benchmarks.md``, ``benchmarks.json`` and ``benchmarks.png``. Absolute figures move with the
machine's neighbours; compare the ratios, which are taken within one run, each round counted
when the probe read the host at one speed for both of its points.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from bench import gpu, instructions
from bench.fleet import Fleet, median_idle
from bench.launch import (
    SERVICE_APP,
    Scenario,
    Server,
    ensure_models,
    floor_as_served,
    free_port,
    grpc_floor,
    otlp_sink,
    peers,
    serve,
    server,
    started_in_turn,
    tls_setup,
)
from bench.measure import (
    activation_kernels,
    activation_requests,
    answer,
    breakdown,
    compute_floor,
    drive,
    drive_order,
    environment,
    measure,
    reference,
    requests_for,
    sample_inputs,
)
from bench.proc import cpu_list
from bench.results import (
    ASGI_FLOOR,
    CACHE_HIT,
    CACHE_MISS,
    ECHO_AS_SERVED,
    FLOOR_AS_SERVED,
    FLOOR_AS_SERVED_ONE,
    FLOOR_AS_SERVED_TWO,
    HTTP_FLOOR,
    OFF_AGAIN,
    ONE_WORKER,
    ONE_WORKER_OFF,
    OVER_TLS,
    PEER_BENTOML,
    PEER_MLSERVER,
    SMALL,
    TRACED,
    TWO_WORKERS,
    TWO_WORKERS_OFF,
    Results,
    median_rounds,
    probe_text,
)
from bench.speed import HostSpeed
from bench.wrk import UNIQUE, Request
from contract.model_config import load_model_config


def run(args: argparse.Namespace) -> Results:
    """Every measurement, in one run."""
    bench = Run(args)
    # The host's speed on every CPU, measured beside every point (bench.speed); only while
    # servers are driven: the in-process measurements after run on the client CPU.
    with bench.host:
        bench.one_core_passes()
        if not args.smoke:  # two processes and wrk, all free to use every core
            bench.worker_passes()
    bench.priority_passes()
    bench.in_process()
    return bench.results


class Run:
    """One run's settings, requests and results, measured pass by pass."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.repository = repository = Path(args.repository).resolve()
        self.large = ensure_models(repository, large=not args.smoke)
        command = "gelu-serve bench " + " ".join(a for a in sys.argv[1:] if a != "bench")
        self.results = Results(environment(args, command))
        self.every_cpu = ",".join(map(str, sorted(os.sched_getaffinity(0))))  # before pinning
        if args.client_cpu is not None:
            os.sched_setaffinity(0, {args.client_cpu})  # this process: compute floor, breakdown
        self.concurrencies = [int(c) for c in args.concurrency.split(",")]
        self.small = requests_for(SMALL, sample_inputs(64))
        large_features = 64 if self.large == "digits-autoencoder" else 784
        self.big = requests_for(self.large, sample_inputs(large_features))
        self.activation = activation_requests(args.activation_values)
        self.floor_request = Request("/floor", self.small["v1"].body, self.small["v1"].headers)
        self.base_env = {
            "GELU_MODEL_REPOSITORY": str(repository),
            "GELU_LOG_LEVEL": "warning",
            "GELU_MAX_BODY_BYTES": str(64 << 20),
            "GELU_MAX_JSON_BYTES": str(64 << 20),  # the activation JSON point's body
            "GELU_DRAIN_SECONDS": "0",
            "GELU_GRPC_PORT": "0",
        }
        self.on_env, self.off_env = (
            {**self.base_env, "GELU_BATCHING": flag} for flag in ("true", "false")
        )
        self.naive_env = {"GELU_NAIVE_MODEL": str(repository / SMALL / "1" / "model.onnx")}
        self.sink_port = free_port()  # bench.otlp_sink, for the traced servers' spans
        self.client_cpus = self.every_cpu if args.client_cpu is None else str(args.client_cpu)
        # The run's own files: its TLS certificates, the small model with its cache on.
        self.scratch = tempfile.TemporaryDirectory(prefix="gelu-bench-")
        self.tls_env, self.tls = tls_setup(Path(self.scratch.name))
        self.cache_env = self.cached_small(Path(self.scratch.name) / "cached")
        self.fleet = Fleet(repository, Path(self.scratch.name) / "fleet", self.on_env)
        self.host = HostSpeed(cpu_list(self.every_cpu))
        self.scenarios: list[Scenario] = []  # the order the report lists them in

    def point(
        self, name: str, target: Server, request: Request, c: int, rows: list[Any], pin: bool = True
    ) -> None:
        """Measure one point into ``rows`` and print it."""
        args = self.args
        row = measure(target, request, c, args.seconds, args.client_cpu if pin else None, self.host)
        row.update(scenario=name, concurrency=c)
        rows.append(row)
        print(
            f"{name:42s} c={c:<3d} {row['rps']:7.0f} req/s  p50 {row['p50_ms']:6.2f} ms  "
            f"p99 {row['p99_ms']:6.2f} ms  errors {row['errors']}  server {row['server_cores']:.2f}"
            f" cores  preempted {row['preempted_per_request']:.3f}/request  "
            f"steal {row['steal_cores']:.2f}  probe {probe_text(row) or '?'} ms",
            flush=True,
        )

    def cached_small(self, root: Path) -> dict[str, str]:
        """Batching on, over a repository of the small model alone with Triton's response
        cache enabled (``response_cache { enable: true }``) and a budget for it."""
        shutil.copytree(self.repository / SMALL, root / SMALL)
        config = root / SMALL / "config.pbtxt"
        config.write_text(config.read_text() + "response_cache { enable: true }\n")
        return {**self.on_env, "GELU_MODEL_REPOSITORY": str(root),
                "GELU_RESPONSE_CACHE_BYTES": str(64 << 20)}  # fmt: skip

    def traced_env(self, ratio: str) -> dict[str, str]:
        """Batching on, with OpenTelemetry sampling ``ratio`` of the requests into the sink."""
        return {
            **self.on_env,
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.sink_port}",
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": ratio,
        }

    def paired(
        self, on: Server, off: Server, again: Server
    ) -> tuple[list[list[Scenario]], list[Scenario]]:
        """The service's scenarios, in groups driven one right after the other (batching on and
        off of one protocol, in the other order every other pass: their ratio, the closest call
        of the targets at c=1, is taken between points seconds apart, and a drift of the
        machine's speed favours neither; V1's group drives a second batching-off server too,
        OFF_AGAIN), and as the report lists them: every "on" row, then every "off" one."""
        small, big, large = self.small, self.big, self.large
        states = (("on", on), ("off", off))
        pairs = [
            [(f"{k} predict, batching {state}", target, small[k]) for state, target in states]
            for k in small
        ]
        twin = (OFF_AGAIN, again, small["v1"])
        listed = [pair[0] for pair in pairs] + [pair[1] for pair in pairs] + [twin]
        pairs[list(small).index("v1")].append(twin)
        if not self.args.smoke:
            pairs.append([
                (f"{large} v2-binary, batching on", on, big["v2-binary"]),
                (f"{large} v2-binary, batching off", off, big["v2-binary"]),
            ])  # fmt: skip
            listed += pairs[-1]
        return pairs, listed

    def warm(self, scenarios: list[Scenario]) -> None:
        """One unrecorded second for each server, with the first of its scenarios."""
        warmed: set[str] = set()
        for _, target, request in scenarios:
            if target.url not in warmed:
                drive(target, request, 8, 1, self.args.client_cpu)
                warmed.add(target.url)

    def one_core_passes(self) -> None:
        """Every 1-worker point, in whole passes.

        Every server of a pass (the floors, the naive app, the peers and the service's) is a
        new process for it, on the one server core, and none is paused: each idles beside the
        one measured as it would beside any other. At each concurrency every scenario is
        driven back to back, so each ratio compares runs taken within a minute or two, and
        batching on and off of one protocol one right after the other.
        """
        with otlp_sink(self.sink_port, self.client_cpus):
            for round_index in range(self.args.rounds):  # each point's rounds spread out
                with ExitStack() as stack:
                    alone, floor, floor_served = self.others(stack)
                    self.service_pass(round_index, alone, floor, floor_served, stack)

    def others(self, stack: ExitStack) -> tuple[list[Scenario], Server, Server]:
        """A pass's servers other than the service's, started for it: the floors, the naive
        app and (with ``--peers``) MLServer and BentoML; their scenarios, the HTTP floor and
        the floor served as the service serves."""
        small, cpus = self.small, self.args.server_cpus
        floor = stack.enter_context(server("bench.floor:create_app", {}, 1, cpus, "/docs"))
        asgi = stack.enter_context(server("bench.floor:create_asgi_app", {}, 1, cpus, "/docs"))
        floor_served = stack.enter_context(floor_as_served(cpus))
        naive = stack.enter_context(
            server("bench.naive:create_app", self.naive_env, 1, cpus, "/ready")
        )
        floor_grpc = stack.enter_context(grpc_floor(cpus))
        alone = [
            (HTTP_FLOOR, floor, self.floor_request),
            (ASGI_FLOOR, asgi, self.floor_request),
            (FLOOR_AS_SERVED, floor_served, self.floor_request),
            ("grpc floor", floor_grpc, small["grpc"]),
            ("naive app", naive, small["v1"]),
        ]
        if self.args.peers:
            model_file = self.repository / SMALL / "1" / "model.onnx"
            config = load_model_config((self.repository / SMALL / "config.pbtxt").read_bytes())
            others = stack.enter_context(peers(model_file, config.max_batch_size, cpus))
            bento_request = Request("/predict", small["v1"].body, small["v1"].headers)
            compared = [
                (f"{PEER_MLSERVER} v2-json", others["mlserver"], small["v2-json"]),
                (f"{PEER_BENTOML}", others["bentoml"], bento_request),
            ]
            # Each peer's answer is the model's before it is timed: a peer answering something
            # else (or an error) would be measured doing other work.
            expected = reference(model_file, sample_inputs(64))
            for name, peer, request in compared:
                got = answer(peer, request)
                if not np.allclose(got, expected, atol=1e-5):
                    raise AssertionError(f"{name} answers {got}, the model {expected}")
            alone += compared
        return alone, floor, floor_served

    def pass_servers(
        self, round_index: int, stack: ExitStack
    ) -> tuple[Server, Server, Server, list[Scenario]]:
        """A pass's servers of the service, started in its turn's order: batching on, off and
        off again, and the scenarios read beside batching on's: the same server over TLS, and
        traced at each sampler ratio."""
        cpus, ready = self.args.server_cpus, "/v2/health/ready"
        states = [self.on_env, self.off_env, self.off_env]
        states += [self.traced_env(ratio) for ratio in TRACED]
        arguments: list[tuple[Any, ...]] = [(SERVICE_APP, env, 1, cpus, ready) for env in states]
        tls_env = {**self.on_env, **self.tls_env}
        arguments.append((SERVICE_APP, tls_env, 1, cpus, ready, self.tls))
        arguments.append((SERVICE_APP, self.cache_env, 1, cpus, ready))
        on, off, again, *traced, over_tls, cached = started_in_turn(arguments, round_index, stack)
        names = [OVER_TLS, *TRACED.values()]
        v1 = self.small["v1"]
        beside = [(n, t, v1) for n, t in zip(names, [over_tls, *traced], strict=True)]
        # The instance's first two values a pair new in every request: all misses.
        instances = json.loads(v1.body)["instances"]
        instances[0][:2] = [UNIQUE.decode()]
        body = json.dumps({"instances": instances}).encode().replace(b'"%s"' % UNIQUE, UNIQUE)
        unique = Request(v1.path, body, v1.headers)
        beside += [(CACHE_HIT, cached, v1), (CACHE_MISS, cached, unique)]
        return on, off, again, beside

    def service_pass(
        self,
        round_index: int,
        alone: list[Scenario],
        floor: Server,
        floor_served: Server,
        stack: ExitStack,
    ) -> None:
        """One pass over every 1-worker point, with the service's servers new for it.

        Two identical servers can differ by more than batching on and off do at c=1, for as
        long as both run; with a pass's own processes, that difference is one more pass's
        noise, for the median over the passes (and over runs, ``bench.pool``) to average.
        docs/performance.md, "The batcher's constants, and other measured choices", has the
        measurements behind this and what else was tried.
        """
        args, activation = self.args, self.activation
        on, off, again, beside = self.pass_servers(round_index, stack)
        pairs, listed = self.paired(on, off, again)
        pairs.append(beside)
        listed += beside
        fleet = self.fleet.servers(round_index, args.server_cpus, stack)
        pairs.append(self.fleet.pair(fleet, self.small["v1"]))
        listed += pairs[-1]
        self.scenarios = alone + listed
        self.warm(alone + listed)
        self.results.idle += self.fleet.idle(fleet, args.idle_seconds)
        driven = drive_order([[s] for s in alone] + pairs, round_index, args.rounds)
        for c in self.concurrencies:
            for name, target, request in driven:
                self.point(name, target, request, c, self.results.http)
        rows = self.results.activations
        for c in (1, 4):
            self.point("echo floor", floor, activation["echo"], c, rows)
            self.point(ECHO_AS_SERVED, floor_served, activation["echo"], c, rows)
            self.point("gelu, float32 binary", on, activation["binary"], c, rows)
            self.point("gelu native, float32 binary", on, activation["native"], c, rows)
        self.point("gelu, JSON", on, activation["json"], 1, rows)

    def worker_passes(self) -> None:
        """Two worker processes against one, in passes of their own.

        Each 2-worker server beside a 1-worker twin, pinned as the rest, driven one right after
        the other in each pass (in the other order every other pass): the ratio of two against
        one is taken seconds apart, not a quarter of an hour.
        """
        every, cpus, v1, ready = (
            self.every_cpu,
            self.args.server_cpus,
            self.small["v1"],
            ("/v2/health/ready"),
        )
        port, port_off = free_port(), free_port()
        serve_two, serve_two_off = (
            [sys.executable, "-m", "cli", "serve", "--port", str(p), "--workers", "2"]
            for p in (port, port_off)
        )
        floor_app, naive_app, naive_env = (
            "bench.floor:create_app",
            "bench.naive:create_app",
            (self.naive_env),
        )
        with (
            serve(serve_two, self.base_env, every, port, ready, settle=1.0) as started,
            server(SERVICE_APP, self.on_env, 1, cpus, ready) as one,
            serve(serve_two_off, self.off_env, every, port_off, ready, settle=1.0) as two_off,
            server(SERVICE_APP, self.off_env, 1, cpus, ready) as one_off,
            server(naive_app, naive_env, 2, every, "/ready") as naive_two,
            server(floor_app, {}, 2, every, "/docs") as floor_two,
            server(floor_app, {}, 1, cpus, "/docs") as floor_one,
            floor_as_served(every, workers=2) as floor_served_two,
            floor_as_served(cpus) as floor_served_one,
        ):
            two, floor = dataclasses.replace(started, batches=True), self.floor_request
            twins = [
                [(TWO_WORKERS, two, v1, False), (ONE_WORKER, one, v1, True)],
                [(TWO_WORKERS_OFF, two_off, v1, False), (ONE_WORKER_OFF, one_off, v1, True)],
                [("naive app, uvicorn --workers 2", naive_two, v1, False)],
                [("http floor, uvicorn --workers 2", floor_two, floor, False),
                 ("http floor, uvicorn --workers 1", floor_one, floor, True)],
                [(FLOOR_AS_SERVED_TWO, floor_served_two, floor, False),
                 (FLOOR_AS_SERVED_ONE, floor_served_one, floor, True)],
            ]  # fmt: skip
            top = max(self.concurrencies)
            for round_index in range(self.args.rounds):
                for name, target, request, pin in drive_order(twins, round_index, self.args.rounds):
                    self.point(name, target, request, top, self.results.http, pin=pin)

    def priority_passes(self) -> None:
        """Priority levels under overload (``bench.priority``): in each pass (one in a smoke
        run) a new server of its two models, driven by its higher-level clients alone, then
        beside its lower-level ones; both models at once, so their ratio meets one machine."""
        from bench.priority import HIGH, LOW, bench_rows, overload, write_models

        root = Path(self.scratch.name) / "priority"
        write_models(root)
        env = {**self.base_env, "GELU_MODEL_REPOSITORY": str(root), "GELU_INLINE_MAX_US": "0",
               "GELU_INTRA_OP_THREADS": "1"}  # fmt: skip
        seconds = self.args.seconds
        for _ in range(1 if self.args.smoke else self.args.rounds):
            with server(SERVICE_APP, env, 1, self.args.server_cpus, "/v2/health/ready") as target:
                port = int(target.url.rsplit(":", 1)[1])
                for low in (0, LOW):
                    rows = bench_rows(overload(port, HIGH, low, seconds), low, seconds, target.pid)
                    self.results.priority += rows
                    for row in rows:
                        print(f"{row['scenario']:42s} beside {low:<3d} {row['rps']:7.0f} req/s  "
                              f"refused {row['refused_per_s']:5.0f}/s  p50 {row['p50_ms']:6.1f} ms"
                              f"  p99 {row['p99_ms']:6.1f} ms", flush=True)  # fmt: skip

    def in_process(self) -> None:
        """The rounds' medians, then what is measured in this process: the compute floor, the
        core's stages, the activation kernels and (under valgrind) instructions per request."""
        args, results, repository = self.args, self.results, self.repository
        results.http = median_rounds(results.http)
        results.activations = median_rounds(results.activations)
        passes, results.priority = results.priority, median_rounds(results.priority)
        for row in results.priority:  # the refusals of every pass, beside the answers'
            row["rounds_refused_per_s"] = [
                r["refused_per_s"] for r in passes
                if (r["scenario"], r["concurrency"]) == (row["scenario"], row["concurrency"])
            ]  # fmt: skip
        results.idle = median_idle(results.idle)
        order = {name: i for i, (name, _, _) in enumerate(self.scenarios)}
        results.http.sort(key=lambda r: (order.get(r["scenario"], len(order)), r["concurrency"]))
        results.compute = compute_floor(repository / SMALL / "1" / "model.onnx", args.seconds)
        results.breakdown = breakdown(repository, args.seconds)
        results.kernels = activation_kernels(args.activation_values)
        if not args.smoke:  # minutes under valgrind, when it is installed
            results.instructions = instructions.count(repository, sample_inputs(64)) or {}
        results.gpu = gpu.measure(repository, [SMALL, self.large], args.seconds / 10)
        results.environment["large_model"] = self.large
