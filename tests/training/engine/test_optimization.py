"""How a step is optimised, in process: the default optimiser and a task's own (checked in one line), a
custom schedule's state through a checkpoint, the data's info in the loss, gradient clipping, accumulation,
precision (bfloat16 trained and resumed exactly on the CPU; float16's scaler state and skipped steps; a
mixed precision refused for a model it cannot apply to, and the parameters' dtype recorded), and the new
options refused in one line."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pytest
import torch
from helpers.training.regression_task import write_sample
from helpers.training.run_outputs import read_metadata
from helpers.training.sgd_task import SgdTabular, step_schedule
from helpers.training.small_run import NO_TRACKING, train_arguments
from mlflow.tracking import MlflowClient
from torch import nn

from core.errors import InputError
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.local_store import LocalCheckpointStore
from training.checkpoint.records import REASON_INTERVAL, CheckpointMeta
from training.cli import main
from training.engine.batch_split import micro_batch_size
from training.engine.batches import BatchSource
from training.engine.config import TrainConfig, trajectory_mismatches
from training.engine.distributed import init_distributed
from training.engine.optimization import DEFAULT, TASK, Optimization, build_optimization
from training.engine.precision import Precision, parameter_dtype, require_applicable, require_supported
from training.engine.preemption import PreemptionNotice
from training.engine.train_args import add_train_arguments, config_from_args
from training.engine.train_state import RunState, build_training_objects, checkpoint_state, restore
from training.engine.train_step import TrainStep
from training.engine.trainer import PREEMPTED, Trainer
from training.tasks.base import (
    OptimizationSettings,
    TaskContractError,
    TensorSplit,
    batch_loss,
    configured_optimization,
    loss_takes_info,
)
from training.tasks.loader import load_task

CPU = torch.device("cpu")
SETTINGS = OptimizationSettings(total_steps=100, learning_rate=0.01, weight_decay=0.0, warmup_steps=4)


def _config(tmp_path: Path, **changes) -> TrainConfig:
    return TrainConfig(data=tmp_path, out=tmp_path / "out", checkpoints=str(tmp_path / "ckpt"), **changes)


class _Hook:
    """A task that is only its optimisation hook (and its name, for the refusal)."""

    name = "hooked"

    def __init__(self, configure) -> None:
        self.configure_optimization = configure


# -- the optimiser and its schedule ----------------------------------------------------------------------


def test_without_a_hook_the_optimiser_is_adamw_warming_up_linearly_then_decaying_along_a_cosine(tmp_path):
    model = nn.Linear(3, 1)
    config = _config(tmp_path, learning_rate=0.01, weight_decay=0.05, warmup_steps=4)
    optimization = build_optimization(object(), model, config, total_steps=20)  # type: ignore[arg-type]
    assert isinstance(optimization.optimizer, torch.optim.AdamW) and optimization.source == DEFAULT
    assert optimization.optimizer.param_groups[0]["weight_decay"] == 0.05
    rates = []
    for _ in range(20):
        rates.append(optimization.learning_rate())
        optimization.optimizer.step()
        optimization.advance_schedule()
    assert rates[:4] == pytest.approx([0.0025, 0.005, 0.0075, 0.01])  # the warm-up
    assert rates[4] == pytest.approx(0.01) and rates[4:] == sorted(rates[4:], reverse=True)
    assert optimization.learning_rate() == pytest.approx(0.001)  # a tenth at the end
    assert optimization.describe() == {
        "optimizer": "AdamW",
        "lr_scheduler": "LambdaLR",
        "optimization_source": "default",
    }


def test_a_task_s_own_optimizer_and_schedule_are_used_and_a_constant_rate_needs_no_schedule():
    model = nn.Linear(3, 1)
    sgd = SgdTabular().configure_optimization(model, SETTINGS)
    optimization = Optimization(
        *configured_optimization(_Hook(lambda m, s: sgd), model, SETTINGS), source=TASK
    )
    assert isinstance(optimization.optimizer, torch.optim.SGD)
    assert isinstance(optimization.scheduler, torch.optim.lr_scheduler.StepLR)
    constant = torch.optim.SGD(model.parameters(), lr=0.1)
    assert configured_optimization(_Hook(lambda m, s: (constant, None)), model, SETTINGS) == (constant, None)


def _bad_results(model: nn.Module):
    other = nn.Linear(3, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    return {
        "only an optimizer": (sgd, "a SGD; it must return a pair (optimizer, scheduler or None)"),
        "no optimizer": ((model, None), "a Linear as its optimizer"),
        "another model's parameters": (
            (torch.optim.SGD(other.parameters(), lr=0.1), None),
            "an optimizer over parameters not the model's",
        ),
        "a scheduler of another optimizer": (
            (sgd, torch.optim.lr_scheduler.StepLR(torch.optim.SGD(other.parameters(), lr=0.1), 5)),
            "a scheduler of another optimizer",
        ),
        "a metric-driven scheduler": (
            (sgd, torch.optim.lr_scheduler.ReduceLROnPlateau(sgd)),
            "a ReduceLROnPlateau, which steps on a metric",
        ),
        "no scheduler": ((sgd, "cosine"), "a str as its scheduler"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "only an optimizer",
        "no optimizer",
        "another model's parameters",
        "a scheduler of another optimizer",
        "a metric-driven scheduler",
        "no scheduler",
    ],
)
def test_a_hook_s_result_is_refused_in_one_line_unless_an_optimizer_of_the_model_and_its_schedule(case):
    model = nn.Linear(3, 1)
    result, said = _bad_results(model)[case]
    with pytest.raises(TaskContractError) as raised:
        configured_optimization(_Hook(lambda m, s: result), model, SETTINGS)
    message = str(raised.value)
    assert message.startswith("task 'hooked': configure_optimization() returned ") and said in message
    assert message.endswith("(training/tasks/base.py)") and "\n" not in message


def test_a_custom_schedule_and_its_optimizer_go_on_from_a_checkpoint_as_they_were(prepared_data, tmp_path):
    task = SgdTabular(hidden_width=8)
    info = task.load(prepared_data).info
    config = _config(tmp_path, task="tests/helpers/training/sgd_task.py:SgdTabular")

    def built():
        return build_training_objects(config, task, info, total_steps=50, device=CPU)

    objects, run = built(), RunState(step=13)
    run.begin_attempt("t", 1, None)
    for _ in range(13):
        objects.optimizer.zero_grad()
        sum(parameter.square().sum() for parameter in objects.model.parameters()).backward()
        objects.optimizer.step()
        objects.optimization.advance_schedule()
    checkpointer = Checkpointer(LocalCheckpointStore(tmp_path / "ckpt"), keep_last=2)
    try:
        meta = CheckpointMeta(13, 0, 0, REASON_INTERVAL, 1, "t", 1, "dv", config.trajectory())
        checkpointer.save(checkpoint_state(objects, run, config, "dv"), meta)
        checkpointer.wait_until_durable()
        loaded = checkpointer.newest_valid()
    finally:
        checkpointer.close()
    fresh = built()
    assert fresh.optimization.learning_rate() == step_schedule(0)
    restore(fresh, loaded, "dv")
    assert isinstance(fresh.scheduler, torch.optim.lr_scheduler.StepLR)
    assert fresh.scheduler.state_dict() == objects.scheduler.state_dict()
    assert fresh.optimization.learning_rate() == step_schedule(13)
    moments = [fresh.optimizer.state[p]["momentum_buffer"] for p in fresh.model.parameters()]
    assert all(
        torch.equal(mine, objects.optimizer.state[p]["momentum_buffer"])
        for mine, p in zip(moments, objects.model.parameters(), strict=True)
    )


# -- the loss --------------------------------------------------------------------------------------------


class _TwoArguments:
    name = "two"

    def loss(self, model, batch):
        return model(batch).mean()


class _WithInfo:
    name = "three"

    def __init__(self) -> None:
        self.given = []

    def loss(self, model, batch, info):
        self.given.append(info)
        return model(batch).mean() * info["weight"]


def test_a_loss_that_takes_info_is_given_the_data_s_info_and_a_two_argument_loss_is_called_as_before():
    model, batch, info = nn.Linear(3, 1), torch.ones(4, 3), {"weight": 2.0}
    assert not loss_takes_info(_TwoArguments()) and loss_takes_info(_WithInfo())
    two = batch_loss(_TwoArguments(), model, batch)  # type: ignore[arg-type]
    task = _WithInfo()
    three = batch_loss(task, model, batch, info)  # type: ignore[arg-type]
    assert task.given == [info] and torch.equal(three, two * 2.0)


# -- one step: clipping and accumulation -----------------------------------------------------------------


class _Regression:
    name = "regression"

    def loss(self, model, batch):
        x, y = batch
        return nn.functional.mse_loss(model(x).squeeze(-1), y)


def _step(model: nn.Module, indices: torch.Tensor, *, accumulate=1, clip=None, lr=1.0) -> float:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(64, 3, generator=generator)
    split = TensorSplit(x, x @ torch.tensor([20.0, -30.0, 40.0]) + 5.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    step = TrainStep(
        _Regression(),  # type: ignore[arg-type]
        BatchSource(split, CPU, "regression"),
        Optimization(optimizer, None, TASK),
        Precision("32", CPU),
        accumulate_grad_batches=accumulate,
        grad_clip_norm=clip,
        loss_info=None,
    )
    return step.run(model, indices, before_update=lambda: None)


def _moved(before: nn.Module, after: nn.Module) -> float:
    return (
        torch.cat([(a - b).flatten() for a, b in zip(after.parameters(), before.parameters(), strict=True)])
        .norm()
        .item()
    )


def test_clipping_bounds_the_gradient_s_norm_and_so_the_update():
    start = nn.Linear(3, 1)
    clipped, free = copy.deepcopy(start), copy.deepcopy(start)
    _step(clipped, torch.arange(16), clip=0.5)  # SGD with lr 1: the update is the gradient
    _step(free, torch.arange(16))
    assert _moved(start, clipped) == pytest.approx(0.5, rel=1e-5)
    assert _moved(start, free) > 10


def test_four_micro_batches_make_the_step_of_the_whole_batch():
    start = nn.Linear(3, 1)
    whole, accumulated = copy.deepcopy(start), copy.deepcopy(start)
    indices = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:32]
    whole_loss = _step(whole, indices, lr=0.01)
    accumulated_loss = _step(accumulated, indices, accumulate=4, lr=0.01)
    assert accumulated_loss == pytest.approx(whole_loss, rel=1e-6)  # the mean of the micro-batches' means
    for mine, theirs in zip(accumulated.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6)


# -- precision -------------------------------------------------------------------------------------------


def test_bf16_mixed_runs_the_forward_pass_in_bfloat16_and_keeps_float32_weights():
    model = nn.Linear(3, 2)
    with Precision("bf16-mixed", CPU).autocast():
        out = model(torch.ones(1, 3))
    assert out.dtype == torch.bfloat16 and model.weight.dtype == torch.float32
    with Precision("32", CPU).autocast():
        assert model(torch.ones(1, 3)).dtype == torch.float32


def test_a_float16_step_the_scaler_skips_leaves_the_weights_its_state_is_checkpointed():
    # torch's scaler runs on the CPU too, which lets its bookkeeping be tested here; the trainer refuses
    # 16-mixed off CUDA (below).
    model = nn.Linear(1, 1)
    precision = Precision("16-mixed", CPU)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [parameter.detach().clone() for parameter in model.parameters()]
    loss = model(torch.ones(1, 1)).sum() * 1e38  # finite; times the scale (65536), its gradients are not
    assert torch.isfinite(loss)
    precision.backward(loss)
    assert precision.step(optimizer) is False and precision.skipped_steps == 1
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    state = precision.state_dict()
    assert state is not None and state["scale"] == 32768.0  # halved
    again = Precision("16-mixed", CPU)
    again.load_state_dict(state)
    assert again.state_dict() == state
    assert Precision("32", CPU).state_dict() is None


def test_16_mixed_is_refused_off_cuda_in_one_line(tmp_path):
    with pytest.raises(InputError, match=r"^--precision 16-mixed: .*needs a CUDA device.*bf16-mixed"):
        require_supported("16-mixed", CPU)
    with pytest.raises(InputError, match=r"^--precision 16-mixed: "):
        build_training_objects(_config(tmp_path, precision="16-mixed"), SgdTabular(), {}, 10, CPU)


class _PartlyFloat64(nn.Module):
    """A float32 body and a float64 head, as a model that keeps one part in double precision is built."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.head = nn.Linear(4, 1).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).double())


