"""The job's prompt dataset: read once, rendered with the model's chat template, sampled per iteration.

`dataset` (`PromptDataset`: files read by the `datasets` library, rows rendered as the rollouts are sent them)
and `labelled` (KTO's rows: each completion and label, tokenized as the model's reply). Callers: `..start`
(the training and evaluation sets), `..preflight` (every prompt's length), the rollout sources and the
evaluator (`Prompt`).
"""
