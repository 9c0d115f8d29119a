"""The engines' decisions at temperature > 0, one record per accept rule (`registry.RULES` names them; each engine's
file holds its rules): the decode policy class, the filter order of p, the closed form of the expected acceptance,
what the engine refuses (trees, thresholds, a reduced draft vocab), whether drafts are sampled. `base` holds what
every rule shares (the draws, the one-hot and sampled-draft policies), `filters` the filter primitives and each
prompt's random stream, `lossless` the distribution check's counts of a run's output.

May import: loop (the policy protocol, trees), models (the target, for lossless), stats, records, settings, errors.
Never: profile, workload, results, the commands, diagnose, servers, api, cli.
"""