def test_a_mixed_precision_is_refused_for_a_model_whose_parameters_are_not_float32():
    # Autocast casts float32 operations only: a float64 model runs in float64 under bf16-mixed as under 32.
    with Precision("bf16-mixed", CPU).autocast():
        assert nn.Linear(3, 2).double()(torch.ones(1, 3, dtype=torch.float64)).dtype == torch.float64
    whole = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1)).double()
    for precision in ("bf16-mixed", "16-mixed"):
        with pytest.raises(InputError) as raised:
            require_applicable(precision, whole)
        assert str(raised.value) == (
            f"--precision {precision}: the model has float64 parameters (4 of 4 tensors, first '0.weight'), "
            "and autocast leaves float64 operations in float64, so it would change nothing; build the model "
            "and its inputs in float32, or train with --precision 32"
        )
    with pytest.raises(InputError, match=r"^--precision bf16-mixed: .*float64 parameters \(2 of 4 tensors, "):
        require_applicable("bf16-mixed", _PartlyFloat64())  # its head would not run in bfloat16
    with pytest.raises(InputError, match=r"bfloat16 parameters .* keeps float32 weights and computes below"):
        require_applicable("bf16-mixed", nn.Linear(3, 2).bfloat16())
    half = (
        r"^--precision 16-mixed: the model has float16 parameters .* keeps float32 weights and computes below"
    )
    with pytest.raises(InputError, match=half):
        require_applicable("16-mixed", nn.Linear(3, 2).half())  # the scaler refuses float16 gradients
    for model in (whole, _PartlyFloat64(), nn.Linear(3, 2).bfloat16()):
        require_applicable("32", model)  # no autocast: the model's own dtype, recorded
    require_applicable("bf16-mixed", nn.Linear(3, 2))
    assert parameter_dtype(nn.Linear(3, 2)) == "float32"
    assert parameter_dtype(whole) == "float64" and parameter_dtype(_PartlyFloat64()) == "float32,float64"


