"""Mock workers (``tropical serve --engine mock``): the router, unchanged, over workers that sleep
the iteration times a latency profile predicts instead of running a model, so one machine can
load-test the router at hundreds of workers (as Dynamo's mocker and llm-d's inference simulator)."""
