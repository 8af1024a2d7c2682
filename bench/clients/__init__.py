"""``jaxinfer-bench clients``: third-party clients, unmodified, against a live ``jaxinfer serve``.

``cli`` is the experiment; ``server`` starts ``jaxinfer serve`` as a user would; ``openai_sdk``,
``lm_eval_harness`` and ``aiperf_load`` drive one client each and return ``common.ClientResult`` rows;
``lm_eval_tasks/`` holds the three small lm-evaluation-harness tasks (local JSONL + task YAML) they run.
"""
