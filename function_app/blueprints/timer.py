"""Timer: flush debounced batches whose quiet period or maximum wait has passed."""

from __future__ import annotations

import logging

import azure.functions as func

from function_app.runtime import front_door

log = logging.getLogger(__name__)
blueprint = func.Blueprint()

# Every 30 s: a batch is submitted at most this long after its quiet period ends.
FLUSH_SCHEDULE = "*/30 * * * * *"


@blueprint.function_name("flush_batches")
@blueprint.timer_trigger(arg_name="timer", schedule=FLUSH_SCHEDULE, run_on_startup=False, use_monitor=True)
def flush_batches(timer: func.TimerRequest) -> None:
    submitted = front_door().flush()
    if timer.past_due:
        log.warning("flush ran late (the host was busy or scaled in); submitted %d batches", len(submitted))
    else:
        log.info("flush submitted %d batches", len(submitted))
