"""servers: the oracle against a running SGLang or vLLM server: the HTTP client (`http`), one module per
engine's wire format (`sglang`, `vllm`), per-request comparison (`compare`), the check itself (`check`),
hypotheses that name a wiring fault (`hypotheses`), and the assertion API for a server's own test
suite (`testing`, also importable as `eagle_eval.testing`).

May import: api, and every lower wing (models, spec, workload, results). Never: diagnose, cli.
"""
