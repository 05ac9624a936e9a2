"""Load generation over HTTP: replay a trace against any OpenAI-compatible server and measure
TTFT, TPOT, inter-token latency, SLO attainment and goodput with the simulator's metric code."""
