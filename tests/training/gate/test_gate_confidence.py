"""The gate's confidence end to end, through the evaluate and register steps on real trainings of the tabular
task: a margin held with 95% confidence on a paired bootstrap of the test split (188 rows, where one row
moves macro-F1 by more than the margin of 0.002).

v1 is an undertrained model (the first model: the confidence does not apply). A well-trained one is clearly
better and is promoted (v2), its interval in the reason. The same recipe with another seed beats v2 on the
whole split by more than the margin, by chance: the margin alone would promote it; the interval refuses it.
The same evaluation decides the same way, an evaluation against a champion that has since moved is decided
on the same resamples as a fresh one, and a register step asked for a confidence refuses an evaluation
without a bootstrap in one line.

Evidence too thin certifies nothing: an evaluation with fewer resamples than the register step's confidence
needs, and a user's task whose test split has fewer than 30 rows, are rejections that say why, and the
registry does not change.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers.training.registry_harness import RESEEDED, Harness, evaluation_document
from helpers.training.regression_task import write_sample

from training.cli import main
from training.gate import lineage as tags
from training.gate.evaluate import champion_from_document, load_trained_model
from training.gate.options import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from training.gate.policy import Scored, decide, policy_of

MODEL = "digits-confident"
CONFIDENT = ("--confidence", "0.95")
TWIN = next(iter(RESEEDED))  # "strong" trained with another seed


class Story:
    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.evaluations: dict[str, Path] = {}
        self.records: dict[str, dict] = {}

    def evaluate(self, key: str, model: str, *extra: str) -> dict:
        self.evaluations[key] = self.harness.evaluate(model, MODEL, *extra)
        return evaluation_document(self.evaluations[key])

    def register(self, key: str, model: str, evaluation: str, *extra: str) -> dict:
        self.records[key] = self.harness.register(model, self.evaluations[evaluation], MODEL, *extra)
        return self.records[key]


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """The steps run in this process, scoring in one thread: a bootstrap is 2000 small scorings, and on a
    machine whose cores other processes share, torch's intra-op threads wait on each other for most of
    each one (twenty times the work, measured on two busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def story(
    one_thread: None, prepared_data: Path, tmp_path_factory: pytest.TempPathFactory, trained_models: Path
) -> Story:
    harness = Harness(tmp_path_factory.mktemp("gate-confidence"), prepared_data, trained_models)
    for name in ("weak", "strong", TWIN):
        harness.train(name, tracked=False)
    story = Story(harness)
    story.evaluate("weak", "weak", *CONFIDENT)
    undertrained = ("--floors", "none", "--first-model-floors", "none")  # it scores below both's defaults
    story.register("weak", "weak", "weak", *CONFIDENT, *undertrained)  # v1
    story.evaluate("twin against v1", TWIN, *CONFIDENT)  # registered after v2 took over: stale
    story.evaluate("strong", "strong", *CONFIDENT)
    story.register("strong", "strong", "strong", *CONFIDENT)  # v2
    story.evaluate("twin", TWIN, *CONFIDENT)
    story.register("twin", TWIN, "twin", *CONFIDENT)
    story.register("twin again", TWIN, "twin", *CONFIDENT)
    story.register("twin, stale evaluation", TWIN, "twin against v1", *CONFIDENT)
    story.evaluate("twin, seed 1", TWIN, *CONFIDENT, "--bootstrap-seed", "1")
    story.register("twin, seed 1", TWIN, "twin, seed 1", *CONFIDENT)
    # Enough resamples for a 90% bound (9), too few for the register step's 95% (19).
    story.evaluate("twin, 9 resamples", TWIN, "--confidence", "0.9", "--bootstrap-resamples", "9")
    story.register("twin, 9 resamples", TWIN, "twin, 9 resamples", *CONFIDENT)
    return story


def test_a_first_model_is_held_to_the_first_model_floors_not_to_the_confidence(story: Story):
    first = story.records["weak"]
    assert first["decision"]["accepted"] and first["registered_version"] == "1"
    assert first["decision"]["reasons"] == ["no champion yet; first-model floors met"]
    assert "interval" not in first["decision"]
    # No champion to pair with: what would be resampled is recorded, no resample is scored.
    assert evaluation_document(story.evaluations["weak"])["bootstrap"] == {
        "metric": "macro_f1",
        "resamples": BOOTSTRAP_RESAMPLES,
        "seed": BOOTSTRAP_SEED,
        "candidate": None,
        "champion": None,
    }


def test_a_clearly_better_candidate_is_promoted_stating_its_interval(story: Story):
    record = story.records["strong"]
    decision = record["decision"]
    assert decision["accepted"] and record["registered_version"] == "2"
    interval = decision["interval"]
    assert (interval["metric"], interval["confidence"]) == ("macro_f1", 0.95)
    assert (interval["resamples"], interval["seed"]) == (BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED)
    assert interval["lower_bound"] > 0.1 and interval["improvement"] > interval["lower_bound"]
    assert decision["reasons"] == [
        f"macro_f1 {decision['candidate_value']:.4f} beats champion v1's {decision['champion_value']:.4f} on "
        f"{record['evaluated_on']['data_version']}: improvement {interval['improvement']:+.4f}, 95% interval "
        f"lower bound {interval['lower_bound']:+.4f} > min_improvement 0.002 (1000 paired resamples, seed 0)"
    ]
    assert decision["policy"]["confidence"] == "0.95"
    # The registered version carries the interval in its lineage.
    version = story.harness.registry.version(MODEL, "2")
    assert json.loads(version.tags[tags.GATE_INTERVAL]) == interval
    assert tags.describe_tags(version.tags)["gate"]["interval"] == interval


def test_the_same_recipe_with_another_seed_is_refused_naming_the_interval(story: Story):
    record = story.records["twin"]
    decision = record["decision"]
    assert not decision["accepted"] and record["registered_version"] is None
    interval = decision["interval"]
    assert interval["improvement"] > 0.002 >= interval["lower_bound"]
    assert decision["reasons"] == [
        f"macro_f1 improvement {interval['improvement']:+.4f} over champion v2, 95% interval lower bound "
        f"{interval['lower_bound']:+.4f} <= min_improvement 0.002 (1000 paired resamples, seed 0)"
    ]
    assert story.harness.registry.alias_holder(MODEL, "champion").version == "2"


def test_the_margin_alone_would_have_promoted_it(story: Story):
    evaluation = evaluation_document(story.evaluations["twin"])
    task = load_trained_model(story.harness.models[TWIN]).task
    candidate = Scored(evaluation["candidate"]["metrics"], evaluation["data_version"], "t" * 64)
    champion = champion_from_document(evaluation["champion"], evaluation["data_version"])
    assert decide(candidate, champion, policy_of(task), task.metrics).accepted


def test_the_same_evaluation_and_seed_decide_the_same_way(story: Story):
    once, again = story.records["twin"]["decision"], story.records["twin again"]["decision"]
    assert again == once
    other_seed = story.records["twin, seed 1"]["decision"]
    assert not other_seed["accepted"] and other_seed["interval"]["seed"] == 1
    assert other_seed["interval"]["lower_bound"] != once["interval"]["lower_bound"]  # the seed matters
    assert "(1000 paired resamples, seed 1)" in other_seed["reasons"][0]
    seed_0 = evaluation_document(story.evaluations["twin"])["bootstrap"]
    seed_1 = evaluation_document(story.evaluations["twin, seed 1"])["bootstrap"]
    assert seed_0["champion"] != seed_1["champion"] and seed_1["seed"] == 1


def test_a_champion_that_moved_is_scored_on_the_evaluation_s_resamples(story: Story):
    stale = story.records["twin, stale evaluation"]
    assert stale["champion_compared"]["version"] == "2"
    assert stale["champion_compared"]["scores_from"] == "re-read under the lock"
    # The evaluation paired the twin with v1; the register step scored v2 on the same resamples, so the
    # decision is the one a fresh evaluation against v2 gives.
    assert evaluation_document(story.evaluations["twin against v1"])["champion"]["version"] == "1"
    assert stale["decision"] == story.records["twin"]["decision"]


def test_without_a_bootstrap_a_confident_register_step_refuses_in_one_line(story: Story, capsys):
    plain = story.harness.evaluate(TWIN, MODEL)
    assert "bootstrap" not in evaluation_document(plain)  # without a confidence, as it always was
    out = story.harness.folder("registration")
    capsys.readouterr()
    argv = story.harness.register_argv(TWIN, plain, MODEL, out, *CONFIDENT)
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith(
        "evaluation.json: no paired bootstrap, which --confidence 0.95 needs; evaluate with --confidence "
        "(and the same --primary-metric) first"
    )
    assert "\n" not in error


def test_an_evaluation_with_too_few_resamples_for_the_confidence_certifies_nothing(story: Story):
    assert evaluation_document(story.evaluations["twin, 9 resamples"])["bootstrap"]["resamples"] == 9
    record = story.records["twin, 9 resamples"]
    decision = record["decision"]
    assert not decision["accepted"] and record["registered_version"] is None
    assert "interval" not in decision  # no bound was read from them
    assert decision["reasons"] == [
        "macro_f1: the margin 0.002 over champion v2 is not certified: --confidence 0.95 with "
        "--bootstrap-resamples 9: a 95% lower bound is the 5% quantile of the resamples, which needs at "
        "least 19 of them; raise --bootstrap-resamples to 19 or more, or lower --confidence"
    ]
    assert story.harness.registry.alias_holder(MODEL, "champion").version == "2"


# -- a test split too small to certify from ---------------------------------------------------------------

REGRESSION = Path(__file__).parents[2] / "helpers" / "training" / "regression_task.py"
SMALL_MODEL = "small-houses"
# A user's regression task on 200 rows: its test split (a tenth, by hash) has about 20.
REGRESSION_TRAIN = [
    *("--learning-rate", "0.05", "--warmup-steps", "0", "--global-batch-size", "32", "--seed", "3"),
    *("--progress", "none", "--no-mlflow", "--checkpoint-every-steps", "off"),
]


@pytest.fixture(scope="module")
def small_split(tmp_path_factory: pytest.TempPathFactory) -> Story:
    root = tmp_path_factory.mktemp("small-split")
    task = f"{REGRESSION}:RegressionTask"
    raw, data = root / "raw", root / "prepared"
    write_sample(raw, rows=200, seed=0)
    assert main(["prepare", "--task", task, "--raw", str(raw), "--out", str(data)]) == 0
    harness = Harness(root, data)
    for name, epochs in (("first", "2"), ("better", "20")):
        out = root / "models" / name
        locations = ("--data", str(data), "--out", str(out), "--checkpoints", str(root / "ck" / name))
        assert main(["train", "--task", task, *locations, "--epochs", epochs, *REGRESSION_TRAIN]) == 0
        harness.models[name] = out
    story = Story(harness)
    for name in ("first", "better"):
        evaluation = harness.evaluate(name, SMALL_MODEL, *CONFIDENT)
        story.evaluations[name] = evaluation
        story.records[name] = harness.register(name, evaluation, SMALL_MODEL, *CONFIDENT)
    return story


def test_a_test_split_of_fewer_than_30_rows_certifies_nothing(small_split: Story):
    first, better = small_split.records["first"], small_split.records["better"]
    assert first["registered_version"] == "1"  # a first model: the first-model floors, no confidence
    rows = better["evaluated_on"]["rows"]
    assert 0 < rows < 30
    # Far better on the whole split (mse a fraction of v1's), but 'rows' rows are no basis for a 95% bound.
    assert better["metrics"]["mse"] < first["metrics"]["mse"] / 2
    decision = better["decision"]
    assert not decision["accepted"] and better["registered_version"] is None and "interval" not in decision
    assert decision["reasons"] == [
        f"mse: the margin 0.002 over champion v1 is not certified: the test split has {rows} rows, fewer "
        "than the 30 a paired bootstrap needs; evaluate on a larger test split, or gate without --confidence"
    ]
    registry = small_split.harness.registry
    assert registry.alias_holder(SMALL_MODEL, "champion").version == "1"
    assert [version.version for version in registry.versions(SMALL_MODEL)] == ["1"]


def test_the_evaluation_says_so_when_it_resamples(small_split: Story, caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="training.gate.evaluate"):
        small_split.harness.evaluate("better", SMALL_MODEL, *CONFIDENT)
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert [message.split(": the test split has")[0] for message in warned] == [
        "paired bootstrap of mse against champion v1 certifies nothing at confidence 0.95"
    ]
