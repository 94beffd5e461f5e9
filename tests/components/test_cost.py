"""A run's estimated cost, computed by hand: GPUs x expected hours x price, with the spot model for
low-priority compute; the tags it puts on the request; and the RETRAIN_* cost settings."""

from __future__ import annotations

import argparse
import io

import pytest

from components.azureml import cli as azureml_cli
from components.cost import (
    CostSettings,
    CostSettingsError,
    MeasuredTraining,
    compute_defaults,
    estimate_run_cost,
    with_estimate,
)
from components.errors import PipelineError, SubmissionError
from components.local import cli as local_cli
from components.request import DataRef, RunRequest
from components.run_inputs import trigger_argument
from components.specs import PIPELINE_FILE

VERSION = "rd-0123456789abcdef"
# 10 h of training, one eviction per node every 20 h, a save every hour, half an hour to restart.
SETTINGS = CostSettings(
    gpu_hour_price=2.0,
    spot_discount=0.6,
    expected_train_hours=10.0,
    mtbe_hours=20.0,
    checkpoint_every_hours=1.0,
    restart_overhead_hours=0.5,
)


def make_request(**changes) -> RunRequest:
    fields = {
        "model_name": "digits",
        "data": DataRef(VERSION, f"azureml:digits-raw:{VERSION}"),
        "trigger": {"source": "blob"},
        "processes_per_instance": 4,
    }
    return RunRequest(**{**fields, **changes})


def test_a_run_on_the_spot_cluster_is_priced_with_the_spot_model():
    estimate = estimate_run_cost(make_request(), SETTINGS)

    # 0.5 evictions (10 h / 20 h), each losing half a save period (0.5 h) and the restart (0.5 h):
    # 10.5 wall hours on 4 GPUs = 42 GPU-hours at 40 % of the price, against 40 dedicated GPU-hours.
    assert (estimate.gpus, estimate.train_compute, estimate.low_priority) == (4, "gpu-spot", True)
    assert estimate.evictions == pytest.approx(0.5)
    assert estimate.wall_hours == pytest.approx(10.5)
    assert estimate.gpu_hours == pytest.approx(42.0)
    assert estimate.cost_vs_dedicated == pytest.approx(0.42)
    assert estimate.cost == pytest.approx(2.0 * 0.4 * 42.0)
    assert estimate.summary() == (
        "estimated cost 33.60: 4 GPU(s) x 10.50 h on low-priority compute gpu-spot = 42.00 GPU-hours "
        "(0.50 expected evictions; spot pays: 58% cheaper than dedicated)"
    )


def test_a_measured_training_sets_the_hours_at_the_run_s_epochs_and_gpus_and_says_so():
    # 0.9 s a step on 2 processes, 40 steps an epoch: 20 epochs on 4 GPUs take 0.9 x 40 x 20 x 2/4 s.
    measured = MeasuredTraining(
        "20261203-101500-3fa2c1", seconds_per_step=0.9, steps_per_epoch=40, world_size=2
    )
    request = make_request(compute={"train": "gpu-dedicated"}, parameters={"epochs": "20"})

    estimate = estimate_run_cost(request, SETTINGS, measured)

    assert estimate.expected_hours == pytest.approx(360 / 3600)
    assert estimate.wall_hours == pytest.approx(0.1) and estimate.gpu_hours == pytest.approx(0.4)
    assert estimate.basis == (
        "train time measured on run 20261203-101500-3fa2c1: 0.9 s per step x 40 steps per epoch x 20 epochs, "
        "on 2 process(es) there"
    )
    # Without one, the setting's hours, said to be assumed; without epochs, pipeline.yml's default (5).
    assumed = estimate_run_cost(request, SETTINGS)
    assert (assumed.expected_hours, assumed.basis) == (
        10.0,
        "train time assumed: RETRAIN_EXPECTED_TRAIN_HOURS=10 h (no measured training)",
    )
    default_epochs = estimate_run_cost(make_request(compute={"train": "gpu-dedicated"}), SETTINGS, measured)
    assert default_epochs.expected_hours == pytest.approx(0.9 * 40 * 5 * 2 / 4 / 3600)