@pytest.fixture(scope="module")
def regression_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("regression")
    write_sample(root / "raw", rows=200, seed=0)
    task = ["--task", "helpers.training.regression_task:RegressionTask"]
    assert main(["prepare", *task, "--raw", str(root / "raw"), "--out", str(root / "prepared")]) == 0
    return root / "prepared"


FLOAT64_TASK = ("--task", "helpers.training.float64_task:Float64Regression")


def _float64_run(data: Path, root: Path, *extra: str) -> list[str]:
    locations = ("--data", str(data), "--out", str(root / "out"), "--checkpoints", str(root / "ckpt"))
    return ["train", *FLOAT64_TASK, *locations, "--epochs", "1", "--progress", "none", *extra]


def test_bf16_mixed_on_a_float64_model_is_refused_before_the_first_step(regression_data, tmp_path, capsys):
    assert main(_float64_run(regression_data, tmp_path, "--precision", "bf16-mixed", *NO_TRACKING)) == 2
    assert capsys.readouterr().err.strip() == (
        "retrain: error: --precision bf16-mixed: the model has float64 parameters (2 of 2 tensors, first "
        "'weight'), and autocast leaves float64 operations in float64, so it would change nothing; build the "
        "model and its inputs in float32, or train with --precision 32"
    )
    assert not (tmp_path / "out").exists()  # nothing trained, nothing records bfloat16
    assert not list((tmp_path / "ckpt").glob("**/*.json"))


