"""The commands, side by side over the oracle: `run` (the reference loop over a workload), `profile`
(every num_steps from one teacher-forced pass), `ablate` (variants of a run, each through `oracle.with_`).

Each takes prompts in memory (`run_prompts`, `profile_prompts`) below a wrapper that reads the settings'
files and owns the output folder (`evaluate`, `profile`, `ablate`); `folder.open_folder` is that ownership.
May import: the oracle, settings, errors and the stages (models, speculative, workload, results). Never:
diagnose, servers, api, cli.
"""
