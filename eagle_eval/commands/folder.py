"""The output folder of a command run with `Settings`: owned by that run (results/run_folder.py), with a
`settings.yaml` that reruns it (`eagle-eval COMMAND --config settings.yaml`)."""

from __future__ import annotations

from dataclasses import fields

from eagle_eval.results.run_folder import RunFolder, open_run_folder
from eagle_eval.settings import Group, Settings, settings_file_text

SETTINGS_FILE = "settings.yaml"


def own_inputs(own: Group | None) -> dict[str, str | None]:
    """{field: path} of the files a command's own options name (e.g. --responses)."""
    return {f.name: getattr(own, f.name) for f in fields(own) if f.metadata.get("input_path")} if own else {}


def command_config(settings: Settings, own: Group | None) -> dict:
    """The flat settings a command's folder records (its owner compares them on resume)."""
    return {**settings.flat(), **(own.as_dict() if own is not None else {})}


def open_folder(command: str, settings: Settings, own: Group | None = None, extra: dict | None = None,
                extra_inputs: dict | None = None) -> RunFolder | None:
    """The RunFolder for settings.output (None without --output-dir); writes settings.yaml into it.
    extra: more settings recorded in the owner file; extra_inputs: more files read ({name: path})."""
    out = settings.output
    if not out.output_dir:
        return None
    ignore = Settings.resumable() + tuple(f.name for f in fields(own) if f.metadata.get("resumable")) if own else \
        Settings.resumable()
    folder = open_run_folder(out.output_dir, command, {**command_config(settings, own), **(extra or {})},
                             {**settings.input_paths(), **own_inputs(own), **(extra_inputs or {})},
                             resume=out.resume, overwrite=out.overwrite, ignore=ignore,
                             full_fingerprint=out.full_fingerprint)
    try:
        folder.write_text(SETTINGS_FILE, settings_file_text(command, settings, own))
    except BaseException:
        folder.close()
        raise
    return folder
