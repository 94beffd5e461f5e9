"""`retrain demo`: run the story, then its summary. `make demo` calls it."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import TextIO

from demo.scenario import DemoSize


def run_demo(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from demo.story import MODEL_NAME, run_story
    from demo.summary import summarise
    from training.gate.history import model_listing
    from training.gate.registry import ModelRegistry, resolve_store

    out = out or sys.stdout
    # The demo narrates; library INFO lines (MLflow, the runner's own logger) would interrupt it.
    logging.getLogger().setLevel(logging.WARNING)
    size = DemoSize(epochs=args.epochs)
    started = time.monotonic()
    story = run_story(args.state_root, out, size, time.monotonic)
    registry = ModelRegistry(resolve_store(None, {}, story.home))
    listing = model_listing(registry, MODEL_NAME)
    summarise(story.say, story.record, story.front_door.ledger_snapshot(), listing)
    story.say.line(f"The whole loop took {time.monotonic() - started:.0f} s.")
    return 0


def register_commands(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo",
        help="the whole loop on this machine: data lands -> one run through an eviction -> champion -> "
        "shifted data -> drift alert -> retrain -> the gate",
    )
    demo.add_argument("--epochs", type=int, default=DemoSize.epochs, help="training epochs per run")
    demo.set_defaults(handler=run_demo)
