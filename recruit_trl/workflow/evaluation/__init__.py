"""Evaluation: whole episodes of any policy over seeds and tasks, their metrics, cached results, tables and plots."""
