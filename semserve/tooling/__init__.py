"""Developer and operator tooling, apart from the runtime: the semantic cache's eval harness
(cache_eval, cache_eval_cli, cache_eval_report, cache_eval_plot), pair generation and scorer
training (pair_generation, scorer_training), the local Redis launcher (local_redis) and the
dependency audit. The services never import this package; the CLI, the tests and bench/ do."""
