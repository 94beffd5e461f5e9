"""checkov's Azure policies pass on infra/; a policy that does not fit is skipped inline, with a reason.

checkov runs once for the whole module (it takes seconds to start), over a copy of infra/ beside the
planted fixtures of fixtures/checkov/, and each test reads its part of the one report.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.infra.checkov_run import (
    CONFIG_FILE_NAMES,
    SKIP_COMMENT,
    CheckovReport,
    checkov_parse_error,
    run_checkov,
    skips_without_reason,
)
from helpers.infra.infra_paths import FIXTURES, INFRA, REPO_ROOT, infra_bicep_files


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckovReport]:
    workdir = tmp_path_factory.mktemp("checkov")
    yield run_checkov({"infra": INFRA, "planted": FIXTURES / "checkov"}, workdir)


def test_infra_passes_checkov(report: CheckovReport) -> None:
    failed = [str(r) for r in report.failed if r.file.startswith("infra/")]
    assert not failed, "checkov policies failed (fix, or skip inline with a reason):\n" + "\n".join(failed)
    assert any(r.file.startswith("infra/") for r in report.passed), "checkov evaluated nothing in infra/"


def test_checkov_read_every_infra_file(report: CheckovReport) -> None:
    # checkov skips a file its pycep-parser cannot read, and only counts it: that would pass unchecked
    unread = [p for p in report.parsing_errors if p.startswith("infra/")]
    where = [f"{p}: {checkov_parse_error(report.root / p)}" for p in unread]
    assert not where, "checkov's own pycep-parser cannot read (checkov would skip them):\n" + "\n".join(where)


def test_a_planted_weak_tls_fails(report: CheckovReport) -> None:
    failed = {(r.file, r.check_id) for r in report.failed}
    assert ("planted/weak_tls.bicep", "CKV_AZURE_44") in failed


def test_a_file_checkov_cannot_read_is_reported_with_its_line(report: CheckovReport) -> None:
    assert "planted/unparsable_by_checkov.bicep" in report.parsing_errors
    assert checkov_parse_error(report.root / "planted/unparsable_by_checkov.bicep").startswith("line 4,")


def test_an_inline_skip_with_its_reason_is_honoured(report: CheckovReport) -> None:
    skipped = {(r.file, r.check_id): r.suppress_comment for r in report.skipped}
    assert skipped[("planted/skipped_inline.bicep", "CKV_AZURE_44")].startswith("planted in a test fixture")
    assert not [
        r for r in report.failed if (r.file, r.check_id) == ("planted/skipped_inline.bicep", "CKV_AZURE_44")
    ]


def test_no_checkov_configuration_file_suppresses_checks() -> None:
    # checkov reads these from the working directory and the scanned folder: a skip there hides a policy
    # for every resource, away from the resource it excuses
    found = [p for name in CONFIG_FILE_NAMES for p in (REPO_ROOT / name, *INFRA.rglob(name)) if p.exists()]
    assert not found, f"move each skip inline beside its resource and delete: {found}"


@pytest.mark.parametrize("path", infra_bicep_files(), ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_inline_skip_in_infra_gives_a_reason(path: Path) -> None:
    assert skips_without_reason(path) == []


def test_a_skip_without_a_reason_is_found(tmp_path: Path) -> None:
    bare = tmp_path / "bare.bicep"
    bare.write_text(
        "resource a 'T@1' = {\n  // checkov:skip=CKV_AZURE_44\n  // checkov:skip=CKV_AZURE_3:  \n}\n"
    )
    assert skips_without_reason(bare) == [
        f"{bare}:2: checkov:skip=CKV_AZURE_44 gives no reason",
        f"{bare}:3: checkov:skip=CKV_AZURE_3 gives no reason",
    ]


def test_every_inline_skip_names_a_check_checkov_skips_there(report: CheckovReport) -> None:
    # a skip of a check checkov never runs on that resource (a Terraform-only or graph check, another
    # resource type's) excuses nothing and reads as if a policy had been weighed: each must be reported
    skipped = {(r.file, r.check_id, r.lines[0]) for r in report.skipped}
    stale = []
    for path in infra_bicep_files():
        relative = "infra/" + path.relative_to(INFRA).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for match in SKIP_COMMENT.finditer(line):
                starts = [
                    start for file, check, start in skipped if (file, check) == (relative, match.group(1))
                ]
                # the comment sits inside the resource checkov reports: the nearest resource opening above it
                if not any(start <= number for start in starts) or _nearest_start(path, number) not in starts:
                    stale.append(f"{relative}:{number}: checkov does not skip {match.group(1)} there")
    assert not stale, "remove these inline skips (checkov never runs the check there):\n" + "\n".join(stale)


def _nearest_start(path: Path, number: int) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()[:number]
    return max(i for i, line in enumerate(lines, start=1) if line.startswith("resource "))
