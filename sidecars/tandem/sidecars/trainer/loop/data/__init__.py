"""The job's prompt dataset: read once, rendered with the model's chat template, sampled per iteration.

`dataset` (`PromptDataset`: rows checked and rendered as the rollouts are sent them), `dataset_files` (the file
or directory read by the `datasets` library; `DatasetError`) and `labelled` (KTO's rows: each completion and
label, tokenized as the model's reply). Callers: `..start` (the training and evaluation sets), `..preflight`
(every prompt's length), the rollout sources and the evaluator (`Prompt`).
"""
