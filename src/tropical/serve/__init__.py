"""`tropical serve`: the router, worker processes and the OpenAI-compatible API."""