def test_a_tiny_measured_training_reads_in_seconds_and_significant_digits_not_zeros():
    # 0.05 s a step, 10 steps an epoch, 2 epochs on one process: 1 s on 4 GPUs is 0.25 s of wall time.
    measured = MeasuredTraining(
        "20261207-140000-aaaaaa", seconds_per_step=0.05, steps_per_epoch=10, world_size=1
    )
    request = make_request(compute={"train": "gpu-dedicated"}, parameters={"epochs": "2"})

    summary = estimate_run_cost(request, SETTINGS, measured).summary()

    assert "4 GPU(s) x 0.2 s on dedicated compute gpu-dedicated = 0.00028 GPU-hours" in summary
    assert "0.00 h" not in summary and "= 0.00 GPU" not in summary
    assert estimate_run_cost(make_request(compute={"train": "gpu-dedicated"}, parameters={"epochs": "2000"}),
                             SETTINGS, measured).summary().count(" x 4.2 min ") == 1  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"), [("seconds_per_step", 0.0), ("steps_per_epoch", float("nan")), ("world_size", 0)]
)
def test_a_measurement_that_is_not_one_is_refused_naming_its_run(field: str, value: float):
    fields = {"seconds_per_step": 1.0, "steps_per_epoch": 10.0, "world_size": 1, field: value}
    with pytest.raises(CostSettingsError, match=f"measured training of run r-1: {field} "):
        MeasuredTraining("r-1", **fields)


def test_a_run_on_dedicated_compute_is_never_evicted_and_pays_the_full_price():
    estimate = estimate_run_cost(make_request(compute={"train": "azureml:gpu-dedicated"}), SETTINGS)

    assert (estimate.train_compute, estimate.low_priority, estimate.evictions) == ("gpu-dedicated", False, 0)
    assert (estimate.wall_hours, estimate.gpu_hours, estimate.cost_vs_dedicated) == (10.0, 40.0, 1.0)
    assert estimate.cost == pytest.approx(80.0)
    assert estimate.summary() == (
        "estimated cost 80.00: 4 GPU(s) x 10.00 h on dedicated compute gpu-dedicated = 40.00 GPU-hours"
    )


def test_a_multi_node_run_counts_every_gpu_and_every_nodes_evictions():
    estimate = estimate_run_cost(make_request(processes_per_instance=2, instance_count=3), SETTINGS)

    # 6 GPUs; any of 3 nodes evicted stops the job: 1.5 evictions, 10 + 1.5 x 1 = 11.5 wall hours.
    assert estimate.gpus == 6
    assert estimate.evictions == pytest.approx(1.5)
    assert estimate.wall_hours == pytest.approx(11.5)
    assert estimate.gpu_hours == pytest.approx(69.0)
    assert estimate.cost_vs_dedicated == pytest.approx(0.4 * 69.0 / 60.0)
    assert estimate.cost == pytest.approx(2.0 * 0.4 * 69.0)


def test_without_a_price_the_estimate_is_in_gpu_hours_and_says_how_to_price_it():
    estimate = estimate_run_cost(make_request(), CostSettings(expected_train_hours=10.0, mtbe_hours=20.0))

    assert estimate.cost is None
    assert "retrain.estimated_cost" not in estimate.as_tags()
    assert estimate.to_dict()["cost"] is None
    assert estimate.summary().startswith("estimated cost unpriced: 4 GPU(s) x ")
    assert estimate.summary().endswith(
        "; set RETRAIN_GPU_HOUR_PRICE to the dedicated price of a GPU-hour to price it"
    )


