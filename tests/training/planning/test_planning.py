"""The planning maths against hand-computed cases, and `retrain plan` end to end through the root CLI."""

from __future__ import annotations

import json
import struct

import pytest

from core.errors import InputError
from training.cli import main
from training.planning.maths import (
    IntervalInputs,
    ScalingInputs,
    SpotScenario,
    checkpoint_interval,
    parse_gpu_counts,
    scaling_plan,
    spot_estimate,
)

# -- spot vs dedicated ----------------------------------------------------------------------------------


def test_spot_with_checkpoints_and_restart_overhead():
    # 3 evictions x (1 h interval / 2 lost + 0.25 h restart) = 2.25 h extra; 0.4 x 98 / 80 = 0.49.
    estimate = spot_estimate(SpotScenario(8, 10, 3, 0.6, checkpoint_every=1, restart_overhead=0.25))
    assert estimate.wall_hours == pytest.approx(12.25)
    assert estimate.lost_hours == pytest.approx(1.5)
    assert estimate.gpu_hours == pytest.approx(98)
    assert estimate.dedicated_gpu_hours == pytest.approx(80)
    assert estimate.cost_vs_dedicated == pytest.approx(0.49)
    assert estimate.verdict == "spot pays: 51% cheaper than dedicated"


def test_spot_without_checkpoints_loses_half_the_run_per_eviction():
    estimate = spot_estimate(SpotScenario(8, 10, 3, 0.6))
    assert estimate.wall_hours == pytest.approx(25)  # 10 + 3 x 5
    assert estimate.lost_hours == pytest.approx(15)
    assert estimate.cost_vs_dedicated == pytest.approx(1.0)  # 0.4 x 200 / 80
    assert estimate.verdict == "break-even: spot costs the same as dedicated"


def test_dedicated_pays_when_evictions_outweigh_the_discount():
    estimate = spot_estimate(SpotScenario(1, 10, 4, 0.2))
    assert estimate.cost_vs_dedicated == pytest.approx(2.4)  # 0.8 x 30 / 10
    assert estimate.verdict == "dedicated pays: spot costs 140% more"


def test_zero_evictions_cost_only_the_discounted_price():
    estimate = spot_estimate(SpotScenario(4, 5, 0, 0.7, restart_overhead=1))
    assert (estimate.wall_hours, estimate.lost_hours) == (5, 0)
    assert estimate.cost_vs_dedicated == pytest.approx(0.3)


def test_discount_zero_and_no_evictions_is_break_even():
    assert spot_estimate(SpotScenario(2, 5, 0, 0)).verdict.startswith("break-even")


def test_checkpoint_interval_longer_than_the_run_is_the_same_as_none():
    assert spot_estimate(SpotScenario(8, 10, 3, 0.6, checkpoint_every=50)) == spot_estimate(
        SpotScenario(8, 10, 3, 0.6)
    )


@pytest.mark.parametrize(
    ("fields", "flag"),
    [
        ({"gpus": 0}, "--gpus"),
        ({"gpus": 1.5}, "--gpus"),
        ({"hours": 0}, "--hours"),
        ({"evictions": -1}, "--evictions"),
        ({"discount": 1}, "--discount"),
        ({"discount": -0.1}, "--discount"),
        ({"checkpoint_every": 0}, "--checkpoint-every"),
        ({"restart_overhead": -1}, "--restart-overhead"),
    ],
)
def test_spot_scenario_refuses_bad_values(fields, flag):
    values = {"gpus": 1, "hours": 1, "evictions": 0, "discount": 0.5, **fields}
    with pytest.raises(InputError, match=rf"^{flag} "):
        SpotScenario(**values)


# -- checkpoint interval --------------------------------------------------------------------------------


