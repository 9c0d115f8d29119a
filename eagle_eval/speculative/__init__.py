"""Speculative decoding: drafting (chain and tree), verification, the reference loop (`chain`), plain
greedy decoding, and the teacher-forced profile that reproduces the loop for every num_steps.

May import: models, results.records (the Prompt and SampleRecord records), results.distribution (the
distribution check's counts), settings, errors.
Never: workload, diagnose, servers, api, cli.
"""
