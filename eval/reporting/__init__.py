"""Reporting: per-request records -> summaries, Markdown tables, plots and W&B runs."""
