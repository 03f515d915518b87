"""Judging a job: the baselines a quant tries first, the scores, and the typed results."""
