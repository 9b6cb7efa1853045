"""The benchmark: localui against its budgets, side by side with the SDK's bundled UI.

``python -m bench`` builds stores of real SDK rows copied under new ids, serves
them with ``localui serve`` (and ``fastaiagent ui``), measures latency, memory,
start-up and page weight, writes a markdown table to ``bench/results/``, and
exits 1 when a budget is missed (2 when the benchmark itself failed).
"""