def test_a_float64_model_trained_at_32_records_the_dtype_it_ran_in(regression_data, tmp_path):
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = (
        "--mlflow-tracking-uri",
        tracking_uri,
        "--mlflow-artifact-location",
        (tmp_path / "art").as_uri(),
    )
    assert main(_float64_run(regression_data, tmp_path, *tracking)) == 0
    metadata = read_metadata(tmp_path / "out")
    assert metadata["optimization"]["precision"] == "32"
    assert metadata["optimization"]["parameter_dtype"] == "float64"
    params = MlflowClient(tracking_uri).get_run(metadata["mlflow_run_id"]).data.params
    assert (params["precision"], params["parameter_dtype"]) == ("32", "float64")


def _preempted_at(step: int, notice: PreemptionNotice):
    class Renderer:
        def emit(self, event: dict) -> None:
            if event["event"] == "step" and event["step"] >= step:
                notice.request("test")

        def close(self) -> None:
            pass

    return Renderer()


def test_bf16_mixed_trains_and_resumes_exactly_on_the_cpu(prepared_data, tmp_path):
    bf16 = ["--precision", "bf16-mixed", "--epochs", "1", *NO_TRACKING, "--progress", "none"]

    def arguments(root: Path) -> list[str]:
        return [*train_arguments(prepared_data, root / "out", root / "ckpt", nproc=1), *bf16]

    assert main(["train", *arguments(tmp_path / "whole")]) == 0
    uninterrupted = read_metadata(tmp_path / "whole" / "out")

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    config = config_from_args(parser.parse_args(arguments(tmp_path / "resumed")[2:]), {}, Path())
    task, notice, tracking = load_task(config.task, config.task_options), PreemptionNotice(), _Tracking()
    checkpointer = Checkpointer(LocalCheckpointStore(Path(config.checkpoints)), keep_last=2)
    trainer = Trainer(
        config, init_distributed("cpu", {}), task, task.load(config.data), checkpointer,
        tracking, _preempted_at(25, notice), launch_id="t", notice=notice,
    )  # fmt: skip
    try:
        assert trainer.run().status == PREEMPTED
    finally:
        checkpointer.close()
    assert main(["train", *arguments(tmp_path / "resumed")]) == 0

    resumed = read_metadata(tmp_path / "resumed" / "out")
    assert resumed["weights_sha256"] == uninterrupted["weights_sha256"]
    first = resumed["attempts"][0]
    assert resumed["resumes"] == 1 and first["ended"] == "preempted" and 25 <= first["ended_at_step"] < 44
    assert resumed["optimization"]["precision"] == "bf16-mixed"
    assert resumed["optimization"]["parameter_dtype"] == "float32"  # what bfloat16 autocast applies to
    assert resumed["config"]["precision"] == "bf16-mixed"
    names = ("optimizer", "lr_scheduler", "precision", "parameter_dtype")
    tracked = {name: tracking.params[name] for name in names}
    assert tracked == {
        "optimizer": "AdamW",
        "lr_scheduler": "LambdaLR",
        "precision": "bf16-mixed",
        "parameter_dtype": "float32",
    }
    # And bfloat16 did the arithmetic: the same run in float32 ends elsewhere.
    full = [arg for arg in arguments(tmp_path / "full") if arg not in ("--precision", "bf16-mixed")]
    assert main(["train", *full]) == 0
    assert read_metadata(tmp_path / "full" / "out")["weights_sha256"] != uninterrupted["weights_sha256"]


