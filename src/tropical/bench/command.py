"""``tropical bench``: run the benchmark and print or write what the user asked for."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tropical.bench.config import BenchConfig
from tropical.bench.output import summary_dict, table, write_outputs
from tropical.bench.run import run_bench


def bench_main(args: argparse.Namespace) -> int:
    run = run_bench(BenchConfig.from_args(args))
    written = write_outputs(run, Path(run.config.out)) if run.config.out else []
    if args.json:
        print(json.dumps(summary_dict(run)))
    else:
        print(table(run))
        if written:
            print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
