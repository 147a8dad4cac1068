"""The ``flinkish`` command: ``flinkish demo`` runs the main job on the embedded broker."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flinkish", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the end-to-end demo on an embedded broker")
    demo.add_argument("--events", type=int, default=400, help="events per partition")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from flinkish.demo import run_demo

        return run_demo(events_per_partition=args.events)
    return 2


if __name__ == "__main__":
    sys.exit(main())
