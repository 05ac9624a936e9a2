"""`tropical serve`: the router around sched's Cluster, and the substrates it runs on.

At this level, what every substrate shares: the router (``router``), the requests in flight and
their streams, metrics, options, the iteration log, the profile choice and the server's entry.
Below it, one package per concern: ``http`` (the OpenAI-compatible API), ``workers`` (our own
engine's worker processes, stepped by the router), ``ray`` (those workers as Ray actors) and
``vllm`` (vLLM servers as workers).
"""