@pytest.mark.parametrize(
    ("parameters", "wall_hours"),
    [
        ({"checkpoint_every_seconds": "7200"}, 10.0 + 0.5 * (1.0 + 0.5)),  # the run's own interval
        ({"checkpoint_every_seconds": 1800}, 10.0 + 0.5 * (0.25 + 0.5)),
        ({"checkpoint_every_seconds": "off"}, 10.0 + 0.5 * (5.0 + 0.5)),  # half the run lost
        ({"checkpoint_every_seconds": "auto"}, 10.0 + 0.5 * (0.5 + 0.5)),  # the setting
        ({"mtbe_hours": "5"}, 10.0 + 2.0 * (0.5 + 0.5)),  # the run's own eviction rate
    ],
)
def test_the_runs_own_checkpoint_interval_and_eviction_rate_win_over_the_settings(parameters, wall_hours):
    estimate = estimate_run_cost(make_request(parameters=parameters), SETTINGS)
    assert estimate.wall_hours == pytest.approx(wall_hours)


def test_the_estimate_travels_as_job_tags_beside_the_lineage_and_leaves_the_trigger_alone():
    request = make_request()

    tagged, estimate = with_estimate(request, SETTINGS)

    assert estimate.as_tags() == {
        "retrain.estimated_gpus": "4",
        "retrain.train_tier": "low_priority",
        "retrain.estimated_wall_hours": "10.50",
        "retrain.estimated_gpu_hours": "42.00",
        "retrain.cost_vs_dedicated": "0.420",
        "retrain.estimated_cost": "33.60",
    }
    assert tagged.tags() == {**request.tags(), **estimate.as_tags()}
    # The trigger feeds the register step's --trigger and the step cache: an estimate must not change it.
    assert (tagged.trigger, tagged.run_key) == (request.trigger, request.run_key)
    assert trigger_argument(tagged.trigger) == trigger_argument(request.trigger)
    assert estimate.to_dict()["summary"] == estimate.summary()


@pytest.mark.parametrize(
    ("job_tags", "message"),
    [
        ({"trigger.source": "x"}, r"job tags \['trigger.source'\]: these name the trigger"),
        ({"retrain.run_key": "x"}, r"job tags \['retrain.run_key'\]: these name the trigger or the run's"),
        ({"a key": "x"}, r"job tags \['a key'\]: expected text keys"),
        ({"retrain.estimated_gpus": 4}, r"job tags \['retrain.estimated_gpus'\]: expected .* text values"),
    ],
)
def test_job_tags_cannot_pose_as_lineage_or_break_the_tag_rules(job_tags, message):
    with pytest.raises(SubmissionError, match=message):
        make_request(job_tags=job_tags)


def test_the_settings_are_read_from_their_variables_and_empty_means_unset():
    settings = CostSettings.from_environ(
        {
            "RETRAIN_GPU_HOUR_PRICE": "3.67",
            "RETRAIN_SPOT_DISCOUNT": " .7 ",
            "RETRAIN_EXPECTED_TRAIN_HOURS": "2.5",
            "RETRAIN_MTBE_HOURS": "6",
            "RETRAIN_CHECKPOINT_EVERY_HOURS": "0.5",
            "RETRAIN_RESTART_OVERHEAD_HOURS": "0",
            "RETRAIN_LOW_PRIORITY_COMPUTES": "gpu-spot, azureml:big-spot",
            "RETRAIN_UNRELATED": "ignored",
        }
    )

    assert settings == CostSettings(
        gpu_hour_price=3.67,
        spot_discount=0.7,
        expected_train_hours=2.5,
        mtbe_hours=6.0,
        checkpoint_every_hours=0.5,
        restart_overhead_hours=0.0,
        low_priority_computes=frozenset({"gpu-spot", "big-spot"}),
    )
    assert CostSettings.from_environ({"RETRAIN_GPU_HOUR_PRICE": "", "RETRAIN_MTBE_HOURS": " "}) == (
        CostSettings()
    )


def test_the_defaults_come_from_the_compute_and_pipeline_yamls(tmp_path):
    defaults = CostSettings()
    assert (defaults.gpu_hour_price, defaults.spot_discount, defaults.mtbe_hours) == (None, 0.6, 12.0)
    assert (defaults.default_train_compute, defaults.low_priority_computes) == ("gpu-spot", {"gpu-spot"})

    spot = tmp_path / "my-spot.yml"
    spot.write_text("name: my-spot\ntype: amlcompute\ntier: low_priority\n")
    dedicated = tmp_path / "my-dedicated.yml"
    dedicated.write_text("name: my-dedicated\ntype: amlcompute\ntier: dedicated\n")
    read = compute_defaults(PIPELINE_FILE, (spot, dedicated))
    assert (read.train_compute, read.low_priority_computes) == ("gpu-spot", {"my-spot"})


