"""The first sitting's choice (max_batch_size 8) against the model's own (256) again, as
`gelu-serve tune`'s check does (bench.tune.confirmed), for more rounds:

    python runs/tune-2026-11-28/ab.py ROUNDS > runs/tune-2026-11-28/ab.txt
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.tune import Point, Runner, confirmed  # noqa: E402

model = Path("model_repository/fashion-mlp-wide")
args = argparse.Namespace(concurrency="16,64", seconds=3.0, server_cpus="0", client_cpu=1,
                          rounds=int(sys.argv[1]), p99_budget_ms=150.0)  # fmt: skip
runner = Runner(args, model, (model / "config.pbtxt").read_text())
try:
    verdict = confirmed(runner, Point(256, 0, 1, 1), Point(8, 0, 1, 1), args)
    print(f"keep: {verdict.keep}: {verdict.reason}")
finally:
    runner.close()