class _Tracking:
    """What the trainer gives an MLflow run (training/engine/tracking.py's Tracker): its parameters."""

    def __init__(self) -> None:
        self.params: dict = {}

    def start(self, run_id, params, tags):
        self.params = dict(params)
        return None

    def log_metrics(self, metrics, step):
        pass

    def set_tags(self, tags):
        pass

    def finish(self, status):
        pass


# -- refused in one line ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"precision": "fp16"}, "--precision fp16: expected one of 32, bf16-mixed, 16-mixed"),
        ({"accumulate_grad_batches": 0}, "--accumulate-grad-batches 0: expected a whole number >= 1"),
        ({"grad_clip_norm": 0.0}, "--grad-clip-norm 0: expected a number > 0"),
        ({"grad_clip_norm": float("nan")}, "--grad-clip-norm nan: expected a number > 0"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_the_flag_and_the_form(tmp_path, change, said):
    with pytest.raises(InputError) as raised:
        _config(tmp_path, **change)
    assert str(raised.value).startswith(said) and "\n" not in str(raised.value)


def test_micro_batches_that_do_not_split_a_process_s_share_evenly_are_refused_in_one_line():
    assert micro_batch_size(32, 2, 4) == 4
    with pytest.raises(InputError) as raised:
        micro_batch_size(32, 2, 3)
    assert str(raised.value) == (
        "--accumulate-grad-batches 3: each of 2 processes trains 16 samples a step (--global-batch-size 32), "
        "which do not split into 3 equal micro-batches; choose a --global-batch-size that is a multiple of 6"
    )


def test_a_checkpoint_older_than_the_step_options_resumes_under_their_defaults_only(tmp_path):
    config = _config(tmp_path)
    older = {name: value for name, value in config.trajectory().items() if name not in (
        "grad_clip_norm", "accumulate_grad_batches", "precision"
    )}  # fmt: skip
    assert trajectory_mismatches(older, config) == []
    assert trajectory_mismatches(older, _config(tmp_path, precision="bf16-mixed")) == [
        "--precision bf16-mixed (checkpoint: 32)"
    ]
