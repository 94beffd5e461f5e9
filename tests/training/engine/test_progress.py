import io
import json

from training.engine.progress import BarRenderer, JsonLinesRenderer, describe


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _step(step: int, total: int = 100) -> dict:
    return {"event": "step", "step": step, "total_steps": total, "epoch": 0, "position": 0, "loss": 0.5,
            "learning_rate": 0.001, "samples_per_second": 1234.0}  # fmt: skip


def test_bar_off_a_terminal_writes_a_line_every_few_seconds_and_always_the_last_step():
    stream, clock = io.StringIO(), FakeClock()
    bar = BarRenderer(stream, in_place=False, clock=clock)
    for step in range(1, 101):
        clock.now = step * 0.25  # 25 seconds in all
        bar.emit(_step(step))
    lines = stream.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["1/100", "21/100", "41/100", "61/100", "81/100", "100/100"]
    assert "1,234 samples/s" in lines[-1] and "\r" not in stream.getvalue()


def test_bar_on_a_terminal_redraws_in_place_and_prints_events_on_their_own_line():
    stream, clock = io.StringIO(), FakeClock()
    bar = BarRenderer(stream, in_place=True, clock=clock)
    bar.emit(_step(1))
    bar.emit({"event": "preempted", "step": 1, "exit_code": 75})
    assert stream.getvalue().startswith("\r\x1b[2K[")
    assert stream.getvalue().endswith("\npreempted: state saved at step 1; exiting with code 75\n")


def test_json_lines_carry_every_event_whole():
    stream = io.StringIO()
    JsonLinesRenderer(stream).emit(_step(7))
    assert json.loads(stream.getvalue()) == _step(7) and stream.getvalue().count("\n") == 1


def test_checkpoint_events_read_as_a_sentence():
    text = describe({"event": "checkpoint", "name": "step-0000000010-a001", "reason": "interval",
                     "bytes": 2_500_000, "blocked_ms": 1.25, "write_seconds": 0.5, "step": 10})  # fmt: skip
    assert text == (
        "checkpoint step-0000000010-a001 (interval) durable: 2.5 MB, "
        "training blocked 1.2 ms, written in 0.50 s"
    )


def test_the_done_line_shows_the_tasks_headline_scores_without_per_class_members():
    event = {"event": "done", "steps": 5, "validation": {"accuracy": 0.5, "recall_0": 1.0, "loss": 0.25}}
    assert describe(event) == "done: 5 steps, validation accuracy 0.5000, loss 0.2500"
    regression = {"event": "done", "steps": 5, "validation": {"mse": 0.125}}
    assert describe(regression) == "done: 5 steps, validation mse 0.1250"


def test_validation_lines_say_the_best_step_and_the_early_stop():
    validation = {
        "event": "validation", "step": 80, "metrics": {"validation_loss": 1.5}, "metric": "validation_loss",
        "best_step": 40, "since_best": 1, "patience": 2, "stop": False,
    }  # fmt: skip
    assert describe(validation) == (
        "validation at step 80: validation_loss 1.5000; best validation_loss at step 40, "
        "1 validation(s) since"
    )
    assert describe({**validation, "step": 120, "since_best": 2, "stop": True}).endswith(
        "best validation_loss at step 40; early stopping: 2 validation(s) without improvement"
    )
    done = {
        "event": "done", "steps": 120, "validation": {"loss": 1.25}, "stop_reason": "early_stopping",
        "candidate": "best", "candidate_step": 40,
    }  # fmt: skip
    assert describe(done) == (
        "done: 120 steps (early stopping), validation loss 1.2500; model: the best validated step, 40"
    )
