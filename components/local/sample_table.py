"""The sample table `retrain init NAME --task tabular` writes beside the model's configuration: customers of
a subscription service, and whether each churned.

    customer_id     the key: unique per row
    tenure_months   numeric, whole months
    monthly_charges numeric, with blanks
    support_calls   numeric, whole calls, with blanks
    plan            categorical: monthly, annual, two-year
    city            categorical: twelve cities, with blanks
    autopay         boolean: true or false, with blanks
    churned         the label, names: yes or no

`churned` is a noisy function of the others (a monthly plan, a short tenure, many support calls and no
autopay make a customer leave), so a model has something to learn and the gate something to weigh. Like the
custom task's `--sample` (components/local/templates/custom_task.py.tmpl) it is generated from a fixed seed,
the same rows on every machine, and written as a raw batch file, `batch-0001.csv`; with the standard library
only, as components/ never imports numpy or torch. The file appears whole and never replaces one.
"""

from __future__ import annotations

import csv
import io
import random
from pathlib import Path

from components.errors import ConfigError
from core.files import create_atomically

KEY_COLUMN = "customer_id"
LABEL_COLUMN = "churned"
COLUMNS = (
    KEY_COLUMN,
    "tenure_months",
    "monthly_charges",
    "support_calls",
    "plan",
    "city",
    "autopay",
    LABEL_COLUMN,
)
# What the tabular template's `column_types` says; the other features are all numbers.
COLUMN_TYPES = {"plan": "categorical", "city": "categorical", "autopay": "boolean"}
CLASSES = ("no", "yes")
PLANS = ("monthly", "annual", "two-year")
CITIES = (
    "Austin", "Boston", "Chicago", "Denver", "Houston", "Miami",
    "Phoenix", "Portland", "Seattle", "San Jose", "Tampa", "Tucson",
)  # fmt: skip
# A share of each column's cells left blank, as real exports have them (the key and the label never are).
BLANKS = {"monthly_charges": 0.04, "support_calls": 0.02, "city": 0.05, "autopay": 0.03}
SAMPLE_ROWS = 500
SAMPLE_SEED = 0
SAMPLE_FILE = "batch-0001.csv"

_PLAN_EFFECT = {"monthly": 1.6, "annual": -0.2, "two-year": -1.6}
_CITY_EFFECT = {"Houston": 0.6, "Miami": 0.4, "Seattle": -0.5}  # the others: 0
_THRESHOLD = -0.7  # about a third of the customers churn


def sample_rows(rows: int = SAMPLE_ROWS, seed: int = SAMPLE_SEED) -> list[dict[str, str]]:
    """The table's rows as CSV cells ("" for a blank); the same for the same `rows` and `seed`."""
    generator = random.Random(seed)  # noqa: S311 - sample data, not a secret: the same rows for a seed
    table = []
    for index in range(rows):
        plan = generator.choice(PLANS)
        tenure = generator.randint(1, 72)
        charges = round(generator.uniform(20.0, 110.0) * (1.1 if plan == "monthly" else 1.0), 2)
        calls = min(int(generator.expovariate(0.6)), 9)
        city = generator.choice(CITIES)
        autopay = generator.random() < (0.35 if plan == "monthly" else 0.7)
        score = (
            _PLAN_EFFECT[plan]
            - 0.05 * tenure
            + 0.5 * calls
            + 0.015 * (charges - 70.0)
            - 0.9 * autopay
            + _CITY_EFFECT.get(city, 0.0)
            + generator.gauss(0.0, 0.4)
        )
        row = {
            KEY_COLUMN: f"cust-{index + 1:05d}",
            "tenure_months": str(tenure),
            "monthly_charges": f"{charges:.2f}",
            "support_calls": str(calls),
            "plan": plan,
            "city": city,
            "autopay": "true" if autopay else "false",
            LABEL_COLUMN: CLASSES[int(score > _THRESHOLD)],
        }
        for column, share in BLANKS.items():
            if generator.random() < share:
                row[column] = ""
        table.append(row)
    return table


def sample_csv(rows: int = SAMPLE_ROWS, seed: int = SAMPLE_SEED) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(sample_rows(rows, seed))
    return buffer.getvalue().encode()


def write_sample_table(out: Path, rows: int = SAMPLE_ROWS, seed: int = SAMPLE_SEED) -> Path:
    """Write the sample table into the folder `out` (made if missing) as `batch-0001.csv`; ConfigError,
    and nothing written, if that file exists."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ConfigError(f"rows={rows!r}: expected a whole number >= 1")
    path = Path(out) / SAMPLE_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        created = create_atomically(path, sample_csv(rows, seed))
    except OSError as error:
        raise ConfigError(
            f"{path}: cannot be written ({error.strerror or error}); expected a writable folder"
        ) from None
    if not created:
        raise ConfigError(f"{path}: exists already; expected a new folder for the sample data")
    return path
