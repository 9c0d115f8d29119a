"""diagnose: train/serve mismatch checks with the target loaded once (`run.diagnose`): the aux-layer
sweep, training-dump matching, the fingerprint, the chat-template check; `decide` holds the three-way
rule (mismatch / consistent / inconclusive) and the sequential looks every comparison uses. The load-time checks that
`run` prints too live in `models.sanity` (they inspect what was loaded, and `api` calls them: keeping
them here would make api and diagnose import each other); the finding record lives in `results.findings`.

May import: api, and every lower wing (models, spec, workload, results). Never: servers, cli.
"""
