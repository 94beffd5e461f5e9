"""Paths shared by the infrastructure checks: the real templates in infra/ and this folder's fixtures."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
INFRA = REPO_ROOT / "infra"
FIXTURES = REPO_ROOT / "tests" / "infra" / "fixtures"
VALID_FIXTURES = sorted((FIXTURES / "valid").glob("*.bicep"))


def infra_bicep_files() -> list[Path]:
    """Every .bicep file under infra/, and infra/main.bicep always, so that a missing entry point fails."""
    return sorted(set(INFRA.rglob("*.bicep")) | {INFRA / "main.bicep"})


def ids(paths: list[Path]) -> list[str]:
    return [p.relative_to(REPO_ROOT).as_posix() for p in paths]