def test_young_and_daly_on_a_hand_computed_case():
    # C = 50 s, M = 3600 s: Young sqrt(2 x 50 x 3600) = 600; C/2M = 1/144, so Daly = 600 x 1333/1296 - 50.
    advice = checkpoint_interval(IntervalInputs(50, 1))
    daly = 600 * 1333 / 1296 - 50
    assert advice.young_seconds == pytest.approx(600)
    assert advice.daly_seconds == pytest.approx(daly)
    assert advice.overhead_fraction == pytest.approx(50 / daly + daly / 7200)
    assert advice.lost_seconds_per_eviction == pytest.approx(daly / 2)


def test_daly_falls_back_to_the_mtbe_when_a_save_costs_twice_the_mtbe():
    advice = checkpoint_interval(IntervalInputs(7200, 1))
    assert advice.daly_seconds == 3600
    assert advice.overhead_fraction == pytest.approx(2.5)  # 7200/3600 + 3600/7200


@pytest.mark.parametrize(("values", "flag"), [((0, 1), "--checkpoint-seconds"), ((1, -2), "--mtbe-hours")])
def test_interval_inputs_refuse_non_positive_values(values, flag):
    with pytest.raises(InputError, match=rf"^{flag} "):
        IntervalInputs(*values)


# -- scaling --------------------------------------------------------------------------------------------

GPUS = (1, 8, 16, 32, 64)


def test_scaling_rows_follow_the_model():
    plan = scaling_plan(ScalingInputs(100, 0.5, GPUS))
    eight = plan.rows[1]
    assert eight.wall_hours == pytest.approx(14)  # 100/8 + 0.5 x 3
    assert eight.speedup == pytest.approx(100 / 14)
    assert eight.efficiency == pytest.approx(100 / 14 / 8)
    assert eight.gpu_hours == pytest.approx(112)
    assert [row.gpus for row in plan.rows] == list(GPUS)
    assert plan.recommended_gpus == 8  # 16 GPUs reach only 100/8.25/16 = 0.758


def test_a_lower_threshold_recommends_more_gpus():
    assert scaling_plan(ScalingInputs(100, 0.5, GPUS, efficiency_threshold=0.7)).recommended_gpus == 16


@pytest.mark.parametrize(("value_per_hour", "expected"), [(10, 16), (1, 8)])
def test_money_decides_between_efficient_counts(value_per_hour, expected):
    # 8 -> 16: 20 extra GPU-hours x 2 = 40 against 5.75 h saved; 16 -> 32: 96 against 2.625 h saved.
    inputs = ScalingInputs(100, 0.5, GPUS, 0.5, gpu_hour_price=2, value_per_hour_saved=value_per_hour)
    plan = scaling_plan(inputs)
    assert plan.recommended_gpus == expected
    assert "value of the hours saved" in plan.reason


def test_one_gpu_is_recommended_when_it_is_the_only_one():
    plan = scaling_plan(ScalingInputs(10, 1, (1,)))
    assert (plan.recommended_gpus, plan.rows[0].efficiency) == (1, 1)


def test_the_smallest_count_when_none_is_efficient_enough():
    plan = scaling_plan(ScalingInputs(100, 5, (32, 64)))
    assert plan.recommended_gpus == 32
    assert "no GPU count" in plan.reason


def test_price_without_value_is_refused():
    with pytest.raises(InputError, match="given together"):
        ScalingInputs(100, 0.5, GPUS, gpu_hour_price=2)


@pytest.mark.parametrize("text", ["", "0,1", "8,1", "1,1", "1,a", "1,,2", "-1", "1.5"])
def test_gpu_counts_are_parsed_strictly(text):
    with pytest.raises(InputError, match=r"^--gpus "):
        parse_gpu_counts(text)


def test_gpu_counts_allow_spaces():
    assert parse_gpu_counts("1, 8,16") == (1, 8, 16)


# -- the command line -----------------------------------------------------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


SPOT = ("spot", "--gpus", "8", "--hours", "10", "--evictions", "3", "--discount", "0.6")
SCALING = (
    "scaling",
    "--single-gpu-hours",
    "100",
    "--comm-hours-per-doubling",
    "0.5",
    "--gpus",
    "1,8,16,32,64",
)


