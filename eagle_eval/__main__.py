"""`python -m eagle_eval COMMAND ...` is `eagle-eval COMMAND ...`: what `torchrun ... -m eagle_eval` and
`accelerate launch ... -m eagle_eval` start in each process (docs/parallel.md)."""

from eagle_eval.cli import entry

if __name__ == "__main__":
    entry()
