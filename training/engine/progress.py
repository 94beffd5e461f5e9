"""Progress of a training run, as events: one dict per step or happening, rendered three ways.

Rank 0 emits events; a renderer shows them as an in-place bar (a terminal), as periodic log lines (a job
log), or as JSON lines on stdout (for a supervising process, such as the demo or the tests, to follow).
Events are plain JSON-ready dicts with an "event" key: `start`, `step`, `checkpoint`,
`checkpoint_interval` (the interval `--checkpoint-every-seconds auto` chose), `preempted`, `diverged`,
`resumed`, `validation` (a validation while training, and whether it stops the run), `done`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

log = logging.getLogger("retrain.progress")

Event = dict[str, Any]


class ProgressRenderer(Protocol):
    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


def describe(event: Event) -> str:
    """One line of text for a non-step event."""
    kind = event["event"]
    if kind == "start":
        origin = f"resuming at step {event['step']}" if event["step"] else "from scratch"
        return (
            f"training {event['total_steps']} steps on {event['world_size']} process(es), {origin}; "
            f"data {event['data_version']}"
        )
    if kind == "resumed":
        return (
            f"resumed from checkpoint {event['checkpoint']} at step {event['step']} "
            f"(epoch {event['epoch']}, sample {event['position']} of the epoch)"
        )
    if kind == "checkpoint":
        return (
            f"checkpoint {event['name']} ({event['reason']}) durable: {event['bytes'] / 1e6:.1f} MB, "
            f"training blocked {event['blocked_ms']:.1f} ms, written in {event['write_seconds']:.2f} s"
        )
    if kind == "checkpoint_interval":
        return _interval_text(event)
    if kind == "preempted":
        if event.get("saved") is False:  # the save failed: already reported as a warning with its reason
            return (
                f"preempted at step {event['step']}, whose state was not saved: a restart resumes "
                f"{event['resumes']}; exiting with code {event['exit_code']}"
            )
        return f"preempted: state saved at step {event['step']}; exiting with code {event['exit_code']}"
    if kind == "diverged":
        what = (
            f"the weights after step {event['step']} are not finite"
            if event["weights_only"]
            else f"the loss of step {event['step']} is {event['loss']}"
        )
        return f"diverged: {what}; nothing saved after it; exiting with code {event['exit_code']}"
    if kind == "done":
        ending = " (early stopping)" if event.get("stop_reason") == "early_stopping" else ""
        model = (
            f"; model: the best validated step, {event['candidate_step']}"
            if event.get("candidate") == "best"
            else ""
        )
        scored = _scores_text(event.get("validation") or {})
        not_saved = event.get("checkpoints_not_saved")
        lost = f"; checkpoints not saved: {not_saved} (metadata.json says why)" if not_saved else ""
        return f"done: {event['steps']} steps{ending}, validation {scored}{model}{lost}"
    if kind == "validation":
        return _validation_text(event)
    return json.dumps(event)


def _validation_text(event: Event) -> str:
    since = event["since_best"]
    text = (
        f"validation at step {event['step']}: {_scores_text(event['metrics'])}; best {event['metric']} at "
        f"step {event['best_step']}"
    )
    if event["stop"]:
        return f"{text}; early stopping: {since} validation(s) without improvement"
    return f"{text}, {since} validation(s) since" if since else text


def _scores_text(metrics: dict[str, float]) -> str:
    # Per-class members of a metric family (recall_3) would drown the headline numbers.
    shown = [name for name in metrics if not re.fullmatch(r".+_\d+", name)] or list(metrics)
    return ", ".join(f"{name} {metrics[name]:.4f}" for name in shown) or "not scored"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:,.0f} s"


def _interval_text(event: Event) -> str:
    interval = _duration(event["interval_seconds"])
    if event["rule"] == "fallback":
        return f"checkpoint interval {interval} (fallback): {event['failed_saves']} measuring saves failed"
    basis = (
        "Daly's optimum"
        if event["rule"] == "daly"
        else f"twice the write time: Daly's {_duration(event['daly_seconds'])} would queue saves"
    )
    return (
        f"checkpoint interval {interval} ({basis}); a save blocks training "
        f"{_duration(event['cost_seconds'])} and is written in {_duration(event['write_seconds'])}; "
        f"mean time between evictions {event['mtbe_hours']:g} h"
    )


def _step_text(event: Event) -> str:
    width = 24
    done = int(width * event["step"] / max(event["total_steps"], 1))
    rate = event["samples_per_second"]
    speed = f"{rate:,.0f} samples/s" if rate else "warming up"
    return (
        f"[{'#' * done}{'.' * (width - done)}] step {event['step']}/{event['total_steps']} "
        f"epoch {event['epoch']} loss {event['loss']:.4f} {speed}"
    )


class BarRenderer:
    """A progress line for people: redrawn in place on a terminal, a new line every few seconds otherwise.

    Other events print as lines of their own.
    """

    def __init__(
        self,
        stream: TextIO = sys.stderr,
        indent: str = "",
        in_place: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._indent = indent
        self._in_place = stream.isatty() if in_place is None else in_place
        self._interval = 0.1 if self._in_place else 5.0
        self._clock = clock
        self._last_drawn = -float("inf")
        self._bar_shown = False

    def emit(self, event: Event) -> None:
        if event["event"] == "step":
            self._draw(event)
            return
        self._end_bar()
        self._stream.write(self._indent + describe(event) + "\n")
        self._stream.flush()

    def close(self) -> None:
        self._end_bar()
        self._stream.flush()

    def _draw(self, event: Event) -> None:
        now = self._clock()
        if now - self._last_drawn < self._interval and event["step"] != event["total_steps"]:
            return
        self._last_drawn = now
        if self._in_place:
            self._stream.write("\r\x1b[2K" + self._indent + _step_text(event))
            self._bar_shown = True
        else:
            self._stream.write(self._indent + _step_text(event) + "\n")
        self._stream.flush()

    def _end_bar(self) -> None:
        if self._bar_shown:
            self._stream.write("\n")
            self._bar_shown = False


class LogRenderer:
    """Log lines for a job log: every event, and a step line at most every `interval` seconds."""

    def __init__(self, interval_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_seconds
        self._clock = clock
        self._last_step_logged = -float("inf")

    def emit(self, event: Event) -> None:
        if event["event"] != "step":
            log.info("%s", describe(event))
            return
        now = self._clock()
        if now - self._last_step_logged >= self._interval or event["step"] == event["total_steps"]:
            self._last_step_logged = now
            log.info("%s", _step_text(event))

    def close(self) -> None:
        pass


class JsonLinesRenderer:
    """One JSON object per line on stdout, flushed at once so a reader sees each step as it happens."""

    def __init__(self, stream: TextIO = sys.stdout) -> None:
        self._stream = stream

    def emit(self, event: Event) -> None:
        self._stream.write(json.dumps(event) + "\n")
        self._stream.flush()

    def close(self) -> None:
        self._stream.flush()


class NullRenderer:
    def emit(self, event: Event) -> None:
        pass

    def close(self) -> None:
        pass


def make_renderer(mode: str, is_primary: bool) -> ProgressRenderer:
    if not is_primary or mode == "none":
        return NullRenderer()
    if mode == "auto":
        mode = "bar" if sys.stderr.isatty() else "log"
    return {"bar": BarRenderer, "log": LogRenderer, "jsonl": JsonLinesRenderer}[mode]()
