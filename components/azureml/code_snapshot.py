"""The code snapshot a job or a publish uploads: the components' kept files, plus a user's task file if any.

Azure ML uploads each component's `code` folder, filtered by its `.amlignore`, and runs the step's command in
it; ours keeps only `training/`. A task file elsewhere (`models/house_task.py`) would not be there, so the
builder stages a folder holding the same kept files plus the task file under `user_tasks/`, beside the
modules of its folder it imports, in their layout (core/sources.py file_task_sources), with an
`.amlignore` that keeps both, points every component's `code` at it, and passes the steps the task as
`user_tasks/<file>:<Attr>` (components/task_ref.py), a path relative to the folder a step runs in.

A staged folder is named by the hash of what it holds and written whole or not at all (staged beside it,
then renamed), so the same code and task file reuse one folder, and a folder of that name is complete.

Every upload goes from a staged folder, task file or not: azure-ai-ml hashes a `code` folder by walking all of
it before applying `.amlignore`, and the checkout's root holds `.venv` and `node_modules` (~150k files, ~30 s
a walk, once per component). A staged folder holds exactly the kept files (the same names and bytes, so the
same content hash and the same uploaded set), and its walk costs nothing.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from components.errors import SubmissionError
from components.fingerprint import IGNORE_FILES, file_sha256, ignore_rules_of, kept_files
from components.specs import REPO_ROOT
from components.task_ref import USER_TASKS_FOLDER
from core.files import staged_folder
from core.sources import file_task_sources

if TYPE_CHECKING:
    from components.azureml.builder import PipelineBuild

SNAPSHOTS_FOLDER = "code-snapshots"
_KEEP_USER_TASKS = (
    f"\n# The user's task file, staged by components/azureml/code_snapshot.py\n!/{USER_TASKS_FOLDER}/\n"
)


def snapshot_files(code_root: Path, task_file: Path | None) -> dict[PurePosixPath, Path]:
    """What the snapshot holds: each relative name and the file it is copied from."""
    files = {relative: code_root / relative for relative in kept_files(code_root, ignore_rules_of(code_root))}
    if task_file is not None:
        for name, source in file_task_sources(task_file).items():
            files[PurePosixPath(USER_TASKS_FOLDER, name)] = source
    return files


def _ignore_file(code_root: Path, keep_user_tasks: bool) -> tuple[str, str] | None:
    """The snapshot's ignore file: the code folder's own (same name), keeping `user_tasks/` if asked."""
    for name in IGNORE_FILES:
        if (code_root / name).is_file():
            text = (code_root / name).read_text()
            return name, text + _KEEP_USER_TASKS if keep_user_tasks else text
    return None


def snapshot_name(files: dict[PurePosixPath, Path], ignore: tuple[str, str] | None) -> str:
    digest = hashlib.sha256()
    for relative in sorted(files):
        digest.update(f"{relative.as_posix()}\0{file_sha256(files[relative])}\n".encode())
    if ignore is not None:
        digest.update(f"{ignore[0]}\0{ignore[1]}".encode())
    return digest.hexdigest()[:16]


def stage_code_snapshot(task_file: Path | None, parent: Path, code_root: Path = REPO_ROOT) -> Path:
    """A folder under `parent` with the code snapshot of `code_root`, plus `task_file` in `user_tasks/`."""
    if task_file is not None:
        task_file = Path(task_file)
        if not task_file.is_file():
            raise SubmissionError(f"task file {task_file}: no such file; expected the model's task file")
    files = snapshot_files(code_root, task_file)
    ignore = _ignore_file(code_root, keep_user_tasks=task_file is not None)
    target = Path(parent) / snapshot_name(files, ignore)
    if target.is_dir():
        return target
    try:
        with staged_folder(target) as staging:
            for relative, source in files.items():
                destination = staging / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, destination)
            if ignore is not None:
                (staging / ignore[0]).write_text(ignore[1])
    except OSError:
        if not target.is_dir():  # not another process staging the same snapshot first
            raise
    return target


def with_code_snapshot(
    build: PipelineBuild, parent: Path, code_root: Path = REPO_ROOT, *, upload: bool = False
) -> PipelineBuild:
    """`build` with its code folder staged under `parent` when its task is a file, or, for a build whose code
    is about to be uploaded (`upload`), whenever its components are not registered ones; else unchanged."""
    if build.task_file is None and not (upload and not build.registered_components):
        return build
    return replace(build, code_folder=stage_code_snapshot(build.task_file, parent, code_root))
