"""A table as people have them, generated: 3 numeric columns, 2 categorical ones (`colour` of 5 values,
`city` of 50), 1 boolean (`member`), a share of every feature's cells blank, and a label that is a class
name (`tier`: bronze, silver or gold) or, for a regression, a number (`spend`).

Both targets come from one additive score: each numeric column's effect, each category's own effect (a
city's is drawn once, from the seed of the city list, so every batch shares it) and the boolean's, plus
noise. A missing cell is missing at random and contributes nothing. `city_shares` skews which cities rows
come from, for a drift check; `cities` may name cities the training data never had.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

COLOURS = ("red", "green", "blue", "black", "white")
CITIES = tuple(f"city-{number:02d}" for number in range(50))
TIERS = ("bronze", "silver", "gold")
NUMERIC = ("age", "income", "visits")
FEATURES = (*NUMERIC, "colour", "city", "member")
MISSING_SHARE = 0.05


def effects() -> dict[str, float]:
    """Each category's effect on the score: fixed, so every batch and every test shares them."""
    generator = np.random.default_rng(1234)
    table = dict(zip(COLOURS, generator.normal(0.0, 0.8, len(COLOURS)), strict=True))
    table.update(zip(CITIES, generator.normal(0.0, 1.0, len(CITIES)), strict=True))
    return table


def mixed_table(
    rows: int,
    seed: int,
    *,
    first_id: int = 0,
    cities: Sequence[str] = CITIES,
    city_shares: Sequence[float] | None = None,
) -> pd.DataFrame:
    """`rows` rows with ids from `first_id`: the features, the class `tier` and the number `spend`."""
    generator = np.random.default_rng(seed)
    effect = effects()
    age = generator.normal(40.0, 12.0, rows).round()
    income = generator.lognormal(3.5, 0.4, rows).round(2)
    visits = generator.poisson(4.0, rows).astype(float)
    colour = generator.choice(COLOURS, rows)
    city = generator.choice(list(cities), rows, p=city_shares)
    member = generator.random(rows) < 0.4
    frame = pd.DataFrame(
        {"id": [f"r{first_id + index}" for index in range(rows)], "age": age, "income": income,
         "visits": visits, "colour": colour, "city": city, "member": member}
    )  # fmt: skip
    for name in FEATURES:  # blanks, missing at random
        frame[name] = frame[name].astype(object).where(generator.random(rows) >= MISSING_SHARE, None)
    score = (
        0.06 * (frame["age"].astype(float).fillna(40.0) - 40.0)
        + 0.04 * (frame["income"].astype(float).fillna(35.0) - 35.0)
        + 0.3 * (frame["visits"].astype(float).fillna(4.0) - 4.0)
        + frame["colour"].map(effect).astype(float).fillna(0.0)
        + frame["city"].map(effect).astype(float).fillna(0.0)
        + 0.8 * frame["member"].astype(float).fillna(0.4)
        + generator.normal(0.0, 0.5, rows)
    )
    frame["tier"] = np.array(TIERS, dtype=object)[np.digitize(score, [-0.6, 0.6])]
    frame["spend"] = (100.0 + 20.0 * score).round(2)
    return frame


def write_batches(folder: Path, frames: Sequence[pd.DataFrame], label: str) -> Path:
    """Each frame as `batch-NNNN.csv` with the label column `label` (the other target left out)."""
    folder.mkdir(parents=True, exist_ok=True)
    other = "spend" if label == "tier" else "tier"
    for number, frame in enumerate(frames, start=1):
        frame.drop(columns=[other]).to_csv(folder / f"batch-{number:04d}.csv", index=False)
    return folder
