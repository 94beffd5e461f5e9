"""Warm starts: a step's `python -m MODULE ...` forked from an interpreter that has already imported torch and
MLflow, instead of a fresh one importing them again.

A fresh interpreter spends seconds before a step does any work: torch (2 s on two cores), torch's compiler
stack, which every optimizer's first parameter group imports (2-3 s), MLflow and its SQL stores (3 s).
A local `retrain run` started five of them (the preflight, prepare, torchrun and its worker, evaluate,
register), and that start-up was most of its wall time for a small model. Here it is paid once per run:

- `starter.py` is the starter: one process per run that imports what the steps import, then forks a child
  for each step the local runner asks it to start, and tells the runner each child's pid and exit code;
- `forked.py` is the child's side: it becomes `python -m MODULE ARGS` with the step's working folder,
  environment and log, in its own session, as an exec'd interpreter would have been (fresh random state,
  default signal handlers, its own standard streams, atexit handlers and non-daemon threads honoured at
  exit). torchrun's agent starts its workers through it too, so they stay its children and in sessions
  of their own, as torchrun starts them;
- `preload.py` names what each kind of process imports ahead, and `torch_patches.py` is every change made
  to torch's own code (torchrun forking its workers), with the torch versions each is tested on.

RETRAIN_WARM_START=off (core/warm_start.py) switches every one of these forks off: the runner's steps,
`retrain train`'s torchrun agent and its workers are then exec'd as fresh interpreters.

Only the interpreter's start-up changes: each step is still its own process, with its own exit code, log
and process group, so the runner's signals, restarts, liveness checks and failure reports are untouched.
The user's task code is never preloaded: each step imports it afresh, as it would have.
"""
