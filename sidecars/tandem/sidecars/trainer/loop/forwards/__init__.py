"""What the Inference phase's collective forwards stand on, on every rank.

`reference` (the reference policy as a frozen copy of weights swapped into the trainer's own model) and
`sharded` (forwards over a packed batch split across data-parallel ranks, gathered back per sample).
Callers: `..phases.inference`; `..start` captures the reference weights.
"""