def test_an_unknown_train_compute_is_priced_as_dedicated_unless_named_low_priority():
    request = make_request(compute={"train": "team-gpus"})
    assert not estimate_run_cost(request, SETTINGS).low_priority
    named = CostSettings(expected_train_hours=10.0, low_priority_computes=frozenset({"team-gpus"}))
    assert estimate_run_cost(request, named).low_priority


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RETRAIN_GPU_HOUR_PRICE": "-3"}, "RETRAIN_GPU_HOUR_PRICE '-3': expected a number such as 3.67"),
        ({"RETRAIN_GPU_HOUR_PRICE": "0"}, "RETRAIN_GPU_HOUR_PRICE '0.0': expected a price per GPU-hour > 0"),
        ({"RETRAIN_SPOT_DISCOUNT": "60%"}, "RETRAIN_SPOT_DISCOUNT '60%': expected a number such as 0.6"),
        ({"RETRAIN_SPOT_DISCOUNT": "1"}, "RETRAIN_SPOT_DISCOUNT '1.0': expected a fraction in [0, 1)"),
        (
            {"RETRAIN_EXPECTED_TRAIN_HOURS": "0"},
            "RETRAIN_EXPECTED_TRAIN_HOURS '0.0': expected a number of hours > 0",
        ),
        ({"RETRAIN_MTBE_HOURS": "nan"}, "RETRAIN_MTBE_HOURS 'nan': expected a number such as 12.0"),
        (
            {"RETRAIN_CHECKPOINT_EVERY_HOURS": "1e9"},
            "RETRAIN_CHECKPOINT_EVERY_HOURS '1e9': expected a number",
        ),
        (
            {"RETRAIN_RESTART_OVERHEAD_HOURS": "-0.1"},
            "RETRAIN_RESTART_OVERHEAD_HOURS '-0.1': expected a number",
        ),
        ({"RETRAIN_LOW_PRIORITY_COMPUTES": "gpu_spot"}, "RETRAIN_LOW_PRIORITY_COMPUTES 'gpu_spot': expected"),
    ],
)
def test_a_bad_setting_is_a_one_line_error_naming_the_variable(environ, message):
    with pytest.raises(CostSettingsError) as raised:
        CostSettings.from_environ(environ)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)
    assert isinstance(raised.value, PipelineError)  # the root CLI prints it alone and exits 2


def test_settings_built_directly_are_validated_too():
    with pytest.raises(CostSettingsError, match="RETRAIN_SPOT_DISCOUNT 'True': expected a fraction"):
        CostSettings(spot_discount=True)
    with pytest.raises(CostSettingsError, match="RETRAIN_LOW_PRIORITY_COMPUTES 'gpu-spot': expected a set"):
        CostSettings(low_priority_computes="gpu-spot")


def _handler_args(register, *argv: str, state_root, environ) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="retrain")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.state_root, args.environ = state_root, environ
    return args


@pytest.mark.parametrize("command", ["run", "submit"])
def test_a_bad_cost_setting_stops_run_and_submit_before_anything_is_pinned(command, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.csv").write_text("id,x,label\n1,0.5,a\n")
    if command == "run":
        argv, register = ("run", "--data", str(raw), "--task", "tabular"), local_cli.register_commands
    else:
        argv = ("submit", "--dry-run", "--data", f"azureml:digits-raw:{VERSION}", "--model-name", "digits")
        argv += ("--task", "tabular")
        register = azureml_cli.register_commands
    args = _handler_args(register, *argv, state_root=tmp_path / "state", environ={"RETRAIN_MTBE_HOURS": "x"})

    with pytest.raises(CostSettingsError, match="RETRAIN_MTBE_HOURS 'x'"):
        args.handler(args, out=io.StringIO())
    assert not (tmp_path / "state").exists()
