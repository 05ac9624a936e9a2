"""vLLM servers as workers: they plan their own iterations; the router routes over a shadow of each."""
