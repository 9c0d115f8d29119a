"""Results: acceptance math (pure functions on counts), sample records, reports, tables, comparison of
saved reports, plots, findings; every writer of results files (JSON, JSONL, CSV, PNG) lives here.

May import: config, errors. Never: models, spec, workload, diagnose, servers, api, cli.
"""
