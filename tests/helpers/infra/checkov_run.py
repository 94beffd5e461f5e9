"""Runs checkov's Bicep policies over folders of .bicep files, in checkov's own virtual environment.

checkov pins dozens of packages exactly, so the Makefile installs it in `.venv-checkov` (from
requirements-checkov.txt) and it runs here as a subprocess. It reads Bicep with its own pinned pycep-parser
and skips a file it cannot parse with no more than a count in its summary, so `parsing_errors` is part of
the result. Suppressions are inline only (`// checkov:skip=CKV_AZURE_xx: reason` beside the resource).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
CHECKOV_VENV = REPO_ROOT / ".venv-checkov"
CHECKOV = CHECKOV_VENV / "bin" / "checkov"
CHECKOV_TIMEOUT_S = 240

# The names checkov reads a configuration from (the working directory, the scanned folder, home), where a
# `skip-check:` would suppress a policy for every resource at once, out of sight of the resource.
CONFIG_FILE_NAMES = (".checkov.yaml", ".checkov.yml")
SKIP_COMMENT = re.compile(r"checkov:skip=([A-Za-z0-9_]+)(?::(.*))?")


@dataclass(frozen=True)
class CheckResult:
    check_id: str
    check_name: str
    file: str  # relative to the scanned root, e.g. "infra/modules/storage.bicep"
    resource: str
    lines: tuple[int, int]
    suppress_comment: str | None

    def __str__(self) -> str:
        return f"{self.file}:{self.lines[0]}: {self.resource}: {self.check_id} {self.check_name}"


@dataclass(frozen=True)
class CheckovReport:
    root: Path
    passed: tuple[CheckResult, ...]
    failed: tuple[CheckResult, ...]
    skipped: tuple[CheckResult, ...]
    parsing_errors: tuple[str, ...]  # relative to root
    resource_count: int


def run_checkov(folders: dict[str, Path], workdir: Path) -> CheckovReport:
    """Copies each folder to workdir/<name> and runs checkov once over workdir (one process, one report)."""
    if not CHECKOV.is_file():
        raise RuntimeError(f"{CHECKOV} is missing: run `make test` (it creates .venv-checkov)")
    for name, folder in folders.items():
        shutil.copytree(folder, workdir / name, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    # --skip-download: no policy or guideline downloads (there is no API key and no network in CI)
    completed = subprocess.run(
        [str(CHECKOV), "-d", ".", "--framework", "bicep", "-o", "json", "--skip-download"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHECKOV_TIMEOUT_S,
        check=False,
    )
    # exit 1 means "some check failed", which the tests sort out per file; anything else is a crash
    if completed.returncode not in (0, 1) or not completed.stdout.strip():
        raise RuntimeError(f"checkov exited {completed.returncode}:\n{completed.stderr[-4000:]}")
    return _report(json.loads(completed.stdout), workdir)


def _report(document: dict | list, root: Path) -> CheckovReport:
    reports = document if isinstance(document, list) else [document]
    bicep = [r for r in reports if r.get("check_type") == "bicep"]
    if not bicep:  # checkov prints a bare summary when it found nothing to scan
        return CheckovReport(root, (), (), (), (), 0)
    (report,) = bicep
    results = report["results"]
    return CheckovReport(
        root=root,
        passed=tuple(_result(c) for c in results["passed_checks"]),
        failed=tuple(_result(c) for c in results["failed_checks"]),
        skipped=tuple(_result(c) for c in results["skipped_checks"]),
        parsing_errors=tuple(_relative(p, root) for p in results["parsing_errors"]),
        resource_count=report["summary"]["resource_count"],
    )


def _relative(path: str, root: Path) -> str:
    full = Path(path) if Path(path).is_absolute() else root / path
    return full.resolve().relative_to(root.resolve()).as_posix()


def _result(check: dict) -> CheckResult:
    comment = check["check_result"].get("suppress_comment")
    return CheckResult(
        check_id=check["check_id"],
        check_name=check["check_name"],
        file=check["file_path"].lstrip("/"),
        resource=check["resource"],
        lines=tuple(check["file_line_range"]),
        suppress_comment=comment.strip() if comment else None,
    )


def skips_without_reason(path: Path) -> list[str]:
    """Each `checkov:skip=` comment in a file that gives no reason after the check ID, as file:line."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for match in SKIP_COMMENT.finditer(line):
            if not (match.group(2) or "").strip():
                found.append(f"{path}:{number}: checkov:skip={match.group(1)} gives no reason")
    return found


def checkov_parse_error(path: Path) -> str:
    """Where checkov's own pycep-parser stops in a file it could not read (checkov itself does not say)."""
    probe = (
        "import sys\nfrom pathlib import Path\nfrom pycep import BicepParser\n"
        "try:\n    BicepParser().parse(file_path=Path(sys.argv[1]))\n"
        "except Exception as exc:\n"
        '    print(f\'line {getattr(exc, "line", "?")}, column {getattr(exc, "column", "?")}\')\n'
    )
    python = CHECKOV_VENV / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", probe, str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    return out.stdout.strip() or out.stderr.strip()[-500:]
