"""A model named by a Hugging Face model id (`--target org/name`), found as `from_pretrained` finds it.

Contract: `model_folder(name, revision, option, files)` -> the local folder to read. `name` itself when
it exists (a folder; a file, which the loader then refuses naming it); else, when `name` is a valid model id
(huggingface_hub's `validate_repo_id`), its snapshot in the Hugging Face cache (HF_HUB_CACHE, or HF_HOME/hub),
downloaded first unless offline (HF_HUB_OFFLINE=1, or the hub unreachable: then the cached snapshot, as
transformers does). The cache is read by huggingface_hub's own `snapshot_download` (refs/REVISION ->
snapshots/COMMIT), never by a parser of ours; `files` are the patterns downloaded (what the caller reads: a
plan, config files only). Anything else is returned as given: the loader says the folder does not exist.
Every failure is a `HubError` (bad input, exit 2) naming the option, the id, the revision and the cache.
"""

from __future__ import annotations

from pathlib import Path

from eagle_eval.errors import UserError
from eagle_eval.settings import ConfigError, bundled_missing

# the files each reader takes from a snapshot (allow_patterns of snapshot_download)
TARGET_FILES = ("*.json", "*.safetensors", "*.jinja", "*.model", "*.tiktoken", "*.txt", "*.py")
# a head: SpecForge/speculators safetensors, EAGLE's .bin, and a DFlash mask row (so that it is refused, not missed)
HEAD_FILES = ("*.json", "*.safetensors", "*.bin", "mask_embedding.pt")
CONFIG_FILES = ("*.json", "*.py")                           # plan: config.json, the safetensors index, code


class HubError(UserError):
    """A model id that cannot be had: not in the cache when offline, unknown to the hub, a bad revision."""


def is_model_id(name: str) -> bool:
    """Whether `name` reads as a Hugging Face model id (org/name or name), by huggingface_hub's own rule.

    >>> is_model_id("Qwen/Qwen3-8B"), is_model_id("/models/qwen3"), is_model_id("./head"), is_model_id("a/b/c")
    (True, False, False, False)
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def model_folder(name, revision: str | None, option: str, files=TARGET_FILES) -> Path:
    """The folder to load for `name` (module contract). `revision` is refused for a local folder (it would be
    ignored)."""
    path = Path(name)
    if path.exists():
        if revision is not None:
            raise ConfigError(f"{_revision_option(option)} {revision}: {option} {name} is a local folder; a revision "
                              "applies to a Hugging Face model id")
        return path
    why = bundled_missing(path)
    if why is not None:
        raise ConfigError(f"{option}: {why}")
    if not is_model_id(str(name)):
        return path
    return Path(_snapshot(str(name), revision, option, files))


def _revision_option(option: str) -> str:
    return "--revision" if option == "--target" else f"{option}-revision"


def _snapshot(repo_id: str, revision: str | None, option: str, files) -> str:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, \
        RevisionNotFoundError

    offline = constants.HF_HUB_OFFLINE              # read now: transformers' is_offline_mode() reads the same
    rev = revision or constants.DEFAULT_REVISION
    where = (f"{option} {repo_id}: no such folder, and as a Hugging Face model id (revision {rev}) it is not in the "
             f"cache {constants.HF_HUB_CACHE}")
    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=list(files), local_files_only=offline)
    except LocalEntryNotFoundError as exc:
        if offline:
            raise HubError(f"{where}; HF_HUB_OFFLINE is set, so nothing is downloaded (download it where the hub "
                           "is reachable, or name a local folder)") from exc
        cause = exc.__cause__ or exc.__context__
        reason = f"{type(cause).__name__}: {str(cause).splitlines()[0]}" if cause is not None else "unreachable"
        raise HubError(f"{where}, and the hub could not be reached ({reason})") from exc
    except RevisionNotFoundError as exc:
        raise HubError(f"{_revision_option(option)} {rev}: no such revision of {repo_id} on the hub") from exc
    except RepositoryNotFoundError as exc:
        raise HubError(f"{option} {repo_id}: no such folder, and no model of that id on the hub (or it is private "
                       "or gated: log in with `hf auth login`)") from exc
    except HfHubHTTPError as exc:
        raise HubError(f"{option} {repo_id}: the hub answered {str(exc).splitlines()[0]}") from exc
    except OSError as exc:             # the download itself: a full disk, an unwritable cache
        raise HubError(f"{option} {repo_id}: cannot download into {constants.HF_HUB_CACHE} "
                       f"({getattr(exc, 'strerror', None) or exc})") from exc
