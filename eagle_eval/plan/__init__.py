"""`eagle-eval plan`: does a target (and its head) fit given GPUs, with what placement and KV-cache room, from
config.json alone (`command`; the meta-device model in `model`). A command of its own.

May import: models, heads, units, settings, errors. Never: loop, rules, profile, the other commands, diagnose,
servers, api, cli.
"""
