"""Evaluation: the commands at this level, the library in rooms below it.

Commands (`python -m eval.NAME recipe=... key=value`):
- `eval` (`__main__`): a streaming evaluation of one model on one benchmark, or a suite;
- `eval.before_after`: a base model against its adaptations, with the report;
- `eval.serve`: streaming generation served on vLLM (OpenAI API, typing sessions);
- `eval.live`: the answer-while-typing page on that server;
- `eval.width_cost`: this machine's width-cost table for a model.

Rooms: `evaluation` (a run: settings, runner, evaluator, results, shards, suite, typing
simulation), `engines` (decoding), `benchmarks`, `sandbox` (running model-written programs),
`reporting`, `serving`.
"""
