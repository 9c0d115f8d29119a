"""The output folder of a command run with `Settings`: owned by that run (results/run_folder.py), with a
`settings.yaml` that reruns it (`eagle-eval COMMAND --config settings.yaml`). In a launched run
(torchrun / accelerate launch, eagle_eval/parallel) every process first checks that all have the same
settings, code and inputs, and rank 0 alone opens and writes the folder; `agree_on_loaded` checks the loaded
target, head and prompts the same way."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from eagle_eval import parallel
from eagle_eval.results.resume import workload_digests
from eagle_eval.results.run_folder import RunFolder, open_run_folder
from eagle_eval.settings import Group, Settings, settings_file_text

SETTINGS_FILE = "settings.yaml"


def own_inputs(own: Group | None) -> dict[str, str | None]:
    """{field: path} of the files a command's own options name (e.g. --responses)."""
    return {f.name: getattr(own, f.name) for f in fields(own) if f.metadata.get("input_path")} if own else {}


def model_folders(settings: Settings) -> dict[str, str]:
    """{"target": folder, "draft": folder}: a model id's snapshot in the HF cache (models/hub.py), so the owner
    file fingerprints the files the run reads; a local folder as given."""
    from eagle_eval.heads.kind import keyword_kind
    from eagle_eval.models.hub import HEAD_FILES, TARGET_FILES, model_folder

    m = settings.model
    out = {}
    for name, given, revision, files in (("target", m.target, m.revision, TARGET_FILES),
                                         ("draft", m.draft, m.draft_revision, HEAD_FILES)):
        if name == "draft" and keyword_kind(given) is not None:
            out[name] = None                     # read from the target's own files (--draft mtp), fingerprinted there
            continue
        folder = model_folder(given, revision, f"--{name}", files)
        out[name] = given if folder == Path(given) else str(folder)        # a local folder keeps its spelling
    return out


def command_config(settings: Settings, own: Group | None) -> dict:
    """The flat settings a command's folder records (its owner compares them on resume)."""
    return {**settings.flat(), **(own.as_dict() if own is not None else {})}


def open_folder(command: str, settings: Settings, own: Group | None = None, extra: dict | None = None,
                extra_inputs: dict | None = None) -> RunFolder | None:
    """The RunFolder for settings.output (None without --output-dir, and on every rank but 0 of a launched run);
    writes settings.yaml into it. extra: more settings recorded in the owner file; extra_inputs: more files read
    ({name: path}). Every process of a launched run first checks that all agree on the settings and inputs."""
    config = {**command_config(settings, own), **(extra or {})}
    inputs = {**settings.input_paths(), **own_inputs(own), **(extra_inputs or {})}
    group = parallel.current()
    if settings.output.output_dir or group.world > 1:        # the files read are fingerprinted: a model id's own
        inputs.update(model_folders(settings))
    if group.world > 1:
        from eagle_eval.parallel.settings import settings_digests
        group.check_same("settings", settings_digests(command, config, inputs))
    return group.on_main(lambda: _open(command, settings, own, config, inputs))


def _open(command: str, settings: Settings, own: Group | None, config: dict, inputs: dict) -> RunFolder | None:
    out = settings.output
    if not out.output_dir:
        return None
    ignore = Settings.resumable() + tuple(f.name for f in fields(own) if f.metadata.get("resumable")) if own else \
        Settings.resumable()
    folder = open_run_folder(out.output_dir, command, config, inputs, resume=out.resume, overwrite=out.overwrite,
                             ignore=ignore, full_fingerprint=out.full_fingerprint)
    try:
        folder.write_text(SETTINGS_FILE, settings_file_text(command, settings, own))
    except BaseException:
        folder.close()
        raise
    return folder


def agree_on_loaded(oracle, prompts) -> None:
    """In a launched run: every process loaded the same target and head and rendered the same prompts (the
    resolved settings less each replica's own devices, and the prompts' token ids)."""
    group = parallel.current()
    if group.world > 1:
        from eagle_eval.parallel.settings import loaded_digests
        group.check_same("loaded target, head and prompts", loaded_digests(
            oracle.resolved.as_dict(), workload_digests(prompts), oracle.settings.input_paths()))
