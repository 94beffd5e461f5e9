"""The training trajectory, and the checkpoint key that digests it: written once, for every room.

The trajectory options are the ones that decide the course of a training: the epochs (they decide the total
steps, and with them the learning-rate schedule from the first step on), the seed, the batch size, the
optimiser's settings, how a step is computed (gradient clipping, accumulation, precision), the task and its
options (the model and the data it reads), and the validation cadence and early-stopping rule (where the
run stops, and which validated step is its best). `--candidate` is not among them: the best validated
weights are kept whenever validation is on, so which ones become the model may change on a resume. A
checkpoint only resumes under the same values (the trainer refuses otherwise,
training/engine/resume_policy.py; a checkpoint from before an option existed counts as made with its
default); anything else (the checkpoint interval and how many to keep, the mean time between evictions,
the world size, the progress display) may change between attempts.

The names are the trainer's `TrainConfig` fields (training/engine/config.py), and the train step's inputs of
the same names (components/train.yml), whose values the checkpoint key digests.

The checkpoint key, `<run key>-<digest>`, is where a training keeps its checkpoints: locally
`<state>/checkpoints/<key>/`, on Azure ML the datastore path `retrain/checkpoints/<key>/`. Two trainings of
one run key (model name + data version) with other trajectory values get other keys, so neither ever resumes
the other's checkpoints. (A 3-epoch run once resumed a 6-epoch run's step 75 and kept that as its 3-epoch
model.) components/checkpoint_key.py finds the values a step receives (an optional input a run leaves
unset is left out, so adding one never moves the checkpoints of runs that do not use it); the key is
computed here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

TRAJECTORY_FIELDS = (
    "epochs",
    "seed",
    "global_batch_size",
    "learning_rate",
    "weight_decay",
    "warmup_steps",
    "grad_clip_norm",
    "accumulate_grad_batches",
    "precision",
    # DDP and FSDP reduce gradients in another order (an all-reduce, a reduce-scatter), and their
    # checkpoints hold the state differently.
    "strategy",
    "task",
    "task_options",
    # Validation decides where an early-stopped run ends and which step is its best; resumed under other
    # values, the run would stop elsewhere or pick its best among other validations.
    "validate_every_epochs",
    "validate_every_steps",
    "early_stopping_metric",
    "early_stopping_patience",
    "early_stopping_min_delta",
)

# Besides the options: a task file's content decides its model, so changing the file is another training.
TASK_FILE_DIGEST = "task_file_sha256"

DIGEST_LENGTH = 12


def trajectory_digest(values: Mapping[str, str]) -> str:
    """A short digest of the trajectory values (each as text: a parameter `2` and `"2"` are one value, as on
    the command line), the same whatever their order."""
    canonical = json.dumps(dict(values), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_LENGTH]


def checkpoint_key_for(run_key: str, values: Mapping[str, str]) -> str:
    """`<run key>-<digest of the trajectory>`: where a training of `run_key` with these values keeps its
    checkpoints."""
    return f"{run_key}-{trajectory_digest(values)}"