def test_cli_spot_json(capsys):
    code, out, _ = run(capsys, *SPOT, "--checkpoint-every", "1", "--restart-overhead", "0.25", "--json")
    result = json.loads(out)
    assert code == 0
    assert set(result) == {
        "wall_hours", "gpu_hours", "dedicated_gpu_hours", "cost_vs_dedicated", "lost_hours", "verdict",
    }  # fmt: skip
    assert result["cost_vs_dedicated"] == pytest.approx(0.49)


def test_cli_spot_table(capsys):
    code, out, _ = run(capsys, *SPOT)
    assert code == 0
    assert "verdict              break-even" in out


def test_cli_interval_json_and_table(capsys):
    code, out, _ = run(capsys, "interval", "--checkpoint-seconds", "50", "--mtbe-hours", "1", "--json")
    result = json.loads(out)
    assert code == 0
    assert set(result) == {"young_seconds", "daly_seconds", "overhead_fraction", "lost_seconds_per_eviction"}
    assert result["young_seconds"] == pytest.approx(600)
    code, out, _ = run(capsys, "interval", "--checkpoint-seconds", "50", "--mtbe-hours", "1")
    assert "Young interval     600 s (10.0 min)" in out


def test_cli_scaling_json_and_table(capsys):
    code, out, _ = run(capsys, *SCALING, "--json")
    result = json.loads(out)
    assert code == 0
    assert set(result) == {"rows", "recommended_gpus", "reason"}
    assert set(result["rows"][0]) == {"gpus", "wall_hours", "speedup", "efficiency", "gpu_hours"}
    assert result["recommended_gpus"] == 8
    code, out, _ = run(capsys, *SCALING)
    assert out.splitlines()[0].split() == ["GPUS", "WALL_HOURS", "SPEEDUP", "EFFICIENCY", "GPU_HOURS"]
    assert out.splitlines()[-1].startswith("recommended: 8 GPUs")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (("spot", "--gpus", "8", "--hours", "-1", "--evictions", "3", "--discount", "0.6"), "--hours"),
        (("spot", "--gpus", "8", "--hours", "ten", "--evictions", "3", "--discount", "0.6"), "--hours"),
        (("spot", "--gpus", "8", "--hours", "10", "--evictions", "3", "--discount", "1"), "--discount"),
        (("spot", "--gpus", "8", "--hours", "10", "--evictions", "3", "--discount", "1.5"), "--discount"),
        (("spot", "--gpus", "0", "--hours", "10", "--evictions", "3", "--discount", "0.6"), "--gpus"),
        (("spot", "--gpus", "two", "--hours", "10", "--evictions", "3", "--discount", "0.6"), "--gpus"),
        (("interval", "--checkpoint-seconds", "nan", "--mtbe-hours", "1"), "--checkpoint-seconds"),
        ((*SCALING[:-1], "1,8,x"), "--gpus"),
        ((*SCALING[:-1], "16,8"), "--gpus"),
        ((*SCALING, "--efficiency-threshold", "0"), "--efficiency-threshold"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(capsys, argv, flag):
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith(f"retrain: error: {flag} ")


def test_the_scaling_plot_is_a_png_of_the_expected_size(tmp_path):
    plot = tmp_path / "plots" / "scaling.png"
    arguments = ["--single-gpu-hours", "100", "--comm-hours-per-doubling", "0.5", "--gpus", "1,8,16,32,64"]
    assert main(["plan", "scaling", *arguments, "--plot", str(plot)]) == 0
    data = plot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (800, 450)
    assert len(data) > 10_000  # lines, axes and labels, not an empty canvas


def test_a_plot_that_is_not_a_png_is_refused_in_one_line(tmp_path, capsys):
    arguments = ["--single-gpu-hours", "100", "--comm-hours-per-doubling", "0.5", "--gpus", "1,8"]
    assert main(["plan", "scaling", *arguments, "--plot", str(tmp_path / "scaling.svg")]) == 2
    assert capsys.readouterr().err.strip().endswith("expected a file name ending in .png")
