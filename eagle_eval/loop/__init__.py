"""The speculative loop: the reference loop one prompt at a time (`reference`), the draft's side of it (`draft`:
a kind's drafting state), verification (`verify`, `tree`), the decode policy (`policy`: what is proposed and kept),
plain greedy decoding (`plain`), and the fast loops: many prompts per forward (`batched`, over the row caches of
`rows`) and the CUDA-graph cycle (`graphed`).

May import: models (the target, the capture), heads (the protocol a head kind implements), records, stats,
settings, errors. Never: rules (a rule reaches the loop as a policy object), profile, workload, results, the
commands, diagnose, servers, api, cli.
"""
