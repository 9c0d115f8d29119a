"""Teacher-forced profiles: every num_steps (and tree shape) of the loop from one target forward per prompt.
`teacher_forced` (greedy run lengths and the cycle simulation), `unroll` (the draft from every start at once),
`run_lengths` (survivor-only drafting), `sampled` (temperature > 0: the exact expectation per start and the
acceptance along sampled continuations), `expected` (the closed forms' shared math), `trees`, `branches` (the
target off the teacher-forced sequence), `rollouts` and `weighted` (sampled drafts), `costs` (the speedup model's
timings).

May import: loop, rules, heads, models, records, stats, settings, errors. Never: workload, results, the commands,
diagnose, servers, api, cli.
"""
