"""The workload: prompt files and standard datasets, chat templates, multi-turn conversations.

May import: results.records (Prompt, SampleRecord), config, errors.
Never: models, spec, diagnose, servers, api, cli (turns are decoded through a callable the caller passes).
"""
