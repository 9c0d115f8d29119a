"""Load-time checks of a loaded target and head, as findings: `sanity` (every head), `variants` (the head
variants and the config-key audit); a kind's own checks live in its folder."""
