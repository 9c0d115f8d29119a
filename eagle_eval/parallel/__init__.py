"""One run over many processes: each process a replica of the target and head, started by torchrun or
`accelerate launch`, with rank 0 the only writer of the run folder.

Rooms: `shard` (pure: heaviest-first order and balanced splits by weight), `group` (the launcher's
process group over gloo: rank, world, collectives, `on_main`, `check_same`, `map_shards`, which GPUs a
replica takes), `settings` (what every process must agree on, as digests), `work_queue` (a dynamic
queue: rank 0 hands out items, every rank works, results reach rank 0 as they finish), `turns` (the
workload's questions over the queue, a question's turns kept on one process), `console` (one progress
bar, stderr tagged by rank, stdout only on rank 0).

May import: results (records, run_folder's hashing), workload (conversations), errors.
Never: models, speculative, diagnose, servers, api, cli (decoding comes in as a callable).
"""
