"""One evaluation run of `python -m eval`: its settings (config), the run over a benchmark
(runner), one request streamed and its baseline (evaluator), the run's output folder
(results_dir), shards of a run (shards), a run over several benchmarks (suite), and the
typing simulation that turns forwards into seconds (typing_sim)."""
