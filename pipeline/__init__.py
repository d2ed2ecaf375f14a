"""Roost's data pipeline: the rules that judge a run's event logs (rules.py), the reference
checker (checker.py), and the Spark side: `roost audit` over the logs and the `roost` data
source that publishes rows to topics (sink.py) and reads durable topics (source.py)
(docs/pipeline.md)."""
